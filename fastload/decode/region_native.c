/* Decode stage, native part: the JPEG path's Python functions (registered in module.c). Each
 * parses its arguments, releases the GIL and calls the C that does the work (jpeg_region.c: a
 * JPEG's crop box decoded and resized; resample.c: a resize alone; jpeg_restarts.c: restart
 * markers for the pack stage). A failed request raises RegionDecodeError, which the Python side
 * answers by decoding with Pillow. */
#include "region_native.h"

#include <stdlib.h>
#include <string.h>

#include "jpeg_restarts.h"

#define RESTART_WIDTH 64 /* restart intervals written by add_restart_markers: at most this wide, in px */

PyObject *fastload_region_error;

/* Raise the error a failed request stands for; NULL. */
PyObject *fastload_request_error(const Request *req) {
    switch (req->status) {
    case 2:
        PyErr_Format(fastload_region_error, "box %d,%d-%d,%d at 1/%d scale is outside the %ux%u image",
                     req->left, req->top, req->right, req->bottom, req->scale,
                     (unsigned)req->image_width, (unsigned)req->image_height);
        break;
    case 3:
        PyErr_Format(fastload_region_error, "%ux%u is over the pixel limit",
                     (unsigned)req->image_width, (unsigned)req->image_height);
        break;
    case 4:
        PyErr_NoMemory();
        break;
    case 5:
        PyErr_Format(fastload_region_error, "the box reaches past the %ux%u image at 1/%d scale",
                     (unsigned)req->image_width, (unsigned)req->image_height, req->scale);
        break;
    case 6:
        PyErr_SetString(fastload_region_error,
                        "not a YCbCr or grey JPEG (CMYK, YCCK, RGB): the fill does not read its planes");
        break;
    default:
        PyErr_Format(fastload_region_error, "libjpeg: %s", req->message);
    }
    return NULL;
}

static int good_scale(int scale) { return scale == 1 || scale == 2 || scale == 4 || scale == 8; }

const char fastload_decode_region_doc[] =
    "decode_region(data, scale, left, top, right, bottom, max_pixels, cut=False)\n"
    "    -> (pixels, left, top, width, height)\n\n"
    "Decode the box [left, right) x [top, bottom) of a JPEG at 1/scale size (scale 1, 2, 4 or 8;\n"
    "the box in scaled pixels, clamped to the image) to RGB: ``pixels`` is a bytearray of\n"
    "height * width * 3 bytes, for the clamped box returned with it. With cut=True, a JPEG whose\n"
    "restart intervals tile its rows is decoded from the box's intervals only (same pixels; data\n"
    "outside them is not read, so pass it only for files checked whole, as `fastload pack\n"
    "--restart-markers` does). Raises RegionDecodeError for anything libjpeg refuses or warns\n"
    "about, a box with nothing inside the image, or an image over max_pixels.";

