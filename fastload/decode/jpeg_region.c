/* Decode stage, native part: a JPEG's crop box decoded without the pixels around it.
 *
 * libjpeg(-turbo) can skip what a crop does not need: the rows under the box are never decoded,
 * the rows above it are entropy-decoded only (jpeg_skip_scanlines: no IDCT, no upsampling, no
 * colour conversion), and inside the box's rows only the iMCU columns that hold it are
 * transformed (jpeg_crop_scanline). RandomResizedCrop boxes cover 8-100% of a photo, so most of
 * the pixel work of a full decode is work no one looks at.
 *
 * Nothing here touches Python: module.c calls it with the GIL released. Any libjpeg error or
 * warning (corrupt or truncated data, an unsupported colour space) fails the request, and
 * module.c raises RegionDecodeError; the Python side then decodes the record with Pillow, which
 * gives the image or the documented error, so this path never decides what a bad record means.
 */
#include <stdlib.h>
#include <string.h>

#include "jpeg_errors.h"
#include "jpeg_region.h"
#include "jpeg_splice.h"

/* Columns and rows decoded beyond each side of the box, then dropped: a cropped decode treats
 * its edges as the image's edges when it upsamples chroma; this margin keeps the kept pixels
 * identical to a full decode's. */
#define MARGIN 16

int fastload_jpeg_header(struct jpeg_decompress_struct *cinfo, Request *req) {
    jpeg_create_decompress(cinfo);
    jpeg_mem_src(cinfo, req->data, (unsigned long)req->length);
    jpeg_read_header(cinfo, TRUE);
    req->image_width = cinfo->image_width;
    req->image_height = cinfo->image_height;
    if ((double)cinfo->image_width * (double)cinfo->image_height > (double)req->max_pixels) {
        req->status = 3;
        return 0;
    }
    return 1;
}

static void decode(Request *req) {
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;

    memset(&cinfo, 0, sizeof cinfo);
    req->pixels = NULL;
    cinfo.err = fastload_jpeg_errors(&err);
    if (setjmp(err.jump)) {
        req->status = 1;
        memcpy(req->message, err.message, sizeof req->message);
        free(req->pixels);
        req->pixels = NULL;
        goto done;
    }
    if (!fastload_jpeg_header(&cinfo, req)) {
        goto done;
    }
    /* Grey stays grey when asked (the resize writes it to all three channels); CMYK/YCCK raise
     * (Pillow converts them). */
    req->channels = req->grey && cinfo.jpeg_color_space == JCS_GRAYSCALE ? 1 : 3;
    cinfo.out_color_space = req->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)req->scale;
    jpeg_start_decompress(&cinfo);
    /* Clamp the box to the image at this scale. */
    if (req->right > (int)cinfo.output_width) req->right = (int)cinfo.output_width;
    if (req->bottom > (int)cinfo.output_height) req->bottom = (int)cinfo.output_height;
    if (req->left >= req->right || req->top >= req->bottom) {
        req->status = 2;
        goto done;
    }
    {
        int height = req->bottom - req->top;
        int first = req->left > MARGIN ? req->left - MARGIN : 0;
        int end = req->right + MARGIN < (int)cinfo.output_width ? req->right + MARGIN
                                                                 : (int)cinfo.output_width;
        JDIMENSION x = (JDIMENSION)first, span = (JDIMENSION)(end - first);
        int skip = req->top > MARGIN ? req->top - MARGIN : 0;
        int y;

        jpeg_crop_scanline(&cinfo, &x, &span); /* x moves left to an iMCU boundary */
        /* Rows land in place: the box starts `offset` bytes into each. */
        req->stride = (ptrdiff_t)cinfo.output_width * req->channels;
        req->offset = (req->left - (int)x) * req->channels;
        req->pixels = malloc((size_t)req->stride * (size_t)height + READ_PAST);
        if (req->pixels == NULL) {
            req->status = 4;
            goto done;
        }
        if (skip > 0) {
            jpeg_skip_scanlines(&cinfo, (JDIMENSION)skip);
        }
        for (y = skip; y < req->top; y++) { /* the margin rows: decoded for context, dropped */
            JSAMPROW rows[1] = {req->pixels};
            jpeg_read_scanlines(&cinfo, rows, 1);
        }
        for (y = 0; y < height; y++) {
            JSAMPROW rows[1] = {req->pixels + (ptrdiff_t)y * req->stride};
            jpeg_read_scanlines(&cinfo, rows, 1);
        }
        req->status = 0;
    }
