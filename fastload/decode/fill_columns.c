/* Decode stage, native part: the columns pass of the pixel cache's resize (fill_resize.h), one
 * row of a plane at a time: output pixel i is the sum of the row's bytes first[i] ... under its
 * weights, rounded to 8 bits.
 *
 * With AVX2, eight output pixels a step. Their bytes come from one 16-byte window of the row per
 * four output pixels, spread over the taps by a byte shuffle planned once per axis
 * (fastload_fill_columns_ready): a crop's or a shrink's four pixels read at most 16 bytes between
 * them at four taps (an enlargement, or a shrink to no less than two thirds) and at eight (to
 * no less than three eighths). Where a window does not hold them (or was not planned), the bytes
 * are gathered pixel by pixel; more taps than eight take the general loop. Each pixel's products
 * are summed by vpmaddwd and vphaddd in int32, as the plain C sums them: the same bytes.
 */
#include <limits.h>
#include <stdlib.h>

#include "cpu_features.h"
#include "fill_resize.h"

static unsigned char clip8(int32_t sum) {
    int32_t v = (sum + FILL_HALF) >> FILL_BITS;
    return (unsigned char)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

int fastload_fill_columns_ready(FillAxis *x, size_t readable) {
    int quads = x->out_size / 4, q, k, t;
    size_t bytes = (size_t)x->taps * 8; /* a quad's shuffles: 4 pixels x taps x 2 bytes */
    if (x->taps != 4 && x->taps != 8) {
        return 1; /* the general loop */
    }
    x->windows = malloc(sizeof(int) * (size_t)(quads > 0 ? quads : 1));
    x->shuffles = malloc(bytes * (size_t)(quads > 0 ? quads : 1));
    if (x->windows == NULL || x->shuffles == NULL) {
        free(x->windows);
        free(x->shuffles);
        x->windows = NULL;
        x->shuffles = NULL;
        return 0;
    }
    for (q = 0; q < quads; q++) {
        const int *first = x->first + 4 * q;
        unsigned char *shuffle = x->shuffles + (size_t)q * bytes;
        int low = INT_MAX, high = 0;
        for (k = 0; k < 4; k++) { /* a mirrored axis's first[] run backwards */
            low = first[k] < low ? first[k] : low;
            high = first[k] > high ? first[k] : high;
        }
        x->windows[q] = high + x->taps - low <= 16 && (size_t)low + 16 <= readable ? low : -1;
        for (k = 0; k < 4; k++) {
            for (t = 0; t < x->taps; t++) { /* each tap a word: its byte, then a zero */
                shuffle[2 * (k * x->taps + t)] = (unsigned char)(first[k] - low + t);
                shuffle[2 * (k * x->taps + t) + 1] = 0x80;
            }
        }
    }
    return 1;
}

#ifdef X86_FAST_PATHS
/* A window of 16 bytes of the row in both lanes, spread by a shuffle: 16 words. */
__attribute__((target("avx2"))) static inline __m256i spread(const unsigned char *row, int at,
                                                            const unsigned char *shuffle) {
    return _mm256_shuffle_epi8(
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(row + at))),
        _mm256_loadu_si256((const __m256i *)shuffle));
}

/* Two output pixels' products summed to four int32 each (the low lane the first's, the high one
 * the second's), their bytes read pixel by pixel, eight taps a group. */
__attribute__((target("avx2"))) static inline __m256i pair_sums(const unsigned char *a,
                                                                const unsigned char *b,
                                                                const int16_t *ka,
                                                                const int16_t *kb, int groups) {
    __m256i sum = _mm256_setzero_si256();
    int g;
    for (g = 0; g < groups; g++, a += 8, b += 8, ka += 8, kb += 8) {
        __m128i bytes = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a),
                                           _mm_loadl_epi64((const __m128i *)b));
        __m256i weights = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)ka)),
            _mm_loadu_si128((const __m128i *)kb), 1);
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_cvtepu8_epi16(bytes), weights));
    }
    return sum;
}

