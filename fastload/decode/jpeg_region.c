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
#include "resample.h"

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
    int grey;                             /* a greyscale JPEG decodes to one channel, not RGB */
    /* results */
    unsigned char *pixels; /* malloc'd: the box's rows, `stride` bytes apart, from byte `offset` */
    ptrdiff_t stride;
    int offset, channels;
    JDIMENSION image_width, image_height;
    char message[JMSG_LENGTH_MAX];
    int status; /* 0 ok, 1 libjpeg error, 2 empty box, 3 over max_pixels, 4 no memory,
                 * 5 box past the image's edge */
} Request;

static void decode(Request *req) {
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;

    memset(&cinfo, 0, sizeof cinfo);
    req->pixels = NULL;
    cinfo.err = fastload_jpeg_errors(&err);
    if (setjmp(err.jump)) {
        req->status = 1;
        memcpy(req->message, err.message, sizeof req->message);
        free(req->pixels);
        req->pixels = NULL;
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
    /* Grey stays grey when asked (the resize writes it to all three channels); CMYK/YCCK raise
     * (Pillow converts them). */
    req->channels = req->grey && cinfo.jpeg_color_space == JCS_GRAYSCALE ? 1 : 3;
    cinfo.out_color_space = req->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
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
        int height = req->bottom - req->top;
        int first = req->left > MARGIN ? req->left - MARGIN : 0;
        int end = req->right + MARGIN < (int)cinfo.output_width ? req->right + MARGIN
                                                                 : (int)cinfo.output_width;
        JDIMENSION x = (JDIMENSION)first, span = (JDIMENSION)(end - first);
        int skip = req->top > MARGIN ? req->top - MARGIN : 0;
        int y;

        jpeg_crop_scanline(&cinfo, &x, &span); /* x moves left to an iMCU boundary */
        /* Rows land in place: the box starts `offset` bytes into each. */
        req->stride = (ptrdiff_t)cinfo.output_width * req->channels;
        req->offset = (req->left - (int)x) * req->channels;
        req->pixels = malloc((size_t)req->stride * (size_t)height + READ_PAST);
        if (req->pixels == NULL) {
            req->status = 4;
            goto done;
        }
        if (skip > 0) {
            jpeg_skip_scanlines(&cinfo, (JDIMENSION)skip);
        }
        for (y = skip; y < req->top; y++) { /* the margin rows: decoded for context, dropped */
            JSAMPROW rows[1] = {req->pixels};
            jpeg_read_scanlines(&cinfo, rows, 1);
        }
        for (y = 0; y < height; y++) {
            JSAMPROW rows[1] = {req->pixels + (ptrdiff_t)y * req->stride};
            jpeg_read_scanlines(&cinfo, rows, 1);
        }
        req->status = 0;
    }
done:
    jpeg_destroy_decompress(&cinfo); /* also ends a decompression stopped part-way */
}

/* The image's size at 1/scale (what a decode at that scale gives), from its header. */
static void measure(Request *req) {
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;

    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = fastload_jpeg_errors(&err);
    if (setjmp(err.jump)) {
        req->status = 1;
        memcpy(req->message, err.message, sizeof req->message);
        jpeg_destroy_decompress(&cinfo);
        return;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, req->data, (unsigned long)req->length);
    jpeg_read_header(&cinfo, TRUE);
    if ((double)cinfo.image_width * (double)cinfo.image_height > (double)req->max_pixels) {
        req->status = 3;
    }
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)req->scale;
    jpeg_calc_output_dimensions(&cinfo);
    req->image_width = cinfo.output_width;
    req->image_height = cinfo.output_height;
    jpeg_destroy_decompress(&cinfo);
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

/* Raise the error a failed request stands for; NULL. */
static PyObject *request_error(const Request *req) {
    switch (req->status) {
    case 2:
        PyErr_Format(RegionDecodeError, "box %d,%d-%d,%d at 1/%d scale is outside the %ux%u image",
                     req->left, req->top, req->right, req->bottom, req->scale,
                     (unsigned)req->image_width, (unsigned)req->image_height);
        break;
    case 3:
        PyErr_Format(RegionDecodeError, "%ux%u is over the pixel limit",
                     (unsigned)req->image_width, (unsigned)req->image_height);
        break;
    case 4:
        PyErr_NoMemory();
        break;
    case 5:
        PyErr_Format(RegionDecodeError, "the box reaches past the %ux%u image at 1/%d scale",
                     (unsigned)req->image_width, (unsigned)req->image_height, req->scale);
        break;
    default:
        PyErr_Format(RegionDecodeError, "libjpeg: %s", req->message);
    }
    return NULL;
}

