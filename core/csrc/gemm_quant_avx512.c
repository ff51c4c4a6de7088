/*
 * The AVX512-VNNI tile kernels of the quantized GEMM: the contract of quant.h for the
 * types where it matters most: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (blocks of 32) and Q4_K, Q6_K
 * (super-blocks of 256). The other types run the AVX2 kernel (dw_tile_kernel_for in
 * gemm_quant.c is the one place that chooses).
 *
 * Why: the AVX2 kernel spends per step and row a broadcast, a vpmaddubsw and a 16-bit add,
 * plus a vpmaddwd flush every few steps. vpdpbusd (u8 codes x s8 activations, four
 * products summed straight into int32) makes a step one instruction per row (the row's
 * four int8 values are a broadcast load); the decode of a step's codes (a load, a shift
 * and a mask or two) is shared by the rows of a pass as before.
 *
 * Two widths, one body (gemm_quant_avx512_body.h): 512 bits hold TWO adjacent tiles of a
 * segment (16 outputs, the second tile's bytes in the upper half), which run_tiles takes
 * wherever a thread's range has a pair, with up to DW_MAX_ROWS2 (8) rows a pass: on this
 * class of CPU a 512-bit vpdpbusd issues as fast as a 256-bit one (measured: two per
 * cycle either way), so the pair costs about what one tile did, and the 32 registers hold
 * eight rows' sums, so 8 rows decode the weights once. A lone tile runs the 256-bit body
 * (eight outputs, up to five rows, like the AVX2 kernel), and a one-row decode, which
 * walks one tile at a time, runs Q4_K and Q6_K on 512 bits two steps a vector (tile_k1_*).
 *
 * Integer sums per type (all exact int32, so any order gives the contract's I):
 *   32-blocks: the chunk's 32 products in two vpdpbusd chains (even / odd steps), added
 *     (one chain past four rows: registers). Q8_0's signed codes take |w| x sign(x, w),
 *     as in the AVX2 kernel (512 bits: a masked negate, AVX-512 has no vpsignb).
 *   Q4_K: per chunk two 16-k sums (<= 15 * 127 * 16, so each fits int16) scaled by the
 *     chunk's 6-bit scale with vpdpwssd into the super-block's sum; the mins as AVX2.
 *     (Q4_K and Q6_K spill some registers at eight rows; still faster than 4 + 4.)
 *   Q6_K: per 16-k sub-block one sum (<= 63 * 127 * 16, not int16) times its signed scale
 *     by vpmulld; the -32 offset against the row's 16-sums as AVX2.
 * The float steps are the same IEEE operations per lane in the same order as the scalar
 * and AVX2 kernels (one convert and the fused multiply-adds of quant.h), so the three agree
 * bitwise; the tests compare them with torch.equal.
 */
#include "quant_layout.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <string.h>

#define TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define ALWAYS static inline __attribute__((always_inline)) TARGET
/* how far ahead the two-tile body asks for each of its two streams (the one-tile body:
 * DW_PREFETCH_AHEAD, quant_layout.h; see prefetch_ahead in the body) */
#define PREFETCH_BYTES 2048

/* KEEP: pins a running sum to a register here (see gemm_quant_avx2.c); "v": any of the 32 */
#define KEEP(v) __asm__("" : "+v"(v))

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

/* one variable per row (FOR_ROWS, rows past R compiled away): see gemm_quant_avx2.c */
#define FOR_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

