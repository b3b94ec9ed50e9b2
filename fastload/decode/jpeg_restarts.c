/* Pack stage, native part: a JPEG rewritten losslessly with restart markers that tile its rows.
 *
 * libjpeg reads the DCT coefficients (every block entropy-decoded: the file is checked whole)
 * and writes the very same coefficients again as a baseline JPEG with optimised Huffman tables
 * and a restart marker every few MCUs. Decoders give the same pixels as before; the loader can
 * then cut a crop's intervals out (jpeg_splice.c) instead of reading every row above the crop.
 * APPn and COM segments (EXIF, ICC profiles, comments) are kept.
 */
#include <stdlib.h>
#include <string.h>

#include "jpeg_errors.h"
#include "jpeg_restarts.h"

#include <jerror.h>

/* Each marker costs about 5 bytes (the marker, padding to a byte, DC values sent whole): an
 * interval should hold at least this many bytes of scan data. */
#define MIN_INTERVAL_BYTES 128

/* A restart interval, in MCUs, that divides the MCUs in a row (so intervals never run from one
 * row into the next): the widest at most target_width pixels wide, unless that holds under
 * MIN_INTERVAL_BYTES (smooth or tiny images), then the narrowest that holds that much. */
static int interval_for(int per_row, int rows, int mcu_width, int target_width, size_t length) {
    double bytes_per_mcu = (double)length / ((double)per_row * (double)rows);
    int best = 1, d;
    for (d = 1; d <= per_row && d * mcu_width <= target_width; d++) {
        if (per_row % d == 0) {
            best = d;
        }
    }
    for (d = best; d < per_row && (per_row % d != 0 || d * bytes_per_mcu < MIN_INTERVAL_BYTES); d++) {
    }
    return d;
}

/* Whether libjpeg writes this segment itself (the JFIF or Adobe header), so copying it would
 * write it twice. */
static int written_anyway(const struct jpeg_compress_struct *dst, jpeg_saved_marker_ptr m) {
    if (m->marker == JPEG_APP0 && dst->write_JFIF_header && m->data_length >= 5 &&
        memcmp(m->data, "JFIF\0", 5) == 0) {
        return 1;
    }
    return m->marker == JPEG_APP0 + 14 && dst->write_Adobe_marker && m->data_length >= 5 &&
           memcmp(m->data, "Adobe", 5) == 0;
}

/* Where the rewritten file goes: one buffer this file owns, doubled as it fills (libjpeg's own
 * memory destination frees and replaces its buffer behind the caller's pointer, so after an error
 * nobody could tell which one to free). */
typedef struct {
    struct jpeg_destination_mgr pub;
    unsigned char *buffer;
    size_t size;
    j_compress_ptr owner;
} Sink;

static void sink_start(j_compress_ptr cinfo) { (void)cinfo; }

static boolean sink_grow(j_compress_ptr cinfo) {
    Sink *sink = (Sink *)cinfo->dest;
    unsigned char *bigger = realloc(sink->buffer, sink->size * 2);
    if (bigger == NULL) {
        ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 10);
    }
    sink->pub.next_output_byte = bigger + sink->size;
    sink->pub.free_in_buffer = sink->size;
    sink->buffer = bigger;
    sink->size *= 2;
    return TRUE;
}

static void sink_end(j_compress_ptr cinfo) { (void)cinfo; }

unsigned char *fastload_jpeg_add_restarts(const unsigned char *data, size_t length,
                                          int target_width, size_t *out_length, int *interval_mcus,
                                          char message[JMSG_LENGTH_MAX]) {
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    ErrorManager src_err, dst_err;
    Sink sink;
    volatile int dst_created = 0;
    unsigned char *result = NULL;

    memset(&src, 0, sizeof src);
    memset(&dst, 0, sizeof dst);
    memset(&sink, 0, sizeof sink);
    src.err = fastload_jpeg_errors(&src_err);
    dst.err = fastload_jpeg_errors(&dst_err);
    if (setjmp(src_err.jump)) {
        memcpy(message, src_err.message, JMSG_LENGTH_MAX);
        goto done;
    }
    if (setjmp(dst_err.jump)) {
        memcpy(message, dst_err.message, JMSG_LENGTH_MAX);
        goto done;
    }
    /* Same size as the input to start: lossless rewrites come out about as large. */
    sink.size = length + 4096;
    sink.buffer = malloc(sink.size);
    if (sink.buffer == NULL) {
        strcpy(message, "out of memory");
        return NULL;
    }
    jpeg_create_decompress(&src);
    jpeg_mem_src(&src, data, (unsigned long)length);
    jpeg_save_markers(&src, JPEG_COM, 0xFFFF);
    for (int i = 0; i < 16; i++) {
        jpeg_save_markers(&src, JPEG_APP0 + i, 0xFFFF);
    }
    jpeg_read_header(&src, TRUE);
    {
        jvirt_barray_ptr *coefficients = jpeg_read_coefficients(&src);
        int mcu_width = 8, mcu_height = 8, per_row, rows;
        jpeg_saved_marker_ptr m;

        jpeg_create_compress(&dst);
        dst_created = 1;
        sink.pub.init_destination = sink_start;
        sink.pub.empty_output_buffer = sink_grow;
        sink.pub.term_destination = sink_end;
        sink.pub.next_output_byte = sink.buffer;
        sink.pub.free_in_buffer = sink.size;
        dst.dest = &sink.pub;
        jpeg_copy_critical_parameters(&src, &dst);
        dst.optimize_coding = TRUE;
        if (dst.num_components > 1) {
            for (int i = 0; i < dst.num_components; i++) {
                int h = dst.comp_info[i].h_samp_factor * 8, v = dst.comp_info[i].v_samp_factor * 8;
                mcu_width = h > mcu_width ? h : mcu_width;
                mcu_height = v > mcu_height ? v : mcu_height;
            }
        }
        per_row = (int)((src.image_width + (JDIMENSION)mcu_width - 1) / (JDIMENSION)mcu_width);
        rows = (int)((src.image_height + (JDIMENSION)mcu_height - 1) / (JDIMENSION)mcu_height);
        *interval_mcus = interval_for(per_row, rows, mcu_width, target_width, length);
        dst.restart_interval = (unsigned int)*interval_mcus;
        jpeg_write_coefficients(&dst, coefficients);
        for (m = src.marker_list; m != NULL; m = m->next) {
            if (!written_anyway(&dst, m)) {
                jpeg_write_marker(&dst, m->marker, m->data, m->data_length);
            }
        }
        jpeg_finish_compress(&dst);
        jpeg_finish_decompress(&src);
    }
    *out_length = sink.size - sink.pub.free_in_buffer;
    result = sink.buffer;
    sink.buffer = NULL;
done:
    if (dst_created) {
        jpeg_destroy_compress(&dst);
    }
    jpeg_destroy_decompress(&src);
    free(sink.buffer);
    return result;
}
