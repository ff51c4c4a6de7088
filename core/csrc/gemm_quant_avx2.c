/*
 * The AVX2 tile kernel of the quantized GEMM: the contract of quant.h, eight outputs at
 * a time (one fp32 lane each) and up to five activation rows per pass over a tile.
 *
 * Per step (four k of eight outputs, one 32-byte vector of codes decoded with a shift
 * and a mask or two) each row costs one broadcast load, one vpmaddubsw (codes x the
 * row's int8 values, pairs summed to 16 bits) and one 16-bit add; the 16-bit sums are
 * widened by vpmaddwd with the sub-block scale as often as their range requires (every
 * 8 steps for 4-bit codes, 4 for 5-bit, 2 for 6-bit, every step for Q8_0's signed
 * bytes, which take the usual abs/sign trick). Then per chunk: one convert and two
 * fused multiply-adds per row. The decode is shared by the rows of a pass, so a verify
 * step of five rows costs much less than five decode steps.
 *
 * Bitwise the scalar kernel (gemm_quant.c): the integer sums are exact (no 16-bit sum
 * can saturate: the flush intervals above keep them within range for codes <= 63 and
 * activations in [-127, 127]), and the float steps are the same IEEE operations per lane
 * in the same order, so the tests compare the two with torch.equal.
 */
#include "quant_layout.h"

/* Built for AVX2 whatever the build's -march (function target attributes), and chosen
 * at run time when the CPU has AVX2, FMA and F16C: a portable build
 * (DRAFTWISE_PORTABLE_BUILD=1) still runs it on any AVX2 machine. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <math.h>

#define TARGET __attribute__((target("avx2,fma,f16c")))
#define ALWAYS static inline __attribute__((always_inline)) TARGET
/* KEEP: an empty asm that pins a running sum to a register at this point. Without it GCC
 * reassociates the integer sums of a pass (exact, so allowed) into one chain per row
 * after all the products, which then wait on the stack: measured 25-35% of a five-row
 * pass. */
#define KEEP(v) __asm__("" : "+x"(v))

ALWAYS __m256i ld(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
ALWAYS __m256 ld_half8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
ALWAYS __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}
ALWAYS __m256i mask8(int m) { return _mm256_set1_epi8((char)m); }
ALWAYS __m256 neg(__m256 v) { return _mm256_xor_ps(v, _mm256_set1_ps(-0.0f)); }

/* bits [from, from + width) of every byte moved to [to, to + width), the rest cleared.
 * The 16-bit shifts carry bits between the two bytes of a word only into positions the
 * mask clears (checked for every (from, to) the kernels use). */
ALWAYS __m256i move_bits(__m256i v, int from, int to, int mask) {
    const __m256i s = from < to   ? _mm256_slli_epi16(v, to - from)
                      : from > to ? _mm256_srli_epi16(v, from - to)
                                  : v;
    return _mm256_and_si256(s, mask8(mask));
}
ALWAYS __m256i nib(__m256i v, int high) { return move_bits(v, high ? 4 : 0, 0, 0x0F); }

/* vpshufb patterns picking byte b of each row's four (rows are 32-bit lanes):
 * PICK16[b]: (b, -, b, -) zero-extended 16-bit pairs; PICK16S[b]: (-, b, -, b), the byte
 * in the high half (shift right arithmetically for a signed pair); PICK32[b]: byte b
 * alone in the low byte; PICK32S[b]: byte b in the high byte. */
#define Z (char)0x80
#define LANES4(a, b, c, d) a, b, c, d, a + 4, b + 4, c + 4, d + 4, a + 8, b + 8, c + 8, d + 8, \
                           a + 12, b + 12, c + 12, d + 12
