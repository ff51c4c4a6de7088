/*
 * The AVX2 tile kernel of NVFP4 weights: the contract of quant.h ("NVFP4 (W4A16)"), eight
 * outputs at a time (one fp32 lane each), bitwise the scalar kernel of gemm_nvfp4.c.
 *
 * Per 32 bytes of a tile block (eight k of eight rows): two nibble masks, four vpshufb
 * (code -> the high and the low byte of 2 x e2m1 in bf16, two 16-entry tables), four
 * byte unpacks into bf16 words and eight word unpacks under zeros into fp32: the codes
 * become floats by moving bytes, on the two shuffle pipes, with no int -> float
 * convert (which, with the sign extensions it needed, held a first version to ~2.1
 * cycles per k instead of ~1.2); shared by the rows of the pass; per row and k one broadcast
 * load and one multiply or fused multiply-add (the four chains of a group are
 * independent, so they overlap). Per group of 16: the fp8 scales of eight rows, decoded
 * with integer ops (no subnormal float: dw_e4m3_half's rule), and one FMA per row.
 *
 * Up to three rows share a decode (their chains and the decoded codes fit the sixteen
 * registers); four and five rows run as 2 + 2 and 3 + 2, each row's arithmetic unchanged.
 */
#include "quant.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,fma,f16c")))
#define ALWAYS static inline __attribute__((always_inline)) TARGET
#define PREFETCH_BYTES 2048

/* 2 x e2m1 by code as bf16 bits, high and low byte (code 8, "-0", is +0 as in the scalar
 * kernel's table); the same in both 128-bit lanes: vpshufb works per lane */
#define E2M1X2_HI 0x00, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, \
                  0x00, (char)0xBF, (char)0xC0, (char)0xC0, (char)0xC0, (char)0xC0, (char)0xC1, (char)0xC1
#define E2M1X2_LO 0x00, (char)0x80, 0x00, 0x40, (char)0x80, (char)0xC0, 0x00, 0x40, \
                  0x00, (char)0x80, 0x00, 0x40, (char)0x80, (char)0xC0, 0x00, 0x40

/* eight scales (row n at byte n) -> fp8 / 2 per lane, as dw_e4m3_half */
ALWAYS __m256 scales8(const uint8_t *p) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i m = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
    const __m256 normal = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_slli_epi32(m, 20), _mm256_set1_epi32(119 << 23)));
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(0x1p-10f));
    const __m256 is_normal = _mm256_castsi256_ps(_mm256_cmpgt_epi32(m, _mm256_set1_epi32(7)));
    const __m256 mag = _mm256_blendv_ps(sub, normal, is_normal);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
    return _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
}

/* The four k (i = 0..3) of one nibble of 32 code bytes (row n's at dw_nvfp4_pos(i, n)):
 * fp32, rows in lanes. Bytes 4 i .. 4 i + 3 of each 128-bit lane hold rows 4 L .. 4 L + 3. */
ALWAYS void widen4(__m256i nib, __m256i thi, __m256i tlo, __m256 w[4]) {
    const __m256i hi = _mm256_shuffle_epi8(thi, nib), lo = _mm256_shuffle_epi8(tlo, nib);
    const __m256i w01 = _mm256_unpacklo_epi8(lo, hi), w23 = _mm256_unpackhi_epi8(lo, hi);
    const __m256i z = _mm256_setzero_si256();
    w[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w01));
    w[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w01));
    w[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w23));
    w[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w23));
}

