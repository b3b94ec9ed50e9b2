/* Decode stage, native part, for the pixel cache (fastload/pixels/): its index's entries, and
 * the fill's decode (fill_decode.c) and the crops from stored pixels (fill_crop.c), called with
 * the GIL released.
 *
 * The index is a file every process of a node maps: a header, then four 64-bit words per record.
 * Word 0 is written last, with release order, and read first, with acquire order: a reader that
 * sees it sees the other three words, and the pixels its writer put in the data file before it
 * (a pwrite before the store), on any CPU, x86's stronger order or Arm's weaker one alike. A
 * process killed before that store leaves no entry; one killed after it left whole pixels.
 */
#include "pixel_native.h"

#include <stdint.h>
#include <string.h>

#include "fill_crop.h"
#include "fill_decode.h"

#define ENTRY_WORDS 4

/* The index's entries as words: base and count, or NULL with an exception set. */
static uint64_t *entry_words(Py_buffer *index, Py_ssize_t header_bytes, Py_ssize_t *count) {
    if (header_bytes < 0 || header_bytes % (ENTRY_WORDS * 8) != 0 || header_bytes > index->len ||
        ((uintptr_t)index->buf % 8) != 0) {
        PyErr_Format(PyExc_ValueError, "pixel index: a header of %zd bytes does not fit an index of %zd",
                     header_bytes, index->len);
        return NULL;
    }
    *count = (index->len - header_bytes) / (ENTRY_WORDS * 8);
    return (uint64_t *)((unsigned char *)index->buf + header_bytes);
}

const char fastload_pixel_entries_doc[] =
    "pixel_entries(index, header_bytes, records, out)\n\n"
    "Copy the entries of ``records`` (int64) from the pixel cache's ``index`` (a buffer: its\n"
    "header, then 4 uint64 words a record) into ``out`` (a writable uint64 array, 4 words a\n"
    "record): word 0 read with acquire order, so the other words and the pixels are there when it\n"
    "is not 0; a record without an entry gets 4 zeros.";

PyObject *fastload_pixel_entries(PyObject *self, PyObject *args) {
    Py_buffer index, records, out;
    Py_ssize_t header_bytes, count, n, k;
    uint64_t *words;
    const int64_t *wanted;
    uint64_t *into;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*ny*w*", &index, &header_bytes, &records, &out)) {
        return NULL;
    }
    words = entry_words(&index, header_bytes, &count);
    n = records.len / 8;
    if (words != NULL && (records.len % 8 != 0 || out.len < n * ENTRY_WORDS * 8)) {
        PyErr_SetString(PyExc_ValueError, "pixel_entries: records must be int64 and out 4 uint64 a record");
        words = NULL;
    }
    wanted = (const int64_t *)records.buf;
    into = (uint64_t *)out.buf;
    for (k = 0; words != NULL && k < n; k++) {
        if (wanted[k] < 0 || wanted[k] >= count) {
            PyErr_Format(PyExc_IndexError, "pixel_entries: record %lld is outside the index of %zd",
                         (long long)wanted[k], count);
            words = NULL;
            break;
        }
        {
            uint64_t *entry = words + wanted[k] * ENTRY_WORDS;
            uint64_t first = __atomic_load_n(entry, __ATOMIC_ACQUIRE);
            int w;
            into[k * ENTRY_WORDS] = first;
            for (w = 1; w < ENTRY_WORDS; w++) {
                into[k * ENTRY_WORDS + w] = first ? __atomic_load_n(entry + w, __ATOMIC_RELAXED) : 0;
            }
        }
    }
    PyBuffer_Release(&index);
    PyBuffer_Release(&records);
    PyBuffer_Release(&out);
    if (words == NULL) {
        return NULL;
    }
    Py_RETURN_NONE;
}

const char fastload_pixel_publish_doc[] =
    "pixel_publish(index, header_bytes, record, w0, w1, w2, w3)\n\n"
    "Publish ``record``'s entry in the pixel cache's ``index`` (a writable buffer): words 1 to 3\n"
    "first, then word 0 (not 0) with release order, after everything this thread wrote before.";