#define PAT(a, b, c, d) {LANES4(a, b, c, d), LANES4(a, b, c, d)}
static const char PICK16[4][32] = {PAT(0, Z, 0, Z), PAT(1, Z, 1, Z), PAT(2, Z, 2, Z), PAT(3, Z, 3, Z)};
static const char PICK16S[4][32] = {PAT(Z, 0, Z, 0), PAT(Z, 1, Z, 1), PAT(Z, 2, Z, 2), PAT(Z, 3, Z, 3)};
static const char PICK32[4][32] = {PAT(0, Z, Z, Z), PAT(1, Z, Z, Z), PAT(2, Z, Z, Z), PAT(3, Z, Z, Z)};
static const char PICK32S[4][32] = {PAT(Z, Z, Z, 0), PAT(Z, Z, Z, 1), PAT(Z, Z, Z, 2), PAT(Z, Z, Z, 3)};
#undef PAT
#undef LANES4
#undef Z
ALWAYS __m256i pick(const char (*pat)[32], __m256i v, int b) {
    return _mm256_shuffle_epi8(v, _mm256_loadu_si256((const __m256i *)pat[b]));
}

ALWAYS int is_k(const int T) { return T == DW_Q2_K || T == DW_Q3_K || T == DW_Q4_K || T == DW_Q5_K || T == DW_Q6_K; }

/* Steps whose 16-bit sums may be added before widening (see the header). */
ALWAYS int flush_steps(const int T) {
    switch (T) {
    case DW_Q4_0: case DW_Q4_1: case DW_Q4_K: return 8;
    case DW_Q8_0: return 1;
    case DW_Q6_K: return 2;
    default: return 4; /* 5-bit codes; Q2_K/Q3_K widen per 16-k sub-block */
    }
}

/* min terms per chunk: 1 (times s[0]) or 2 (times s[1], s[2]) or 0 */
ALWAYS int min_terms(const int T) {
    return T == DW_Q8_0 ? 0 : T == DW_Q2_K || T == DW_Q3_K || T == DW_Q6_K ? 2 : 1;
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
    case DW_Q2_K: return move_bits(ld(b + 8 * Q2_K_QS + 32 * (8 * (c / 4) + s)), 2 * (c % 4), 0, 3);
    case DW_Q3_K:
        return _mm256_or_si256(move_bits(ld(b + 8 * Q3_K_QS + 32 * (8 * (c / 4) + s)), 2 * (c % 4), 0, 3),
                               move_bits(ld(b + 8 * Q3_K_HM + 32 * s), c, 2, 0x04));
    case DW_Q4_K: return nib(ld(b + 8 * Q4_K_QS + 32 * (8 * (c / 2) + s)), c % 2);
    case DW_Q5_K:
        return _mm256_or_si256(nib(ld(b + 8 * Q5_K_QS + 32 * (8 * (c / 2) + s)), c % 2),
                               move_bits(ld(b + 8 * Q5_K_QH + 32 * s), c, 4, 0x10));
    default: { /* Q6_K */
        const int h = c / 4, f = c % 4;
        return _mm256_or_si256(nib(ld(b + 8 * Q6_K_QL + 32 * (16 * h + 8 * (f % 2) + s)), f / 2),
                               move_bits(ld(b + 8 * Q6_K_QH + 32 * (8 * h + s)), 2 * f, 4, 0x30));
    }
    }
}

/* A tile block's scales, decoded once and shared by its chunks. */
typedef struct {
    __m256 d, dmin;
    __m256i sc[4]; /* per-row scale bytes, four per lane (type-specific, see block_scales) */
} blk_scales;

