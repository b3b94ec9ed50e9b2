/* Decode stage, native part: a crop's restart intervals cut out into a JPEG of their own.
 *
 * A baseline JPEG's scan is one stream of Huffman codes: to reach a block, a decoder reads every
 * code before it. A restart marker (RSTn) ends that dependence: each restart interval starts on a
 * byte boundary with fresh DC predictions. When the intervals tile the MCU rows (the interval
 * divides the MCUs in a row, as `fastload pack --restart-markers` writes them), the intervals
 * under a crop box form a smaller JPEG: the same headers with the box's width and height, those
 * intervals in raster order with their RST numbers counted anew, and an end marker. Decoding it
 * gives the box's pixels without entropy-decoding a single block outside the box's columns and
 * rows. This file only moves bytes; libjpeg decodes the result (jpeg_region.c).
 */
#include <stdlib.h>
#include <string.h>

#include "jpeg_splice.h"

typedef struct {
    size_t header_end;            /* first byte of the entropy-coded data */
    size_t size_at;               /* offset of the frame header's height (then width), 2 bytes each */
    int width, height, mcu_width, mcu_height, interval;
} Layout;

static int read16(const unsigned char *p) { return (p[0] << 8) | p[1]; }

/* The headers up to the scan: a baseline (SOF0/SOF1) frame with one scan holding every
 * component, and its restart interval. 0 for anything else. */
static int read_layout(const unsigned char *data, size_t length, Layout *layout) {
    size_t pos = 2;
    int components = 0, h_max = 1, v_max = 1, i;

    memset(layout, 0, sizeof *layout);
    if (length < 4 || data[0] != 0xFF || data[1] != 0xD8) {
        return 0;
    }
    while (pos + 4 <= length) {
        int marker, segment;
        if (data[pos] != 0xFF) {
            return 0;
        }
        marker = data[pos + 1];
        if (marker == 0xFF) { /* fill byte */
            pos++;
            continue;
        }
        segment = read16(data + pos + 2);
        if (segment < 2 || pos + 2 + (size_t)segment > length) {
            return 0;
        }
        const unsigned char *body = data + pos + 4;
        if (marker == 0xC0 || marker == 0xC1) {
            if (segment < 8 || body[0] != 8) {
                return 0;
            }
            layout->size_at = pos + 5;
            layout->height = read16(body + 1);
            layout->width = read16(body + 3);
            components = body[5];
            if (components < 1 || segment < 8 + 3 * components) {
                return 0;
            }
            for (i = 0; i < components; i++) {
                int h = body[7 + 3 * i] >> 4, v = body[7 + 3 * i] & 15;
                h_max = h > h_max ? h : h_max;
                v_max = v > v_max ? v : v_max;
            }
        } else if ((marker >= 0xC2 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
                    marker != 0xCC) || marker == 0xDC) {
            return 0; /* progressive, lossless, arithmetic-coded, or a DNL-sized frame */
        } else if (marker == 0xDD) {
            if (segment < 4) {
                return 0;
            }
            layout->interval = read16(body);
        } else if (marker == 0xDA) {
            if (components == 0 || layout->width == 0 || layout->height == 0 ||
                body[0] != components) {
                return 0; /* no frame yet, or a scan without every component */
            }
            /* One component alone: its MCU is one 8x8 block, whatever its sampling factors. */
            layout->mcu_width = components == 1 ? 8 : 8 * h_max;
            layout->mcu_height = components == 1 ? 8 : 8 * v_max;
            layout->header_end = pos + 2 + (size_t)segment;
            return layout->interval > 0;
        }
        pos += 2 + (size_t)segment;
    }
    return 0;
}

/* Where each restart interval's bytes start and end, up to interval `last` (ended by its RSTn, or
 * by the end-of-image marker); 0 when the scan does not hold them in order (another marker, an
 * RST out of sequence, the image ending early, or data cut short). */
