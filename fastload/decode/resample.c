/* Decode stage, native part: the crop's resize, Pillow's bilinear resample to the bit.
 *
 * Same weights (a triangle filter stretched by the reduction, so it antialiases; normalised,
 * then 22-bit fixed point: resample_axes.c), same two passes each rounded to 8 bits, in the
 * order Pillow 13 picks from the sizes (fastload_crop), so a crop resized here equals
 * Image.resize(size, BILINEAR, box=...) exactly. What Pillow cannot do, and why this exists:
 * read a decoded JPEG window in place, write each pixel straight into its slot of a CHW batch
 * tensor (flipped or not), with the GIL released, and no image objects or copies in between.
 * The column pass runs as one vectorisable loop over a whole row.
 */
#include "resample.h"

#include <stdlib.h>
#include <string.h>

#include "cpu_features.h"
#include "resample_store.h"

/* Loops the compiler vectorises, built twice: for AVX2 (picked at load time where the CPU has
 * it: 8 lanes, vpmulld) and for the baseline. */
#if defined(X86_FAST_PATHS) && !defined(__clang__)
#define FAST_PATHS __attribute__((target_clones("avx2", "default")))
#else
#define FAST_PATHS
#endif

#define HALF (1 << (PRECISION_BITS - 1))

static unsigned char clip8(int32_t sum) {
    int32_t v = sum >> PRECISION_BITS;
    return (unsigned char)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

#ifdef X86_FAST_PATHS
/* The row pass for RGB with AVX2: two output pixels at a time, one in each 128-bit lane, two
 * taps per step. A lane holds two input pixels as 16-bit pairs (R R G G B B 0 0), so vpmaddwd
 * multiplies each pair by its two weights and adds them. The weights are 22-bit, too wide for
 * 16, so each is split into an 11-bit high and low part, the two summed apart and joined at
 * the end: (high << 11) + low is the very integer sum the scalar code makes, so the same bytes.
 * Both pixels run to the longer of their two counts; the shorter one's extra weights are 0
 * (Pillow's unused slots are), and its extra pixels lie inside the pair's span. Returns 0 when
 * out of memory. A pair whose 16-byte loads would pass `end`, and an odd last pixel, go through
 * `slow` (the scalar code). Writes one byte past the last pixel of `out`. */
__attribute__((target("avx2"))) static int horizontal_rgb_avx2(
    const Axis *x, const unsigned char *base, ptrdiff_t stride, int origin, int rows,
    unsigned char *out, const unsigned char *end,
    void (*slow)(const unsigned char *, const int32_t *, int, unsigned char *)) {
    const __m256i spread = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1,
                                            -1, 0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1,
                                            -1, -1);
    const __m256i half = _mm256_set1_epi32(HALF);
    int steps = (x->taps + 1) / 2, pairs = x->out_size / 2, r, i, t;
    /* Per pair and step: the high parts' vector, then the low parts'. */
    __m256i *w = _mm_malloc(sizeof(__m256i) * 2 * (size_t)(pairs > 0 ? pairs : 1) * (size_t)steps,
                            32);

    if (w == NULL) {
        return 0;
    }
    for (i = 0; i < pairs; i++) {
        const int32_t *a = x->weights + (size_t)(2 * i) * (size_t)x->taps, *b = a + x->taps;
        for (t = 0; t < steps; t++) {
            int32_t a0 = a[2 * t], b0 = b[2 * t];
            int32_t a1 = 2 * t + 1 < x->taps ? a[2 * t + 1] : 0;
            int32_t b1 = 2 * t + 1 < x->taps ? b[2 * t + 1] : 0;
            __m256i *k = w + ((size_t)i * (size_t)steps + (size_t)t) * 2;
            k[0] = _mm256_setr_epi16(
                (int16_t)(a0 >> 11), (int16_t)(a1 >> 11), (int16_t)(a0 >> 11), (int16_t)(a1 >> 11),
                (int16_t)(a0 >> 11), (int16_t)(a1 >> 11), 0, 0, (int16_t)(b0 >> 11),
                (int16_t)(b1 >> 11), (int16_t)(b0 >> 11), (int16_t)(b1 >> 11), (int16_t)(b0 >> 11),
                (int16_t)(b1 >> 11), 0, 0);
            k[1] = _mm256_setr_epi16(
                (int16_t)(a0 & 2047), (int16_t)(a1 & 2047), (int16_t)(a0 & 2047),
                (int16_t)(a1 & 2047), (int16_t)(a0 & 2047), (int16_t)(a1 & 2047), 0, 0,
                (int16_t)(b0 & 2047), (int16_t)(b1 & 2047), (int16_t)(b0 & 2047),
                (int16_t)(b1 & 2047), (int16_t)(b0 & 2047), (int16_t)(b1 & 2047), 0, 0);
        }
    }
    for (r = 0; r < rows; r++) {
        const unsigned char *row = base + (ptrdiff_t)r * stride;
        unsigned char *o = out + (size_t)r * (size_t)x->out_size * 3;
        for (i = 0; i + 1 < x->out_size; i += 2) {
            const unsigned char *p = row + (ptrdiff_t)(x->first[i] - origin) * 3;
            const unsigned char *q = row + (ptrdiff_t)(x->first[i + 1] - origin) * 3;
            const __m256i *k = w + (size_t)(i / 2) * (size_t)steps * 2;
            int n = x->count[i] > x->count[i + 1] ? x->count[i] : x->count[i + 1];
            __m256i high = _mm256_setzero_si256(), low = _mm256_setzero_si256(), sum;
            int32_t first, second;
            if (end - q < 3 * (ptrdiff_t)(n + (n & 1)) + 10) { /* q >= p: q's loads end last */
                slow(p, x->weights + (size_t)i * (size_t)x->taps, x->count[i], o + 3 * i);
                slow(q, x->weights + (size_t)(i + 1) * (size_t)x->taps, x->count[i + 1],
                     o + 3 * i + 3);
                continue;
            }
            for (t = 0; t < n; t += 2, k += 2) {
                __m256i two = _mm256_shuffle_epi8(
                    _mm256_loadu2_m128i((const __m128i *)(q + 3 * t), (const __m128i *)(p + 3 * t)),
                    spread);
                high = _mm256_add_epi32(high, _mm256_madd_epi16(two, k[0]));
                low = _mm256_add_epi32(low, _mm256_madd_epi16(two, k[1]));
            }
            sum = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(high, 11), low), half);
            sum = _mm256_srai_epi32(sum, PRECISION_BITS);
            sum = _mm256_packs_epi32(sum, sum);
            sum = _mm256_packus_epi16(sum, sum); /* clamps to 0..255, as clip8 */
            first = _mm256_cvtsi256_si32(sum);
            second = _mm_cvtsi128_si32(_mm256_extracti128_si256(sum, 1));
            memcpy(o + 3 * i, &first, 4); /* the fourth byte is overwritten next */
            memcpy(o + 3 * i + 3, &second, 4); /* the next pixel's, or the padding's */
        }
        if (i < x->out_size) {
            slow(row + (ptrdiff_t)(x->first[i] - origin) * 3,
                 x->weights + (size_t)i * (size_t)x->taps, x->count[i], o + 3 * i);
        }
    }
    _mm_free(w);
    return 1;
}
#endif

