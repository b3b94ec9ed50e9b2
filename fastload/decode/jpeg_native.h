/* What the native JPEG code shares: libjpeg's error handling, and the cut a splice makes. */
#ifndef FASTLOAD_JPEG_NATIVE_H
#define FASTLOAD_JPEG_NATIVE_H

#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>

#include <jpeglib.h>

/* libjpeg reports errors through a callback that must not return: it jumps back here. Warnings
 * (corrupt data libjpeg would paper over) are errors too, so a damaged record is never half read. */
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} ErrorManager;

/* Point cinfo's errors at err; the caller then does setjmp(err->jump). */
struct jpeg_error_mgr *fastload_jpeg_errors(ErrorManager *err);

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

/* Rewrite a JPEG losslessly (the same DCT coefficients) as baseline with a restart marker every
 * interval_mcus MCUs (jpeg_restarts.c). Returns the new bytes (malloc'd, *length set) or NULL
 * with message filled. */
unsigned char *fastload_jpeg_add_restarts(const unsigned char *data, size_t length,
                                          int target_width, size_t *out_length, int *interval_mcus,
                                          char message[JMSG_LENGTH_MAX]);

#endif
