/* Decode stage, native part: a resized crop written into its slot of a batch tensor (strided,
 * flipped or not, grey to three channels); planar RGB slots with byte shuffles where the CPU
 * has AVX2. Called by resample.c. */
#include "resample_store.h"

#include <string.h>

#include "cpu_features.h"

/* An RGB crop (packed rows) into a planar target, flipped or not: the baseline for CPUs without
 * AVX2 (store_planes_avx2 is the fast one). */
static void store_planes(const unsigned char *restrict pixels, int height, int width,
                         const Target *target) {
    int i, j;
    for (i = 0; i < height; i++) {
        const unsigned char *restrict row = pixels + (size_t)i * (size_t)width * 3;
        unsigned char *restrict r = target->pixels + (ptrdiff_t)i * target->stride_y;
        unsigned char *restrict g = r + target->stride_c;
        unsigned char *restrict b = g + target->stride_c;
        if (target->flip) {
            for (j = 0; j < width; j++) {
                r[width - 1 - j] = row[3 * j];
                g[width - 1 - j] = row[3 * j + 1];
                b[width - 1 - j] = row[3 * j + 2];
            }
        } else {
            for (j = 0; j < width; j++) {
                r[j] = row[3 * j];
                g[j] = row[3 * j + 1];
                b[j] = row[3 * j + 2];
            }
        }
    }
}

#ifdef X86_FAST_PATHS
/* store_planes with byte shuffles: 16 pixels (48 bytes, three loads) at a time become 16 bytes
 * of each plane, each plane gathered from the three loads by one vpshufb each (mirrored by the
 * masks when flipped); the last width % 16 pixels go one by one. */
__attribute__((target("avx2"))) static void store_planes_avx2(const unsigned char *pixels,
                                                              int height, int width,
                                                              const Target *target) {
    __m128i mask[3][3]; /* [plane][load] */
    int i, j, c, s, d;
    for (c = 0; c < 3; c++) {
        for (s = 0; s < 3; s++) {
            signed char m[16];
            for (d = 0; d < 16; d++) {
                int from = 3 * (target->flip ? 15 - d : d) + c - 16 * s;
                m[d] = (signed char)(from >= 0 && from < 16 ? from : -1);
            }
            mask[c][s] = _mm_loadu_si128((const __m128i *)m);
        }
    }
    for (i = 0; i < height; i++) {
        const unsigned char *row = pixels + (size_t)i * (size_t)width * 3;
        unsigned char *plane = target->pixels + (ptrdiff_t)i * target->stride_y;
        for (j = 0; j + 16 <= width; j += 16) {
            __m128i a = _mm_loadu_si128((const __m128i *)(row + 3 * j));
            __m128i b = _mm_loadu_si128((const __m128i *)(row + 3 * j + 16));
            __m128i e = _mm_loadu_si128((const __m128i *)(row + 3 * j + 32));
            int at = target->flip ? width - 16 - j : j;
            for (c = 0; c < 3; c++) {
                __m128i v = _mm_or_si128(
                    _mm_or_si128(_mm_shuffle_epi8(a, mask[c][0]), _mm_shuffle_epi8(b, mask[c][1])),
                    _mm_shuffle_epi8(e, mask[c][2]));
                _mm_storeu_si128((__m128i *)(plane + c * target->stride_c + at), v);
            }
        }
        for (; j < width; j++) {
            int at = target->flip ? width - 1 - j : j;
            for (c = 0; c < 3; c++) {
                plane[c * target->stride_c + at] = row[3 * j + c];
            }
        }
    }
}
#endif

/* The resized crop (packed rows) into the target: strided, flipped, grey to three channels. */
void fastload_store_rgb(const unsigned char *pixels, int height, int width, int channels,
                        const Target *target) {
    int i, j, c;
    if (channels == 3 && !target->flip && target->stride_x == 3 && target->stride_c == 1) {
        for (i = 0; i < height; i++) { /* packed RGB rows, as the pixel cache stores them */
            memcpy(target->pixels + (ptrdiff_t)i * target->stride_y,
                   pixels + (size_t)i * (size_t)width * 3, (size_t)width * 3);
        }
        return;
    }
    if (channels == 3 && target->stride_x == 1 && target->stride_c >= width) {
#ifdef X86_FAST_PATHS
        if (fastload_has_avx2()) {
            store_planes_avx2(pixels, height, width, target); /* a CHW slot of a batch tensor */
            return;
        }
#endif
        store_planes(pixels, height, width, target);
        return;
    }
    for (i = 0; i < height; i++) {
        const unsigned char *row = pixels + (size_t)i * (size_t)width * (size_t)channels;
        unsigned char *out = target->pixels + (ptrdiff_t)i * target->stride_y;
        for (j = 0; j < width; j++) {
            int x = target->flip ? width - 1 - j : j;
            unsigned char *o = out + (ptrdiff_t)x * target->stride_x;
            for (c = 0; c < 3; c++) {
                o[c * target->stride_c] = row[j * channels + (channels == 3 ? c : 0)];
            }
        }
    }
}