/* Four output pixels of a four-tap axis summed to two int32 each (pixels 0, 1 in the low lane, 2,
 * 3 in the high one), from their window or gathered. */
__attribute__((target("avx2"))) static inline __m256i quad_sums(const FillAxis *x,
                                                                const unsigned char *row, int i) {
    const int16_t *k = x->weights + (size_t)i * 4;
    __m128i bytes;
    if (x->windows != NULL && x->windows[i / 4] >= 0) {
        return _mm256_madd_epi16(spread(row, x->windows[i / 4], x->shuffles + (size_t)i * 8),
                                 _mm256_loadu_si256((const __m256i *)k));
    }
    bytes = _mm_i32gather_epi32((const int *)row,
                                _mm_loadu_si128((const __m128i *)(x->first + i)), 1);
    return _mm256_madd_epi16(_mm256_cvtepu8_epi16(bytes),
                             _mm256_loadu_si256((const __m256i *)k));
}

/* Sums of pixels 0-7 in int32, the low lane 0, 2, 4, 6 or 0, 1, 4, 5 (see the callers), rounded
 * and packed to bytes: the low lane's first four and the high lane's. */
__attribute__((target("avx2"))) static inline __m256i round8(__m256i sums) {
    sums = _mm256_srai_epi32(_mm256_add_epi32(sums, _mm256_set1_epi32(FILL_HALF)), FILL_BITS);
    return _mm256_packus_epi16(_mm256_packs_epi32(sums, sums), sums);
}

/* The columns pass, eight output pixels a step; returns the pixels done. */
__attribute__((target("avx2"))) static int columns_avx2(const FillAxis *x,
                                                       const unsigned char *row,
                                                       unsigned char *out) {
    const int16_t *weights = x->weights;
    int taps = x->taps, i, p;
    for (i = 0; i + 8 <= x->out_size; i += 8) {
        __m256i bytes;
        if (taps == 4) { /* a vphaddd of two quads: pixels 0, 1, 4, 5 | 2, 3, 6, 7 */
            bytes = round8(_mm256_hadd_epi32(quad_sums(x, row, i), quad_sums(x, row, i + 4)));
            _mm_storel_epi64((__m128i *)(out + i),
                             _mm_unpacklo_epi16(_mm256_castsi256_si128(bytes),
                                                _mm256_extracti128_si256(bytes, 1)));
            continue;
        }
        { /* four pairs, three vphaddd: pixels 0, 2, 4, 6 | 1, 3, 5, 7 */
            __m256i s[4];
            for (p = 0; p < 4; p++) {
                int a = i + 2 * p, q = a / 4;
                const int16_t *k = weights + (size_t)a * (size_t)taps;
                const unsigned char *shuffle = x->shuffles + (size_t)q * 64 + (size_t)(a % 4) * 16;
                s[p] = taps == 8 && x->windows != NULL && x->windows[q] >= 0
                           ? _mm256_madd_epi16(spread(row, x->windows[q], shuffle),
                                               _mm256_loadu_si256((const __m256i *)k))
                           : pair_sums(row + x->first[a], row + x->first[a + 1], k, k + taps,
                                       taps / 8);
            }
            bytes = round8(_mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]),
                                             _mm256_hadd_epi32(s[2], s[3])));
            _mm_storel_epi64((__m128i *)(out + i),
                             _mm_unpacklo_epi8(_mm256_castsi256_si128(bytes),
                                               _mm256_extracti128_si256(bytes, 1)));
        }
    }
    return i;
}
#endif

void fastload_fill_columns(const FillAxis *x, const unsigned char *row, unsigned char *out) {
    int i = 0, t;
#ifdef X86_FAST_PATHS
    if (fastload_has_avx2() && x->taps > 0) {
        i = columns_avx2(x, row, out);
    }
#endif
    for (; i < x->out_size; i++) {
        const unsigned char *p = row + x->first[i];
        const int16_t *k = x->weights + (size_t)i * (size_t)x->taps;
        int32_t sum = 0;
        for (t = 0; t < x->count[i]; t++) {
            sum += p[t] * k[t];
        }
        out[i] = clip8(sum);
    }
}