ALWAYS void kernel(const int R, const uint8_t *tile, int64_t chunks, const void *const *xv,
                   float (*out)[DW_TILE]) {
    const __m256i thi = _mm256_setr_epi8(E2M1X2_HI, E2M1X2_HI);
    const __m256i tlo = _mm256_setr_epi8(E2M1X2_LO, E2M1X2_LO);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const float *x0 = xv[0], *x1 = R > 1 ? xv[1] : NULL, *x2 = R > 2 ? xv[2] : NULL;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0;
    const uint8_t *blk = tile + DW_NVFP4_HEADER;
    for (int64_t b = 0; b < chunks; b++, blk += DW_NVFP4_BLOCK) {
        _mm_prefetch((const char *)blk + PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + PREFETCH_BYTES + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + PREFETCH_BYTES + 128, _MM_HINT_T0);
#pragma GCC unroll 2
        for (int g = 0; g < 2; g++) {
            __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, u0 = t0, u1 = t0, u2 = t0;
#pragma GCC unroll 2
            for (int v = 2 * g; v < 2 * g + 2; v++) {
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + 32 * v));
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) { /* quarter q = 2 (v - 2 g) + h */
                    const __m256i nib = h ? _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4)
                                          : _mm256_and_si256(raw, low4);
                    __m256 w[4];
                    widen4(nib, thi, tlo, w);
                    const int64_t k = DW_CHUNK * b + 8 * v + 4 * h;
                    const int q = 2 * (v - 2 * g) + h;
#define CHAIN(r)                                                                                  \
    {                                                                                             \
        __m256 p = _mm256_mul_ps(w[0], _mm256_broadcast_ss(x##r + k));                            \
        p = _mm256_fmadd_ps(w[1], _mm256_broadcast_ss(x##r + k + 1), p);                          \
        p = _mm256_fmadd_ps(w[2], _mm256_broadcast_ss(x##r + k + 2), p);                          \
        p = _mm256_fmadd_ps(w[3], _mm256_broadcast_ss(x##r + k + 3), p);                          \
        /* (p0 + p1) + (p2 + p3): t holds p0, then p0 + p1, then (with u) p2 */                  \
        if (q == 0) t##r = p;                                                                     \
        else if (q == 1) t##r = _mm256_add_ps(t##r, p);                                           \
        else if (q == 2) u##r = p;                                                                \
        else t##r = _mm256_add_ps(t##r, _mm256_add_ps(u##r, p));                                  \
    }
                    CHAIN(0)
                    if (R > 1) CHAIN(1)
                    if (R > 2) CHAIN(2)
#undef CHAIN
                }
            }
            const __m256 s = scales8(blk + 128 + 8 * g);
            acc0 = _mm256_fmadd_ps(t0, s, acc0);
            if (R > 1) acc1 = _mm256_fmadd_ps(t1, s, acc1);
            if (R > 2) acc2 = _mm256_fmadd_ps(t2, s, acc2);
        }
    }
    const __m256 mult = _mm256_loadu_ps((const float *)(const void *)tile);
    _mm256_storeu_ps(out[0], _mm256_mul_ps(acc0, mult));
    if (R > 1) _mm256_storeu_ps(out[1], _mm256_mul_ps(acc1, mult));
    if (R > 2) _mm256_storeu_ps(out[2], _mm256_mul_ps(acc2, mult));
}

static TARGET __attribute__((noinline)) void kernel1(const uint8_t *t, int64_t c,
                                                     const void *const *x, float (*out)[DW_TILE]) {
    kernel(1, t, c, x, out);
}
static TARGET __attribute__((noinline)) void kernel2(const uint8_t *t, int64_t c,
                                                     const void *const *x, float (*out)[DW_TILE]) {
    kernel(2, t, c, x, out);
}
static TARGET __attribute__((noinline)) void kernel3(const uint8_t *t, int64_t c,
                                                     const void *const *x, float (*out)[DW_TILE]) {
    kernel(3, t, c, x, out);
}

static TARGET void tile_avx2(const uint8_t *t, int64_t c, const void *const *x, int rows,
                             float (*out)[DW_TILE]) {
    for (int r = 0; r < rows;) { /* 1, 2, 3; 4 = 2 + 2; 5 = 3 + 2 */
        const int left = rows - r, take = left == 4 ? 2 : left > 3 ? 3 : left;
        if (take == 1) kernel1(t, c, x + r, out + r);
        else if (take == 2) kernel2(t, c, x + r, out + r);
        else kernel3(t, c, x + r, out + r);
        r += take;
    }
}

static int cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}

dw_tile_fn dw_nvfp4_kernel_simd(void) { return cpu_has_avx2() ? tile_avx2 : NULL; }

#else

dw_tile_fn dw_nvfp4_kernel_simd(void) { return NULL; }

#endif
