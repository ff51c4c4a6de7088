/*
 * The AVX512-VNNI tile kernel of the quantized GEMM: the contract of quant.h, eight
 * outputs at a time (one int32 / fp32 lane each) and up to five activation rows per pass
 * over a tile, for the types where it matters most: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (blocks
 * of 32) and Q4_K, Q6_K (super-blocks of 256). The other types run the AVX2 kernel
 * (dw_tile_kernel_for in gemm_quant.c is the one place that chooses).
 *
 * Why: the AVX2 kernel spends per step and row a broadcast, a vpmaddubsw and a 16-bit add,
 * plus a vpmaddwd flush every few steps. vpdpbusd (u8 codes x s8 activations, four
 * products summed straight into int32) takes the row's four int8 values as an embedded
 * broadcast, so a step costs one instruction per row; the decode of a step's codes (a
 * load, a shift and a mask or two) is shared by the rows of a pass as before. The vectors
 * stay 256 bits (AVX512-VL): a tile is eight rows x four bytes per step, and 256-bit EVEX
 * instructions also get the 32 registers five rows' sums need.
 *
 * Integer sums per type (all exact int32, so any order gives the contract's I):
 *   32-blocks: the chunk's 32 products in two vpdpbusd chains (even / odd steps), added.
 *     Q8_0's signed codes take |w| x sign(x, w), as in the AVX2 kernel.
 *   Q4_K: per chunk two 16-k sums (<= 15 * 127 * 16, so each fits int16) scaled by the
 *     chunk's 6-bit scale with vpdpwssd into the super-block's sum; the mins as AVX2.
 *   Q6_K: per 16-k sub-block one sum (<= 63 * 127 * 16, not int16) times its signed scale
 *     by vpmulld; the -32 offset against the row's 16-sums as AVX2.
 * The float steps are the same IEEE operations per lane in the same order as the scalar
 * and AVX2 kernels (one convert and the fused multiply-adds of quant.h), so the three agree
 * bitwise; the tests compare them with torch.equal.
 */
#include "quant_layout.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define ALWAYS static inline __attribute__((always_inline)) TARGET
#define PREFETCH_BYTES 2048

/* KEEP: pins a running sum to a register here (see gemm_quant_avx2.c); "v": any of the 32 */
#define KEEP(v) __asm__("" : "+v"(v))