ALWAYS int32_t ld32(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* ---- one tile: 256 bits ---- */
#define V_TILES 1
#define V_OUT DW_TILE
#define SFX(f) f##_8
#define VI __m256i
#define VF __m256
#define V_LD(ts, p) ((void)(ts), _mm256_loadu_si256((const __m256i *)(p)))
#define V_HALF(ts, p) ((void)(ts), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))
#define V_B4(p) _mm256_set1_epi32(ld32(p))
#define V_BPAIR(p) _mm256_set1_epi32(ld32(p))
#define V_B8(m) _mm256_set1_epi8((char)(m))
#define V_ZI() _mm256_setzero_si256()
#define V_ZF() _mm256_setzero_ps()
#define V_SET1F _mm256_set1_ps
#define V_OR _mm256_or_si256
#define V_AND _mm256_and_si256
#define V_SRLI16 _mm256_srli_epi16
#define V_SLLI16 _mm256_slli_epi16
#define V_ADD32 _mm256_add_epi32
#define V_SUB32 _mm256_sub_epi32
#define V_SLLI32 _mm256_slli_epi32
#define V_SRAI32 _mm256_srai_epi32
#define V_SRAI16 _mm256_srai_epi16
#define V_MULLO32 _mm256_mullo_epi32
#define V_MADD16 _mm256_madd_epi16
#define V_DPBUSD _mm256_dpbusd_epi32
#define V_DPWSSD _mm256_dpwssd_epi32
#define V_CVT _mm256_cvtepi32_ps
#define V_MULF _mm256_mul_ps
#define V_FMA _mm256_fmadd_ps
#define V_STORE _mm256_storeu_ps
#define V_ABS8 _mm256_abs_epi8
#define V_SIGN8 _mm256_sign_epi8
#define V_NEG(v) _mm256_xor_ps(v, _mm256_set1_ps(-0.0f))
#define V_SHUF8(v, pat) _mm256_shuffle_epi8(v, _mm256_loadu_si256((const __m256i *)(pat)))
#include "gemm_quant_avx512_body.h"

/* ---- two adjacent tiles: 512 bits, the second tile's bytes ``ts`` after the first's ---- */
#define V_TILES 2
#define V_OUT (2 * DW_TILE)
#define SFX(f) f##_16
#define VI __m512i
#define VF __m512
#define V_LD(ts, p)                                                                               \
    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p))),          \
                       _mm256_loadu_si256((const __m256i *)((p) + (ts))), 1)
#define V_HALF(ts, p)                                                                             \
    _mm512_cvtph_ps(_mm256_inserti128_si256(                                                      \
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p))),                            \
        _mm_loadu_si128((const __m128i *)((p) + (ts))), 1))
#define V_B4(p) _mm512_set1_epi32(ld32(p))
#define V_BPAIR(p) _mm512_set1_epi32(ld32(p))
#define V_B8(m) _mm512_set1_epi8((char)(m))
#define V_ZI() _mm512_setzero_si512()
#define V_ZF() _mm512_setzero_ps()
#define V_SET1F _mm512_set1_ps
#define V_OR _mm512_or_si512
#define V_AND _mm512_and_si512
#define V_SRLI16 _mm512_srli_epi16
#define V_SLLI16 _mm512_slli_epi16
#define V_ADD32 _mm512_add_epi32
#define V_SUB32 _mm512_sub_epi32
#define V_SLLI32 _mm512_slli_epi32
#define V_SRAI32 _mm512_srai_epi32
#define V_SRAI16 _mm512_srai_epi16
#define V_MULLO32 _mm512_mullo_epi32
#define V_MADD16 _mm512_madd_epi16
#define V_DPBUSD _mm512_dpbusd_epi32
#define V_DPWSSD _mm512_dpwssd_epi32
#define V_CVT _mm512_cvtepi32_ps
#define V_MULF _mm512_mul_ps
#define V_FMA _mm512_fmadd_ps
#define V_STORE _mm512_storeu_ps
#define V_ABS8 _mm512_abs_epi8
/* x * sign(v) for the |v| x x products: where v = 0 the product is 0 either way */
#define V_SIGN8(x, v) _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(v), _mm512_setzero_si512(), x)
#define V_NEG(v)                                                                                  \
    _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN)))
/* the 32-byte patterns hold the same 16 bytes twice: repeated for the 128-bit lanes */
#define V_SHUF8(v, pat)                                                                           \
    _mm512_shuffle_epi8(v, _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(pat))))
#include "gemm_quant_avx512_body.h"

/* ---- one tile, one row, two steps a vector: Q4_K and Q6_K ----
 * A one-row decode reads one tile at a time (gemm_quant.c, pair_min_rows), and there the
 * super-block kernels are near what limits one thread (measured with the weights in cache,
 * one thread, the 256-bit body: ~47 GB/s Q4_K, ~33 Q6_K, against ~36-38 from memory;
 * this one: ~54 and ~36; from memory Q6_K 17920 x 1536 best ~31 -> ~35, Q4_K unchanged,
 * memory-bound). Here one 512-bit vector holds TWO
 * consecutive steps of the tile (the step's 32 bytes and the next one's, one load), the
 * row's int8 values of both steps in the matching halves (one 8-byte load, one vpermd),
 * so a pair of steps is one vpdpbusd. The halves' integer sums are added when the
 * super-block's integer sum is done: every partial sum is an exact int32 (an 8-k half of
 * a 16-k sum, so it still fits int16 where vpdpwssd needs it), so the sum is the same I of
 * quant.h, and the float steps are the 256-bit kernel's: the same bits. */
