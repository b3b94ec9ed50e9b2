/* A crop of a mask stored as rows, cut from its runs with no row expanded whole: the positions
 * are Pillow's nearest-neighbour positions (as fastload/decode/masks.py computes them, to the
 * bit); each source row the crop shows is read once, each of its runs filling the output columns
 * that show it, and an output row that shows the same source row as the one above is a copy of
 * it. Below the cut, its Python function (arguments parsed, the GIL released around the cut). */
#include "mask_rows.h"

#include <stdlib.h>
#include <string.h>

static uint32_t load_le(const unsigned char *p, int bytes) {
    switch (bytes) {
    case 1:
        return p[0];
    case 2:
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    default:
        return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    }
}

/* Source row or column under each of `out` output pixels of the span [start, end), clamped to
 * [0, limit): Pillow's nearest resize over a box of C floats (ImagingScaleAffine steps from the
 * last position; ImagingGenericTransform, for 16-bit images, computes each alone). */
static void positions(double start, double end, int out, int per_pixel, uint32_t limit, uint32_t *pos) {
    float low = (float)start, high = (float)end;
    float span = high - low; /* a float subtraction, as Pillow's box is a float[4] */
    double step = (double)span / out, at = (double)low + step * 0.5;
    int k;
    for (k = 0; k < out; k++) {
        if (per_pixel) {
            /* volatile: rounded to a double before the add, never fused into one multiply-add */
            volatile double scaled = step * ((double)k + 0.5);
            at = scaled + (double)low;
        }
        /* COORD(): truncation toward zero, negatives to -1; then clamped into the mask */
        if (!(at >= 1.0)) {
            pos[k] = 0;
        } else {
            pos[k] = at >= (double)limit ? limit - 1 : (uint32_t)at;
        }
        if (!per_pixel) {
            at += step;
        }
    }
}

/* The band rows first..last, checked: inside the arrays, and (runs) its runs add up to its
 * pixels; *run0 and *run1 are its runs. */
static int check_band(const StoredMask *mask, uint32_t first, uint32_t last, size_t *run0, size_t *run1) {
    size_t k;
    uint64_t pixels = 0;
    if (mask->lengths == NULL) {
        return (uint64_t)(last + 1) * mask->width <= mask->value_count ? MASK_CUT_OK : MASK_CUT_BAD_VALUES;
    }
    if ((size_t)last + 2 > mask->row_start_count) {
        return MASK_CUT_BAD_VALUES;
    }
    *run0 = load_le(mask->row_starts + 4 * (size_t)first, 4);
    *run1 = load_le(mask->row_starts + 4 * ((size_t)last + 1), 4);
    if (*run0 > *run1 || *run1 > mask->run_count || *run1 > mask->value_count) {
        return MASK_CUT_BAD_ROWS;
    }
    for (k = *run0; k < *run1; k++) {
        pixels += load_le(mask->lengths + k * (size_t)mask->length_bytes, mask->length_bytes);
    }
    return pixels == (uint64_t)(last - first + 1) * mask->width ? MASK_CUT_OK : MASK_CUT_BAD_ROWS;
}

/* Output columns [from, to) (ascending, before the flip) set to one value. */
static void fill(unsigned char *row, int from, int to, uint32_t value, int out_bytes, int flip, int out_w) {
    int j;
    if (flip) {
        int mirrored = out_w - to;
        to = out_w - from;
        from = mirrored;
    }
    if (out_bytes == 1) {
        memset(row + from, (int)value, (size_t)(to - from));
        return;
    }
    for (j = from; j < to; j++) {
        memcpy(row + (size_t)j * 4, &value, 4); /* uint16 zero-extended, 4-byte values as their bits */
    }
}

/* One output row from source row `source` stored as runs: each run that reaches into the
 * columns lo..hi fills the output columns showing it (first_out: for each source column from lo
 * to hi + 1, the first output column at or right of it). 0 when the row's runs are not its
 * pixels, or lie outside the band's runs run0..run1. */
static int runs_row(const StoredMask *mask, uint32_t source, size_t run0, size_t run1, uint32_t lo, uint32_t hi,
                    const uint32_t *first_out, int out_bytes, int flip, int out_w, unsigned char *row) {
    size_t k = load_le(mask->row_starts + 4 * (size_t)source, 4);
    size_t stop = load_le(mask->row_starts + 4 * ((size_t)source + 1), 4);
    uint64_t at = 0; /* the row's pixel where run k starts */
    if (k < run0 || stop < k || stop > run1) {
        return 0;
    }
    for (; k < stop; k++) {
        uint64_t end = at + load_le(mask->lengths + k * (size_t)mask->length_bytes, mask->length_bytes);
        if (end > lo && at <= hi) {
            uint32_t from = first_out[(at > lo ? at : lo) - lo], to = first_out[(end <= hi ? end : hi + 1) - lo];
            if (from < to) {
                fill(row, (int)from, (int)to,
                     load_le(mask->values + k * (size_t)mask->value_bytes, mask->value_bytes), out_bytes, flip, out_w);
            }
        }
        at = end;
    }
    return at == mask->width;
}

