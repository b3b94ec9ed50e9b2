/* The pixel cache's colours (fill_colour.c): stored YCbCr planes to a batch slot's RGB, and RGB to
 * stored planes. */
#ifndef FASTLOAD_FILL_COLOUR_H
#define FASTLOAD_FILL_COLOUR_H

#include <stdint.h>

#include "resample.h"

/* A chroma row upsampled 2x each way (libjpeg's h2v2 fancy upsampling): near, the half row the
 * output row lies in, far the one beside it (above for an even output row, below for an odd;
 * the same row at an edge), n bytes each, into out's 2n bytes; sum: n + 2 to work in. A chroma
 * sample sits centred on the 2 x 2 output pixels it covers, as in a 4:2:0 JPEG. */
void fastload_chroma_upsample(const unsigned char *near, const unsigned char *far, int n,
                              int16_t *sum, unsigned char *out);

/* One row of width pixels from its Y, Cb and Cr bytes into target's first row as RGB (never
 * mirrored: a flip is in the columns pass's order). */
void fastload_ycc_store(const unsigned char *y, const unsigned char *cb, const unsigned char *cr,
                        int width, const Target *target);

/* A width x height image (packed RGB rows) as the pixel cache's planes into out: Y width x
 * height, then Cb and Cr each ceil(width / 2) x ceil(height / 2). */
void fastload_rgb_to_planes(const unsigned char *rgb, int width, int height,
                              unsigned char *out);

#endif
