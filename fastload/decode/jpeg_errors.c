/* Native JPEG code, both stages: libjpeg's error manager, which turns warnings into errors too and
 * jumps back to the caller with libjpeg's message instead of exiting. */
#include "jpeg_errors.h"

static void stop_on_error(j_common_ptr cinfo) {
    ErrorManager *err = (ErrorManager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void stop_on_warning(j_common_ptr cinfo, int level) {
    /* level < 0: a warning (corrupt data that libjpeg would paper over); >= 0: trace output. */
    if (level < 0) {
        stop_on_error(cinfo);
    }
}

struct jpeg_error_mgr *fastload_jpeg_errors(ErrorManager *err) {
    struct jpeg_error_mgr *pub = jpeg_std_error(&err->pub);
    pub->error_exit = stop_on_error;
    pub->emit_message = stop_on_warning;
    err->message[0] = '\0';
    return pub;
}
