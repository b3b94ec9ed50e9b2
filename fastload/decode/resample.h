/* The resize of the decode stage: Pillow's bilinear (antialiased) resample, computed the way
 * Pillow computes it, so the pixels are Pillow's to the bit, written into any strided uint8
 * output (a CHW slot of a batch tensor, flipped or not). resample.c. */
#ifndef FASTLOAD_RESAMPLE_H
#define FASTLOAD_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

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
