/* Decode stage, native part: the pixel cache's fill, a JPEG decoded whole into the planes it
 * holds, each shrunk to its stored size on the way out of the decoder (fastload/pixels/layout.py:
 * Y at the stored size, Cb and Cr at half of it, rounded up).
 *
 * libjpeg hands over its raw data (no upsampling, no colour conversion) an iMCU row at a time,
 * each component's rows into a ring of as many rows as one output row of its plane reads and an
 * iMCU row more; as soon as the rows under an output row are there, the rows pass makes it and
 * the columns pass writes it into the plane (fill_resize.c). No whole decoded image is kept: what
 * the resize reads is still in cache when it reads it. Each plane's resize maps its own samples
 * onto the image: chroma decoded at half the luma's width is shrunk by half the luma's
 * reduction. Read so: a YCbCr JPEG of any subsampling whose Y has the largest sampling factors
 * and whose Cb and Cr share theirs (4:2:0, 4:2:2, 4:4:4, ...), progressive or not, and a grey
 * one (its chroma planes neutral, 128). Anything else (CMYK, YCCK, RGB) is status 6, which the
 * Python side answers with Pillow's RGB made into planes (fill_colour.c). At 1/1 (or 1/2, 1/4,
 * 1/8, where the image is large enough) rather than libjpeg's other M/8 scales, whose transforms
 * have no SIMD code and cost more than this resize. Any libjpeg error or warning fails the
 * request, as in jpeg_region.c; the Python side then lets Pillow decide what the record is.
 */
#include "fill_decode.h"

#include <stdlib.h>
#include <string.h>

#include "fill_resize.h"
#include "jpeg_errors.h"

#if JPEG_LIB_VERSION >= 70
#define H_SCALED(c) ((c)->DCT_h_scaled_size)
#define V_SCALED(c) ((c)->DCT_v_scaled_size)
#define MIN_H_SCALED(ci) ((ci)->min_DCT_h_scaled_size)
#define MIN_V_SCALED(ci) ((ci)->min_DCT_v_scaled_size)
#else
#define H_SCALED(c) ((c)->DCT_scaled_size)
#define V_SCALED(c) ((c)->DCT_scaled_size)
#define MIN_H_SCALED(ci) ((ci)->min_DCT_scaled_size)
#define MIN_V_SCALED(ci) ((ci)->min_DCT_scaled_size)
#endif

/* One component on its way to its stored plane. */
typedef struct {
    FillAxis x, y;
    unsigned char *ring, *row, *out; /* out: the stored plane, x.out_size bytes a row */
    JSAMPROW *band;                  /* the rows libjpeg writes this call */
    const unsigned char **under;     /* the rows under the output row being made */
    int width, ring_rows, rows, next; /* rows: a band's; next: the next output row to make */
    size_t row_bytes;                 /* a ring row: whole blocks */
} Plane;

typedef struct {
    Plane plane[3];
    int planes;
} Fill;

static void fill_free(Fill *fill) {
    int c;
    if (fill == NULL) {
        return;
    }
    for (c = 0; c < 3; c++) {
        Plane *p = &fill->plane[c];
        fastload_fill_axis_free(&p->x);
        fastload_fill_axis_free(&p->y);
        free(p->ring);
        free(p->row);
        free((void *)p->band);
        free((void *)p->under);
    }
    free(fill);
}

/* Whether the components are planes the fill reads: grey, or YCbCr with Y sampled the most. */
static int planes_of(const struct jpeg_decompress_struct *cinfo) {
    const jpeg_component_info *c = cinfo->comp_info;
    if (cinfo->jpeg_color_space == JCS_GRAYSCALE && cinfo->num_components == 1) {
        return 1;
    }
    if (cinfo->jpeg_color_space == JCS_YCbCr && cinfo->num_components == 3 &&
        c[0].h_samp_factor == cinfo->max_h_samp_factor &&
        c[0].v_samp_factor == cinfo->max_v_samp_factor &&
        c[1].h_samp_factor == c[2].h_samp_factor && c[1].v_samp_factor == c[2].v_samp_factor) {
        return 3;
    }
    return 0;
}

/* Component ci's plane: out_width x out_height stored pixels at out (a chroma one's pixels two
 * stored luma pixels wide and high, of a luma plane luma_width x luma_height). 0 when out of
 * memory. */
