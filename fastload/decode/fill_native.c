/* Decode stage, native part, for the pixel cache (fastload/pixels/): its fill's decode
 * (fill_decode.c), RGB made into planes (fill_colour.c) and the crops from stored planes
 * (fill_crop.c) as Python functions, called with the GIL released. Stored planes are one buffer
 * of bytes: Y, width x height, then Cb and Cr, each ceil(width / 2) x ceil(height / 2).
 */
#include "fill_native.h"

#include <string.h>

#include "fill_colour.h"
#include "fill_crop.h"
#include "fill_decode.h"
#include "region_native.h"

/* Bytes of a width x height image's planes. */
static Py_ssize_t planes_bytes(Py_ssize_t width, Py_ssize_t height) {
    return width * height + 2 * ((width + 1) / 2) * ((height + 1) / 2);
}

/* The planes of a width x height image in obj (C-contiguous bytes, writable when asked), sides of
 * 1 to 65535; 0 with a ValueError set (naming it `what`) and nothing held, else the caller
 * releases it. */
static int planes_buffer(PyObject *obj, Py_buffer *view, int writable, int width, int height,
                         const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        return 0;
    }
    if (width >= 1 && height >= 1 && width <= 0xFFFF && height <= 0xFFFF &&
        view->len == planes_bytes(width, height)) {
        return 1;
    }
    PyErr_Format(PyExc_ValueError, "%s: %zd bytes are not the planes of a %dx%d image (%zd bytes)",
                 what, view->len, width, height,
                 planes_bytes(width > 0 ? width : 0, height > 0 ? height : 0));
    PyBuffer_Release(view);
    return 0;
}

/* An RGB array of obj (uint8, H x W x 3, sides of 1 to 65535) with flags' layout; 0 with a
 * ValueError set (naming it `what`) and nothing held, else the caller releases it. */
static int rgb_buffer(PyObject *obj, Py_buffer *view, int flags, const char *what) {
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_FORMAT) < 0) {
        return 0;
    }
    if (view->ndim == 3 && view->shape[2] == 3 && view->itemsize == 1 && view->shape[0] >= 1 &&
        view->shape[1] >= 1 && view->shape[0] <= 0xFFFF && view->shape[1] <= 0xFFFF &&
        (view->format == NULL || strcmp(view->format, "B") == 0)) {
        return 1;
    }
    PyErr_Format(PyExc_ValueError, "%s must be a uint8 array of shape (H, W, 3)", what);
    PyBuffer_Release(view);
    return 0;
}

const char fastload_decode_planes_into_doc[] =
    "decode_planes_into(data, scale, width, height, out, stored_width, stored_height, max_pixels)\n\n"
    "A width x height JPEG decoded whole at 1/scale (1, 2, 4 or 8) into its Y, Cb and Cr planes\n"
    "(libjpeg's raw data: no upsampling, no colour conversion), each shrunk with the pixel cache's\n"
    "resize into ``out`` (C-contiguous writable bytes): Y at stored_width x stored_height (no\n"
    "larger than the image at that scale), then Cb and Cr at half that, rounded up; a grey JPEG's\n"
    "chroma is 128. Every row is decoded. The GIL is released. Raises RegionDecodeError for a\n"
    "JPEG that is not YCbCr or grey, anything libjpeg refuses or warns about, an image of another\n"
    "size, one over max_pixels, or one smaller than the stored size.";

PyObject *fastload_decode_planes_into(PyObject *self, PyObject *args) {
    Py_buffer data, view;
    Request req;
    int width, height, stored_width, stored_height;
    PyObject *out;
    (void)self;
    memset(&req, 0, sizeof req);
    if (!PyArg_ParseTuple(args, "y*iiiOiil", &data, &req.scale, &width, &height, &out,
                          &stored_width, &stored_height, &req.max_pixels)) {
        return NULL;
    }
    if (req.scale != 1 && req.scale != 2 && req.scale != 4 && req.scale != 8) {
        PyErr_Format(PyExc_ValueError, "decode_planes_into: bad scale %d", req.scale);
        PyBuffer_Release(&data);
        return NULL;
    }
    if (!planes_buffer(out, &view, 1, stored_width, stored_height, "decode_planes_into: out")) {
        PyBuffer_Release(&data);
        return NULL;
    }
    req.data = (const unsigned char *)data.buf;
    req.length = (size_t)data.len;
    Py_BEGIN_ALLOW_THREADS
    fastload_jpeg_fill(&req, (unsigned char *)view.buf, stored_width, stored_height);
    Py_END_ALLOW_THREADS
    if (req.status == 0 && ((int)req.image_width != width || (int)req.image_height != height)) {
        req.status = 5; /* another image than the index describes: Pillow's path says what */
    }
    PyBuffer_Release(&view);
    PyBuffer_Release(&data);
    if (req.status != 0) {
        return fastload_request_error(&req);
    }
    Py_RETURN_NONE;
}