/* One output row from source row `source` stored raw: each column's pixel. */
static void raw_row(const StoredMask *mask, uint32_t source, const uint32_t *cols, int out_bytes, int flip,
                    int out_w, unsigned char *row) {
    const unsigned char *pixels = mask->values + (size_t)source * mask->width * (size_t)mask->value_bytes;
    int j;
    for (j = 0; j < out_w; j++) {
        int to = flip ? out_w - 1 - j : j;
        uint32_t value = load_le(pixels + (size_t)cols[j] * (size_t)mask->value_bytes, mask->value_bytes);
        if (out_bytes == 1) {
            row[to] = (unsigned char)value;
        } else {
            memcpy(row + (size_t)to * 4, &value, 4);
        }
    }
}

int fastload_mask_rows_cut(const StoredMask *mask, const MaskCut *cut, const MaskTarget *target,
                           uint32_t *first, uint32_t *last) {
    int out_w = cut->out_width, out_h = cut->out_height, r, j, status;
    uint32_t *rows, *cols, *first_out, lo, hi, c;
    size_t run0 = 0, run1 = 0, row_bytes = (size_t)out_w * (size_t)target->out_bytes;
    if (out_w < 1 || out_h < 1 || mask->width < 1 || mask->height < 1 ||
        !((mask->value_bytes == 1 && target->out_bytes == 1) ||
          ((mask->value_bytes == 2 || mask->value_bytes == 4) && target->out_bytes == 4)) ||
        (mask->lengths != NULL && mask->length_bytes != 2 && mask->length_bytes != 4)) {
        return MASK_CUT_BAD_REQUEST;
    }
    rows = malloc(sizeof(uint32_t) * ((size_t)out_h + (size_t)out_w));
    if (rows == NULL) {
        return MASK_CUT_NO_MEMORY;
    }
    cols = rows + out_h;
    positions(cut->box[1], cut->box[1] + cut->box[3], out_h, cut->per_pixel, mask->height, rows);
    positions(cut->box[0], cut->box[0] + cut->box[2], out_w, cut->per_pixel, mask->width, cols);
    *first = rows[0]; /* positions only grow: the band of rows, and the columns, the box shows */
    *last = rows[out_h - 1];
    lo = cols[0];
    hi = cols[out_w - 1];
    first_out = malloc(sizeof(uint32_t) * ((size_t)(hi - lo) + 2));
    if (first_out == NULL) {
        free(rows);
        return MASK_CUT_NO_MEMORY;
    }
    for (c = lo, j = 0; c <= hi + 1; c++) {
        while (j < out_w && cols[j] < c) {
            j++;
        }
        first_out[c - lo] = (uint32_t)j;
    }
    status = check_band(mask, *first, *last, &run0, &run1);
    for (r = 0; status == MASK_CUT_OK && r < out_h; r++) {
        unsigned char *row = target->pixels + (ptrdiff_t)r * target->stride;
        if (r > 0 && rows[r] == rows[r - 1]) {
            memcpy(row, row - target->stride, row_bytes);
        } else if (mask->lengths == NULL) {
            raw_row(mask, rows[r], cols, target->out_bytes, cut->flip, out_w, row);
        } else if (!runs_row(mask, rows[r], run0, run1, lo, hi, first_out, target->out_bytes, cut->flip, out_w,
                             row)) {
            status = MASK_CUT_BAD_ROWS;
        }
    }
    free(first_out);
    free(rows);
    return status;
}

