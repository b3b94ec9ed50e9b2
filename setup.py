"""The one thing setup.cfg cannot declare: fastload's C extension (metadata stays in setup.cfg).

``fastload.decode._jpeg_region`` decodes only a JPEG crop's rows and columns with the system's
libjpeg(-turbo) (Debian/Ubuntu: ``libjpeg-dev``; most Python images have it). It is optional:
without a compiler or those headers the install still succeeds and fastload decodes whole images
with Pillow (same pixels, slower), and ``fastload pack --restart-markers`` is refused;
``fastload doctor`` says which decoder runs.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("fastload.decode._jpeg_region",
                             sources=["fastload/decode/module.c", "fastload/decode/jpeg_region.c",
                                      "fastload/decode/jpeg_splice.c", "fastload/decode/jpeg_errors.c",
                                      "fastload/decode/jpeg_restarts.c", "fastload/decode/resample.c",
                                      "fastload/decode/resample_axes.c", "fastload/decode/resample_store.c",
                                      "fastload/decode/mask_rows.c", "fastload/decode/pixel_native.c",
                                      "fastload/decode/crop_taps.c", "fastload/decode/fill_decode.c",
                                      "fastload/decode/fill_resize.c", "fastload/decode/fill_crop.c",
                                      "fastload/decode/fill_colour.c", "fastload/decode/fill_columns.c",
                                      "fastload/decode/fill_native.c",
                                      "fastload/decode/region_native.c"],
                             depends=["fastload/decode/jpeg_region.h", "fastload/decode/jpeg_splice.h",
                                      "fastload/decode/jpeg_errors.h", "fastload/decode/jpeg_restarts.h",
                                      "fastload/decode/resample.h", "fastload/decode/resample_axes.h",
                                      "fastload/decode/resample_store.h", "fastload/decode/cpu_features.h",
                                      "fastload/decode/mask_rows.h", "fastload/decode/pixel_native.h",
                                      "fastload/decode/crop_taps.h", "fastload/decode/fill_decode.h",
                                      "fastload/decode/fill_resize.h", "fastload/decode/fill_crop.h",
                                      "fastload/decode/fill_colour.h", "fastload/decode/fill_native.h",
                                      "fastload/decode/region_native.h"],
                             # -O3 vectorises resample.c's column pass (some Pythons build with -O2).
                             extra_compile_args=["-O3"], libraries=["jpeg"], optional=True)])
