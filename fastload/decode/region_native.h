/* The JPEG path's Python functions (region_native.c), and the error every native request raises
 * when it fails. Registered in module.c. */
#ifndef FASTLOAD_REGION_NATIVE_H
#define FASTLOAD_REGION_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "jpeg_region.h"

/* fastload.decode._jpeg_region.RegionDecodeError (made by module.c). */
extern PyObject *fastload_region_error;

/* The RegionDecodeError (or MemoryError) a failed request stands for; NULL. */
PyObject *fastload_request_error(const Request *req);

PyObject *fastload_decode_region(PyObject *self, PyObject *args);
PyObject *fastload_decode_crop_into(PyObject *self, PyObject *args);
PyObject *fastload_resize_into(PyObject *self, PyObject *args);
PyObject *fastload_add_restart_markers(PyObject *self, PyObject *args);
extern const char fastload_decode_region_doc[], fastload_decode_crop_into_doc[];
extern const char fastload_resize_into_doc[], fastload_add_restart_markers_doc[];

#define FASTLOAD_REGION_METHODS                                                                  \
    {"decode_region", fastload_decode_region, METH_VARARGS, fastload_decode_region_doc},          \
    {"decode_crop_into", fastload_decode_crop_into, METH_VARARGS, fastload_decode_crop_into_doc}, \
    {"resize_into", fastload_resize_into, METH_VARARGS, fastload_resize_into_doc},                \
    {"add_restart_markers", fastload_add_restart_markers, METH_VARARGS,                           \
     fastload_add_restart_markers_doc},

#endif
