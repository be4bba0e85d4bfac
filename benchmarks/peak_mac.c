/* The multiply-accumulate ceiling of one core, for the roofline beside the GEMM tables:
 * float32 FMA on 256-bit vectors (10 independent chains), exact 8-bit products the way
 * BlockInt8MatMul's AVX2 tiles form them (vpmaddubsw, vpmaddwd against ones, vpaddd; 8 chains)
 * and, built for a host with AVX-512 VNNI, the way its VNNI tiles do (vpdpbusd on 512-bit
 * vectors, 10 chains, written in assembly so the compiler keeps every accumulator in a register).
 *
 *     gcc -O2 -march=native benchmarks/peak_mac.c -o /tmp/peak_mac
 *     /tmp/peak_mac; (/tmp/peak_mac & /tmp/peak_mac; wait)   # one core, then both at once
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    const long iters = 25000000L;
    __m256 acc_f[10];
    const __m256 x = _mm256_set1_ps(1.0000001f), y = _mm256_set1_ps(0.9999999f);
    for (int i = 0; i < 10; i++) acc_f[i] = _mm256_set1_ps((float)i);
    double t = now();
    for (long n = 0; n < iters; n++) {
#pragma GCC unroll 10
        for (int i = 0; i < 10; i++) acc_f[i] = _mm256_fmadd_ps(acc_f[i], x, y);
    }
    t = now() - t;
    float keep_f = 0;
    for (int i = 0; i < 10; i++) keep_f += acc_f[i][0];
    printf("float32 FMA: %.2f GMAC/s per core (%g)\n", iters * 10.0 * 8 / t / 1e9, keep_f);

    __m256i acc_i[8];
    __m256i a = _mm256_set1_epi8(3);
    const __m256i w = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
    for (int i = 0; i < 8; i++) acc_i[i] = _mm256_set1_epi32(i);
    t = now();
    for (long n = 0; n < iters; n++) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m256i pairs = _mm256_maddubs_epi16(a, w);
            acc_i[i] = _mm256_add_epi32(acc_i[i], _mm256_madd_epi16(pairs, ones));
            a = _mm256_add_epi8(a, ones); /* new operands each time: nothing is hoisted */
        }
    }
    t = now() - t;
    int keep_i = 0;
    for (int i = 0; i < 8; i++) keep_i += _mm256_extract_epi32(acc_i[i], 0);
    printf("exact int8 (vpmaddubsw, vpmaddwd): %.2f GMAC/s per core (%d)\n",
           iters * 8.0 * 32 / t / 1e9, keep_i);
#ifdef __AVX512VNNI__
    __m512i v0 = _mm512_set1_epi32(1), v1 = v0, v2 = v0, v3 = v0, v4 = v0, v5 = v0, v6 = v0,
            v7 = v0, v8 = v0, v9 = v0;
    const __m512i ua = _mm512_set1_epi8(3), sb = _mm512_set1_epi8(-2);
    t = now();
    for (long n = 0; n < 4 * iters; n++) {
        __asm__ volatile(
            "vpdpbusd %11, %10, %0\n\tvpdpbusd %11, %10, %1\n\tvpdpbusd %11, %10, %2\n\t"
            "vpdpbusd %11, %10, %3\n\tvpdpbusd %11, %10, %4\n\tvpdpbusd %11, %10, %5\n\t"
            "vpdpbusd %11, %10, %6\n\tvpdpbusd %11, %10, %7\n\tvpdpbusd %11, %10, %8\n\t"
            "vpdpbusd %11, %10, %9"
            : "+v"(v0), "+v"(v1), "+v"(v2), "+v"(v3), "+v"(v4), "+v"(v5), "+v"(v6), "+v"(v7),
              "+v"(v8), "+v"(v9)
            : "v"(ua), "v"(sb));
    }
    t = now() - t;
    __m512i sum = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(v0, v1), v2),
                                   _mm512_add_epi32(_mm512_add_epi32(v3, v4), v5));
    sum = _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_add_epi32(v6, v7),
                                                 _mm512_add_epi32(v8, v9)));
    printf("exact int8 (vpdpbusd, 512-bit): %.2f GMAC/s per core (%d)\n",
           4 * iters * 10.0 * 64 / t / 1e9, _mm512_reduce_add_epi32(sum));
#endif
    return 0;
}
