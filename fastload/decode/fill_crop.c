/* Decode stage, native part: a sample's crop from the pixel cache's stored planes, made with the
 * fill's resize (fill_resize.c) so that a crop costs as little as a fill's shrink. Each output
 * row: the Y plane's rows under it over the box's columns (the rows pass), then the columns pass;
 * the same for Cb and Cr over the box at their half scale (always resized in place: their edges
 * see their neighbours, as libjpeg's upsampling does); then the three rows become RGB in their
 * slot of the batch (fill_colour.c). A flip is the columns passes' order, mirrored. Only the
 * rows and columns the crop reads are touched: the stored planes are a mapped file.
 */
#include "fill_crop.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fill_colour.h"
#include "fill_resize.h"

/* An axis over [in0, in1) of in_size pixels; cut: over that span alone (its own image), then
 * moved back. Either way, first[] counts from the axis's first pixel read (begin). */
static int crop_axis(FillAxis *axis, int in_size, double in0, double in1, int cut, int out_size) {
    int offset = cut ? (int)in0 : 0, i;
    if (!(cut ? fastload_fill_axis(axis, (int)in1 - offset, 0.0, in1 - offset, out_size)
              : fastload_fill_axis(axis, in_size, in0, in1, out_size))) {
        return 0;
    }
    for (i = 0; i < out_size; i++) {
        axis->first[i] -= axis->begin;
    }
    axis->begin += offset;
    axis->end += offset;
    return 1;
}

/* The axis's output pixels in the other order: a mirrored crop. */
static void mirror(FillAxis *axis) {
    int i, j, t;
    for (i = 0, j = axis->out_size - 1; i < j; i++, j--) {
        int16_t *a = axis->weights + (size_t)i * (size_t)axis->taps;
        int16_t *b = axis->weights + (size_t)j * (size_t)axis->taps;
        int first = axis->first[i], count = axis->count[i];
        axis->first[i] = axis->first[j];
        axis->count[i] = axis->count[j];
        axis->first[j] = first;
        axis->count[j] = count;
        for (t = 0; t < axis->taps; t++) {
            int16_t w = a[t];
            a[t] = b[t];
            b[t] = w;
        }
    }
}

/* A plane's crop: its axes, and the row the rows pass makes. */
typedef struct {
    FillAxis x, y;
    const unsigned char *columns; /* the plane's first row, from the box's first column read */
    size_t stride, span;
    unsigned char *row, *out;
} PlaneCrop;

static int plane_crop(PlaneCrop *p, const unsigned char *plane, int width, int height,
                      const double box[4], int cut, int out_width, int out_height, int flip) {
    if (!crop_axis(&p->x, width, box[0], box[2], cut, out_width)) {
        return 0;
    }
    if (!crop_axis(&p->y, height, box[1], box[3], cut, out_height)) {
        fastload_fill_axis_free(&p->x);
        return 0;
    }
    if (flip) {
        mirror(&p->x);
    }
    p->stride = (size_t)width;
    p->columns = plane + p->x.begin;
    p->span = (size_t)(p->x.end - p->x.begin);
    p->row = calloc(p->span + (size_t)p->x.taps, 1);
    p->out = malloc((size_t)out_width);
    return p->row != NULL && p->out != NULL &&
           fastload_fill_columns_ready(&p->x, p->span + (size_t)p->x.taps);
}

static void plane_row(PlaneCrop *p, int i, const unsigned char **under) {
    int t;
    for (t = 0; t < p->y.count[i]; t++) {
        under[t] = p->columns + (size_t)(p->y.begin + p->y.first[i] + t) * p->stride;
    }
    fastload_fill_rows(&p->y, i, under, p->span, p->row);
    fastload_fill_columns(&p->x, p->row, p->out);
}

static void plane_free(PlaneCrop *p) {
    fastload_fill_axis_free(&p->x);
    fastload_fill_axis_free(&p->y);
    free(p->row);
    free(p->out);
}

int fastload_fill_crop(const unsigned char *planes, int width, int height, const double box[4],
                       int crop_first, int out_width, int out_height, const Target *target) {
    int cut = crop_first && box[0] == floor(box[0]) && box[1] == floor(box[1]) &&
              box[2] == floor(box[2]) && box[3] == floor(box[3]);
    int chroma_width = (width + 1) / 2, chroma_height = (height + 1) / 2, i, c, ok = 1, most = 1;
    const double half[4] = {box[0] / 2, box[1] / 2, box[2] / 2, box[3] / 2};
    const unsigned char *cb = planes + (size_t)width * (size_t)height;
    const unsigned char *cr = cb + (size_t)chroma_width * (size_t)chroma_height;
    PlaneCrop p[3];
    const unsigned char **under = NULL;

    memset(p, 0, sizeof p);
    ok = plane_crop(&p[0], planes, width, height, box, cut, out_width, out_height, target->flip) &&
         plane_crop(&p[1], cb, chroma_width, chroma_height, half, 0, out_width, out_height,
                    target->flip) &&
         plane_crop(&p[2], cr, chroma_width, chroma_height, half, 0, out_width, out_height,
                    target->flip);
    for (c = 0; ok && c < 3; c++) {
        most = p[c].y.max_count > most ? p[c].y.max_count : most;
    }
    under = ok ? malloc(sizeof(unsigned char *) * (size_t)most) : NULL;
    ok = ok && under != NULL;
    for (i = 0; ok && i < out_height; i++) {
        Target line = *target;
        for (c = 0; c < 3; c++) {
            plane_row(&p[c], i, under);
        }
        line.pixels += (ptrdiff_t)i * target->stride_y;
        fastload_ycc_store(p[0].out, p[1].out, p[2].out, out_width, &line);
    }
    free((void *)under);
    for (c = 0; c < 3; c++) {
        plane_free(&p[c]);
    }
    return ok;
}
