/* The pixel cache's fill and crops as Python functions (fill_native.c): a JPEG decoded into its
 * stored planes, an RGB image made into them, and crops from them. Registered in module.c. */
#ifndef FASTLOAD_FILL_NATIVE_H
#define FASTLOAD_FILL_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *fastload_decode_planes_into(PyObject *self, PyObject *args);
PyObject *fastload_planes_from_rgb(PyObject *self, PyObject *args);
PyObject *fastload_crop_planes_into(PyObject *self, PyObject *args);
extern const char fastload_decode_planes_into_doc[], fastload_planes_from_rgb_doc[];
extern const char fastload_crop_planes_into_doc[];

#define FASTLOAD_FILL_METHODS                                                                   \
    {"decode_planes_into", fastload_decode_planes_into, METH_VARARGS,                            \
     fastload_decode_planes_into_doc},                                                          \
    {"planes_from_rgb", fastload_planes_from_rgb, METH_VARARGS, fastload_planes_from_rgb_doc},   \
    {"crop_planes_into", fastload_crop_planes_into, METH_VARARGS, fastload_crop_planes_into_doc},

#endif
