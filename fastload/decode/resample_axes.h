/* The geometry of the decode stage's resize: which input pixels each output pixel reads, with
 * Pillow's bilinear weights, and the order of the two passes (resample_axes.c). resample.h runs
 * the passes. */
#ifndef FASTLOAD_RESAMPLE_AXES_H
#define FASTLOAD_RESAMPLE_AXES_H

#include <stdint.h>

/* The weights' fixed point, Pillow's: 32 bits less 8 for the pixel less 2 for headroom. */
#define PRECISION_BITS 22

/* One axis of a resize: for each output pixel, the input pixels it reads and their weights. */
typedef struct {
    int out_size;
    int taps;         /* weight slots per output pixel */
    int *first;       /* per output pixel: its first input pixel */
    int *count;       /* per output pixel: how many input pixels it reads */
    int32_t *weights; /* out_size * taps fixed-point weights */
    int begin, end;   /* every input pixel read lies in [begin, end) */
} Axis;

/* The weights Pillow's resize(size, BILINEAR, box=(in0, ..., in1, ...)) uses along an axis of
 * in_size pixels. Returns 0 when out of memory. */
int fastload_axis(Axis *axis, int in_size, float in0, float in1, int out_size);
void fastload_axis_free(Axis *axis);

/* The geometry of one crop: the box (x0, y0, x1, y1) of a width x height image resized to
 * out_width x out_height. crop_first, for a box whose corners are whole pixels (a train crop):
 * cut the box out first, then resize it whole (edge pixels see only the box); otherwise, or for
 * a fractional box, resize(box=) on the whole image. Axes are in image pixels either way.
 * Returns 0 when out of memory (nothing to free) or 1 (free with fastload_crop_free). */
typedef struct {
    Axis x, y;
    int columns_first; /* the order of the passes, as Pillow chooses it */
} Crop;

int fastload_crop(Crop *crop, int width, int height, double x0, double y0, double x1, double y1,
                  int crop_first, int out_width, int out_height);
void fastload_crop_free(Crop *crop);

/* The box clamped to a width x height image as Pillow's path clamps float round-off; 0 when it
 * starts outside the image or ends more than round-off past it. */
int fastload_clamp_box(double box[4], int width, int height);

#endif