static const int32_t HALVES[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};

/* the row's int8 values of steps s and s + 1 (8 bytes at p): the first four in lanes 0-7 */
ALWAYS __m512i x_pair(const int8_t *p) {
    return _mm512_permutexvar_epi32(_mm512_loadu_si512(HALVES),
                                    _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)p)));
}
ALWAYS __m512i ld512(const uint8_t *p) { return _mm512_loadu_si512(p); }
ALWAYS __m512i twice(__m256i v) { return _mm512_broadcast_i64x4(v); }
ALWAYS __m256i fold(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

static TARGET __attribute__((noinline)) void tile_k1_q4k(const uint8_t *tile, int64_t chunks,
                                                         const void *const *xv,
                                                         float (*out)[DW_TILE]) {
    const int64_t tb = (int64_t)DW_TILE * Q4_K_BYTES, supers = chunks / 8;
    const int64_t ahead = prefetch_ahead_8(tb);
    const dw_act256 *x = (const dw_act256 *)xv[0];
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t bi = 0; bi < supers; bi++) {
        const uint8_t *b = tile + bi * tb;
        prefetch_8(b, bi * tb, ahead, tb, 0);
        const __m256i a = _mm256_loadu_si256((const __m256i *)(b + 8 * Q4_K_SC));
        const __m256i bb = _mm256_loadu_si256((const __m256i *)(b + 8 * Q4_K_SC + 32));
        const __m256i c8 = _mm256_loadu_si256((const __m256i *)(b + 8 * Q4_K_SC + 64));
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 8 * Q4_K_D)));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 8 * Q4_K_DMIN)));
        __m256i sc[4];
        sc[0] = _mm256_and_si256(a, _mm256_set1_epi8(63));
        sc[1] = _mm256_or_si256(_mm256_and_si256(c8, _mm256_set1_epi8(0x0F)), move_bits_8(a, 6, 4, 0x30));
        sc[2] = _mm256_and_si256(bb, _mm256_set1_epi8(63));
        sc[3] = _mm256_or_si256(move_bits_8(c8, 4, 0, 0x0F), move_bits_8(bb, 6, 4, 0x30));
        const int8_t *xq = x[bi].q;
        __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            const __m512i p = twice(_mm256_shuffle_epi8(sc[c / 4], _mm256_loadu_si256((const __m256i *)PICK32[c % 4])));
            __m512i h0 = _mm512_setzero_si512(), h1 = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int s = 0; s < 8; s += 2) {
                __m512i v = ld512(b + 8 * Q4_K_QS + 32 * (8 * (c / 2) + s));
                v = _mm512_and_si512(c % 2 ? _mm512_srli_epi16(v, 4) : v, m4);
                if (s < 4) h0 = _mm512_dpbusd_epi32(h0, v, x_pair(xq + 32 * c + 4 * s));
                else h1 = _mm512_dpbusd_epi32(h1, v, x_pair(xq + 32 * c + 4 * s));
            }
            isum = _mm512_dpwssd_epi32(isum, h0, p);
            isum = _mm512_dpwssd_epi32(isum, h1, p);
        }
        __m256i mp[4];
        for (int j = 0; j < 4; j++)
            mp[j] = _mm256_shuffle_epi8(sc[2 + j / 2], _mm256_loadu_si256((const __m256i *)PAIR16[j % 2]));
        const dw_act256 *ax = x + bi;
        __m256i im = _mm256_madd_epi16(mp[0], _mm256_set1_epi32(ld32(ax->b32)));
        for (int j = 1; j < 4; j++)
            im = _mm256_add_epi32(im, _mm256_madd_epi16(mp[j], _mm256_set1_epi32(ld32(ax->b32 + 2 * j))));
        const __m256 xd = _mm256_set1_ps(ax->d);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold(isum)), _mm256_mul_ps(d, xd), acc);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im),
                              _mm256_xor_ps(_mm256_mul_ps(dmin, xd), _mm256_set1_ps(-0.0f)), acc);
    }
    _mm256_storeu_ps(out[0], acc);
}

