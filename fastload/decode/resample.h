/* The resize of the decode stage: Pillow's bilinear (antialiased) resample, computed the way
 * Pillow computes it, so the pixels are Pillow's to the bit, written into any strided uint8
 * output (a CHW slot of a batch tensor, flipped or not). resample.c. */
#ifndef FASTLOAD_RESAMPLE_H
#define FASTLOAD_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "resample_axes.h"

/* Bytes a buffer of pixels should have readable past its last pixel, for the fast paths;
 * without them those paths step aside near the end (see Source.end). */
#define READ_PAST 16

/* Pixels read: `channels` (1 or 3) interleaved bytes per pixel, rows `row_stride` bytes apart;
 * pixel (0, 0) of `pixels` is image pixel (origin_x, origin_y). It must hold the crop's
 * [x.begin, x.end) x [y.begin, y.end); `end` is one past the last byte that may be read. */
typedef struct {
    const unsigned char *pixels;
    ptrdiff_t row_stride;
    int channels, origin_x, origin_y;
    const unsigned char *end;
} Source;

/* Pixels written: RGB, byte (y, x, c) at y * stride_y + x * stride_x + c * stride_c (grey is
 * written to all three channels); flip mirrors left and right. */
typedef struct {
    unsigned char *pixels;
    ptrdiff_t stride_y, stride_x, stride_c;
    int flip;
} Target;

/* Resize. Returns 0 when out of memory (the target is then partly written). */
int fastload_resample(const Crop *crop, const Source *source, const Target *target);

#endif
