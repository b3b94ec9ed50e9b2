/* A crop's restart intervals cut out of a JPEG into a JPEG of their own (jpeg_splice.c). */
#ifndef FASTLOAD_JPEG_SPLICE_H
#define FASTLOAD_JPEG_SPLICE_H

#include <stddef.h>

/* A smaller JPEG that holds only some restart intervals of another (jpeg_splice.c). */
typedef struct {
    unsigned char *data; /* malloc'd; the caller frees it */
    size_t length;
    int x, y;            /* where the cut's top-left pixel lies in the original image */
} JpegCut;

/* Cut the restart intervals that cover [left, right) x [top, bottom) (original pixels) out of a
 * baseline JPEG whose restart intervals tile its MCU rows. Returns 1 and fills cut, or 0 when the
 * file cannot be cut that way (no restart markers, progressive, intervals across rows, a box that
 * needs the whole image, malformed data) or max_pixels refuses it: then decode the original. */
int fastload_jpeg_cut(const unsigned char *data, size_t length, int left, int top, int right,
                      int bottom, long max_pixels, JpegCut *cut);

#endif