/* A contiguous buffer of `what` (None: NULL when `optional`), or 0 with an exception set. */
static int get_array(PyObject *obj, Py_buffer *view, int optional, const char *what) {
    if (obj == Py_None && optional) {
        view->obj = NULL;
        view->buf = NULL;
        view->len = 0;
        view->itemsize = 0;
        return 1;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return 0;
    }
    if (view->itemsize != 1 && view->itemsize != 2 && view->itemsize != 4) {
        PyErr_Format(PyExc_ValueError, "mask_rows_into: %s must hold 1-, 2- or 4-byte elements", what);
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

static void release(Py_buffer *view) {
    if (view->obj != NULL) {
        PyBuffer_Release(view);
    }
}

const char fastload_mask_rows_into_doc[] =
"mask_rows_into(values, lengths, row_starts, width, height, x0, y0, box_width, box_height,\n"
"               per_pixel, flip, out)\n\n"
"A stored mask's crop (fastload.format.mask_rows: its arrays, lengths and row_starts None for\n"
"raw rows) cut into ``out`` (a writable C-contiguous H x W array: uint8 for 1-byte values,\n"
"int32 or float32 for 2- and 4-byte ones) as fastload.decode.masks cuts it, to the bit: the box\n"
"resized to out's size with Pillow's nearest positions (per_pixel: as for 16-bit images),\n"
"mirrored when flip. Only the rows under the box are read. The GIL is released. Raises\n"
"ValueError for runs that are not their rows' pixels, or arrays too short for the mask.";

PyObject *fastload_mask_rows_into(PyObject *self, PyObject *args) {
    PyObject *values_obj, *lengths_obj, *starts_obj, *out_obj;
    Py_buffer values, lengths, starts, out;
    StoredMask mask;
    MaskCut cut;
    MaskTarget target;
    unsigned int width, height;
    uint32_t first = 0, last = 0;
    int status;
    (void)self;
    memset(&mask, 0, sizeof mask);
    memset(&cut, 0, sizeof cut);
    if (!PyArg_ParseTuple(args, "OOOIIddddppO", &values_obj, &lengths_obj, &starts_obj, &width, &height,
                          &cut.box[0], &cut.box[1], &cut.box[2], &cut.box[3], &cut.per_pixel, &cut.flip,
                          &out_obj)) {
        return NULL;
    }
    if (!get_array(values_obj, &values, 0, "values")) {
        return NULL;
    }
    if (!get_array(lengths_obj, &lengths, 1, "lengths")) {
        release(&values);
        return NULL;
    }
    if (!get_array(starts_obj, &starts, 1, "row_starts")) {
        release(&values);
        release(&lengths);
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_RECORDS) < 0) {
        release(&values);
        release(&lengths);
        release(&starts);
        return NULL;
    }
    mask.values = values.buf;
    mask.value_count = (size_t)(values.len / values.itemsize);
    mask.value_bytes = (int)values.itemsize;
    mask.lengths = lengths.buf;
    mask.length_bytes = (int)lengths.itemsize;
    mask.run_count = lengths.itemsize ? (size_t)(lengths.len / lengths.itemsize) : 0;
    mask.row_starts = starts.buf;
    mask.row_start_count = (size_t)(starts.len / 4);
    mask.width = width;
    mask.height = height;
    target.pixels = out.buf;
    target.stride = out.ndim == 2 ? out.strides[0] : 0;
    target.out_bytes = (int)out.itemsize;
    if (out.ndim != 2 || out.strides[1] != out.itemsize || out.shape[0] > 0x7FFFFFFF ||
        out.shape[1] > 0x7FFFFFFF || (lengths.obj == NULL) != (starts.obj == NULL) ||
        (starts.obj != NULL && starts.itemsize != 4)) {
        status = MASK_CUT_BAD_REQUEST;
    } else {
        cut.out_height = (int)out.shape[0];
        cut.out_width = (int)out.shape[1];
        Py_BEGIN_ALLOW_THREADS
        status = fastload_mask_rows_cut(&mask, &cut, &target, &first, &last);
        Py_END_ALLOW_THREADS
    }
    release(&values);
    release(&lengths);
    release(&starts);
    PyBuffer_Release(&out);
    switch (status) {
    case MASK_CUT_OK:
        Py_RETURN_NONE;
    case MASK_CUT_NO_MEMORY:
        return PyErr_NoMemory();
    case MASK_CUT_BAD_ROWS:
        return PyErr_Format(PyExc_ValueError, "a stored mask whose rows %u..%u are not %u pixels each",
                            (unsigned)first, (unsigned)last, width);
    case MASK_CUT_BAD_VALUES:
        return PyErr_Format(PyExc_ValueError, "a stored mask of %ux%u pixels with too few values for rows "
                            "%u..%u", width, height, (unsigned)first, (unsigned)last);
    default:
        return PyErr_Format(PyExc_ValueError, "mask_rows_into: out must be a non-empty C-contiguous 2-D "
                            "array, uint8 for 1-byte values, 4-byte elements for 2- and 4-byte ones, "
                            "with lengths and 4-byte row_starts both given or both None");
    }
}
