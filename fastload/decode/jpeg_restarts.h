/* A JPEG rewritten losslessly with restart markers that tile its rows (jpeg_restarts.c). */
#ifndef FASTLOAD_JPEG_RESTARTS_H
#define FASTLOAD_JPEG_RESTARTS_H

#include <stddef.h>
#include <stdio.h>

#include <jpeglib.h>

/* Rewrite a JPEG losslessly (the same DCT coefficients) as baseline with a restart marker every
 * interval_mcus MCUs (jpeg_restarts.c). Returns the new bytes (malloc'd, *length set) or NULL
 * with message filled. */
unsigned char *fastload_jpeg_add_restarts(const unsigned char *data, size_t length,
                                          int target_width, size_t *out_length, int *interval_mcus,
                                          char message[JMSG_LENGTH_MAX]);

#endif
