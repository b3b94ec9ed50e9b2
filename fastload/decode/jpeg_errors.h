/* libjpeg errors for the native JPEG code: each error and warning stops the call. */
#ifndef FASTLOAD_JPEG_ERRORS_H
#define FASTLOAD_JPEG_ERRORS_H

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

#endif