static int plane_start(const struct jpeg_decompress_struct *cinfo, int ci, Plane *p,
                       unsigned char *out, int out_width, int out_height, int luma_width,
                       int luma_height) {
    const jpeg_component_info *c = &cinfo->comp_info[ci];
    int half = ci > 0;
    /* a decoded sample of this component, in decoded luma pixels, each way */
    double rx = (double)(cinfo->max_h_samp_factor * MIN_H_SCALED(cinfo)) /
                (c->h_samp_factor * H_SCALED(c));
    double ry = (double)(cinfo->max_v_samp_factor * MIN_V_SCALED(cinfo)) /
                (c->v_samp_factor * V_SCALED(c));
    /* the decoded samples under the plane: its stored pixels are 1 << half stored luma pixels
     * each way (so Y's span is the decoded width and height to the bit) */
    double span_x = (double)((size_t)out_width << half) * cinfo->output_width / luma_width / rx;
    double span_y = (double)((size_t)out_height << half) * cinfo->output_height / luma_height / ry;

    p->out = out;
    p->width = (int)c->downsampled_width;
    p->rows = c->v_samp_factor * V_SCALED(c);
    p->row_bytes = (size_t)c->width_in_blocks * (size_t)H_SCALED(c);
    if (!fastload_fill_axis(&p->x, p->width, 0.0, span_x, out_width) ||
        !fastload_fill_axis(&p->y, (int)c->downsampled_height, 0.0, span_y, out_height)) {
        return 0;
    }
    /* Room for one output row's rows and a band more: a band read never lands on a row that an
     * output row still to be made reads. */
    p->ring_rows = p->y.max_count + p->rows;
    p->ring = malloc(p->row_bytes * (size_t)p->ring_rows);
    p->row = calloc((size_t)p->width + (size_t)p->x.taps, 1);
    p->band = malloc(sizeof(JSAMPROW) * (size_t)p->rows);
    p->under = malloc(sizeof(unsigned char *) * (size_t)(p->ring_rows));
    return p->ring != NULL && p->row != NULL && p->band != NULL && p->under != NULL &&
           fastload_fill_columns_ready(&p->x, (size_t)p->width + (size_t)p->x.taps);
}

/* The output rows whose rows are all decoded (the first `decoded` of the component's), made. */
static void plane_rows(Plane *p, int decoded) {
    int stride = p->x.out_size, t;
    for (; p->next < p->y.out_size; p->next++) {
        int first = p->y.first[p->next], count = p->y.count[p->next];
        if (first + count > decoded) {
            return;
        }
        for (t = 0; t < count; t++) {
            p->under[t] = p->ring + (size_t)((first + t) % p->ring_rows) * p->row_bytes;
        }
        fastload_fill_rows(&p->y, p->next, p->under, (size_t)p->width, p->row);
        fastload_fill_columns(&p->x, p->row, p->out + (size_t)p->next * (size_t)stride);
    }
}

/* Every band read and every plane's rows made: 1, or -1 when libjpeg stops handing rows over. */
static int read_planes(struct jpeg_decompress_struct *cinfo, Fill *fill) {
    JSAMPARRAY bands[3];
    int lines = cinfo->max_v_samp_factor * MIN_V_SCALED(cinfo), decoded = 0, c, t;
    while (cinfo->output_scanline < cinfo->output_height) {
        for (c = 0; c < fill->planes; c++) {
            Plane *p = &fill->plane[c];
            int at = decoded * p->rows;
            for (t = 0; t < p->rows; t++) {
                p->band[t] = p->ring + (size_t)((at + t) % p->ring_rows) * p->row_bytes;
            }
            bands[c] = p->band;
        }
        if (jpeg_read_raw_data(cinfo, bands, (JDIMENSION)lines) == 0) {
            return -1;
        }
        decoded++;
        for (c = 0; c < fill->planes; c++) {
            plane_rows(&fill->plane[c], decoded * fill->plane[c].rows);
        }
    }
    for (c = 0; c < fill->planes; c++) {
        if (fill->plane[c].next < fill->plane[c].y.out_size) {
            return -1;
        }
    }
    return 1;
}

void fastload_jpeg_fill(Request *req, unsigned char *out, int out_width, int out_height) {
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    Fill *fill = calloc(1, sizeof *fill); /* on the heap: what it holds outlives a longjmp */
    size_t luma = (size_t)out_width * (size_t)out_height;
    int chroma_width = (out_width + 1) / 2, chroma_height = (out_height + 1) / 2, c, rows;
    size_t chroma = (size_t)chroma_width * (size_t)chroma_height;

    memset(&cinfo, 0, sizeof cinfo);
    if (fill == NULL) {
        req->status = 4;
        return;
    }
    cinfo.err = fastload_jpeg_errors(&err);
    if (setjmp(err.jump)) {
        req->status = 1;
        memcpy(req->message, err.message, sizeof req->message);
        goto done;
    }
    if (!fastload_jpeg_header(&cinfo, req)) {
        goto done;
    }
    fill->planes = planes_of(&cinfo);
    if (fill->planes == 0) {
        req->status = 6;
        goto done;
    }
    cinfo.raw_data_out = TRUE;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)req->scale;
    jpeg_start_decompress(&cinfo);
    if ((int)cinfo.output_width < out_width || (int)cinfo.output_height < out_height) {
        req->status = 5;
        goto done;
    }
    for (c = 0; c < fill->planes; c++) {
        unsigned char *at = c == 0 ? out : out + luma + (size_t)(c - 1) * chroma;
        if (!plane_start(&cinfo, c, &fill->plane[c], at, c ? chroma_width : out_width,
                         c ? chroma_height : out_height, out_width, out_height)) {
            req->status = 4;
            goto done;
        }
    }
    rows = read_planes(&cinfo, fill);
    if (rows != 1) {
        req->status = 1;
        strcpy(req->message, "no rows came out of the decoder");
        goto done;
    }
    if (fill->planes == 1) {
        memset(out + luma, 128, 2 * chroma); /* grey: neutral chroma */
    }
    jpeg_finish_decompress(&cinfo);
    req->status = 0;
done:
    jpeg_destroy_decompress(&cinfo);
    fill_free(fill);
}
