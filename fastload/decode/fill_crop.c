/* Decode stage, native part: a sample's crop from the pixel cache's stored pixels, made with the
 * fill's resize (fill_resize.c) so that a crop costs as little as a fill's shrink: each output
 * row from the box's rows under it (the rows pass, over the box's columns only), then the
 * columns pass, then written into its slot of the batch (flipped or not) by resample_store.c.
 * Only the rows and columns the crop reads are touched: the stored pixels are a mapped file.
 */
#include "fill_crop.h"

#include <math.h>
#include <stdlib.h>

#include "fill_resize.h"
#include "resample_store.h"

/* An axis over [in0, in1) of in_size pixels (lanes: for a columns pass); cut: over that span
 * alone (its own image), then moved back. Either way, first[] counts from the axis's first pixel
 * read (begin). */
static int crop_axis(FillAxis *axis, int in_size, double in0, double in1, int cut, int out_size,
                     int lanes) {
    int offset = cut ? (int)in0 : 0, i;
    if (!(cut ? fastload_fill_axis(axis, (int)in1 - offset, 0.0, in1 - offset, out_size, lanes)
              : fastload_fill_axis(axis, in_size, in0, in1, out_size, lanes))) {
        return 0;
    }
    for (i = 0; i < out_size; i++) {
        axis->first[i] -= axis->begin;
    }
    axis->begin += offset;
    axis->end += offset;
    return 1;
}

int fastload_fill_crop(const unsigned char *pixels, int width, int height, const double box[4],
                       int crop_first, int out_width, int out_height, const Target *target) {
    int cut = crop_first && box[0] == floor(box[0]) && box[1] == floor(box[1]) &&
              box[2] == floor(box[2]) && box[3] == floor(box[3]);
    FillAxis x, y;
    size_t span, stride = (size_t)width * 3;
    unsigned char *row = NULL, *out = NULL;
    const unsigned char **under = NULL;
    int i, t, ok = 0;

    if (!crop_axis(&x, width, box[0], box[2], cut, out_width, 1)) {
        return 0;
    }
    if (!crop_axis(&y, height, box[1], box[3], cut, out_height, 0)) {
        fastload_fill_axis_free(&x);
        return 0;
    }
    span = (size_t)(x.end - x.begin) * 3;
    row = calloc(span + FILL_READ_PAST, 1);
    out = malloc((size_t)out_width * 3 + 4);
    under = malloc(sizeof(unsigned char *) * (size_t)(y.max_count > 0 ? y.max_count : 1));
    if (row != NULL && out != NULL && under != NULL) {
        const unsigned char *columns = pixels + (size_t)x.begin * 3;
        for (i = 0; i < out_height; i++) {
            Target line = *target;
            for (t = 0; t < y.count[i]; t++) {
                under[t] = columns + (size_t)(y.begin + y.first[i] + t) * stride;
            }
            fastload_fill_rows(&y, i, under, span, row);
            fastload_fill_columns(&x, row, out);
            line.pixels += (ptrdiff_t)i * target->stride_y;
            fastload_store_rgb(out, 1, out_width, 3, &line);
        }
        ok = 1;
    }
    free(row);
    free(out);
    free((void *)under);
    fastload_fill_axis_free(&x);
    fastload_fill_axis_free(&y);
    return ok;
}