static int good_scale(int scale) { return scale == 1 || scale == 2 || scale == 4 || scale == 8; }

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
    PyThreadState *thread;
    PyObject *result = NULL;
    int cut = 0;
    (void)self;
    memset(&req, 0, sizeof req);
    if (!PyArg_ParseTuple(args, "y*iiiiil|p", &data, &req.scale, &req.left, &req.top, &req.right,
                          &req.bottom, &req.max_pixels, &cut)) {
        return NULL;
    }
    if (!good_scale(req.scale) || req.left < 0 || req.top < 0) {
        PyErr_Format(PyExc_ValueError, "decode_region: bad scale %d or box corner %d,%d",
                     req.scale, req.left, req.top);
        PyBuffer_Release(&data);
        return NULL;
    }
    req.data = (const unsigned char *)data.buf;
    req.length = (size_t)data.len;
    thread = PyEval_SaveThread();
    if (cut) {
        decode_cut_or_whole(&req);
    } else {
        decode(&req);
    }
    PyEval_RestoreThread(thread);
    PyBuffer_Release(&data);
    if (req.status != 0) {
        return request_error(&req);
    }
    {
        int width = req.right - req.left, height = req.bottom - req.top, y;
        size_t row = (size_t)width * 3;
        PyObject *pixels = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(row * (size_t)height));
        if (pixels != NULL) {
            for (y = 0; y < height; y++) {
                memcpy(PyByteArray_AS_STRING(pixels) + (size_t)y * row,
                       req.pixels + (ptrdiff_t)y * req.stride + req.offset, row);
            }
            result = Py_BuildValue("(Niiii)", pixels, req.left, req.top, width, height);
        }
    }
    free(req.pixels);
    return result;
}