static TARGET __attribute__((noinline)) void tile_k1_q6k(const uint8_t *tile, int64_t chunks,
                                                         const void *const *xv,
                                                         float (*out)[DW_TILE]) {
    const int64_t tb = (int64_t)DW_TILE * Q6_K_BYTES, supers = chunks / 8;
    const int64_t ahead = prefetch_ahead_8(tb);
    const dw_act256 *x = (const dw_act256 *)xv[0];
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t bi = 0; bi < supers; bi++) {
        const uint8_t *b = tile + bi * tb;
        prefetch_8(b, bi * tb, ahead, tb, 0);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 8 * Q6_K_D)));
        __m256i sc[4];
        for (int g = 0; g < 4; g++) sc[g] = _mm256_loadu_si256((const __m256i *)(b + 8 * Q6_K_SC + 32 * g));
        const int8_t *xq = x[bi].q;
        __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            const int c = i / 2, hh = c / 4, f = c % 4;
            const __m512i p = twice(_mm256_srai_epi32(
                _mm256_shuffle_epi8(sc[i / 4], _mm256_loadu_si256((const __m256i *)PICK32S[i % 4])), 24));
            __m512i h = _mm512_setzero_si512();
#pragma GCC unroll 2
            for (int s = 4 * (i % 2); s < 4 * (i % 2) + 4; s += 2) {
                __m512i lo = ld512(b + 8 * Q6_K_QL + 32 * (16 * hh + 8 * (f % 2) + s));
                lo = _mm512_and_si512(f / 2 ? _mm512_srli_epi16(lo, 4) : lo, m4);
                __m512i hi = ld512(b + 8 * Q6_K_QH + 32 * (8 * hh + s));
                hi = _mm512_and_si512(2 * f > 4 ? _mm512_srli_epi16(hi, 2 * f - 4)
                                      : 2 * f < 4 ? _mm512_slli_epi16(hi, 4 - 2 * f) : hi, m30);
                h = _mm512_dpbusd_epi32(h, _mm512_or_si512(lo, hi), x_pair(xq + 32 * c + 4 * s));
            }
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(h, p));
        }
        __m256i pp[8];
        for (int j = 0; j < 8; j++)
            pp[j] = _mm256_srai_epi16(_mm256_shuffle_epi8(sc[j / 2], _mm256_loadu_si256((const __m256i *)PAIR16S[j % 2])), 8);
        const dw_act256 *ax = x + bi;
        __m256i ib = _mm256_madd_epi16(pp[0], _mm256_set1_epi32(ld32(ax->b16)));
        for (int j = 1; j < 8; j++)
            ib = _mm256_add_epi32(ib, _mm256_madd_epi16(pp[j], _mm256_set1_epi32(ld32(ax->b16 + 2 * j))));
        const __m256i tot = _mm256_sub_epi32(fold(isum), _mm256_slli_epi32(ib, 5));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_mul_ps(d, _mm256_set1_ps(ax->d)), acc);
    }
    _mm256_storeu_ps(out[0], acc);
}

/* Q4_K on two tiles at seven rows: GCC's code for that one instance runs at 3.3x the
 * six-row time (one thread, 1536 x 8960: 1.44 ms against 0.53 at six rows and 0.69 at
 * eight; benchmarks/quant_gemm.py --rows 1,2,3,4,5,6,7,8), which made every verify of
 * seven tokens (k = 6) cost twice a k = 7 one. It runs as eight rows instead, the last
 * row repeated into a scratch row: each row is its own accumulation, so rows 0..6 get
 * the bits the seven-row kernel gives (the batch-invariance tests hold them to it). */
typedef void (*tile16_r_fn)(const uint8_t *, int64_t, int64_t, const void *const *,
                            float (*)[2 * DW_TILE]);
static void pad_to_8_q4k(const uint8_t *t, int64_t ts, int64_t c, const void *const *x,
                         float (*out)[2 * DW_TILE], tile16_r_fn eight) {
    const void *x8[8] = {x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[6]};
    float o8[8][2 * DW_TILE];
    eight(t, ts, c, x8, o8);
    memcpy(out, o8, 7 * sizeof o8[0]);
}

/* one function per row count and width (as gemm_quant_avx2.c): 1..5 rows on one tile,
 * 1..8 on two */