ALWAYS __m256i ld(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
ALWAYS __m256 ld_half8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
ALWAYS __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}
ALWAYS __m256i mask8(int m) { return _mm256_set1_epi8((char)m); }
ALWAYS __m256 neg(__m256 v) { return _mm256_xor_ps(v, _mm256_set1_ps(-0.0f)); }
ALWAYS __m256i bcast_pair(const int16_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

/* bits [from, from + width) of every byte moved to [to, to + width), the rest cleared
 * (as gemm_quant_avx2.c: the 16-bit shifts only carry into bits the mask clears) */
ALWAYS __m256i move_bits(__m256i v, int from, int to, int mask) {
    const __m256i s = from < to   ? _mm256_slli_epi16(v, to - from)
                      : from > to ? _mm256_srli_epi16(v, from - to)
                                  : v;
    return _mm256_and_si256(s, mask8(mask));
}
ALWAYS __m256i nib(__m256i v, int high) { return move_bits(v, high ? 4 : 0, 0, 0x0F); }

/* vpshufb patterns (as gemm_quant_avx2.c): PICK32[b] byte b of each row's four alone in
 * the low byte of its lane; PICK32S[b] in the high byte; PAIR16[p] / PAIR16S[p] bytes
 * (2p, 2p + 1) as zero-extended 16-bit pairs / in the pairs' high bytes. */
#define Z (char)0x80
#define LANES4(a, b, c, d) a, b, c, d, a + 4, b + 4, c + 4, d + 4, a + 8, b + 8, c + 8, d + 8, \
                           a + 12, b + 12, c + 12, d + 12
#define PAT(a, b, c, d) {LANES4(a, b, c, d), LANES4(a, b, c, d)}
static const char PICK32[4][32] = {PAT(0, Z, Z, Z), PAT(1, Z, Z, Z), PAT(2, Z, Z, Z), PAT(3, Z, Z, Z)};
static const char PICK32S[4][32] = {PAT(Z, Z, Z, 0), PAT(Z, Z, Z, 1), PAT(Z, Z, Z, 2), PAT(Z, Z, Z, 3)};
static const char PAIR16[2][32] = {PAT(0, Z, 1, Z), PAT(2, Z, 3, Z)};
static const char PAIR16S[2][32] = {PAT(Z, 0, Z, 1), PAT(Z, 2, Z, 3)};
#undef PAT
#undef LANES4
#undef Z
ALWAYS __m256i pick(const char (*pat)[32], __m256i v, int b) {
    return _mm256_shuffle_epi8(v, _mm256_loadu_si256((const __m256i *)pat[b]));
}

ALWAYS int block_bytes(const int T) {
    switch (T) {
    case DW_Q4_0: return Q4_0_BYTES;
    case DW_Q4_1: return Q4_1_BYTES;
    case DW_Q5_0: return Q5_0_BYTES;
    case DW_Q5_1: return Q5_1_BYTES;
    case DW_Q8_0: return Q8_0_BYTES;
    case DW_Q4_K: return Q4_K_BYTES;
    default: return Q6_K_BYTES;
    }
}

/* Step s of chunk c: the codes (dw_quant_code) of eight rows x four k. */
ALWAYS __m256i codes(const int T, const uint8_t *b, const int c, const int s) {
    switch (T) {
    case DW_Q4_0: return nib(ld(b + 8 * Q4_0_QS + 32 * (s % 4)), s >= 4);
    case DW_Q4_1: return nib(ld(b + 8 * Q4_1_QS + 32 * (s % 4)), s >= 4);
    case DW_Q5_0:
        return _mm256_or_si256(nib(ld(b + 8 * Q5_0_QS + 32 * (s % 4)), s >= 4),
                               move_bits(ld(b + 8 * Q5_0_QH), s, 4, 0x10));
    case DW_Q5_1:
        return _mm256_or_si256(nib(ld(b + 8 * Q5_1_QS + 32 * (s % 4)), s >= 4),
                               move_bits(ld(b + 8 * Q5_1_QH), s, 4, 0x10));
    case DW_Q8_0: return ld(b + 8 * Q8_0_QS + 32 * s);
    case DW_Q4_K: return nib(ld(b + 8 * Q4_K_QS + 32 * (8 * (c / 2) + s)), c % 2);
    default: { /* Q6_K */
        const int h = c / 4, f = c % 4;
        return _mm256_or_si256(nib(ld(b + 8 * Q6_K_QL + 32 * (16 * h + 8 * (f % 2) + s)), f / 2),
                               move_bits(ld(b + 8 * Q6_K_QH + 32 * (8 * h + s)), 2 * f, 4, 0x30));
    }
    }
}

/* one variable per row (FOR_ROWS, rows past R compiled away): see gemm_quant_avx2.c */
#define FOR_ROWS(X) X(0) X(1) X(2) X(3) X(4)

/* The blocks of 32 (dw_act rows). */
ALWAYS void tile_kernel32(const int T, const int R, const uint8_t *tile, int64_t chunks,
                          const void *const *xv, float (*out)[DW_TILE]) {
    const dw_act *const *x = (const dw_act *const *)xv;
    const int64_t tb = (int64_t)DW_TILE * block_bytes(T);
#define DECL(r)                                                                                   \
    __m256 acc##r = _mm256_setzero_ps();                                                          \
    const dw_act *x##r = R > r ? x[r] : NULL;
    FOR_ROWS(DECL)
#undef DECL
    const int64_t ahead = ((PREFETCH_BYTES + tb - 1) / tb) * tb;
    for (int64_t ci = 0; ci < chunks; ci++) {
        const uint8_t *b = tile + ci * tb;
        for (int64_t line = 0; line < tb; line += 64) _mm_prefetch((const char *)b + ahead + line, _MM_HINT_T0);
        __m256 d, m = _mm256_setzero_ps();
        switch (T) {
        case DW_Q4_0: d = ld_half8(b + 8 * Q4_0_D), m = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f)); break;
        case DW_Q5_0: d = ld_half8(b + 8 * Q5_0_D), m = _mm256_mul_ps(d, _mm256_set1_ps(-16.0f)); break;
        case DW_Q4_1: d = ld_half8(b + 8 * Q4_1_D), m = ld_half8(b + 8 * Q4_1_M); break;
        case DW_Q5_1: d = ld_half8(b + 8 * Q5_1_D), m = ld_half8(b + 8 * Q5_1_M); break;
        default: d = ld_half8(b + 8 * Q8_0_D); break;
        }
#define DECL(r) __m256i e##r = _mm256_setzero_si256(), o##r = _mm256_setzero_si256();
        FOR_ROWS(DECL)
#undef DECL
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            const __m256i v = codes(T, b, 0, s);
            const __m256i va = T == DW_Q8_0 ? _mm256_abs_epi8(v) : v;
#define STEP(r)                                                                                   \
    if (R > r) {                                                                                  \
        __m256i xb = bcast4(x##r[ci].q + 4 * s);                                                  \
        if (T == DW_Q8_0) xb = _mm256_sign_epi8(xb, v);                                           \
        if (s % 2) { o##r = _mm256_dpbusd_epi32(o##r, va, xb); KEEP(o##r); }                      \
        else { e##r = _mm256_dpbusd_epi32(e##r, va, xb); KEEP(e##r); }                            \
    }
            FOR_ROWS(STEP)
#undef STEP
        }
#define FINISH(r)                                                                                 \
    if (R > r) {                                                                                  \
        const dw_act *a = x##r + ci;                                                              \
        const __m256i isum = _mm256_add_epi32(e##r, o##r);                                        \
        acc##r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(a->d)), acc##r); \
        if (T != DW_Q8_0) acc##r = _mm256_fmadd_ps(m, _mm256_set1_ps(a->s[0]), acc##r);           \
    }
        FOR_ROWS(FINISH)
#undef FINISH
    }
#define STORE(r) if (R > r) _mm256_storeu_ps(out[r], acc##r);
    FOR_ROWS(STORE)
#undef STORE
}

/* The super-block types (Q4_K, Q6_K: dw_act256 rows). */
ALWAYS void tile_kernel256(const int T, const int R, const uint8_t *tile, int64_t chunks,
                           const void *const *xv, float (*out)[DW_TILE]) {
    const int64_t tb = (int64_t)DW_TILE * block_bytes(T), supers = chunks / 8;
#define DECL(r)                                                                                   \
    __m256 acc##r = _mm256_setzero_ps();                                                          \
    const dw_act256 *x##r = R > r ? (const dw_act256 *)xv[r] : NULL;
    FOR_ROWS(DECL)
#undef DECL
    const int64_t ahead = ((PREFETCH_BYTES + tb - 1) / tb) * tb;
    for (int64_t bi = 0; bi < supers; bi++) {
        const uint8_t *b = tile + bi * tb;
        for (int64_t line = 0; line < tb; line += 64) _mm_prefetch((const char *)b + ahead + line, _MM_HINT_T0);
        __m256i sc[4];
        __m256 d, dmin = _mm256_setzero_ps();
        if (T == DW_Q4_K) { /* sc[0..1]: scales of sub-blocks 0-3, 4-7; sc[2..3]: their mins */
            const __m256i a = ld(b + 8 * Q4_K_SC), bb = ld(b + 8 * Q4_K_SC + 32), c = ld(b + 8 * Q4_K_SC + 64);
            d = ld_half8(b + 8 * Q4_K_D), dmin = ld_half8(b + 8 * Q4_K_DMIN);
            sc[0] = _mm256_and_si256(a, mask8(63));
            sc[1] = _mm256_or_si256(_mm256_and_si256(c, mask8(0x0F)), move_bits(a, 6, 4, 0x30));
            sc[2] = _mm256_and_si256(bb, mask8(63));
            sc[3] = _mm256_or_si256(nib(c, 1), move_bits(bb, 6, 4, 0x30));
        } else { /* Q6_K: 16 signed scales */
            d = ld_half8(b + 8 * Q6_K_D);
            for (int g = 0; g < 4; g++) sc[g] = ld(b + 8 * Q6_K_SC + 32 * g);
        }
#define DECL(r) __m256i isum##r = _mm256_setzero_si256();
        FOR_ROWS(DECL)
#undef DECL
        if (T == DW_Q4_K) {
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                /* the chunk's scale as (sc, 0) 16-bit pairs: vpdpwssd of a 16-k sum (whose
                 * value fits int16, so its high half is its sign) gives sc * sum exactly */
                const __m256i p = pick(PICK32, sc[c / 4], c % 4);
#define DECL(r) __m256i h0_##r = _mm256_setzero_si256(), h1_##r = _mm256_setzero_si256();
                FOR_ROWS(DECL)
#undef DECL
#pragma GCC unroll 8
                for (int s = 0; s < 8; s++) {
                    const __m256i v = codes(T, b, c, s);
#define STEP(r)                                                                                   \
    if (R > r) {                                                                                  \
        const __m256i xb = bcast4(x##r[bi].q + 32 * c + 4 * s);                                   \
        if (s < 4) { h0_##r = _mm256_dpbusd_epi32(h0_##r, v, xb); KEEP(h0_##r); }                 \
        else { h1_##r = _mm256_dpbusd_epi32(h1_##r, v, xb); KEEP(h1_##r); }                       \
    }
                    FOR_ROWS(STEP)
#undef STEP
                }
#define SCALE(r)                                                                                  \
    if (R > r) {                                                                                  \
        isum##r = _mm256_dpwssd_epi32(isum##r, h0_##r, p);                                        \
        isum##r = _mm256_dpwssd_epi32(isum##r, h1_##r, p);                                        \
        KEEP(isum##r);                                                                            \
    }
                FOR_ROWS(SCALE)
#undef SCALE
            }
            /* the mins: (m_2j, m_2j+1) pairs against the row's 32-sums, integer */
            __m256i mp[4];
            for (int j = 0; j < 4; j++) mp[j] = _mm256_shuffle_epi8(sc[2 + j / 2], _mm256_loadu_si256((const __m256i *)PAIR16[j % 2]));
#define FINISH(r)                                                                                 \
    if (R > r) {                                                                                  \
        const dw_act256 *a = x##r + bi;                                                           \
        __m256i im = _mm256_madd_epi16(mp[0], bcast_pair(a->b32));                                \
        for (int j = 1; j < 4; j++) im = _mm256_add_epi32(im, _mm256_madd_epi16(mp[j], bcast_pair(a->b32 + 2 * j))); \
        const __m256 xd = _mm256_set1_ps(a->d);                                                   \
        acc##r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum##r), _mm256_mul_ps(d, xd), acc##r);      \
        acc##r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), neg(_mm256_mul_ps(dmin, xd)), acc##r);   \
    }
            FOR_ROWS(FINISH)
#undef FINISH
        } else {
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                const int c = i / 2;
                /* the sub-block's signed scale, sign-extended to 32 bits */
                const __m256i p = _mm256_srai_epi32(pick(PICK32S, sc[i / 4], i % 4), 24);
#define DECL(r) __m256i h_##r = _mm256_setzero_si256();
                FOR_ROWS(DECL)
#undef DECL
#pragma GCC unroll 4
                for (int s = 4 * (i % 2); s < 4 * (i % 2) + 4; s++) {
                    const __m256i v = codes(T, b, c, s);
#define STEP(r)                                                                                   \
    if (R > r) {                                                                                  \
        h_##r = _mm256_dpbusd_epi32(h_##r, v, bcast4(x##r[bi].q + 32 * c + 4 * s));              \
        KEEP(h_##r);                                                                              \
    }
                    FOR_ROWS(STEP)
#undef STEP
                }
#define SCALE(r)                                                                                  \
    if (R > r) {                                                                                  \
        isum##r = _mm256_add_epi32(isum##r, _mm256_mullo_epi32(h_##r, p));                        \
        KEEP(isum##r);                                                                            \
    }
                FOR_ROWS(SCALE)
#undef SCALE
            }
            /* the -32 offset: (p_2j, p_2j+1) pairs against the row's 16-sums, integer */
            __m256i pp[8];
            for (int j = 0; j < 8; j++) pp[j] = _mm256_srai_epi16(_mm256_shuffle_epi8(sc[j / 2], _mm256_loadu_si256((const __m256i *)PAIR16S[j % 2])), 8);
#define FINISH(r)                                                                                 \
    if (R > r) {                                                                                  \
        const dw_act256 *a = x##r + bi;                                                           \
        __m256i ib = _mm256_madd_epi16(pp[0], bcast_pair(a->b16));                                \
        for (int j = 1; j < 8; j++) ib = _mm256_add_epi32(ib, _mm256_madd_epi16(pp[j], bcast_pair(a->b16 + 2 * j))); \
        const __m256i tot = _mm256_sub_epi32(isum##r, _mm256_slli_epi32(ib, 5));                  \
        acc##r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_mul_ps(d, _mm256_set1_ps(a->d)), acc##r); \
    }
            FOR_ROWS(FINISH)
#undef FINISH
        }
    }
#define STORE(r) if (R > r) _mm256_storeu_ps(out[r], acc##r);
    FOR_ROWS(STORE)
#undef STORE
}

ALWAYS void tile_kernel(const int T, const int R, const uint8_t *tile, int64_t chunks,
                        const void *const *xv, float (*out)[DW_TILE]) {
    if (T == DW_Q4_K || T == DW_Q6_K) tile_kernel256(T, R, tile, chunks, xv, out);
    else tile_kernel32(T, R, tile, chunks, xv, out);
}

/* one function per row count (as gemm_quant_avx2.c) */
#define KERNEL_R(T, R)                                                                            \
    static TARGET __attribute__((noinline)) void tile_vnni_##T##_##R(                            \
        const uint8_t *t, int64_t c, const void *const *x, float (*out)[DW_TILE]) {              \
        tile_kernel(T, R, t, c, x, out);                                                          \
    }
#define KERNEL(T)                                                                                 \
    KERNEL_R(T, 1) KERNEL_R(T, 2) KERNEL_R(T, 3) KERNEL_R(T, 4) KERNEL_R(T, 5)                    \
    static TARGET void tile_vnni_##T(const uint8_t *t, int64_t c, const void *const *x, int rows, \
                                     float (*out)[DW_TILE]) {                                     \
        switch (rows) {                                                                           \
        case 1: tile_vnni_##T##_1(t, c, x, out); break;                                           \
        case 2: tile_vnni_##T##_2(t, c, x, out); break;                                           \
        case 3: tile_vnni_##T##_3(t, c, x, out); break;                                           \
        case 4: tile_vnni_##T##_4(t, c, x, out); break;                                           \
        default: tile_vnni_##T##_5(t, c, x, out); break;                                          \
        }                                                                                         \
    }
KERNEL(DW_Q4_0)
KERNEL(DW_Q4_1)
KERNEL(DW_Q5_0)
KERNEL(DW_Q5_1)
KERNEL(DW_Q8_0)
KERNEL(DW_Q4_K)
KERNEL(DW_Q6_K)

int dw_cpu_has_avx512vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
}

dw_tile_fn dw_tile_kernel_avx512(int qtype) {
    if (!dw_cpu_has_avx512vnni()) return NULL;
    switch (qtype) {
    case DW_Q4_0: return tile_vnni_DW_Q4_0;
    case DW_Q4_1: return tile_vnni_DW_Q4_1;
    case DW_Q5_0: return tile_vnni_DW_Q5_0;
    case DW_Q5_1: return tile_vnni_DW_Q5_1;
    case DW_Q8_0: return tile_vnni_DW_Q8_0;
    case DW_Q4_K: return tile_vnni_DW_Q4_K;
    case DW_Q6_K: return tile_vnni_DW_Q6_K;
    default: return NULL; /* Q2_K, Q3_K, Q5_K: the AVX2 kernel */
    }
}

#else

int dw_cpu_has_avx512vnni(void) { return 0; }

dw_tile_fn dw_tile_kernel_avx512(int qtype) {
    (void)qtype;
    return NULL;
}

#endif