/* One RGB pixel of the row pass, as Pillow computes it. */
static void pixel_rgb(const unsigned char *p, const int32_t *k, int n, unsigned char *o) {
    int32_t s0 = HALF, s1 = HALF, s2 = HALF;
    int t;
    for (t = 0; t < n; t++, p += 3) {
        s0 += p[0] * k[t];
        s1 += p[1] * k[t];
        s2 += p[2] * k[t];
    }
    o[0] = clip8(s0);
    o[1] = clip8(s1);
    o[2] = clip8(s2);
}

/* One pass along rows: each of `rows` rows (`stride` bytes apart, `base` at input pixel
 * `origin`) resized to x's output width, into `out` (rows packed, 8 bits, rounded as Pillow). */
static int horizontal(const Axis *x, const unsigned char *base, ptrdiff_t stride, int origin,
                      int rows, int channels, unsigned char *out, const unsigned char *end) {
    size_t out_row = (size_t)x->out_size * (size_t)channels;
    int r, i, t;

#ifdef X86_FAST_PATHS
    if (channels == 3 && fastload_has_avx2()) {
        return horizontal_rgb_avx2(x, base, stride, origin, rows, out, end, pixel_rgb);
    }
#else
    (void)end;
#endif
    for (r = 0; r < rows; r++) {
        const unsigned char *row = base + (ptrdiff_t)r * stride;
        unsigned char *o = out + (size_t)r * out_row;
        for (i = 0; i < x->out_size; i++) {
            const int32_t *k = x->weights + (size_t)i * (size_t)x->taps;
            const unsigned char *p = row + (ptrdiff_t)(x->first[i] - origin) * channels;
            int n = x->count[i];
            if (channels == 3) {
                pixel_rgb(p, k, n, o + 3 * i);
            } else {
                int32_t s = HALF;
                for (t = 0; t < n; t++) {
                    s += p[t] * k[t];
                }
                o[i] = clip8(s);
            }
        }
    }
    return 1;
}

