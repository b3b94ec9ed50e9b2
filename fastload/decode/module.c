/* The native module fastload.decode._jpeg_region: its functions registered, from the files that
 * wrap each part for Python (region_native.c: the JPEG path's crops, resizes and restart markers;
 * pixel_native.c and fill_native.c: the pixel cache's index, fill and crops; mask_rows.c,
 * crop_taps.c: a stored mask's cut, the GPU tails' resample taps), and RegionDecodeError, which a
 * failed request raises and the Python side answers by decoding with Pillow. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "crop_taps.h"
#include "fill_native.h"
#include "mask_rows.h"
#include "pixel_native.h"
#include "region_native.h"

static PyMethodDef methods[] = {
    FASTLOAD_REGION_METHODS
    {"mask_rows_into", fastload_mask_rows_into, METH_VARARGS, fastload_mask_rows_into_doc},
    {"crop_taps", fastload_crop_taps, METH_VARARGS, fastload_crop_taps_doc},
    FASTLOAD_PIXEL_METHODS
    FASTLOAD_FILL_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fastload.decode._jpeg_region",
    "A JPEG's crop box decoded with libjpeg, skipping the rows and columns outside it.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpeg_region(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    fastload_region_error = PyErr_NewException("fastload.decode._jpeg_region.RegionDecodeError",
                                               PyExc_ValueError, NULL);
    if (fastload_region_error == NULL ||
        PyModule_AddObject(m, "RegionDecodeError", fastload_region_error) < 0) {
        Py_XDECREF(fastload_region_error);
        Py_DECREF(m);
        return NULL;
    }
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
    /* e.g. 2001005 for libjpeg-turbo 2.1.5 */
    if (PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION", LIBJPEG_TURBO_VERSION_NUMBER) < 0) {
#else
    if (PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION", 0) < 0) {
#endif
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
