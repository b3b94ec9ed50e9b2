/* The decode stage of a mask stored as rows (fastload/format/mask_rows.py): a crop's pixels cut
 * straight from the stored runs, nearest neighbour as Pillow cuts a mask file, into any row of
 * an output (a slot of a batch tensor). mask_rows.c. */
#ifndef FASTLOAD_MASK_ROWS_H
#define FASTLOAD_MASK_ROWS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

/* A stored mask's arrays, as the format lays them out (little-endian): raw, `values` holds every
 * pixel row after row and `lengths` is NULL; runs, row r is the runs row_starts[r] up to
 * row_starts[r + 1], each lengths[k] pixels of values[k]. Sizes are in elements. */
typedef struct {
    const unsigned char *values, *lengths, *row_starts;
    size_t value_count, run_count, row_start_count;
    int value_bytes;  /* 1, 2 or 4 */
    int length_bytes; /* runs: 2 or 4 */
    uint32_t width, height;
} StoredMask;

/* The cut: the box (left, top, width, height) in the mask's pixels resized to out_width x
 * out_height, mirrored left to right with flip. per_pixel: each position computed alone, as
 * Pillow does for 16-bit images; else each stepped on from the last, as it does for 8-bit. */
typedef struct {
    double box[4];
    int out_width, out_height, flip, per_pixel;
} MaskCut;

/* Values written: out_bytes 1 (from 1-byte values) or 4 (from 2-byte values, zero-extended to
 * int32, or 4-byte ones, copied), rows `stride` bytes apart. */
typedef struct {
    unsigned char *pixels;
    ptrdiff_t stride;
    int out_bytes;
} MaskTarget;

enum {
    MASK_CUT_OK = 0,
    MASK_CUT_NO_MEMORY = 1,
    MASK_CUT_BAD_ROWS = 2,    /* the band's runs are not its rows' pixels: *first, *last say which */
    MASK_CUT_BAD_VALUES = 3,  /* fewer values, lengths or row starts than the mask's size needs */
    MASK_CUT_BAD_REQUEST = 4, /* value and output sizes that do not go together, an empty cut */
};

/* Cut `cut` from `mask` into `target`; a MASK_CUT_ status. The band of rows the cut reads is
 * checked before any is read; *first and *last are set to it. Needs no Python: call it with the
 * GIL released. */
int fastload_mask_rows_cut(const StoredMask *mask, const MaskCut *cut, const MaskTarget *target,
                           uint32_t *first, uint32_t *last);

/* The Python function mask_rows_into of fastload.decode._jpeg_region (registered in module.c). */
PyObject *fastload_mask_rows_into(PyObject *self, PyObject *args);
extern const char fastload_mask_rows_into_doc[];

#endif
