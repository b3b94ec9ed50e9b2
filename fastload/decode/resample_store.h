/* Writing a resized crop (packed rows of `channels` bytes per pixel) into a Target: resample_store.c. */
#ifndef FASTLOAD_RESAMPLE_STORE_H
#define FASTLOAD_RESAMPLE_STORE_H

#include "resample.h"

void fastload_store_rgb(const unsigned char *pixels, int height, int width, int channels,
                        const Target *target);

#endif