PyObject *fastload_decode_region(PyObject *self, PyObject *args) {
    Py_buffer data;
    Request req;
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
    Py_BEGIN_ALLOW_THREADS
    fastload_jpeg_decode_box(&req, cut);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (req.status != 0) {
        return fastload_request_error(&req);
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

static Target target_of(const Py_buffer *view, int flip) {
    Target target = {(unsigned char *)view->buf, view->strides[0], view->strides[1],
                     view->strides[2], flip};
    return target;
}

const char fastload_decode_crop_into_doc[] =
    "decode_crop_into(data, scale, x0, y0, x1, y1, crop_first, flip, out, max_pixels, cut=False)\n\n"
    "A JPEG crop decoded at 1/scale and resized into ``out`` (a writable uint8 H x W x 3 array,\n"
    "any strides), as decode_crop's Pillow path would give it, to the bit: the box (x0, y0)-(x1,\n"
    "y1) in scaled pixels, resized with Pillow's bilinear weights; cut out first when crop_first\n"
    "and its corners are whole pixels, else resized in place; mirrored when flip. Only the rows\n"
    "and columns the resize reads are decoded (with cut=True, from their restart intervals only:\n"
    "see decode_region). The GIL is released throughout. Raises RegionDecodeError as\n"
    "decode_region does, and for a box past the image's edge (Pillow's path says why).";

PyObject *fastload_decode_crop_into(PyObject *self, PyObject *args) {
    Py_buffer data, view;
    Request req;
    PyObject *out;
    Target target;
    double box[4];
    int crop_first, flip, cut = 0;
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
    target = target_of(&view, flip);
    Py_BEGIN_ALLOW_THREADS
    fastload_jpeg_crop_into(&req, box, crop_first, cut, (int)view.shape[1], (int)view.shape[0],
                            &target);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyBuffer_Release(&data);
    if (req.status != 0) {
        return fastload_request_error(&req);
    }
    Py_RETURN_NONE;
}

const char fastload_resize_into_doc[] =
    "resize_into(pixels, x0, y0, x1, y1, crop_first, flip, out)\n\n"
    "Resize the box (x0, y0)-(x1, y1) of ``pixels`` (a C-contiguous uint8 H x W x 3 or H x W\n"
    "array) into ``out`` (a writable uint8 H x W x 3 array, any strides) exactly as Pillow's\n"
    "resize(size, BILINEAR, box=...) would, cut out first when crop_first and its corners are whole\n"
    "pixels, mirrored when flip; grey is written to all three channels. The GIL is released.\n"
    "Raises ValueError for a box outside the image.";

PyObject *fastload_resize_into(PyObject *self, PyObject *args) {
    Py_buffer pixels, view;
    PyObject *source_obj, *out;
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
    if (!fastload_clamp_box(box, width, height)) {
        PyErr_Format(PyExc_ValueError, "resize_into: the box is outside the %dx%d image", width,
                     height);
        PyBuffer_Release(&pixels);
        return NULL;
    }
    if (!get_target(out, &view)) {
        PyBuffer_Release(&pixels);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    if (fastload_crop(&crop, width, height, box[0], box[1], box[2], box[3], crop_first,
                      (int)view.shape[1], (int)view.shape[0])) {
        Source source = {(const unsigned char *)pixels.buf, (ptrdiff_t)width * channels, channels,
                         0, 0, (const unsigned char *)pixels.buf + pixels.len};
        Target target = target_of(&view, flip);
        ok = fastload_resample(&crop, &source, &target);
        fastload_crop_free(&crop);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyBuffer_Release(&pixels);
    if (!ok) {
        return PyErr_NoMemory();
    }
    Py_RETURN_NONE;
}

const char fastload_add_restart_markers_doc[] =
    "add_restart_markers(data) -> (jpeg_bytes, interval_mcus)\n\n"
    "The JPEG rewritten losslessly (the same DCT coefficients, so the same pixels) as baseline\n"
    "with optimised Huffman tables and a restart marker every interval_mcus MCUs: intervals at\n"
    "most 64 pixels wide that never run from one MCU row into the next, so decode_region(...,\n"
    "cut=True) can decode a crop from its intervals alone. Every block is decoded on the way:\n"
    "raises RegionDecodeError with libjpeg's message for anything corrupt, truncated or not a\n"
    "JPEG libjpeg reads.";

PyObject *fastload_add_restart_markers(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned char *out;
    size_t length = 0;
    int interval = 0;
    char message[JMSG_LENGTH_MAX] = "";
    PyObject *result;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &data)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    out = fastload_jpeg_add_restarts((const unsigned char *)data.buf, (size_t)data.len,
                                     RESTART_WIDTH, &length, &interval, message);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (out == NULL) {
        PyErr_Format(fastload_region_error, "libjpeg: %s", message);
        return NULL;
    }
    result = Py_BuildValue("(y#i)", (const char *)out, (Py_ssize_t)length, interval);
    free(out);
    return result;
}
