/* Decode stage, native part: the resize's geometry, Pillow's bilinear weights for each axis (a
 * triangle filter stretched by the reduction, so it antialiases; normalised, then 22-bit fixed
 * point) and the order of the passes, as Pillow 13 picks them from the sizes. resample.c runs the
 * passes with them.
 */
#include "resample_axes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double triangle(double x) {
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

int fastload_axis(Axis *axis, int in_size, float in0, float in1, int out_size) {
    /* The span in float, as Pillow takes the box: the weights must round as Pillow's do. */
    float span = in1 - in0;
    double scale = (double)span / out_size;
    double stretch = scale < 1.0 ? 1.0 : scale; /* shrinking widens the filter: antialiasing */
    double support = stretch, inverse = 1.0 / stretch;
    double *w;
    int i, t;

    memset(axis, 0, sizeof *axis);
    axis->out_size = out_size;
    axis->taps = (int)ceil(support) * 2 + 1;
    axis->first = malloc(sizeof(int) * (size_t)out_size);
    axis->count = malloc(sizeof(int) * (size_t)out_size);
    axis->weights = malloc(sizeof(int32_t) * (size_t)out_size * (size_t)axis->taps);
    w = malloc(sizeof(double) * (size_t)axis->taps);
    if (axis->first == NULL || axis->count == NULL || axis->weights == NULL || w == NULL) {
        free(w);
        fastload_axis_free(axis);
        return 0;
    }
    axis->begin = in_size;
    axis->end = 0;
    for (i = 0; i < out_size; i++) {
        double center = in0 + (i + 0.5) * scale, total = 0.0;
        int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5), n;
        int32_t *k = axis->weights + (size_t)i * (size_t)axis->taps;

        lo = lo < 0 ? 0 : lo;
        hi = hi > in_size ? in_size : hi;
        n = hi - lo;
        for (t = 0; t < n; t++) {
            w[t] = triangle((t + lo - center + 0.5) * inverse);
            total += w[t];
        }
        for (t = 0; t < axis->taps; t++) {
            double v = t < n ? (total != 0.0 ? w[t] / total : w[t]) : 0.0;
            double fixed = v * (1 << PRECISION_BITS);
            k[t] = (int32_t)(v < 0 ? fixed - 0.5 : fixed + 0.5);
        }
        axis->first[i] = lo;
        axis->count[i] = n > 0 ? n : 0;
        if (n > 0) {
            axis->begin = lo < axis->begin ? lo : axis->begin;
            axis->end = hi > axis->end ? hi : axis->end;
        }
    }
    if (axis->end <= axis->begin) {
        axis->begin = axis->end = 0;
    }
    free(w);
    return 1;
}

void fastload_axis_free(Axis *axis) {
    free(axis->first);
    free(axis->count);
    free(axis->weights);
    axis->first = axis->count = NULL;
    axis->weights = NULL;
}

/* Move an axis computed on a crop starting at `offset` to image pixels. */
static void shift(Axis *axis, int offset) {
    int i;
    for (i = 0; i < axis->out_size; i++) {
        axis->first[i] += offset;
    }
    axis->begin += offset;
    axis->end += offset;
}

int fastload_crop(Crop *crop, int width, int height, double x0, double y0, double x1, double y1,
                  int crop_first, int out_width, int out_height) {
    /* Cut out first: Image.crop(box).resize(size), the box's own pixels from 0 to its size,
     * then moved back to image pixels. Otherwise resize(size, box=) on the whole image. */
    int cut = crop_first && x0 == floor(x0) && y0 == floor(y0) && x1 == floor(x1) &&
              y1 == floor(y1);
    int left = cut ? (int)x0 : 0, top = cut ? (int)y0 : 0;
    int in_width = cut ? (int)x1 - left : width, in_height = cut ? (int)y1 - top : height;

    memset(crop, 0, sizeof *crop);
    /* Pillow's order: columns first when that shrinks the image by more than twice what the
     * rows pass would (counted in pixels), else rows first. Each pass rounds to 8 bits, so
     * the order shows in the pixels. */
    crop->columns_first = in_height - out_height > 0 &&
                          in_height - out_height > 2 * (in_width - out_width);
    if (!fastload_axis(&crop->x, in_width, cut ? 0.0f : (float)x0,
                       cut ? (float)in_width : (float)x1, out_width)) {
        return 0;
    }
    if (!fastload_axis(&crop->y, in_height, cut ? 0.0f : (float)y0,
                       cut ? (float)in_height : (float)y1, out_height)) {
        fastload_axis_free(&crop->x);
        return 0;
    }
    shift(&crop->x, left);
    shift(&crop->y, top);
    return 1;
}

void fastload_crop_free(Crop *crop) {
    fastload_axis_free(&crop->x);
    fastload_axis_free(&crop->y);
}

int fastload_clamp_box(double box[4], int width, int height) {
    if (!(box[0] >= 0 && box[1] >= 0 && box[2] <= width + 1e-6 && box[3] <= height + 1e-6 &&
          box[0] < box[2] && box[1] < box[3])) {
        return 0;
    }
    box[2] = box[2] < width ? box[2] : width;
    box[3] = box[3] < height ? box[3] : height;
    return box[0] < box[2] && box[1] < box[3];
}