#define KERNEL8_R(T, R)                                                                           \
    static TARGET __attribute__((noinline)) void tile_vnni8_##T##_##R(                           \
        const uint8_t *t, int64_t c, const void *const *x, float (*out)[DW_TILE]) {              \
        tile_kernel_8(T, R, t, 0, c, x, &out[0][0]);                                              \
    }
#define KERNEL16_R(T, R)                                                                          \
    static TARGET __attribute__((noinline)) void tile_vnni16_##T##_##R(                          \
        const uint8_t *t, int64_t ts, int64_t c, const void *const *x,                            \
        float (*out)[2 * DW_TILE]) {                                                              \
        tile_kernel_16(T, R, t, ts, c, x, &out[0][0]);                                            \
    }
#define KERNEL(T)                                                                                 \
    KERNEL8_R(T, 1) KERNEL8_R(T, 2) KERNEL8_R(T, 3) KERNEL8_R(T, 4) KERNEL8_R(T, 5)               \
    KERNEL16_R(T, 1) KERNEL16_R(T, 2) KERNEL16_R(T, 3) KERNEL16_R(T, 4) KERNEL16_R(T, 5)          \
    KERNEL16_R(T, 6) KERNEL16_R(T, 7) KERNEL16_R(T, 8)                                            \
    static TARGET void tile_vnni8_##T(const uint8_t *t, int64_t c, const void *const *x,          \
                                      int rows, float (*out)[DW_TILE]) {                          \
        switch (rows) {                                                                           \
        case 1:                                                                                   \
            if (T == DW_Q4_K) tile_k1_q4k(t, c, x, out);                                          \
            else if (T == DW_Q6_K) tile_k1_q6k(t, c, x, out);                                     \
            else tile_vnni8_##T##_1(t, c, x, out);                                                \
            break;                                                                                \
        case 2: tile_vnni8_##T##_2(t, c, x, out); break;                                          \
        case 3: tile_vnni8_##T##_3(t, c, x, out); break;                                          \
        case 4: tile_vnni8_##T##_4(t, c, x, out); break;                                          \
        default: tile_vnni8_##T##_5(t, c, x, out); break;                                         \
        }                                                                                         \
    }                                                                                             \
    static TARGET void tile_vnni16_##T(const uint8_t *t, int64_t ts, int64_t c,                   \
                                       const void *const *x, int rows,                            \
                                       float (*out)[2 * DW_TILE]) {                               \
        switch (rows) {                                                                           \
        case 1: tile_vnni16_##T##_1(t, ts, c, x, out); break;                                     \
        case 2: tile_vnni16_##T##_2(t, ts, c, x, out); break;                                     \
        case 3: tile_vnni16_##T##_3(t, ts, c, x, out); break;                                     \
        case 4: tile_vnni16_##T##_4(t, ts, c, x, out); break;                                     \
        case 5: tile_vnni16_##T##_5(t, ts, c, x, out); break;                                     \
        case 6: tile_vnni16_##T##_6(t, ts, c, x, out); break;                                     \
        case 7:                                                                                   \
            if (T == DW_Q4_K) pad_to_8_q4k(t, ts, c, x, out, tile_vnni16_##T##_8);                \
            else tile_vnni16_##T##_7(t, ts, c, x, out);                                           \
            break;                                                                                \
        default: tile_vnni16_##T##_8(t, ts, c, x, out); break;                                    \
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

dw_tile_fn dw_tile_kernel_avx512(int qtype, dw_tile2_fn *pair) {
    if (pair) *pair = NULL;
    if (!dw_cpu_has_avx512vnni()) return NULL;
#define CASE(T)                                                                                   \
    case T:                                                                                       \
        if (pair) *pair = tile_vnni16_##T;                                                        \
        return tile_vnni8_##T;
    switch (qtype) {
    CASE(DW_Q4_0)
    CASE(DW_Q4_1)
    CASE(DW_Q5_0)
    CASE(DW_Q5_1)
    CASE(DW_Q8_0)
    CASE(DW_Q4_K)
    CASE(DW_Q6_K)
    default: return NULL; /* Q2_K, Q3_K, Q5_K: the AVX2 kernel */
    }
#undef CASE
}

#else

int dw_cpu_has_avx512vnni(void) { return 0; }

dw_tile_fn dw_tile_kernel_avx512(int qtype, dw_tile2_fn *pair) {
    (void)qtype;
    if (pair) *pair = NULL;
    return NULL;
}

#endif