ALWAYS blk_scales block_scales(const int T, const uint8_t *b) {
    blk_scales r;
    r.d = r.dmin = _mm256_setzero_ps();
    switch (T) {
    case DW_Q4_0: r.d = ld_half8(b + 8 * Q4_0_D); break;
    case DW_Q4_1: r.d = ld_half8(b + 8 * Q4_1_D), r.dmin = ld_half8(b + 8 * Q4_1_M); break;
    case DW_Q5_0: r.d = ld_half8(b + 8 * Q5_0_D); break;
    case DW_Q5_1: r.d = ld_half8(b + 8 * Q5_1_D), r.dmin = ld_half8(b + 8 * Q5_1_M); break;
    case DW_Q8_0: r.d = ld_half8(b + 8 * Q8_0_D); break;
    case DW_Q2_K:
        r.d = ld_half8(b + 8 * Q2_K_D), r.dmin = ld_half8(b + 8 * Q2_K_DMIN);
        for (int g = 0; g < 4; g++) r.sc[g] = ld(b + 8 * Q2_K_SC + 32 * g);
        break;
    case DW_Q3_K: { /* 16 six-bit scales from 12 bytes, then minus 32 (signed bytes) */
        const __m256i a = ld(b + 8 * Q3_K_SC), bb = ld(b + 8 * Q3_K_SC + 32), c = ld(b + 8 * Q3_K_SC + 64);
        const __m256i lo = mask8(0x0F), k32 = mask8(32);
        r.d = ld_half8(b + 8 * Q3_K_D);
        r.sc[0] = _mm256_or_si256(_mm256_and_si256(a, lo), move_bits(c, 0, 4, 0x30));
        r.sc[1] = _mm256_or_si256(_mm256_and_si256(bb, lo), move_bits(c, 2, 4, 0x30));
        r.sc[2] = _mm256_or_si256(nib(a, 1), move_bits(c, 4, 4, 0x30));
        r.sc[3] = _mm256_or_si256(nib(bb, 1), move_bits(c, 6, 4, 0x30));
        for (int g = 0; g < 4; g++) r.sc[g] = _mm256_sub_epi8(r.sc[g], k32);
        break;
    }
    case DW_Q4_K:
    case DW_Q5_K: { /* sc[0..1]: scales of sub-blocks 0-3, 4-7; sc[2..3]: their mins */
        const int o = T == DW_Q4_K ? Q4_K_SC : Q5_K_SC;
        const __m256i a = ld(b + 8 * o), bb = ld(b + 8 * o + 32), c = ld(b + 8 * o + 64);
        r.d = ld_half8(b + 8 * Q4_K_D), r.dmin = ld_half8(b + 8 * Q4_K_DMIN);
        r.sc[0] = _mm256_and_si256(a, mask8(63));
        r.sc[1] = _mm256_or_si256(_mm256_and_si256(c, mask8(0x0F)), move_bits(a, 6, 4, 0x30));
        r.sc[2] = _mm256_and_si256(bb, mask8(63));
        r.sc[3] = _mm256_or_si256(nib(c, 1), move_bits(bb, 6, 4, 0x30));
        break;
    }
    default: /* Q6_K: 16 signed scales */
        r.d = ld_half8(b + 8 * Q6_K_D);
        for (int g = 0; g < 4; g++) r.sc[g] = ld(b + 8 * Q6_K_SC + 32 * g);
        break;
    }
    return r;
}

/* Chunk c's sub-block scales (16-bit pairs for vpmaddwd, per half) and min terms. */
typedef struct {
    __m256i p[2];
    __m256 m[2];
} chunk_scales;

