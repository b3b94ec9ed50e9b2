/* The GPU tails' resample, planned on the host: Pillow's bilinear taps of many crops at once, for
 * a batched resample on the device (fastload/backends/resample_plan.py). crop_taps.c. */
#ifndef FASTLOAD_CROP_TAPS_H
#define FASTLOAD_CROP_TAPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

/* One axis of one crop: the box [start, start + extent) of a line that may be read in [low,
 * high), resized to out_size pixels (mirrored with flip). Writes out_size * taps tap indices
 * (relative to reach[0]; a slot past an output pixel's window repeats its first tap, weight 0)
 * and Pillow's weights (its 22-bit fixed point, as floats), and reach: the [begin, end) of the
 * line's pixels any tap reads. Returns 0, or the taps an output pixel needs when that is more
 * than `taps`. Needs no Python: call it with the GIL released. */
int fastload_line_taps(double start, double extent, int64_t low, int64_t high, int out_size, int flip,
                       int taps, int64_t *index, float *weights, int64_t reach[2]);

/* The Python function crop_taps of fastload.decode._jpeg_region (registered in module.c). */
PyObject *fastload_crop_taps(PyObject *self, PyObject *args);
extern const char fastload_crop_taps_doc[];

#endif
