/* Decode stage, native part: the pixel cache's resize, one plane of bytes at a time (a decoded
 * plane to its stored size; a crop's box of a stored plane to the output).
 *
 * Pillow's bilinear filter (a triangle stretched by the reduction, so it antialiases), with
 * weights in 14-bit fixed point that sum exactly to 1 << 14, the rows pass first (each output
 * row made from the few decoded rows under it, while they are in cache) and then the columns
 * pass on that one row, each pass rounded to 8 bits. Not Pillow's bytes (its passes run in
 * another order with 22-bit weights; a pixel differs by a level at most, now and then), but the
 * same bytes on every CPU: the AVX2 paths add the same integer products as the plain C, so the
 * stored pixels of a record do not depend on the machine that stored them. Here: the axes and
 * the rows pass; the columns pass is fill_columns.c.
 */
#include "fill_resize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_features.h"

#define ONE (1 << FILL_BITS)
#define HALF FILL_HALF

static unsigned char clip8(int32_t sum) {
    int32_t v = (sum + HALF) >> FILL_BITS;
    return (unsigned char)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

int fastload_fill_axis(FillAxis *axis, int in_size, double in0, double in1, int out_size) {
    double scale = (in1 - in0) / out_size, stretch = scale < 1.0 ? 1.0 : scale;
    double inverse = 1.0 / stretch, *w;
    int i, t;

    memset(axis, 0, sizeof *axis);
    axis->in_size = in_size;
    axis->out_size = out_size;
    axis->first = malloc(sizeof(int) * (size_t)out_size);
    axis->count = malloc(sizeof(int) * (size_t)out_size);
    if (axis->first == NULL || axis->count == NULL) {
        fastload_fill_axis_free(axis);
        return 0;
    }
    for (i = 0; i < out_size; i++) { /* each output pixel's window, as Pillow's resize(box=) */
        double center = in0 + (i + 0.5) * scale;
        int lo = (int)(center - stretch + 0.5), hi = (int)(center + stretch + 0.5);
        lo = lo < 0 ? 0 : lo;
        hi = hi > in_size ? in_size : hi;
        axis->first[i] = lo;
        axis->count[i] = hi > lo ? hi - lo : 0;
        axis->max_count = axis->count[i] > axis->max_count ? axis->count[i] : axis->max_count;
    }
    /* four, or whole groups of eight, for the columns pass */
    axis->taps = axis->max_count <= 4 ? 4 : (axis->max_count + 7) / 8 * 8;
    axis->weights = calloc((size_t)out_size * (size_t)axis->taps, sizeof(int16_t));
    w = malloc(sizeof(double) * (size_t)(axis->taps > 0 ? axis->taps : 1)); /* one window's */
    if (axis->weights == NULL || w == NULL) {
        free(w);
        fastload_fill_axis_free(axis);
        return 0;
    }
    axis->begin = in_size;
    for (i = 0; i < out_size; i++) {
        double center = in0 + (i + 0.5) * scale, total = 0.0;
        int lo = axis->first[i], n = axis->count[i], largest = 0, sum = 0;
        int16_t *k = axis->weights + (size_t)i * (size_t)axis->taps;

        for (t = 0; t < n; t++) {
            double x = fabs((t + lo - center + 0.5) * inverse);
            w[t] = x < 1.0 ? 1.0 - x : 0.0;
            total += w[t];
        }
        for (t = 0; t < n; t++) { /* normalised, rounded, and the rounding's rest on the largest */
            k[t] = (int16_t)floor((total > 0.0 ? w[t] / total : 1.0 / n) * ONE + 0.5);
            sum += k[t];
            largest = k[t] > k[largest] ? t : largest;
        }
        if (n > 0) {
            k[largest] = (int16_t)(k[largest] + ONE - sum);
            axis->begin = lo < axis->begin ? lo : axis->begin;
            axis->end = lo + n > axis->end ? lo + n : axis->end;
        }
    }
    if (axis->end <= axis->begin) {
        axis->begin = axis->end = 0;
    }
    free(w);
    return 1;
}

void fastload_fill_axis_free(FillAxis *axis) {
    free(axis->first);
    free(axis->count);
    free(axis->weights);
    free(axis->windows);
    free(axis->shuffles);
    axis->first = axis->count = axis->windows = NULL;
    axis->weights = NULL;
    axis->shuffles = NULL;
}

#ifdef X86_FAST_PATHS
/* Sixteen bytes of the rows pass from two rows: their bytes widened to 16 bits and interleaved,
 * so that one vpmaddwd multiplies each pair by its two weights (w: both in one word) and adds
 * them; low: bytes 0-3 and 8-11, high: 4-7 and 12-15 (per 128-bit lane). */
__attribute__((target("avx2"))) static inline void two_rows(const unsigned char *a,
                                                           const unsigned char *b, __m256i w,
                                                           __m256i *low, __m256i *high) {
    __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)a));
    __m256i y = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b));
    *low = _mm256_add_epi32(*low, _mm256_madd_epi16(_mm256_unpacklo_epi16(x, y), w));
    *high = _mm256_add_epi32(*high, _mm256_madd_epi16(_mm256_unpackhi_epi16(x, y), w));
}