done:
    jpeg_destroy_decompress(&cinfo); /* also ends a decompression stopped part-way */
}

/* The image's size at 1/scale (what a decode at that scale gives), from its header. */
static void measure(Request *req) {
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;

    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = fastload_jpeg_errors(&err);
    if (setjmp(err.jump)) {
        req->status = 1;
        memcpy(req->message, err.message, sizeof req->message);
        jpeg_destroy_decompress(&cinfo);
        return;
    }
    fastload_jpeg_header(&cinfo, req); /* over the limit: status 3, and the size still measured */
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)req->scale;
    jpeg_calc_output_dimensions(&cinfo);
    req->image_width = cinfo.output_width;
    req->image_height = cinfo.output_height;
    jpeg_destroy_decompress(&cinfo);
}

/* The box's corner, in original pixels, moved by `by` scaled pixels and kept within int. */
static int original_pixels(int scaled, int by, int scale) {
    long long v = ((long long)scaled + by) * scale;
    return v > 0x3FFFFFFF ? 0x3FFFFFFF : (v < 0 ? 0 : (int)v);
}

/* Decode from the box's restart intervals alone when the JPEG has intervals that tile its rows
 * (jpeg_splice.c); otherwise, or when the cut would be the whole image, from the whole file. The
 * cut reaches MARGIN pixels past the box too, so the pixels are those of a whole-file decode. */
static void decode_cut_or_whole(Request *req) {
    JpegCut cut;
    Request part;
    int s = req->scale, dx, dy;

    if (!fastload_jpeg_cut(req->data, req->length, original_pixels(req->left, -MARGIN, s),
                           original_pixels(req->top, -MARGIN, s),
                           original_pixels(req->right, MARGIN, s),
                           original_pixels(req->bottom, MARGIN, s), req->max_pixels, &cut)) {
        decode(req);
        return;
    }
    dx = cut.x / s; /* whole scaled pixels: cuts start on MCU edges, 8 or 16 pixels apart */
    dy = cut.y / s;
    part = *req;
    part.data = cut.data;
    part.length = cut.length;
    part.left -= dx;
    part.right -= dx;
    part.top -= dy;
    part.bottom -= dy;
    decode(&part);
    free(cut.data);
    part.data = req->data;
    part.length = req->length;
    part.left += dx;
    part.right += dx;
    part.top += dy;
    part.bottom += dy;
    *req = part;
}

void fastload_jpeg_decode_box(Request *req, int cut) {
    if (cut) {
        decode_cut_or_whole(req);
    } else {
        decode(req);
    }
}

void fastload_jpeg_crop_into(Request *req, double box[4], int crop_first, int cut, int out_width,
                             int out_height, const Target *target) {
    Crop crop;
    int ok;

    measure(req);
    if (req->status == 0 &&
        !fastload_clamp_box(box, (int)req->image_width, (int)req->image_height)) {
        req->status = 5;
    }
    if (req->status == 0 && !fastload_crop(&crop, (int)req->image_width, (int)req->image_height,
                                           box[0], box[1], box[2], box[3], crop_first, out_width,
                                           out_height)) {
        req->status = 4;
    } else if (req->status == 0) {
        /* Decode what the resize reads, no more. */
        req->left = crop.x.begin;
        req->top = crop.y.begin;
        req->right = crop.x.end;
        req->bottom = crop.y.end;
        fastload_jpeg_decode_box(req, cut);
        if (req->status == 0) {
            Source source = {req->pixels + req->offset, req->stride, req->channels, req->left,
                             req->top,
                             req->pixels + req->stride * (req->bottom - req->top) + READ_PAST};
            ok = req->left == crop.x.begin && req->top == crop.y.begin &&
                 req->right == crop.x.end &&
                 req->bottom == crop.y.end; /* never clamped: the axes lie inside the image */
            req->status = !ok ? 5 : (fastload_resample(&crop, &source, target) ? 0 : 4);
        }
        free(req->pixels);
        fastload_crop_free(&crop);
    }
}