/* An HxWx3 uint8 buffer to write into, or NULL with an exception set. */
static int get_target(PyObject *out, Py_buffer *view) {
    if (PyObject_GetBuffer(out, view, PyBUF_RECORDS) < 0) {
        return 0;
    }
    if (view->ndim != 3 || view->shape[2] != 3 || view->itemsize != 1 ||
        (view->format != NULL && strcmp(view->format, "B") != 0) || view->shape[0] < 1 ||
        view->shape[1] < 1 || view->shape[0] > 0x7FFFFFFF || view->shape[1] > 0x7FFFFFFF) {
        PyErr_SetString(PyExc_ValueError, "out must be a writable uint8 array of shape (H, W, 3)");
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* The box clamped to a width x height image as Pillow's path clamps float round-off; 0 when it
 * starts outside the image or ends more than round-off past it. */
static int clamp_box(double box[4], int width, int height) {
    if (!(box[0] >= 0 && box[1] >= 0 && box[2] <= width + 1e-6 && box[3] <= height + 1e-6 &&
          box[0] < box[2] && box[1] < box[3])) {
        return 0;
    }
    box[2] = box[2] < width ? box[2] : width;
    box[3] = box[3] < height ? box[3] : height;
    return box[0] < box[2] && box[1] < box[3];
}

static Target target_of(const Py_buffer *view, int flip) {
    Target target = {(unsigned char *)view->buf, view->strides[0], view->strides[1],
                     view->strides[2], flip};
    return target;
}

PyDoc_STRVAR(decode_crop_into_doc,
"decode_crop_into(data, scale, x0, y0, x1, y1, crop_first, flip, out, max_pixels, cut=False)\n\n"
"A JPEG crop decoded at 1/scale and resized into ``out`` (a writable uint8 H x W x 3 array,\n"
"any strides), as decode_crop's Pillow path would give it, to the bit: the box (x0, y0)-(x1,\n"
"y1) in scaled pixels, resized with Pillow's bilinear weights; cut out first when crop_first\n"
"and its corners are whole pixels, else resized in place; mirrored when flip. Only the rows\n"
"and columns the resize reads are decoded (with cut=True, from their restart intervals only:\n"
"see decode_region). The GIL is released throughout. Raises RegionDecodeError as\n"
"decode_region does, and for a box past the image's edge (Pillow's path says why).");

static PyObject *decode_crop_into(PyObject *self, PyObject *args) {
    Py_buffer data, view;
    Request req;
    PyObject *out;
    PyThreadState *thread;
    double box[4];
    int crop_first, flip, cut = 0, ok = 1;
    Crop crop;
    (void)self;
    memset(&req, 0, sizeof req);
    if (!PyArg_ParseTuple(args, "y*iddddppOl|p", &data, &req.scale, &box[0], &box[1], &box[2],
                          &box[3], &crop_first, &flip, &out, &req.max_pixels, &cut)) {
        return NULL;
    }
    if (!good_scale(req.scale)) {
        PyErr_Format(PyExc_ValueError, "decode_crop_into: bad scale %d", req.scale);
        PyBuffer_Release(&data);
        return NULL;
    }
    if (!get_target(out, &view)) {
        PyBuffer_Release(&data);
        return NULL;
    }
    req.data = (const unsigned char *)data.buf;
    req.length = (size_t)data.len;
    req.grey = 1;
    thread = PyEval_SaveThread();
    measure(&req);
    if (req.status == 0 && !clamp_box(box, (int)req.image_width, (int)req.image_height)) {
        req.status = 5;
    }
    if (req.status == 0 && !fastload_crop(&crop, (int)req.image_width, (int)req.image_height,
                                          box[0], box[1], box[2], box[3], crop_first,
                                          (int)view.shape[1], (int)view.shape[0])) {
        req.status = 4;
    } else if (req.status == 0) {
        /* Decode what the resize reads, no more. */
        req.left = crop.x.begin;
        req.top = crop.y.begin;
        req.right = crop.x.end;
        req.bottom = crop.y.end;
        if (cut) {
            decode_cut_or_whole(&req);
        } else {
            decode(&req);
        }
        if (req.status == 0) {
            Source source = {req.pixels + req.offset, req.stride, req.channels, req.left, req.top,
                             req.pixels + req.stride * (req.bottom - req.top) + READ_PAST};
            Target target = target_of(&view, flip);
            ok = req.left == crop.x.begin && req.top == crop.y.begin && req.right == crop.x.end &&
                 req.bottom == crop.y.end; /* never clamped: the axes lie inside the image */
            req.status = !ok ? 5 : (fastload_resample(&crop, &source, &target) ? 0 : 4);
        }
        free(req.pixels);
        fastload_crop_free(&crop);
    }
    PyEval_RestoreThread(thread);
    PyBuffer_Release(&view);
    PyBuffer_Release(&data);
    if (req.status != 0) {
        return request_error(&req);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(resize_into_doc,
"resize_into(pixels, x0, y0, x1, y1, crop_first, flip, out)\n\n"
"Resize the box (x0, y0)-(x1, y1) of ``pixels`` (a C-contiguous uint8 H x W x 3 or H x W\n"
"array) into ``out`` (a writable uint8 H x W x 3 array, any strides) exactly as Pillow's\n"
"resize(size, BILINEAR, box=...) would, cut out first when crop_first and its corners are whole\n"
"pixels, mirrored when flip; grey is written to all three channels. The GIL is released.\n"
"Raises ValueError for a box outside the image.");

static PyObject *resize_into(PyObject *self, PyObject *args) {
    Py_buffer pixels, view;
    PyObject *source_obj, *out;
    PyThreadState *thread;
    double box[4];
    int crop_first, flip, ok = 0, channels, width, height;
    Crop crop;
    (void)self;
    if (!PyArg_ParseTuple(args, "OddddppO", &source_obj, &box[0], &box[1], &box[2], &box[3],
                          &crop_first, &flip, &out)) {
        return NULL;
    }
    if (PyObject_GetBuffer(source_obj, &pixels, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return NULL;
    }
    channels = pixels.ndim == 3 ? (int)pixels.shape[2] : 1;
    if ((pixels.ndim != 2 && pixels.ndim != 3) || (channels != 1 && channels != 3) ||
        pixels.itemsize != 1 || pixels.shape[0] > 0x7FFFFFFF || pixels.shape[1] > 0x7FFFFFFF) {
        PyBuffer_Release(&pixels);
        PyErr_SetString(PyExc_ValueError,
                        "pixels must be a uint8 array of shape (H, W, 3) or (H, W)");
        return NULL;
    }
    width = (int)pixels.shape[1];
    height = (int)pixels.shape[0];
    if (!clamp_box(box, width, height)) {
        PyErr_Format(PyExc_ValueError, "resize_into: the box is outside the %dx%d image", width,
                     height);
        PyBuffer_Release(&pixels);
        return NULL;
    }
    if (!get_target(out, &view)) {
        PyBuffer_Release(&pixels);
        return NULL;
    }
    thread = PyEval_SaveThread();
    if (fastload_crop(&crop, width, height, box[0], box[1], box[2], box[3], crop_first,
                      (int)view.shape[1], (int)view.shape[0])) {
        Source source = {(const unsigned char *)pixels.buf, (ptrdiff_t)width * channels, channels,
                         0, 0, (const unsigned char *)pixels.buf + pixels.len};
        Target target = target_of(&view, flip);
        ok = fastload_resample(&crop, &source, &target);
        fastload_crop_free(&crop);
    }
    PyEval_RestoreThread(thread);
    PyBuffer_Release(&view);
    PyBuffer_Release(&pixels);
    if (!ok) {
        return PyErr_NoMemory();
    }
    Py_RETURN_NONE;
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
    {"decode_crop_into", decode_crop_into, METH_VARARGS, decode_crop_into_doc},
    {"resize_into", resize_into, METH_VARARGS, resize_into_doc},
    {"add_restart_markers", add_restart_markers, METH_VARARGS, add_restart_markers_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fastload.decode._jpeg_region",
    "A JPEG's crop box decoded with libjpeg, skipping the rows and columns outside it.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpeg_region(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    RegionDecodeError = PyErr_NewException("fastload.decode._jpeg_region.RegionDecodeError",
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
