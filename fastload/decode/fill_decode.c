/* Decode stage, native part: the pixel cache's fill, a JPEG decoded whole and shrunk to its stored
 * size on the way out of the decoder.
 *
 * libjpeg hands the image over a row at a time into a ring of as many rows as one output row
 * reads; as soon as the rows under an output row are there, the rows pass makes it (one row
 * of the decoded width) and the columns pass writes it into the output. No whole decoded image
 * is kept: what the resize reads is still in cache when it reads it. At 1/1 (or 1/2, 1/4, 1/8,
 * where the image is large enough) rather than libjpeg's other M/8 scales, whose transforms have
 * no SIMD code and cost more than this resize. Any libjpeg error or warning fails the request,
 * as in jpeg_region.c; the Python side then lets Pillow decide what the record is.
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

/* The resize, as rows come: 0 when out of memory. */
static int resize_rows(struct jpeg_decompress_struct *cinfo, Fill *fill, unsigned char *out,
                       int out_width, int out_height) {
    size_t row_bytes = (size_t)cinfo->output_width * 3;
    int decoded = 0, i, t, ring;

    if (!fastload_fill_axis(&fill->x, (int)cinfo->output_width, 0.0, cinfo->output_width, out_width) ||
        !fastload_fill_axis(&fill->y, (int)cinfo->output_height, 0.0, cinfo->output_height, out_height)) {
        return 0;
    }
    ring = fill->y.max_count > 0 ? fill->y.max_count : 1;
    fill->ring = malloc(row_bytes * (size_t)ring);
    fill->row = calloc(row_bytes + FILL_READ_PAST, 1);
    fill->under = malloc(sizeof(unsigned char *) * (size_t)ring);
    if (fill->ring == NULL || fill->row == NULL || fill->under == NULL) {
        return 0;
    }
    for (i = 0; i < out_height; i++) {
        int first = fill->y.first[i], need = first + fill->y.count[i];
        for (; decoded < need; decoded++) { /* over the row `ring` before it: no output row left reads it */
            JSAMPROW into[1] = {fill->ring + (size_t)(decoded % ring) * row_bytes};
            jpeg_read_scanlines(cinfo, into, 1);
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
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, req->data, (unsigned long)req->length);
    jpeg_read_header(&cinfo, TRUE);
    req->image_width = cinfo.image_width;
    req->image_height = cinfo.image_height;
    if ((double)cinfo.image_width * (double)cinfo.image_height > (double)req->max_pixels) {
        req->status = 3;
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
    if ((int)cinfo.output_width == out_width && (int)cinfo.output_height == out_height) {
        while ((int)cinfo.output_scanline < out_height) { /* stored as decoded */
            JSAMPROW into[1] = {out + (size_t)cinfo.output_scanline * (size_t)out_width * 3};
            jpeg_read_scanlines(&cinfo, into, 1);
        }
    } else if (!resize_rows(&cinfo, fill, out, out_width, out_height)) {
        req->status = 4;
        goto done;
    }
    while (cinfo.output_scanline < cinfo.output_height) { /* rows no output row reads: checked too */
        JSAMPROW into[1] = {fill->ring};
        jpeg_read_scanlines(&cinfo, into, 1);
    }
    jpeg_finish_decompress(&cinfo);
    req->status = 0;
done:
    jpeg_destroy_decompress(&cinfo);
    fill_free(fill);
}
