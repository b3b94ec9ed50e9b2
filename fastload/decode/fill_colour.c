/* Decode stage, native part: the pixel cache's colours. Stored planes are JFIF's YCbCr (full
 * range, BT.601 weights: what a JPEG holds); a crop's planes, resized to the output, become RGB in
 * its batch slot with libjpeg's decompression arithmetic (jdcolor.c: 16-bit fixed point,
 * rounded) after their chroma, resized to half the output, is upsampled as libjpeg's "fancy"
 * upsampling does it (jdsample.c's h2v2, rounded alike each way), and an image the fill cannot read as planes (Pillow's RGB at its stored size) becomes
 * planes with libjpeg's compression arithmetic (jccolor.c), each chroma sample the mean of the
 * 2 x 2 pixels it covers (the last row or column counted twice where a side is odd). The loops
 * are plain C that the compiler vectorises, built twice where the CPU may have AVX2 (the
 * upsampling's AVX2 loop written out by hand): the same integer arithmetic, so the same bytes
 * either way.
 */
#include "fill_colour.h"

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

/* libjpeg's h2v2 "fancy" upsampling (jdsample.c), rounded alike either way (+8 where libjpeg
 * adds 8 and 7 by turns), so that a mirrored half row upsamples to the mirrored row: each column
 * 3 x the nearer row + the farther, then each pixel 3 x its column + its neighbour, over 16. */
static void upsample(const unsigned char *restrict near, const unsigned char *restrict far, int n,
                     int16_t *restrict sum, unsigned char *restrict out) {
    int k;
    for (k = 0; k < n; k++) {
        sum[k + 1] = (int16_t)(3 * near[k] + far[k]);
    }
    sum[0] = sum[1];
    sum[n + 1] = sum[n];
    for (k = 0; k < n; k++) {
        int16_t mid = (int16_t)(3 * sum[k + 1] + 8);
        out[2 * k] = (unsigned char)((mid + sum[k]) >> 4);
        out[2 * k + 1] = (unsigned char)((mid + sum[k + 2]) >> 4);
    }
}

#ifdef X86_FAST_PATHS
/* Sixteen samples a step; each even output byte and the odd one after it leave as one 16-bit
 * word (little-endian: the even byte first), so no shuffle interleaves them. */
__attribute__((target("avx2"))) static void upsample_avx2(const unsigned char *restrict near,
                                                          const unsigned char *restrict far, int n,
                                                          int16_t *restrict sum,
                                                          unsigned char *restrict out) {
    const __m256i eight = _mm256_set1_epi16(8);
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        __m256i a = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(near + k)));
        __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(far + k)));
        _mm256_storeu_si256((__m256i *)(sum + k + 1),
                            _mm256_add_epi16(_mm256_add_epi16(a, _mm256_add_epi16(a, a)), b));
    }
    for (; k < n; k++) {
        sum[k + 1] = (int16_t)(3 * near[k] + far[k]);
    }
    sum[0] = sum[1];
    sum[n + 1] = sum[n];
    for (k = 0; k + 16 <= n; k += 16) {
        __m256i left = _mm256_loadu_si256((const __m256i *)(sum + k));
        __m256i mid = _mm256_loadu_si256((const __m256i *)(sum + k + 1));
        __m256i right = _mm256_loadu_si256((const __m256i *)(sum + k + 2));
        mid = _mm256_add_epi16(_mm256_add_epi16(mid, _mm256_add_epi16(mid, mid)), eight);
        __m256i even = _mm256_srli_epi16(_mm256_add_epi16(mid, left), 4);
        __m256i odd = _mm256_srli_epi16(_mm256_add_epi16(mid, right), 4);
        _mm256_storeu_si256((__m256i *)(out + 2 * k),
                            _mm256_or_si256(even, _mm256_slli_epi16(odd, 8)));
    }
    for (; k < n; k++) {
        int16_t mid = (int16_t)(3 * sum[k + 1] + 8);
        out[2 * k] = (unsigned char)((mid + sum[k]) >> 4);
        out[2 * k + 1] = (unsigned char)((mid + sum[k + 2]) >> 4);
    }
}
#endif

void fastload_chroma_upsample(const unsigned char *near, const unsigned char *far, int n,
                              int16_t *sum, unsigned char *out) {
#ifdef X86_FAST_PATHS
    if (fastload_has_avx2()) {
        upsample_avx2(near, far, n, sum, out);
        return;
    }
#endif
    upsample(near, far, n, sum, out);
}

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
