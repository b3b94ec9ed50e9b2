/* Decode stage, native part: the pixel cache's colours. Stored planes are JFIF's YCbCr (full
 * range, BT.601 weights: what a JPEG holds); a crop's planes, resized to the output, become RGB in
 * its batch slot with libjpeg's decompression arithmetic (jdcolor.c: 16-bit fixed point,
 * rounded), and an image the fill cannot read as planes (Pillow's RGB at its stored size) becomes
 * planes with libjpeg's compression arithmetic (jccolor.c), each chroma sample the mean of the
 * 2 x 2 pixels it covers (the last row or column counted twice where a side is odd). The loops
 * are plain C that the compiler vectorises, built twice where the CPU may have AVX2: the same
 * integer arithmetic, so the same bytes either way.
 */
#include "fill_colour.h"

#include <stdint.h>

#include "cpu_features.h"

#define SCALE 16
#define FIX(x) ((int32_t)((x) * (1 << SCALE) + 0.5))
#define HALF (1 << (SCALE - 1))

static inline unsigned char clamp8(int32_t v) {
    return (unsigned char)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

#define RGB_ROW_BODY                                                                              \
    for (j = 0; j < n; j++) {                                                                     \
        int32_t luma = y[j], u = cb[j] - 128, v = cr[j] - 128;                                    \
        r[j] = clamp8(luma + ((FIX(1.40200) * v + HALF) >> SCALE));                               \
        g[j] = clamp8(luma + ((-FIX(0.34414) * u - FIX(0.71414) * v + HALF) >> SCALE));           \
        b[j] = clamp8(luma + ((FIX(1.77200) * u + HALF) >> SCALE));                               \
    }

static void rgb_row(const unsigned char *restrict y, const unsigned char *restrict cb,
                    const unsigned char *restrict cr, int n, unsigned char *restrict r,
                    unsigned char *restrict g, unsigned char *restrict b) {
    int j;
    RGB_ROW_BODY
}

#ifdef X86_FAST_PATHS
__attribute__((target("avx2"))) static void rgb_row_avx2(
    const unsigned char *restrict y, const unsigned char *restrict cb,
    const unsigned char *restrict cr, int n, unsigned char *restrict r, unsigned char *restrict g,
    unsigned char *restrict b) {
    int j;
    RGB_ROW_BODY
}
#endif

void fastload_ycc_store(const unsigned char *y, const unsigned char *cb, const unsigned char *cr,
                        int width, const Target *target) {
    unsigned char *r = target->pixels, *g = r + target->stride_c, *b = g + target->stride_c;
    int j;
    if (target->stride_x == 1 && target->stride_c >= width) { /* a CHW slot of a batch tensor */
#ifdef X86_FAST_PATHS
        if (fastload_has_avx2()) {
            rgb_row_avx2(y, cb, cr, width, r, g, b);
            return;
        }
#endif
        rgb_row(y, cb, cr, width, r, g, b);
        return;
    }
    for (j = 0; j < width; j++) { /* any other strides, a pixel at a time */
        unsigned char rgb[3];
        ptrdiff_t at = (ptrdiff_t)j * target->stride_x;
        rgb_row(y + j, cb + j, cr + j, 1, &rgb[0], &rgb[1], &rgb[2]);
        r[at] = rgb[0];
        g[at] = rgb[1];
        b[at] = rgb[2];
    }
}

/* One pixel's chroma before its scale and offset (jccolor.c's sums). */
static inline int32_t blue(const unsigned char *p) {
    return -FIX(0.16874) * p[0] - FIX(0.33126) * p[1] + FIX(0.50000) * p[2];
}

static inline int32_t red(const unsigned char *p) {
    return FIX(0.50000) * p[0] - FIX(0.41869) * p[1] - FIX(0.08131) * p[2];
}

void fastload_rgb_to_planes(const unsigned char *rgb, int width, int height,
                              unsigned char *out) {
    int chroma_width = (width + 1) / 2, chroma_height = (height + 1) / 2, i, j;
    unsigned char *cb = out + (size_t)width * (size_t)height;
    unsigned char *cr = cb + (size_t)chroma_width * (size_t)chroma_height;
    size_t stride = (size_t)width * 3;
    for (i = 0; i < height; i++) {
        const unsigned char *p = rgb + (size_t)i * stride;
        unsigned char *y = out + (size_t)i * (size_t)width;
        for (j = 0; j < width; j++, p += 3) {
            y[j] = (unsigned char)((FIX(0.29900) * p[0] + FIX(0.58700) * p[1] +
                                    FIX(0.11400) * p[2] + HALF) >> SCALE);
        }
    }
    for (i = 0; i < chroma_height; i++) {
        const unsigned char *top = rgb + (size_t)(2 * i) * stride;
        const unsigned char *bottom = 2 * i + 1 < height ? top + stride : top;
        for (j = 0; j < chroma_width; j++) {
            size_t left = (size_t)(2 * j) * 3, right = 2 * j + 1 < width ? left + 3 : left;
            int32_t u = blue(top + left) + blue(top + right) + blue(bottom + left) +
                        blue(bottom + right);
            int32_t v = red(top + left) + red(top + right) + red(bottom + left) +
                        red(bottom + right);
            /* the mean of four, offset to 128, rounded */
            cb[(size_t)i * (size_t)chroma_width + (size_t)j] =
                clamp8((u + (128 << (SCALE + 2)) + (1 << (SCALE + 1))) >> (SCALE + 2));
            cr[(size_t)i * (size_t)chroma_width + (size_t)j] =
                clamp8((v + (128 << (SCALE + 2)) + (1 << (SCALE + 1))) >> (SCALE + 2));
        }
    }
}
