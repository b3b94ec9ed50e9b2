/* The native part of the pixel cache's index (fastload/pixels): its shared entries read and
 * published in an order every CPU keeps. pixel_native.c; registered in module.c. */
#ifndef FASTLOAD_PIXEL_NATIVE_H
#define FASTLOAD_PIXEL_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *fastload_pixel_entries(PyObject *self, PyObject *args);
PyObject *fastload_pixel_publish(PyObject *self, PyObject *args);
extern const char fastload_pixel_entries_doc[], fastload_pixel_publish_doc[];

#define FASTLOAD_PIXEL_METHODS                                                                  \
    {"pixel_entries", fastload_pixel_entries, METH_VARARGS, fastload_pixel_entries_doc},         \
    {"pixel_publish", fastload_pixel_publish, METH_VARARGS, fastload_pixel_publish_doc},

#endif
