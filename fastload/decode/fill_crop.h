/* A crop from the pixel cache's stored pixels, resized with the fill's resize (fill_crop.c). */
#ifndef FASTLOAD_FILL_CROP_H
#define FASTLOAD_FILL_CROP_H

#include "resample.h"

/* The box (x0, y0)-(x1, y1) of pixels (width x height packed RGB rows) resized to out_width x
 * out_height into target, as Pillow's resize(size, BILINEAR, box=) places it (when crop_first
 * and the corners are whole pixels: the box cut out first, its edges seeing only the box), with
 * fill_resize.c's arithmetic. The box must lie inside the image (fastload_clamp_box). Returns 0
 * when out of memory. */
int fastload_fill_crop(const unsigned char *pixels, int width, int height, const double box[4],
                       int crop_first, int out_width, int out_height, const Target *target);

#endif
