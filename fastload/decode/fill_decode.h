/* A JPEG decoded whole and resized to the pixel cache's stored size as its rows come out of the
 * decoder (fill_decode.c). */
#ifndef FASTLOAD_FILL_DECODE_H
#define FASTLOAD_FILL_DECODE_H

#include "jpeg_region.h"

/* Decode req's JPEG whole at 1/req->scale to RGB (grey too) and resize it to out_width x
 * out_height into out (packed rows), every scanline read and the file checked to its end. Sets
 * req->status as fastload_jpeg_decode_box does (5: the image at that scale is smaller than the
 * output, which the fill never enlarges). */
void fastload_jpeg_fill(Request *req, unsigned char *out, int out_width, int out_height);

#endif