ALWAYS chunk_scales chunk_of(const int T, const blk_scales *bs, const int c) {
    chunk_scales r;
    switch (T) {
    case DW_Q4_0: r.p[0] = r.p[1] = _mm256_set1_epi16(1), r.m[0] = _mm256_mul_ps(bs->d, _mm256_set1_ps(-8.0f)); break;
    case DW_Q5_0: r.p[0] = r.p[1] = _mm256_set1_epi16(1), r.m[0] = _mm256_mul_ps(bs->d, _mm256_set1_ps(-16.0f)); break;
    case DW_Q4_1:
    case DW_Q5_1: r.p[0] = r.p[1] = _mm256_set1_epi16(1), r.m[0] = bs->dmin; break;
    case DW_Q8_0: r.p[0] = r.p[1] = _mm256_set1_epi16(1); break;
    case DW_Q4_K:
    case DW_Q5_K: {
        r.p[0] = r.p[1] = pick(PICK16, bs->sc[c / 4], c % 4);
        const __m256 m = _mm256_cvtepi32_ps(pick(PICK32, bs->sc[2 + c / 4], c % 4));
        r.m[0] = neg(_mm256_mul_ps(bs->dmin, m));
        break;
    }
    case DW_Q2_K:
        for (int h = 0; h < 2; h++) {
            const int i = 2 * c + h;
            r.p[h] = _mm256_and_si256(pick(PICK16, bs->sc[i / 4], i % 4), _mm256_set1_epi16(0x0F));
            const __m256i m = _mm256_srli_epi32(pick(PICK32, bs->sc[i / 4], i % 4), 4);
            r.m[h] = neg(_mm256_mul_ps(bs->dmin, _mm256_cvtepi32_ps(m)));
        }
        break;
    default: /* Q3_K, Q6_K: signed scales, offset 4 or 32 */
        for (int h = 0; h < 2; h++) {
            const int i = 2 * c + h;
            r.p[h] = _mm256_srai_epi16(pick(PICK16S, bs->sc[i / 4], i % 4), 8);
            const __m256 sc = _mm256_cvtepi32_ps(_mm256_srai_epi32(pick(PICK32S, bs->sc[i / 4], i % 4), 24));
            r.m[h] = _mm256_mul_ps(bs->d, _mm256_mul_ps(sc, _mm256_set1_ps(T == DW_Q6_K ? -32.0f : -4.0f)));
        }
        break;
    }
    return r;
}

/* Per-row state as named variables, one per row (acc0..acc4 and so on), expanded by
 * FOR_ROWS with the rows past R compiled away: GCC keeps arrays of vectors indexed in
 * loops on the stack here (every sum a load and a store), named variables in registers. */
#define FOR_ROWS(X) X(0) X(1) X(2) X(3) X(4)

/* pshufb patterns making 16-bit pairs of bytes (2p, 2p + 1) of each 32-bit lane:
 * PAIR16[p] zero-extended (low bytes), PAIR16S[p] in the high bytes (for a signed shift) */
#define Z (char)0x80
#define LANES4(a, b, c, d) a, b, c, d, a + 4, b + 4, c + 4, d + 4, a + 8, b + 8, c + 8, d + 8, \
                           a + 12, b + 12, c + 12, d + 12
#define PAT(a, b, c, d) {LANES4(a, b, c, d), LANES4(a, b, c, d)}
static const char PAIR16[2][32] = {PAT(0, Z, 1, Z), PAT(2, Z, 3, Z)};
static const char PAIR16S[2][32] = {PAT(Z, 0, Z, 1), PAT(Z, 2, Z, 3)};
#undef PAT
#undef LANES4
#undef Z