PyObject *fastload_pixel_publish(PyObject *self, PyObject *args) {
    Py_buffer index;
    Py_ssize_t header_bytes, record, count;
    unsigned long long w[ENTRY_WORDS];
    uint64_t *words;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*nnKKKK", &index, &header_bytes, &record, &w[0], &w[1], &w[2],
                          &w[3])) {
        return NULL;
    }
    words = entry_words(&index, header_bytes, &count);
    if (words != NULL && (record < 0 || record >= count || w[0] == 0)) {
        PyErr_Format(PyExc_ValueError, "pixel_publish: record %zd of %zd, word 0 %llu (must not be 0)",
                     record, count, w[0]);
        words = NULL;
    }
    if (words != NULL) {
        uint64_t *entry = words + record * ENTRY_WORDS;
        __atomic_store_n(entry + 1, (uint64_t)w[1], __ATOMIC_RELAXED);
        __atomic_store_n(entry + 2, (uint64_t)w[2], __ATOMIC_RELAXED);
        __atomic_store_n(entry + 3, (uint64_t)w[3], __ATOMIC_RELAXED);
        __atomic_store_n(entry, (uint64_t)w[0], __ATOMIC_RELEASE);
    }
    PyBuffer_Release(&index);
    if (words == NULL) {
        return NULL;
    }
    Py_RETURN_NONE;
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

const char fastload_decode_stored_into_doc[] =
    "decode_stored_into(data, scale, width, height, out, max_pixels)\n\n"
    "A width x height JPEG decoded whole at 1/scale (1, 2, 4 or 8) and shrunk into ``out`` (a\n"
    "C-contiguous writable uint8 H x W x 3 array, no larger than the image at that scale) with\n"
    "the pixel cache's resize (fill_resize.c); grey is written as RGB. Every row is decoded. The\n"
    "GIL is released. Raises RegionDecodeError for anything libjpeg refuses or warns about, an\n"
    "image of another size, one over max_pixels, or one smaller than ``out``.";

PyObject *fastload_decode_stored_into(PyObject *self, PyObject *args) {
    Py_buffer data, view;
    Request req;
    int width, height;
    PyObject *out;
    (void)self;
    memset(&req, 0, sizeof req);
    if (!PyArg_ParseTuple(args, "y*iiiOl", &data, &req.scale, &width, &height, &out,
                          &req.max_pixels)) {
        return NULL;
    }
    if (req.scale != 1 && req.scale != 2 && req.scale != 4 && req.scale != 8) {
        PyErr_Format(PyExc_ValueError, "decode_stored_into: bad scale %d", req.scale);
        PyBuffer_Release(&data);
        return NULL;
    }
    if (!rgb_buffer(out, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE, "out (C-contiguous)")) {
        PyBuffer_Release(&data);
        return NULL;
    }
    req.data = (const unsigned char *)data.buf;
    req.length = (size_t)data.len;
    Py_BEGIN_ALLOW_THREADS
    fastload_jpeg_fill(&req, (unsigned char *)view.buf, (int)view.shape[1], (int)view.shape[0]);
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

const char fastload_crop_stored_into_doc[] =
    "crop_stored_into(pixels, x0, y0, x1, y1, crop_first, flip, out)\n\n"
    "The box (x0, y0)-(x1, y1) of ``pixels`` (stored pixels: a C-contiguous uint8 H x W x 3\n"
    "array) resized into ``out`` (a writable uint8 H x W x 3 array, any strides) with the fill's\n"
    "resize, placed as Pillow's resize(box=) places it (cut out first when crop_first and its\n"
    "corners are whole pixels), mirrored when flip. Only the box's rows and columns are read. The\n"
    "GIL is released. Raises ValueError for a box outside the image.";

PyObject *fastload_crop_stored_into(PyObject *self, PyObject *args) {
    Py_buffer pixels, view;
    PyObject *source, *out;
    double box[4];
    int crop_first, flip, width, height, ok = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OddddppO", &source, &box[0], &box[1], &box[2], &box[3],
                          &crop_first, &flip, &out) ||
        !rgb_buffer(source, &pixels, PyBUF_C_CONTIGUOUS, "pixels (C-contiguous)")) {
        return NULL;
    }
    width = (int)pixels.shape[1];
    height = (int)pixels.shape[0];
    if (!fastload_clamp_box(box, width, height)) {
        PyErr_Format(PyExc_ValueError, "crop_stored_into: the box is outside the %dx%d image",
                     width, height);
    } else if (rgb_buffer(out, &view, PyBUF_RECORDS, "out (writable)")) {
        Target target = {(unsigned char *)view.buf, view.strides[0], view.strides[1],
                         view.strides[2], flip};
        Py_BEGIN_ALLOW_THREADS
        ok = fastload_fill_crop((const unsigned char *)pixels.buf, width, height, box, crop_first,
                                (int)view.shape[1], (int)view.shape[0], &target);
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&view);
        if (!ok) {
            PyErr_NoMemory();
        }
    }
    PyBuffer_Release(&pixels);
    if (!ok) {
        return NULL;
    }
    Py_RETURN_NONE;
}
