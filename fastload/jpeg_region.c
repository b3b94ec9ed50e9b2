/* Decode stage, native part: a JPEG's crop box decoded without the pixels around it.
 *
 * libjpeg(-turbo) can skip what a crop does not need: the rows under the box are never decoded,
 * the rows above it are entropy-decoded only (jpeg_skip_scanlines: no IDCT, no upsampling, no
 * colour conversion), and inside the box's rows only the iMCU columns that hold it are
 * transformed (jpeg_crop_scanline). RandomResizedCrop boxes cover 8-100% of a photo, so most of
 * the pixel work of a full decode is work no one looks at.
 *
 * The GIL is released while libjpeg runs. Any libjpeg error or warning (corrupt or truncated
 * data, an unsupported colour space) raises RegionDecodeError; the Python side then decodes the
 * record with Pillow, which gives the image or the documented error, so this path never decides
 * what a bad record means.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "jpeg_native.h"

/* Columns and rows decoded beyond each side of the box, then dropped: a cropped decode treats
 * its edges as the image's edges when it upsamples chroma; this margin keeps the kept pixels
 * identical to a full decode's. */
#define MARGIN 16

/* Restart intervals written by add_restart_markers: at most this many pixels wide. */
#define RESTART_WIDTH 64

static PyObject *RegionDecodeError;