ALWAYS __m256i bcast_pair(const int16_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

/* The super-block types (Q4_K, Q6_K) on dw_act256 rows: per step each row costs one
 * broadcast load, one vpmaddubsw and one 16-bit add (as tile_kernel); the 16-bit sums
 * widen into one int32 sum per row that runs to the end of the super-block (scales
 * applied by vpmaddwd on the way), so the float work is one or two fused multiply-adds
 * per row per 256 k, and the per-row state is two registers (the 16- and 32-bit sums),
 * which lets five rows share a decoded code vector without spilling. */
ALWAYS void tile_kernel_super(const int T, const int R, const uint8_t *tile, int64_t chunks,
                              const void *const *xv, float (*out)[DW_TILE]) {
    const int64_t tb = (int64_t)DW_TILE * dw_block_bytes(T), supers = chunks / 8;
#define DECL(r)                                                                                   \
    __m256 acc##r = _mm256_setzero_ps();                                                          \
    const dw_act256 *x##r = R > r ? (const dw_act256 *)xv[r] : NULL;
    FOR_ROWS(DECL)
#undef DECL
    const int64_t ahead = ((DW_PREFETCH_AHEAD + tb - 1) / tb) * tb;
    for (int64_t bi = 0; bi < supers; bi++) {
        const uint8_t *b = tile + bi * tb;
        dw_prefetch_block(b + ahead, tb);
        const blk_scales bs = block_scales(T, b);
#define DECL(r) __m256i isum##r = _mm256_setzero_si256();
        FOR_ROWS(DECL)
#undef DECL
#define STEP(r)                                                                                   \
    if (R > r) {                                                                                  \
        const __m256i prod = _mm256_maddubs_epi16(v, bcast4(x##r[bi].q + 32 * c + 4 * s));        \
        a16_##r = s % fl == 0 ? prod : _mm256_add_epi16(a16_##r, prod);                           \
        KEEP(a16_##r);                                                                            \
        if ((s + 1) % fl == 0) {                                                                  \
            isum##r = _mm256_add_epi32(isum##r, _mm256_madd_epi16(a16_##r, p));                   \
            KEEP(isum##r);                                                                        \
        }                                                                                         \
    }
#define DECL(r) __m256i a16_##r = _mm256_setzero_si256();
        if (T == DW_Q4_K) {
            /* a chunk: eight steps per widening (codes <= 15), the chunk's scale pair */
            const int fl = 8;
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m256i p = pick(PICK16, bs.sc[c / 4], c % 4);
                FOR_ROWS(DECL)
#pragma GCC unroll 8
                for (int s = 0; s < 8; s++) {
                    const __m256i v = codes(T, b, c, s);
                    FOR_ROWS(STEP)
                }
            }
        } else {
            /* a 16-k sub-block: two steps per widening (codes <= 63), its signed scale */
            const int fl = 2;
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                const int c = i / 2;
                const __m256i p = _mm256_srai_epi16(pick(PICK16S, bs.sc[i / 4], i % 4), 8);
                FOR_ROWS(DECL)
#pragma GCC unroll 4
                for (int s = 4 * (i % 2); s < 4 * (i % 2) + 4; s++) {
                    const __m256i v = codes(T, b, c, s);
                    FOR_ROWS(STEP)
                }
            }
        }
#undef DECL
#undef STEP
        if (T == DW_Q4_K) {
            /* the mins: (m_2j, m_2j+1) pairs against the row's 32-sums, integer */
            __m256i mp[4];
            for (int j = 0; j < 4; j++) mp[j] = _mm256_shuffle_epi8(bs.sc[2 + j / 2], _mm256_loadu_si256((const __m256i *)PAIR16[j % 2]));
#define FINISH(r)                                                                                 \
    if (R > r) {                                                                                  \
        const dw_act256 *a = x##r + bi;                                                           \
        __m256i im = _mm256_madd_epi16(mp[0], bcast_pair(a->b32));                                \
        for (int j = 1; j < 4; j++) im = _mm256_add_epi32(im, _mm256_madd_epi16(mp[j], bcast_pair(a->b32 + 2 * j))); \
        const __m256 xd = _mm256_set1_ps(a->d);                                                   \
        acc##r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum##r), _mm256_mul_ps(bs.d, xd), acc##r);   \
        acc##r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), neg(_mm256_mul_ps(bs.dmin, xd)), acc##r); \
    }
            FOR_ROWS(FINISH)
#undef FINISH
        } else {
            /* the -32 offset: (p_2j, p_2j+1) pairs against the row's 16-sums, integer */
            __m256i pp[8];
            for (int j = 0; j < 8; j++) pp[j] = _mm256_srai_epi16(_mm256_shuffle_epi8(bs.sc[j / 2], _mm256_loadu_si256((const __m256i *)PAIR16S[j % 2])), 8);
#define FINISH(r)                                                                                 \
    if (R > r) {                                                                                  \
        const dw_act256 *a = x##r + bi;                                                           \
        __m256i ib = _mm256_madd_epi16(pp[0], bcast_pair(a->b16));                                \
        for (int j = 1; j < 8; j++) ib = _mm256_add_epi32(ib, _mm256_madd_epi16(pp[j], bcast_pair(a->b16 + 2 * j))); \
        const __m256i tot = _mm256_sub_epi32(isum##r, _mm256_slli_epi32(ib, 5));                  \
        acc##r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_mul_ps(bs.d, _mm256_set1_ps(a->d)), acc##r); \
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
    if (T == DW_Q4_K || T == DW_Q6_K) {
        tile_kernel_super(T, R, tile, chunks, xv, out);
        return;
    }
    const dw_act *const *x = (const dw_act *const *)xv;
    const int cpb = is_k(T) ? 8 : 1, fl = flush_steps(T), nm = min_terms(T);
    const int64_t tb = (int64_t)DW_TILE * dw_block_bytes(T);
#define DECL(r)                                                                                   \
    __m256 acc##r = _mm256_setzero_ps();                                                          \
    const dw_act *x##r = R > r ? x[r] : NULL;
    FOR_ROWS(DECL)
#undef DECL
    /* prefetch whole tile blocks DW_PREFETCH_AHEAD ahead into L2 (quant_layout.h): a
     * K-quant block's scales sit at its end (Q6_K, Q3_K, Q2_K), and reading them first
     * defeats the hardware streamer */
    const int64_t ahead = ((DW_PREFETCH_AHEAD + tb - 1) / tb) * tb;
    for (int64_t bi = 0; bi < chunks / cpb; bi++) {
        const uint8_t *b = tile + bi * tb;
        dw_prefetch_block(b + ahead, tb);
        const blk_scales bs = block_scales(T, b);
#pragma GCC unroll 8
        for (int c = 0; c < cpb; c++) {
            const int64_t ci = bi * cpb + c;
            const chunk_scales cs = chunk_of(T, &bs, c);
            /* step by step, each decoded code vector applied to every row at once: live
             * are one code vector and two sums per row, so several rows fit the sixteen
             * registers (a whole chunk's codes held across the rows would spill) */
#define DECL(r) __m256i a16_##r = _mm256_setzero_si256(), isum##r = _mm256_setzero_si256();
            FOR_ROWS(DECL)
#undef DECL
#pragma GCC unroll 8
            for (int s = 0; s < 8; s++) {
                const __m256i v = codes(T, b, c, s);
                const __m256i va = T == DW_Q8_0 ? _mm256_abs_epi8(v) : v;
#define STEP(r)                                                                                   \
    if (R > r) {                                                                                  \
        __m256i xb = bcast4(x##r[ci].q + 4 * s);                                                  \
        if (T == DW_Q8_0) xb = _mm256_sign_epi8(xb, v);                                           \
        const __m256i prod = _mm256_maddubs_epi16(va, xb);                                        \
        a16_##r = s % fl == 0 ? prod : _mm256_add_epi16(a16_##r, prod);                           \
        KEEP(a16_##r);                                                                            \
        if ((s + 1) % fl == 0) {                                                                  \
            const __m256i w = _mm256_madd_epi16(a16_##r, cs.p[s / 4]);                            \
            isum##r = s + 1 == fl ? w : _mm256_add_epi32(isum##r, w);                             \
            KEEP(isum##r);                                                                        \
        }                                                                                         \
    }
                FOR_ROWS(STEP)
#undef STEP
            }
#define FINISH(r)                                                                                 \
    if (R > r) {                                                                                  \
        const dw_act *a = x##r + ci;                                                              \
        const __m256 dd = _mm256_mul_ps(bs.d, _mm256_set1_ps(a->d));                              \
        acc##r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum##r), dd, acc##r);                        \
        if (nm == 1) acc##r = _mm256_fmadd_ps(cs.m[0], _mm256_set1_ps(a->s[0]), acc##r);          \
        if (nm == 2) {                                                                            \
            acc##r = _mm256_fmadd_ps(cs.m[0], _mm256_set1_ps(a->s[1]), acc##r);                   \
            acc##r = _mm256_fmadd_ps(cs.m[1], _mm256_set1_ps(a->s[2]), acc##r);                   \
        }                                                                                         \
    }
            FOR_ROWS(FINISH)
#undef FINISH
        }
    }
#define STORE(r) if (R > r) _mm256_storeu_ps(out[r], acc##r);
    FOR_ROWS(STORE)
#undef STORE
}

/* one function per row count (inlined into one, the compiler spills across them) */
#define KERNEL_R(T, R)                                                                            \
    static TARGET __attribute__((noinline)) void tile_avx2_##T##_##R(                            \
        const uint8_t *t, int64_t c, const void *const *x, float (*out)[DW_TILE]) {              \
        tile_kernel(T, R, t, c, x, out);                                                          \
    }
#define KERNEL(T)                                                                                 \
    KERNEL_R(T, 1) KERNEL_R(T, 2) KERNEL_R(T, 3) KERNEL_R(T, 4) KERNEL_R(T, 5)                    \
    static TARGET void tile_avx2_##T(const uint8_t *t, int64_t c, const void *const *x, int rows, \
                                     float (*out)[DW_TILE]) {                                     \
        switch (rows) {                                                                           \
        case 1: tile_avx2_##T##_1(t, c, x, out); break;                                           \
        case 2: tile_avx2_##T##_2(t, c, x, out); break;                                           \
        case 3: tile_avx2_##T##_3(t, c, x, out); break;                                           \
        case 4: tile_avx2_##T##_4(t, c, x, out); break;                                           \
        default: tile_avx2_##T##_5(t, c, x, out); break;                                          \
        }                                                                                         \
    }
KERNEL(DW_Q4_0)
KERNEL(DW_Q4_1)
KERNEL(DW_Q5_0)
KERNEL(DW_Q5_1)
KERNEL(DW_Q8_0)
KERNEL(DW_Q2_K)
KERNEL(DW_Q3_K)
KERNEL(DW_Q4_K)
KERNEL(DW_Q5_K)
KERNEL(DW_Q6_K)

/* ---- activation quantization (dw_quant_act_row / dw_quant_act256_row, bit for bit) ---- */

ALWAYS __m256 bf16x8(const uint16_t *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* |x| max over n (a multiple of 8) bf16 values, and whether one is inf or NaN */
ALWAYS float amax_of(const uint16_t *x, int n, int *bad) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(3.402823466e38f);
    __m256 m = _mm256_setzero_ps(), ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int i = 0; i < n; i += 8) {
        const __m256 a = _mm256_and_ps(bf16x8(x + i), abs_mask);
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, big, _CMP_LE_OQ));
        m = _mm256_max_ps(m, a); /* NaN lanes: flagged by ``ok`` */
    }
    *bad = _mm256_movemask_ps(ok) != 0xff;
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* 32 values: q = clamp(round(x * id)) (as nearbyintf in the default rounding mode) to
 * q[0..31]; sums of q[0..15] and q[16..31] to lo, hi. ``bad``: all zero. */
ALWAYS void quant32(const uint16_t *x, float id, int bad, int8_t *q, int *lo, int *hi) {
    if (bad) {
        memset(q, 0, 32);
        *lo = *hi = 0;
        return;
    }
    const __m256 vid = _mm256_set1_ps(id), top = _mm256_set1_ps(127.0f), bot = _mm256_set1_ps(-127.0f);
    __m256i w[4];
    for (int j = 0; j < 4; j++) {
        __m256 r = _mm256_round_ps(_mm256_mul_ps(bf16x8(x + 8 * j), vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm256_max_ps(_mm256_min_ps(r, top), bot);
        w[j] = _mm256_cvttps_epi32(r);
    }
    const __m256i s01 = _mm256_add_epi32(w[0], w[1]), s23 = _mm256_add_epi32(w[2], w[3]);
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(w[0], w[1]), _mm256_packs_epi32(w[2], w[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    int32_t t[16];
    _mm256_storeu_si256((__m256i *)t, s01);
    _mm256_storeu_si256((__m256i *)(t + 8), s23);
    int a = 0, c = 0;
    for (int i = 0; i < 8; i++) a += t[i], c += t[8 + i];
    *lo = a, *hi = c;
}

static TARGET void act_row_avx2(const uint16_t *x, int64_t k, dw_act *out) {
    for (int64_t c = 0; c < k / DW_CHUNK; c++, x += DW_CHUNK, out++) {
        int bad;
        const float amax = amax_of(x, DW_CHUNK, &bad);
        const float d = bad ? NAN : amax / 127.0f, id = !bad && amax > 0.0f ? 127.0f / amax : 0.0f;
        int lo, hi;
        quant32(x, id, bad, out->q, &lo, &hi);
        out->d = d;
        out->s[0] = d * (float)(lo + hi);
        out->s[1] = d * (float)lo;
        out->s[2] = d * (float)hi;
    }
}

static TARGET void act256_row_avx2(const uint16_t *x, int64_t k, dw_act256 *out) {
    for (int64_t c = 0; c < k / DW_SUPER; c++, x += DW_SUPER, out++) {
        int bad;
        const float amax = amax_of(x, DW_SUPER, &bad);
        const float d = bad ? NAN : amax / 127.0f, id = !bad && amax > 0.0f ? 127.0f / amax : 0.0f;
        memset(out, 0, sizeof *out);
        for (int j = 0; j < DW_SUPER / 32; j++) {
            int lo, hi;
            quant32(x + 32 * j, id, bad, out->q + 32 * j, &lo, &hi);
            out->b16[2 * j] = (int16_t)lo, out->b16[2 * j + 1] = (int16_t)hi;
            out->b32[j] = (int16_t)(lo + hi);
        }
        out->d = d;
    }
}

static int cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}

dw_tile_fn dw_tile_kernel_avx2(int qtype) {
    if (!cpu_has_avx2()) return NULL;
    switch (qtype) {
    case DW_Q4_0: return tile_avx2_DW_Q4_0;
    case DW_Q4_1: return tile_avx2_DW_Q4_1;
    case DW_Q5_0: return tile_avx2_DW_Q5_0;
    case DW_Q5_1: return tile_avx2_DW_Q5_1;
    case DW_Q8_0: return tile_avx2_DW_Q8_0;
    case DW_Q2_K: return tile_avx2_DW_Q2_K;
    case DW_Q3_K: return tile_avx2_DW_Q3_K;
    case DW_Q4_K: return tile_avx2_DW_Q4_K;
    case DW_Q5_K: return tile_avx2_DW_Q5_K;
    case DW_Q6_K: return tile_avx2_DW_Q6_K;
    default: return NULL;
    }
}

int dw_cpu_has_avx2(void) { return cpu_has_avx2(); }

dw_act_fn dw_act_row_simd(void) { return cpu_has_avx2() ? act_row_avx2 : NULL; }
dw_act256_fn dw_act256_row_simd(void) { return cpu_has_avx2() ? act256_row_avx2 : NULL; }

#else

dw_tile_fn dw_tile_kernel_avx2(int qtype) {
    (void)qtype;
    return NULL;
}

int dw_cpu_has_avx2(void) { return 0; }

dw_act_fn dw_act_row_simd(void) { return NULL; }
dw_act256_fn dw_act256_row_simd(void) { return NULL; }

#endif
