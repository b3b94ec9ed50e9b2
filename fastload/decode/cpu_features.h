/* What the CPU offers the native decode stage's fast paths: AVX2 on x86-64, asked once. */
#ifndef FASTLOAD_CPU_FEATURES_H
#define FASTLOAD_CPU_FEATURES_H

/* Built with -DFASTLOAD_NO_SIMD, the plain C alone (tests compare the two). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(FASTLOAD_NO_SIMD)
#include <immintrin.h>
#define X86_FAST_PATHS 1

static inline int fastload_has_avx2(void) {
    static int known = -1; /* the same answer from any thread */
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return known;
}
#endif

#endif
