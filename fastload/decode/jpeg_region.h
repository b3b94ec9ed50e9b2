/* A JPEG's crop box decoded without the pixels around it, and a crop of it resized straight into
 * a target (jpeg_region.c). */
#ifndef FASTLOAD_JPEG_REGION_H
#define FASTLOAD_JPEG_REGION_H

#include <stddef.h>
#include <stdio.h>

#include <jpeglib.h>

#include "resample.h"

typedef struct {
    const unsigned char *data;
    size_t length;
    int scale, left, top, right, bottom; /* the box asked for, in scaled pixels */
    long max_pixels;
    int grey;                             /* a greyscale JPEG decodes to one channel, not RGB */
    /* results */
    unsigned char *pixels; /* malloc'd: the box's rows, `stride` bytes apart, from byte `offset` */
    ptrdiff_t stride;
    int offset, channels;
    JDIMENSION image_width, image_height;
    char message[JMSG_LENGTH_MAX];
    int status; /* 0 ok, 1 libjpeg error, 2 empty box, 3 over max_pixels, 4 no memory,
                 * 5 box past the image's edge */
} Request;

/* Start reading req's JPEG into cinfo (created, its header read; libjpeg's errors jump to the
 * caller's setjmp) and note its size in req; 0, with req->status 3, when it is over the pixel
 * limit. */
int fastload_jpeg_header(struct jpeg_decompress_struct *cinfo, Request *req);

/* Decode the box [left, right) x [top, bottom) of req's JPEG at 1/scale (the box in scaled
 * pixels, clamped to the image). With cut, from the box's restart intervals alone when the JPEG
 * has intervals that tile its rows, else from the whole file. Sets req->status; when 0, pixels
 * holds the box's rows (the caller frees it). */
void fastload_jpeg_decode_box(Request *req, int cut);

/* The crop box (x0, y0)-(x1, y1) of req's JPEG at 1/scale (scaled pixels) resized into target,
 * out_width x out_height, as Pillow's resize(box=) would, cut out first when crop_first and its
 * corners are whole pixels: only the rows and columns the resize reads are decoded (cut: as in
 * fastload_jpeg_decode_box). Sets req->status (5: the box reaches past the image's edge). */
void fastload_jpeg_crop_into(Request *req, double box[4], int crop_first, int cut, int out_width,
                             int out_height, const Target *target);

#endif