static void stop_on_error(j_common_ptr cinfo) {
    ErrorManager *err = (ErrorManager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void stop_on_warning(j_common_ptr cinfo, int level) {
    /* level < 0: a warning (corrupt data that libjpeg would paper over); >= 0: trace output. */
    if (level < 0) {
        stop_on_error(cinfo);
    }
}

struct jpeg_error_mgr *fastload_jpeg_errors(ErrorManager *err) {
    struct jpeg_error_mgr *pub = jpeg_std_error(&err->pub);
    pub->error_exit = stop_on_error;
    pub->emit_message = stop_on_warning;
    err->message[0] = '\0';
    return pub;
}

typedef struct {
    const unsigned char *data;
    size_t length;
    int scale, left, top, right, bottom; /* the box asked for, in scaled pixels */
    long max_pixels;
    PyThreadState *thread;                /* the GIL is released while this is set */
    /* results */
    PyObject *pixels;                     /* bytearray, height x width x 3 */
    JDIMENSION image_width, image_height;
    char message[JMSG_LENGTH_MAX];
    int status; /* 0 ok, 1 libjpeg error, 2 empty box, 3 over max_pixels, 4 no memory */
} Request;

/* The output buffer, allocated with the GIL held for a moment: no libjpeg call runs meanwhile,
 * so no error can jump over the re-release. */
static unsigned char *allocate(Request *req, size_t size) {
    PyEval_RestoreThread(req->thread);
    req->pixels = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (req->pixels == NULL) {
        PyErr_Clear();
    }
    req->thread = PyEval_SaveThread();
    return req->pixels == NULL ? NULL : (unsigned char *)PyByteArray_AS_STRING(req->pixels);
}

static void decode(Request *req) {
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    JSAMPLE *volatile row = NULL;

    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = fastload_jpeg_errors(&err);
    if (setjmp(err.jump)) {
        req->status = 1;
        memcpy(req->message, err.message, sizeof req->message);
        goto done;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, req->data, (unsigned long)req->length);
    jpeg_read_header(&cinfo, TRUE);
    req->image_width = cinfo.image_width;
    req->image_height = cinfo.image_height;
    if ((double)cinfo.image_width * (double)cinfo.image_height > (double)req->max_pixels) {
        req->status = 3;
        goto done;
    }
    cinfo.out_color_space = JCS_RGB; /* grey expands to RGB; CMYK/YCCK raise (Pillow converts them) */
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)req->scale;
    jpeg_start_decompress(&cinfo);
    /* Clamp the box to the image at this scale. */
    if (req->right > (int)cinfo.output_width) req->right = (int)cinfo.output_width;
    if (req->bottom > (int)cinfo.output_height) req->bottom = (int)cinfo.output_height;
    if (req->left >= req->right || req->top >= req->bottom) {
        req->status = 2;
        goto done;
    }
    {
        int width = req->right - req->left, height = req->bottom - req->top;
        int first = req->left > MARGIN ? req->left - MARGIN : 0;
        int end = req->right + MARGIN < (int)cinfo.output_width ? req->right + MARGIN
                                                                 : (int)cinfo.output_width;
        JDIMENSION x = (JDIMENSION)first, span = (JDIMENSION)(end - first);
        int skip = req->top > MARGIN ? req->top - MARGIN : 0;
        size_t stride = (size_t)width * 3;
        unsigned char *out;
        int y;

        jpeg_crop_scanline(&cinfo, &x, &span); /* x moves left to an iMCU boundary */
        row = (JSAMPLE *)malloc((size_t)cinfo.output_width * 3);
        out = row == NULL ? NULL : allocate(req, stride * (size_t)height);
        if (out == NULL) {
            req->status = 4;
            goto done;
        }
        if (skip > 0) {
            jpeg_skip_scanlines(&cinfo, (JDIMENSION)skip);
        }
        for (y = skip; y < req->top; y++) { /* the margin rows: decoded for context, dropped */
            JSAMPROW rows[1] = {row};
            jpeg_read_scanlines(&cinfo, rows, 1);
        }
        for (y = 0; y < height; y++) {
            JSAMPROW rows[1] = {row};
            jpeg_read_scanlines(&cinfo, rows, 1);
            memcpy(out + (size_t)y * stride, row + (size_t)(req->left - (int)x) * 3, stride);
        }
        req->status = 0;
    }
done:
    free(row);
    jpeg_destroy_decompress(&cinfo); /* also ends a decompression stopped part-way */
}

/* The box's corner, in original pixels, moved by `by` scaled pixels and kept within int. */
static int original_pixels(int scaled, int by, int scale) {
    long long v = ((long long)scaled + by) * scale;
    return v > 0x3FFFFFFF ? 0x3FFFFFFF : (v < 0 ? 0 : (int)v);
}

/* Decode from the box's restart intervals alone when the JPEG has intervals that tile its rows
 * (jpeg_splice.c); otherwise, or when the cut would be the whole image, from the whole file. The
 * cut reaches MARGIN pixels past the box too, so the pixels are those of a whole-file decode. */
static void decode_cut_or_whole(Request *req) {
    JpegCut cut;
    Request part;
    int s = req->scale, dx, dy;

    if (!fastload_jpeg_cut(req->data, req->length, original_pixels(req->left, -MARGIN, s),
                           original_pixels(req->top, -MARGIN, s),
                           original_pixels(req->right, MARGIN, s),
                           original_pixels(req->bottom, MARGIN, s), req->max_pixels, &cut)) {
        decode(req);
        return;
    }
    dx = cut.x / s; /* whole scaled pixels: cuts start on MCU edges, 8 or 16 pixels apart */
    dy = cut.y / s;
    part = *req;
    part.data = cut.data;
    part.length = cut.length;
    part.left -= dx;
    part.right -= dx;
    part.top -= dy;
    part.bottom -= dy;
    decode(&part);
    free(cut.data);
    part.data = req->data;
    part.length = req->length;
    part.left += dx;
    part.right += dx;
    part.top += dy;
    part.bottom += dy;
    *req = part;
}

PyDoc_STRVAR(decode_region_doc,
"decode_region(data, scale, left, top, right, bottom, max_pixels, cut=False)\n"
"    -> (pixels, left, top, width, height)\n\n"
"Decode the box [left, right) x [top, bottom) of a JPEG at 1/scale size (scale 1, 2, 4 or 8;\n"
"the box in scaled pixels, clamped to the image) to RGB: ``pixels`` is a bytearray of\n"
"height * width * 3 bytes, for the clamped box returned with it. With cut=True, a JPEG whose\n"
"restart intervals tile its rows is decoded from the box's intervals only (same pixels; data\n"
"outside them is not read, so pass it only for files checked whole, as `fastload pack\n"
"--restart-markers` does). Raises RegionDecodeError for anything libjpeg refuses or warns\n"
"about, a box with nothing inside the image, or an image over max_pixels.");

static PyObject *decode_region(PyObject *self, PyObject *args) {
    Py_buffer data;
    Request req;
    int cut = 0;
    (void)self;
    memset(&req, 0, sizeof req);
    if (!PyArg_ParseTuple(args, "y*iiiiil|p", &data, &req.scale, &req.left, &req.top, &req.right,
                          &req.bottom, &req.max_pixels, &cut)) {
        return NULL;
    }
    if (!(req.scale == 1 || req.scale == 2 || req.scale == 4 || req.scale == 8) || req.left < 0 ||
        req.top < 0) {
        PyErr_Format(PyExc_ValueError, "decode_region: bad scale %d or box corner %d,%d",
                     req.scale, req.left, req.top);
        PyBuffer_Release(&data);
        return NULL;
    }
    req.data = (const unsigned char *)data.buf;
    req.length = (size_t)data.len;
    req.thread = PyEval_SaveThread();
    if (cut) {
        decode_cut_or_whole(&req);
    } else {
        decode(&req);
    }
    PyEval_RestoreThread(req.thread);
    PyBuffer_Release(&data);
    switch (req.status) {
    case 0:
        return Py_BuildValue("(Niiii)", req.pixels, req.left, req.top, req.right - req.left,
                             req.bottom - req.top);
    case 2:
        PyErr_Format(RegionDecodeError, "box %d,%d-%d,%d at 1/%d scale is outside the %ux%u image",
                     req.left, req.top, req.right, req.bottom, req.scale,
                     (unsigned)req.image_width, (unsigned)req.image_height);
        break;
    case 3:
        PyErr_Format(RegionDecodeError, "%ux%u is over the pixel limit",
                     (unsigned)req.image_width, (unsigned)req.image_height);
        break;
    case 4:
        PyErr_NoMemory();
        break;
    default:
        PyErr_Format(RegionDecodeError, "libjpeg: %s", req.message);
    }
    Py_XDECREF(req.pixels);
    return NULL;
}

PyDoc_STRVAR(add_restart_markers_doc,
"add_restart_markers(data) -> (jpeg_bytes, interval_mcus)\n\n"
"The JPEG rewritten losslessly (the same DCT coefficients, so the same pixels) as baseline\n"
"with optimised Huffman tables and a restart marker every interval_mcus MCUs: intervals at\n"
"most 64 pixels wide that never run from one MCU row into the next, so decode_region(...,\n"
"cut=True) can decode a crop from its intervals alone. Every block is decoded on the way:\n"
"raises RegionDecodeError with libjpeg's message for anything corrupt, truncated or not a\n"
"JPEG libjpeg reads.");

static PyObject *add_restart_markers(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned char *out;
    size_t length = 0;
    int interval = 0;
    char message[JMSG_LENGTH_MAX];
    PyObject *result;
    PyThreadState *thread;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &data)) {
        return NULL;
    }
    message[0] = '\0';
    thread = PyEval_SaveThread();
    out = fastload_jpeg_add_restarts((const unsigned char *)data.buf, (size_t)data.len,
                                     RESTART_WIDTH, &length, &interval, message);
    PyEval_RestoreThread(thread);
    PyBuffer_Release(&data);
    if (out == NULL) {
        PyErr_Format(RegionDecodeError, "libjpeg: %s", message);
        return NULL;
    }
    result = Py_BuildValue("(y#i)", (const char *)out, (Py_ssize_t)length, interval);
    free(out);
    return result;
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS, decode_region_doc},
    {"add_restart_markers", add_restart_markers, METH_VARARGS, add_restart_markers_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fastload._jpeg_region",
    "A JPEG's crop box decoded with libjpeg, skipping the rows and columns outside it.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpeg_region(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    RegionDecodeError = PyErr_NewException("fastload._jpeg_region.RegionDecodeError",
                                           PyExc_ValueError, NULL);
    if (RegionDecodeError == NULL || PyModule_AddObject(m, "RegionDecodeError", RegionDecodeError) < 0) {
        Py_XDECREF(RegionDecodeError);
        Py_DECREF(m);
        return NULL;
    }
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
    /* e.g. 2001005 for libjpeg-turbo 2.1.5 */
    if (PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION", LIBJPEG_TURBO_VERSION_NUMBER) < 0) {
#else
    if (PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION", 0) < 0) {
#endif
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