const char fastload_planes_from_rgb_doc[] =
    "planes_from_rgb(rgb, out)\n\n"
    "An RGB image (a C-contiguous uint8 H x W x 3 array) as the pixel cache's planes into ``out``\n"
    "(C-contiguous writable bytes): Y, then Cb and Cr at half its size, rounded up, each chroma\n"
    "sample the mean of the 2 x 2 pixels it covers (JFIF's YCbCr, libjpeg's arithmetic). The GIL\n"
    "is released.";

PyObject *fastload_planes_from_rgb(PyObject *self, PyObject *args) {
    Py_buffer rgb, view;
    PyObject *source, *out;
    int width, height, ok = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO", &source, &out) ||
        !rgb_buffer(source, &rgb, PyBUF_C_CONTIGUOUS, "planes_from_rgb: rgb (C-contiguous)")) {
        return NULL;
    }
    width = (int)rgb.shape[1];
    height = (int)rgb.shape[0];
    if (planes_buffer(out, &view, 1, width, height, "planes_from_rgb: out")) {
        Py_BEGIN_ALLOW_THREADS
        fastload_rgb_to_planes((const unsigned char *)rgb.buf, width, height,
                                 (unsigned char *)view.buf);
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&view);
        ok = 1;
    }
    PyBuffer_Release(&rgb);
    if (!ok) {
        return NULL;
    }
    Py_RETURN_NONE;
}

const char fastload_crop_planes_into_doc[] =
    "crop_planes_into(planes, width, height, x0, y0, x1, y1, crop_first, flip, out)\n\n"
    "The box (x0, y0)-(x1, y1) of a width x height image's stored ``planes`` (C-contiguous bytes)\n"
    "resized into ``out`` (a writable uint8 H x W x 3 array, any strides) as RGB with the fill's\n"
    "resize, placed as Pillow's resize(box=) places it (the Y plane's box cut out first when\n"
    "crop_first and its corners are whole pixels; the chroma planes' over the box at half\n"
    "scale, in place, to half the output, then upsampled 2x as libjpeg's fancy upsampling\n"
    "does), mirrored when flip. Only the box's rows and columns are read. The GIL is\n"
    "released. Raises ValueError for a box outside the image.";

PyObject *fastload_crop_planes_into(PyObject *self, PyObject *args) {
    Py_buffer planes, view;
    PyObject *source, *out;
    double box[4];
    int crop_first, flip, width, height, ok = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OiiddddppO", &source, &width, &height, &box[0], &box[1], &box[2],
                          &box[3], &crop_first, &flip, &out) ||
        !planes_buffer(source, &planes, 0, width, height, "crop_planes_into: planes")) {
        return NULL;
    }
    if (!fastload_clamp_box(box, width, height)) {
        PyErr_Format(PyExc_ValueError, "crop_planes_into: the box is outside the %dx%d image",
                     width, height);
    } else if (rgb_buffer(out, &view, PyBUF_RECORDS, "out (writable)")) {
        Target target = {(unsigned char *)view.buf, view.strides[0], view.strides[1],
                         view.strides[2], flip};
        Py_BEGIN_ALLOW_THREADS
        ok = fastload_fill_crop((const unsigned char *)planes.buf, width, height, box, crop_first,
                                (int)view.shape[1], (int)view.shape[0], &target);
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&view);
        if (!ok) {
            PyErr_NoMemory();
        }
    }
    PyBuffer_Release(&planes);
    if (!ok) {
        return NULL;
    }
    Py_RETURN_NONE;
}
