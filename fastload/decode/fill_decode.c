/* Decode stage, native part: the pixel cache's fill, a JPEG decoded whole and shrunk to its stored
 * size on the way out of the decoder.
 *
 * libjpeg hands the image over an iMCU row (16 rows) at a time into a ring of as many rows as
 * one output row reads and a band more; as soon as the rows under an output row are there, the
 * rows pass makes it (one row of the decoded width) and the columns pass writes it into the
 * output. No whole decoded image is kept: what the resize reads is still in cache when it reads
 * it. At 1/1 (or 1/2, 1/4, 1/8, where the image is large enough) rather than libjpeg's other M/8
 * scales, whose transforms have no SIMD code and cost more than this resize. Any libjpeg error
 * or warning fails the request, as in jpeg_region.c; the Python side then lets Pillow decide
 * what the record is.
 */
#include "fill_decode.h"

#include <stdlib.h>
#include <string.h>

#include "fill_resize.h"
#include "jpeg_errors.h"

typedef struct {
    FillAxis x, y;
    unsigned char *ring, *row;
    const unsigned char **under; /* the rows under the output row being made */
} Fill;

static void fill_free(Fill *fill) {
    if (fill == NULL) {
        return;
    }
    fastload_fill_axis_free(&fill->x);
    fastload_fill_axis_free(&fill->y);
    free(fill->ring);
    free(fill->row);
    free((void *)fill->under);
    free(fill);
}

/* Rows libjpeg is asked for at a time: an iMCU row of 4:2:0 (fewer, one by one, cost a copy of
 * every other row inside libjpeg, and the switching between it and the resize costs more). */
#define BAND 16

/* Every row into out, as it is stored: 1, or -1 when libjpeg stops handing rows over. */
static int read_whole(struct jpeg_decompress_struct *cinfo, unsigned char *out) {
    size_t row_bytes = (size_t)cinfo->output_width * 3;
    while (cinfo->output_scanline < cinfo->output_height) {
        JSAMPROW into[BAND];
        int row = (int)cinfo->output_scanline, left = (int)cinfo->output_height - row, t;
        int n = left < BAND ? left : BAND;
        for (t = 0; t < n; t++) {
            into[t] = out + (size_t)(row + t) * row_bytes;
        }
        if (jpeg_read_scanlines(cinfo, into, (JDIMENSION)n) == 0) {
            return -1;
        }
    }
    return 1;
}

/* The resize, as rows come: 1, or 0 when out of memory, -1 when libjpeg stops handing rows over. */
static int resize_rows(struct jpeg_decompress_struct *cinfo, Fill *fill, unsigned char *out,
                       int out_width, int out_height) {
    size_t row_bytes = (size_t)cinfo->output_width * 3;
    int height = (int)cinfo->output_height, decoded = 0, i, t, ring;

    if (!fastload_fill_axis(&fill->x, (int)cinfo->output_width, 0.0, cinfo->output_width,
                            out_width, 1) ||
        !fastload_fill_axis(&fill->y, height, 0.0, height, out_height, 0)) {
        return 0;
    }
    /* Room for one output row's rows and a band more: a band read never lands on a row that an
     * output row still to be made reads. */
    ring = fill->y.max_count + BAND;
    fill->ring = malloc(row_bytes * (size_t)ring);
    fill->row = calloc(row_bytes + FILL_READ_PAST, 1);
    fill->under = malloc(sizeof(unsigned char *) * (size_t)ring);
    if (fill->ring == NULL || fill->row == NULL || fill->under == NULL) {
        return 0;
    }
    for (i = 0; i < out_height; i++) {
        int first = fill->y.first[i], need = first + fill->y.count[i];
        while (decoded < need) {
            JSAMPROW into[BAND];
            int n = height - decoded < BAND ? height - decoded : BAND;
            for (t = 0; t < n; t++) {
                into[t] = fill->ring + (size_t)((decoded + t) % ring) * row_bytes;
            }
            n = (int)jpeg_read_scanlines(cinfo, into, (JDIMENSION)n);
            if (n == 0) {
                return -1;
            }
            decoded += n;
        }
        for (t = 0; t < fill->y.count[i]; t++) {
            fill->under[t] = fill->ring + (size_t)((first + t) % ring) * row_bytes;
        }
        fastload_fill_rows(&fill->y, i, fill->under, row_bytes, fill->row);
        fastload_fill_columns(&fill->x, fill->row, out + (size_t)i * (size_t)out_width * 3);
    }
    return 1;
}

void fastload_jpeg_fill(Request *req, unsigned char *out, int out_width, int out_height) {
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    Fill *fill = calloc(1, sizeof *fill); /* on the heap: what it holds outlives a longjmp */
    int rows;

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
    cinfo.out_color_space = JCS_RGB; /* grey too; CMYK and YCCK raise (Pillow converts them) */
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)req->scale;
    jpeg_start_decompress(&cinfo);
    if ((int)cinfo.output_width < out_width || (int)cinfo.output_height < out_height) {
        req->status = 5;
        goto done;
    }
    rows = (int)cinfo.output_width == out_width && (int)cinfo.output_height == out_height
               ? read_whole(&cinfo, out) /* stored as decoded */
               : resize_rows(&cinfo, fill, out, out_width, out_height);
    if (rows != 1) {
        req->status = rows == 0 ? 4 : 1;
        strcpy(req->message, "no rows came out of the decoder");
        goto done;
    }
    while (cinfo.output_scanline < cinfo.output_height) { /* rows no output row reads: checked */
        JSAMPROW into[1] = {fill->ring};
        if (jpeg_read_scanlines(&cinfo, into, 1) == 0) {
            break; /* jpeg_finish_decompress says why */
        }
    }
    jpeg_finish_decompress(&cinfo);
    req->status = 0;
done:
    jpeg_destroy_decompress(&cinfo);
    fill_free(fill);
}