static int find_intervals(const unsigned char *data, size_t length, size_t pos, int last,
                          size_t *starts, size_t *ends) {
    int k = 0;
    starts[0] = pos;
    while (pos + 1 < length) {
        const unsigned char *ff = memchr(data + pos, 0xFF, length - pos - 1);
        size_t at;
        int marker;
        if (ff == NULL) {
            return 0;
        }
        at = (size_t)(ff - data);
        pos = at + 1;
        while (pos < length && data[pos] == 0xFF) { /* fill bytes before a marker */
            pos++;
        }
        if (pos >= length) {
            return 0;
        }
        marker = data[pos++];
        if (marker == 0x00) { /* a stuffed 0xFF data byte */
            continue;
        }
        if (marker == 0xD0 + (k & 7) || (marker == 0xD9 && k == last)) {
            ends[k] = at;
            if (k == last) {
                return 1;
            }
            starts[++k] = pos;
            continue;
        }
        return 0;
    }
    return 0;
}

int fastload_jpeg_cut(const unsigned char *data, size_t length, int left, int top, int right,
                      int bottom, long max_pixels, JpegCut *cut) {
    Layout layout;
    int per_row, intervals_per_row, rows, c0, c1, r0, r1, last, r, c, n = 0;
    size_t *starts, *ends, size, at;
    unsigned char *out;

    if (!read_layout(data, length, &layout) ||
        (double)layout.width * (double)layout.height > (double)max_pixels) {
        return 0;
    }
    per_row = (layout.width + layout.mcu_width - 1) / layout.mcu_width;
    rows = (layout.height + layout.mcu_height - 1) / layout.mcu_height;
    if (per_row % layout.interval != 0) {
        return 0; /* intervals run across rows: no rectangle of them exists */
    }
    intervals_per_row = per_row / layout.interval;
    /* The box, clamped, in intervals (columns) and MCU rows. */
    left = left < 0 ? 0 : left;
    top = top < 0 ? 0 : top;
    right = right > layout.width ? layout.width : right;
    bottom = bottom > layout.height ? layout.height : bottom;
    if (left >= right || top >= bottom) {
        return 0;
    }
    c0 = left / layout.mcu_width / layout.interval;
    c1 = ((right + layout.mcu_width - 1) / layout.mcu_width + layout.interval - 1) / layout.interval;
    r0 = top / layout.mcu_height;
    r1 = (bottom + layout.mcu_height - 1) / layout.mcu_height;
    if (c0 == 0 && c1 == intervals_per_row && r0 == 0 && r1 == rows) {
        return 0; /* the whole image: nothing to cut */
    }
    last = (r1 - 1) * intervals_per_row + c1 - 1;
    starts = malloc(sizeof(size_t) * (size_t)(last + 1) * 2);
    if (starts == NULL) {
        return 0;
    }
    ends = starts + last + 1;
    if (!find_intervals(data, length, layout.header_end, last, starts, ends)) {
        free(starts);
        return 0;
    }
    size = layout.header_end + 2;
    for (r = r0; r < r1; r++) {
        for (c = c0; c < c1; c++) {
            int k = r * intervals_per_row + c;
            size += ends[k] - starts[k] + 2;
        }
    }
    out = malloc(size);
    if (out == NULL) {
        free(starts);
        return 0;
    }
    memcpy(out, data, layout.header_end);
    cut->x = c0 * layout.interval * layout.mcu_width;
    cut->y = r0 * layout.mcu_height;
    {
        int width = (c1 * layout.interval * layout.mcu_width < layout.width
                         ? c1 * layout.interval * layout.mcu_width : layout.width) - cut->x;
        int height = (r1 * layout.mcu_height < layout.height ? r1 * layout.mcu_height
                                                             : layout.height) - cut->y;
        out[layout.size_at] = (unsigned char)(height >> 8);
        out[layout.size_at + 1] = (unsigned char)height;
        out[layout.size_at + 2] = (unsigned char)(width >> 8);
        out[layout.size_at + 3] = (unsigned char)width;
    }
    at = layout.header_end;
    for (r = r0; r < r1; r++) {
        for (c = c0; c < c1; c++) {
            int k = r * intervals_per_row + c;
            if (n > 0) { /* RST numbers count 0..7 over again in the cut */
                out[at++] = 0xFF;
                out[at++] = (unsigned char)(0xD0 + ((n - 1) & 7));
            }
            memcpy(out + at, data + starts[k], ends[k] - starts[k]);
            at += ends[k] - starts[k];
            n++;
        }
    }
    out[at++] = 0xFF;
    out[at++] = 0xD9;
    free(starts);
    cut->data = out;
    cut->length = at;
    return 1;
}
