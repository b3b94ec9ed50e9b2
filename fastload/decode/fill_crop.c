/* Decode stage, native part: a sample's crop from the pixel cache's stored planes, made with the
 * fill's resize (fill_resize.c) so that a crop costs as little as a fill's shrink. Each output
 * row: the Y plane's rows under it over the box's columns (the rows pass), then the columns pass.
 * Cb and Cr, as a 4:2:0 JPEG's: the box at their half scale resized to half the output (one pair
 * of axes for both; always in place, so their edges see their neighbours, as libjpeg's
 * upsampling does), each half row made once, then upsampled 2x as libjpeg's "fancy" upsampling
 * does (fill_colour.c), a chroma sample centred on the 2 x 2 output pixels it covers. The three
 * rows then become RGB in their slot of the batch. A flip is the columns passes' order,
 * mirrored; the upsampling of a mirrored half row is the mirrored row. Only the rows and columns
 * the crop reads are touched: the stored planes are a mapped file.
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

/* One axis each way of a crop of a plane: the chroma planes share theirs. */
typedef struct {
    FillAxis x, y;
    size_t span; /* the bytes of a row the columns pass reads, from x.begin */
} Axes;

static int axes_make(Axes *a, int width, int height, const double box[4], int cut, int out_width,
                     int out_height, int flip) {
    if (!crop_axis(&a->x, width, box[0], box[2], cut, out_width)) {
        return 0;
    }
    if (!crop_axis(&a->y, height, box[1], box[3], cut, out_height)) {
        fastload_fill_axis_free(&a->x);
        return 0;
    }
    if (flip) {
        mirror(&a->x);
    }
    a->span = (size_t)(a->x.end - a->x.begin);
    return fastload_fill_columns_ready(&a->x, a->span + (size_t)a->x.taps);
}

static void axes_free(Axes *a) {
    fastload_fill_axis_free(&a->x);
    fastload_fill_axis_free(&a->y);
}

/* A plane's crop: its axes, the row the rows pass makes, and the last three output rows
 * (chroma's upsampling reads the rows above and below). */
typedef struct {
    const Axes *a;
    const unsigned char *columns; /* the plane's first row, from the box's first column read */
    size_t stride;
    unsigned char *row, *out[3];
    int made; /* output rows made so far */
} PlaneCrop;

static int plane_crop(PlaneCrop *p, const Axes *a, const unsigned char *plane, int width) {
    int k;
    p->a = a;
    p->stride = (size_t)width;
    p->columns = plane + a->x.begin;
    p->row = calloc(a->span + (size_t)a->x.taps, 1);
    for (k = 0; k < 3; k++) {
        p->out[k] = malloc((size_t)a->x.out_size);
    }
    return p->row != NULL && p->out[0] != NULL && p->out[1] != NULL && p->out[2] != NULL;
}

/* Output row i (at most one past the last made) of the plane's resize. */
static const unsigned char *plane_row(PlaneCrop *p, int i, const unsigned char **under) {
    const FillAxis *y = &p->a->y;
    int t;
    if (i < p->made) {
        return p->out[i % 3];
    }
    for (t = 0; t < y->count[i]; t++) {
        under[t] = p->columns + (size_t)(y->begin + y->first[i] + t) * p->stride;
    }
    fastload_fill_rows(y, i, under, p->a->span, p->row);
    fastload_fill_columns(&p->a->x, p->row, p->out[i % 3]);
    p->made = i + 1;
    return p->out[i % 3];
}

static void plane_free(PlaneCrop *p) {
    int k;
    free(p->row);
    for (k = 0; k < 3; k++) {
        free(p->out[k]);
    }
}

/* Output row i of a chroma plane: its half-size rows upsampled (into full, 2 x half_width). */
static void chroma_row(PlaneCrop *p, int i, const unsigned char **under, int16_t *sum,
                       unsigned char *full) {
    int near = i / 2, last = p->a->y.out_size - 1;
    int far = i % 2 ? (near < last ? near + 1 : near) : (near > 0 ? near - 1 : near);
    /* rows are made in order, each once: near first (far, when below it, is the next) */
    const unsigned char *a = plane_row(p, near, under), *b = plane_row(p, far, under);
    fastload_chroma_upsample(a, b, p->a->x.out_size, sum, full);
}

int fastload_fill_crop(const unsigned char *planes, int width, int height, const double box[4],
                       int crop_first, int out_width, int out_height, const Target *target) {
    int cut = crop_first && box[0] == floor(box[0]) && box[1] == floor(box[1]) &&
              box[2] == floor(box[2]) && box[3] == floor(box[3]);
    int chroma_width = (width + 1) / 2, chroma_height = (height + 1) / 2, i, c, ok, most;
    int half_width = (out_width + 1) / 2, half_height = (out_height + 1) / 2;
    /* the box at chroma's scale, widened (an odd output side) so that each of the half output's
     * samples covers two output pixels: the last one's second lies past the output */
    const double half[4] = {box[0] / 2, box[1] / 2,
                            box[0] / 2 + (box[2] - box[0]) * half_width / out_width,
                            box[1] / 2 + (box[3] - box[1]) * half_height / out_height};
    /* a mirrored half row upsamples to the mirrored row of 2 x half_width: with an odd output
     * width, that row's first pixel is the one past the unmirrored output */
    size_t skip = target->flip && out_width % 2 ? 1 : 0;
    const unsigned char *cb = planes + (size_t)width * (size_t)height;
    const unsigned char *cr = cb + (size_t)chroma_width * (size_t)chroma_height;
    Axes luma, chroma;
    PlaneCrop p[3];
    const unsigned char **under = NULL;
    int16_t *sum = malloc(sizeof(int16_t) * (size_t)(half_width + 2));
    unsigned char *full = malloc(4 * (size_t)half_width);

    memset(p, 0, sizeof p);
    memset(&luma, 0, sizeof luma);
    memset(&chroma, 0, sizeof chroma);
    ok = sum != NULL && full != NULL &&
         axes_make(&luma, width, height, box, cut, out_width, out_height, target->flip) &&
         axes_make(&chroma, chroma_width, chroma_height, half, 0, half_width, half_height,
                   target->flip) &&
         plane_crop(&p[0], &luma, planes, width) && plane_crop(&p[1], &chroma, cb, chroma_width) &&
         plane_crop(&p[2], &chroma, cr, chroma_width);
    most = luma.y.max_count > chroma.y.max_count ? luma.y.max_count : chroma.y.max_count;
    under = ok ? malloc(sizeof(unsigned char *) * (size_t)(most > 1 ? most : 1)) : NULL;
    ok = ok && under != NULL;
    for (i = 0; ok && i < out_height; i++) {
        Target line = *target;
        const unsigned char *y = plane_row(&p[0], i, under);
        for (c = 1; c < 3; c++) {
            chroma_row(&p[c], i, under, sum, full + (size_t)(c - 1) * 2 * (size_t)half_width);
        }
        line.pixels += (ptrdiff_t)i * target->stride_y;
        fastload_ycc_store(y, full + skip, full + 2 * (size_t)half_width + skip, out_width, &line);
    }
    free((void *)under);
    free(sum);
    free(full);
    for (c = 0; c < 3; c++) {
        plane_free(&p[c]);
    }
    axes_free(&luma);
    axes_free(&chroma);
    return ok;
}
