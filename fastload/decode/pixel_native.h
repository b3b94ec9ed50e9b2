/* The native part of the pixel cache (fastload/pixels): its shared index's entries read and
 * published in an order every CPU keeps, a JPEG decoded whole to its stored size, and crops
 * from stored pixels.
 * pixel_native.c; registered in module.c. */
#ifndef FASTLOAD_PIXEL_NATIVE_H
#define FASTLOAD_PIXEL_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "jpeg_region.h"

PyObject *fastload_pixel_entries(PyObject *self, PyObject *args);
PyObject *fastload_pixel_publish(PyObject *self, PyObject *args);
PyObject *fastload_decode_stored_into(PyObject *self, PyObject *args);
PyObject *fastload_crop_stored_into(PyObject *self, PyObject *args);
extern const char fastload_pixel_entries_doc[], fastload_pixel_publish_doc[];
extern const char fastload_decode_stored_into_doc[], fastload_crop_stored_into_doc[];

/* The RegionDecodeError (or MemoryError) a failed request stands for; NULL. region_native.c. */
PyObject *fastload_request_error(const Request *req);

#define FASTLOAD_PIXEL_METHODS                                                                  \
    {"pixel_entries", fastload_pixel_entries, METH_VARARGS, fastload_pixel_entries_doc},         \
    {"pixel_publish", fastload_pixel_publish, METH_VARARGS, fastload_pixel_publish_doc},         \
    {"decode_stored_into", fastload_decode_stored_into, METH_VARARGS, fastload_decode_stored_into_doc}, \
    {"crop_stored_into", fastload_crop_stored_into, METH_VARARGS, fastload_crop_stored_into_doc},

#endif