/* One pass along columns: rows `stride` bytes apart (`base` at input row `origin`), each
 * `row_bytes` long, resized to y's output height, into `out` (rows packed). */
FAST_PATHS
static void vertical(const Axis *y, const unsigned char *base, ptrdiff_t stride, int origin,
                     size_t row_bytes, unsigned char *restrict out, int32_t *restrict sum) {
    int i, t;
    size_t j;

    for (i = 0; i < y->out_size; i++) {
        const int32_t *k = y->weights + (size_t)i * (size_t)y->taps;
        const unsigned char *first = base + (ptrdiff_t)(y->first[i] - origin) * stride;
        unsigned char *o = out + (size_t)i * row_bytes;
        for (j = 0; j < row_bytes; j++) {
            sum[j] = HALF;
        }
        for (t = 0; t < y->count[i]; t++) {
            const unsigned char *restrict row = first + (ptrdiff_t)t * stride;
            int32_t weight = k[t];
            for (j = 0; j < row_bytes; j++) { /* vectorised by the compiler */
                sum[j] += row[j] * weight;
            }
        }
        for (j = 0; j < row_bytes; j++) {
            o[j] = clip8(sum[j]);
        }
    }
}

int fastload_resample(const Crop *crop, const Source *source, const Target *target) {
    const Axis *x = &crop->x, *y = &crop->y;
    int ch = source->channels, width = x->out_size, height = y->out_size;
    int rows = y->end - y->begin, columns = x->end - x->begin, ok;
    /* Rows first: the rows the column pass reads, at the output width; columns first: the
     * output's rows, over the columns the row pass reads. */
    size_t middle_bytes = crop->columns_first ? (size_t)height * (size_t)columns * (size_t)ch
                                              : (size_t)(rows > 0 ? rows : 1) * (size_t)width *
                                                    (size_t)ch;
    size_t sum_bytes = (size_t)(crop->columns_first ? columns : width) * (size_t)ch;
    unsigned char *middle = malloc(middle_bytes + READ_PAST);
    unsigned char *resized = malloc((size_t)height * (size_t)width * (size_t)ch + READ_PAST);
    int32_t *sum = malloc(sizeof(int32_t) * (sum_bytes + 1));
    const unsigned char *at =
        source->pixels + (ptrdiff_t)(y->begin - source->origin_y) * source->row_stride;

    if (middle == NULL || resized == NULL || sum == NULL) {
        free(middle);
        free(resized);
        free(sum);
        return 0;
    }
    if (crop->columns_first) {
        at += (ptrdiff_t)(x->begin - source->origin_x) * ch;
        vertical(y, at, source->row_stride, y->begin, sum_bytes, middle, sum);
        ok = horizontal(x, middle, (ptrdiff_t)columns * ch, x->begin, height, ch, resized,
                        middle + middle_bytes + READ_PAST);
    } else {
        ok = horizontal(x, at, source->row_stride, source->origin_x, rows, ch, middle, source->end);
        vertical(y, middle, (ptrdiff_t)width * ch, y->begin, sum_bytes, resized, sum);
    }
    if (ok) {
        fastload_store_rgb(resized, height, width, ch, target);
    }
    free(middle);
    free(resized);
    free(sum);
    return ok;
}
