/* A crop from the pixel cache's stored planes, resized with the fill's resize (fill_crop.c). */
#ifndef FASTLOAD_FILL_CROP_H
#define FASTLOAD_FILL_CROP_H

#include "resample.h"

/* The box (x0, y0)-(x1, y1) of planes (a width x height image's stored planes: Y, then Cb and Cr
 * at half its size, rounded up) resized to out_width x out_height into target as RGB, placed as
 * Pillow's resize(size, BILINEAR, box=) places it (the Y plane's box cut out first when
 * crop_first and the corners are whole pixels: its edges then see only the box), mirrored when
 * target->flip, with fill_resize.c's arithmetic; Cb and Cr resized so to half the output's size
 * (rounded up) and upsampled 2x (fastload_chroma_upsample). The box must lie inside the image
 * (fastload_clamp_box). Returns 0 when out of memory. */
int fastload_fill_crop(const unsigned char *planes, int width, int height, const double box[4],
                       int crop_first, int out_width, int out_height, const Target *target);

#endif