/* The sums rounded to 8 bits and stored: packing per lane puts bytes 0-15 back in order. */
__attribute__((target("avx2"))) static inline void store16(__m256i low, __m256i high,
                                                          unsigned char *out) {
    __m256i packed = _mm256_packs_epi32(_mm256_srai_epi32(low, FILL_BITS),
                                        _mm256_srai_epi32(high, FILL_BITS));
    packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(packed, packed), 0x08);
    _mm_storeu_si128((__m128i *)out, _mm256_castsi256_si128(packed));
}

/* The rows pass, 16 bytes at a time, rows taken two by two (an odd last one with a zero
 * weight on itself). Returns the bytes done. */
__attribute__((target("avx2"))) static size_t rows_avx2(const int16_t *k, int n,
                                                        const unsigned char *const *rows,
                                                        size_t row_bytes, unsigned char *out) {
    const __m256i half = _mm256_set1_epi32(HALF);
    const unsigned char *row[64];
    __m256i pairs[32]; /* weights t and t + 1 in each word */
    size_t j;
    int t;
    if (n > 64 || n < 1) {
        return 0;
    }
    for (t = 0; t < n; t += 2) {
        uint32_t next = t + 1 < n ? (uint16_t)k[t + 1] : 0;
        row[t] = rows[t];
        row[t + 1] = t + 1 < n ? rows[t + 1] : rows[t];
        pairs[t / 2] = _mm256_set1_epi32((int)((uint16_t)k[t] | next << 16));
    }
    if (n <= 4) { /* the usual shrink (to at most half): two pairs, in registers */
        const unsigned char *r0 = row[0], *r1 = row[1];
        const unsigned char *r2 = n > 2 ? row[2] : row[0], *r3 = n > 2 ? row[3] : row[0];
        __m256i w0 = pairs[0], w1 = n > 2 ? pairs[1] : _mm256_setzero_si256();
        for (j = 0; j + 16 <= row_bytes; j += 16) {
            __m256i low = half, high = half;
            two_rows(r0 + j, r1 + j, w0, &low, &high);
            two_rows(r2 + j, r3 + j, w1, &low, &high);
            store16(low, high, out + j);
        }
        return j;
    }
    for (j = 0; j + 16 <= row_bytes; j += 16) {
        __m256i low = half, high = half;
        for (t = 0; t < n; t += 2) {
            two_rows(row[t] + j, row[t + 1] + j, pairs[t / 2], &low, &high);
        }
        store16(low, high, out + j);
    }
    return j;
}
#endif

void fastload_fill_rows(const FillAxis *y, int i, const unsigned char *const *rows,
                        size_t row_bytes, unsigned char *out) {
    const int16_t *k = y->weights + (size_t)i * (size_t)y->taps;
    int n = y->count[i], t;
    size_t j = 0;
#ifdef X86_FAST_PATHS
    if (fastload_has_avx2()) {
        j = rows_avx2(k, n, rows, row_bytes, out);
    }
#endif
    for (; j < row_bytes; j++) {
        int32_t sum = 0;
        for (t = 0; t < n; t++) {
            sum += rows[t][j] * k[t];
        }
        out[j] = clip8(sum);
    }
}
