/* The GPU tails' resample planned on the host: each crop's taps along one axis, as Pillow's
 * resize(box=) computes them (resample_axes.c's fastload_axis, the CPU path's own weights), laid
 * out for the device: per output pixel a fixed number of (index, weight) slots, indices from
 * the first pixel the crop reads. Many crops in one call, the GIL released.
 */
#include "crop_taps.h"

#include <stdlib.h>
#include <string.h>

#include "resample_axes.h"

int fastload_line_taps(double start, double extent, int64_t low, int64_t high, int out_size, int flip,
                       int taps, int64_t *index, float *weights, int64_t reach[2]) {
    Axis axis;
    int i, t;
    /* The line as Pillow's cut sees it: [low, high) from 0, the box moved with it (a whole-pixel
     * box cut out first is then Image.crop(box).resize(size)). */
    if (!fastload_axis(&axis, (int)(high - low), (float)(start - (double)low),
                       (float)(start - (double)low + extent), out_size)) {
        return -1;
    }
    if (axis.taps > taps) {
        int needed = axis.taps;
        fastload_axis_free(&axis);
        return needed;
    }
    reach[0] = low + axis.begin;
    reach[1] = low + (axis.end > axis.begin ? axis.end : axis.begin + 1);
    for (i = 0; i < out_size; i++) {
        int o = flip ? out_size - 1 - i : i, n = axis.count[i];
        int64_t first = axis.first[i] - axis.begin;
        for (t = 0; t < taps; t++) {
            index[(size_t)o * taps + t] = t < n ? first + t : (first > 0 ? first : 0);
            weights[(size_t)o * taps + t] =
                t < n ? (float)axis.weights[(size_t)i * axis.taps + t] / (float)(1 << PRECISION_BITS) : 0.0f;
        }
    }
    fastload_axis_free(&axis);
    return 0;
}

static int get(PyObject *obj, Py_buffer *view, int flags, Py_ssize_t itemsize, Py_ssize_t count,
               const char *name) {
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return 0;
    }
    if (view->itemsize != itemsize || view->len != itemsize * count) {
        PyErr_Format(PyExc_ValueError, "crop_taps: %s must hold %zd items of %zd bytes", name, count,
                     itemsize);
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

const char fastload_crop_taps_doc[] =
"crop_taps(starts, extents, lows, highs, flips, out_size, index, weights, reach)\n\n"
"The taps of n crops along one axis, as Pillow's resize(box=) computes them: crop k's box\n"
"[starts[k], starts[k] + extents[k]) (float64) of a line readable in [lows[k], highs[k])\n"
"(int64), resized to out_size pixels, mirrored where flips[k] (uint8). Writes index (int64) and\n"
"weights (float32), each n * out_size * taps (taps = their length / (n * out_size)): output\n"
"pixel o of crop k is the sum over t of weights[k, o, t] times pixel reach[k, 0] + index[k, o, t];\n"
"and reach (int64 n * 2): the [begin, end) each crop reads. The GIL is released. Raises\n"
"ValueError when an output pixel needs more taps than that.";

PyObject *fastload_crop_taps(PyObject *self, PyObject *args) {
    PyObject *objs[8];
    Py_buffer views[8];
    int out_size, got = 0, status = 0;
    Py_ssize_t n, k, taps;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOiOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &out_size,
                          &objs[5], &objs[6], &objs[7])) {
        return NULL;
    }
    n = PyObject_Length(objs[0]);
    if (n < 0 || out_size < 1) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "crop_taps: out_size must be at least 1");
        }
        return NULL;
    }
    {
        Py_buffer probe;
        if (PyObject_GetBuffer(objs[5], &probe, PyBUF_SIMPLE) < 0) {
            return NULL;
        }
        taps = n > 0 ? probe.len / 8 / (n * out_size) : 1;
        PyBuffer_Release(&probe);
    }
    {
        const char *names[8] = {"starts", "extents", "lows", "highs", "flips", "index", "weights", "reach"};
        Py_ssize_t sizes[8] = {8, 8, 8, 8, 1, 8, 4, 8};
        Py_ssize_t counts[8] = {n, n, n, n, n, n * out_size * taps, n * out_size * taps, 2 * n};
        for (got = 0; got < 8; got++) {
            if (!get(objs[got], &views[got], got >= 5 ? PyBUF_WRITABLE : 0, sizes[got], counts[got],
                     names[got])) {
                break;
            }
        }
    }
    if (got == 8 && taps >= 1) {
        const double *starts = views[0].buf, *extents = views[1].buf;
        const int64_t *lows = views[2].buf, *highs = views[3].buf;
        const unsigned char *flips = views[4].buf;
        Py_BEGIN_ALLOW_THREADS
        for (k = 0; k < n && status == 0; k++) {
            size_t at = (size_t)k * (size_t)out_size * (size_t)taps;
            status = fastload_line_taps(starts[k], extents[k], lows[k], highs[k], out_size, flips[k],
                                        (int)taps, (int64_t *)views[5].buf + at, (float *)views[6].buf + at,
                                        (int64_t *)views[7].buf + 2 * k);
        }
        Py_END_ALLOW_THREADS
    }
    while (got > 0) {
        PyBuffer_Release(&views[--got]);
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (taps < 1 || status > 0) {
        PyErr_Format(PyExc_ValueError, "crop_taps: an output pixel needs %d taps, the arrays hold %zd", status,
                     taps);
        return NULL;
    }
    if (status < 0) {
        return PyErr_NoMemory();
    }
    Py_RETURN_NONE;
}
