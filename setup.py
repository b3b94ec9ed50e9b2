"""The one thing setup.cfg cannot declare: fastload's C extension (metadata stays in setup.cfg).

``fastload._jpeg_region`` decodes only a JPEG crop's rows and columns with the system's
libjpeg(-turbo) (Debian/Ubuntu: ``libjpeg-dev``; most Python images have it). It is optional:
without a compiler or those headers the install still succeeds and fastload decodes whole images
with Pillow (same pixels, slower), and ``fastload pack --restart-markers`` is refused;
``fastload doctor`` says which decoder runs.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("fastload._jpeg_region",
                             sources=["fastload/jpeg_region.c", "fastload/jpeg_splice.c",
                                      "fastload/jpeg_restarts.c", "fastload/resample.c"],
                             depends=["fastload/jpeg_native.h", "fastload/resample.h"],
                             # -O3 vectorises resample.c's column pass (some Pythons build with -O2).
                             extra_compile_args=["-O3"], libraries=["jpeg"], optional=True)])
