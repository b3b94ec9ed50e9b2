/* A JPEG decoded whole into the pixel cache's planes, each resized to its stored size as its rows
 * come out of the decoder (fill_decode.c). */
#ifndef FASTLOAD_FILL_DECODE_H
#define FASTLOAD_FILL_DECODE_H

#include "jpeg_region.h"

/* Decode req's JPEG whole at 1/req->scale to its planes and resize them into out: Y out_width x
 * out_height, then Cb and Cr each ceil(out_width / 2) x ceil(out_height / 2), packed rows; every
 * row read and the file checked to its end. Sets req->status as fastload_jpeg_decode_box does (5:
 * the image at that scale is smaller than the output, which the fill never enlarges; 6: not a
 * YCbCr or grey JPEG the fill reads). */
void fastload_jpeg_fill(Request *req, unsigned char *out, int out_width, int out_height);

#endif
