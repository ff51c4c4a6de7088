/* The two products of paged attention (paged_attention.c): the scores Q K^T and P @ V,
 * over bf16 pairs, for QGROUP query-heads at a time, in AV vectors of LANES lanes.
 *
 * Why a file of its own: these are the kernel's inner loops, the one place its numerics
 * (the order of every reduction, hence batch invariance) are written; the rest of
 * paged_attention.c walks the paged cache, lays out each row's keys and values, runs the
 * softmax and spreads the work over threads. Included once, by paged_attention.c, after
 * it defines LANES (vec.h's EW_LANES) and includes kernels.h: static functions in the
 * same translation unit, so the same machine code as when they were written inline there.
 */
#ifndef DRAFTWISE_PAGED_ATTENTION_PRODUCTS_H
#define DRAFTWISE_PAGED_ATTENTION_PRODUCTS_H

/* The broadcast side of both products (a query's dim pairs, a probability's key pairs).
 * Where one vdpbf16ps takes a bf16 pair as it is (AVX512-BF16), it stays a pair (src_t a
 * uint32). Elsewhere the pair is split once, when it is written, into its two values as
 * fp32 (src_t a float, two per pair): the inner step then broadcasts each from memory
 * instead of splatting the pair and unpacking it again for every key vector it meets
 * (three vector ops a query-head a step on AVX2). The two fp32 values are the pair's own,
 * exactly, and each step is the same two fused multiply-adds in the same order as
 * dot2_bf16's, so the results are the same bits. */
#if LANES == 16 && defined(__AVX512F__) && defined(__AVX512BF16__)
typedef uint32_t src_t;
#define SRC_PER_PAIR 1
static inline __attribute__((always_inline)) vewf dot2_src(vewf acc, const src_t *p, vewu x) {
    return EW(dot2_bf16)(acc, EW(splat_u32)(p[0]), x);
}
#else
typedef float src_t;
#define SRC_PER_PAIR 2
static inline __attribute__((always_inline)) vewf dot2_src(vewf acc, const src_t *p, vewu x) {
    const vewf xlo = (vewf)(x << 16), xhi = (vewf)(x & 0xffff0000u);
    return acc + EW(splat)(p[0]) * xlo + EW(splat)(p[1]) * xhi; /* = dot2_bf16(acc, pair, x) */
}
#endif

/* query-heads that share key tiles in the score and P @ V loops */
#define QGROUP 4
/* vectors per pass of the score and P @ V loops (keys or dims per pass: AV * LANES):
 * four of 16 lanes, two of 8 (four of 8 would hold QGROUP x 4 accumulators in all 16 of
 * AVX2's registers, and spill). Each lane's sums are the same whatever AV is. */
#if LANES == 16
#define AV 4
#else
#define AV 2
#endif

/* Row ``i`` of a broadcast-side array of ``width`` bf16 values a row (width even). */
static inline src_t *src_row(src_t *base, int64_t i, int64_t width) {
    return base + i * width * SRC_PER_PAIR / 2;
}

/* n bf16 values written as the broadcast side from value k of ``base`` on (value 2m is
 * pair m's low half, 2m + 1 its high half) */
static inline void put_src(src_t *base, int64_t k, const uint16_t *bf16, int64_t n) {
#if SRC_PER_PAIR == 1
    memcpy((uint16_t *)base + k, bf16, (size_t)n * sizeof(uint16_t));
#else
    for (int64_t i = 0; i < n; i++) {
        const uint32_t bits = (uint32_t)bf16[i] << 16;
        memcpy(base + k + i, &bits, sizeof bits);
    }
#endif
}

/* LANES values already rounded to bf16 (low 16 bits clear), written as put_src would */
static inline void put_src_rounded(src_t *base, int64_t k, vewf r) {
#if SRC_PER_PAIR == 1
    const vewu bits = (vewu)r >> 16;
    uint16_t tmp[LANES];
    for (int l = 0; l < LANES; l++) tmp[l] = (uint16_t)bits[l];
    put_src(base, k, tmp, LANES);
#else
    memcpy(base + k, &r, sizeof r); /* the bf16 values, as fp32 */
#endif
}

/* acc[g][u] += pair ``at`` of src[g] (broadcast) x pair vector u of ``row`` (AV vectors of
 * bf16 pairs), for G query-heads: the inner step of both the score and P @ V loops. */
static inline __attribute__((always_inline)) void dot2_rows(vewf acc[][AV], const uint32_t *row,
                                                            const src_t *const src[],
                                                            int64_t at, const int G) {
    vewu x0, x1; /* named, not an array: an array is spilled to the stack */
    memcpy(&x0, row, sizeof x0);
    memcpy(&x1, row + LANES, sizeof x1);
#if LANES == 16
    vewu x2, x3;
    memcpy(&x2, row + 2 * LANES, sizeof x2);
    memcpy(&x3, row + 3 * LANES, sizeof x3);
#endif
    for (int g = 0; g < G; g++) {
        const src_t *p = src[g] + at * SRC_PER_PAIR;
        acc[g][0] = dot2_src(acc[g][0], p, x0);
        acc[g][1] = dot2_src(acc[g][1], p, x1);
#if LANES == 16
        acc[g][2] = dot2_src(acc[g][2], p, x2);
        acc[g][3] = dot2_src(acc[g][3], p, x3);
#endif
    }
}

/* Scores of G query-heads against AV blocks of LANES keys starting at ``base`` (a column of
 * kt2, keys' head dims as bf16 pairs). Each (query-head, block) is one accumulator summing
 * dim pairs in order, exactly as when that query-head is alone; G only decides how many
 * share each load of kt2. */
static inline __attribute__((always_inline)) void score_group(const uint32_t *base,
                                                              const src_t *const qv[QGROUP],
                                                              const int G, int64_t d2,
                                                              int64_t npad, vewf acc[QGROUP][AV]) {
    for (int g = 0; g < G; g++)
        for (int u = 0; u < AV; u++) acc[g][u] = EW(splat)(0.0f);
    for (int64_t c = 0; c < d2; c++, base += npad) dot2_rows(acc, base, qv, c, G);
}

static void score_tiles(const uint32_t *base, const src_t *q2, const int64_t *grp,
                        const int64_t *nbs, int ng, int64_t d2, int64_t npad, float scale,
                        float *s, int64_t b) {
    const src_t *qv[QGROUP];
    for (int g = 0; g < ng; g++) qv[g] = q2 + grp[g] * d2 * SRC_PER_PAIR;
    vewf acc[QGROUP][AV];
    switch (ng) {
    case 1: score_group(base, qv, 1, d2, npad, acc); break;
    case 2: score_group(base, qv, 2, d2, npad, acc); break;
    case 3: score_group(base, qv, 3, d2, npad, acc); break;
    default: score_group(base, qv, 4, d2, npad, acc); break;
    }
    for (int g = 0; g < ng; g++)
        for (int u = 0; u < AV && b + u < nbs[g]; u++) {
            const vewf x = EW(round_bf16)(acc[g][u]) * EW(splat)(scale);
            memcpy(s + grp[g] * npad + (b + u) * LANES, &x, sizeof x);
        }
}

/* o[q] = sum over key pairs M of (p[2M] v[2M] + p[2M+1] v[2M+1]) for AV vectors of dims
 * starting at dim v0, pairs from ``m0`` to each query-head's own end: pairs in order, so
 * each query-head's sums are the same as alone; the group shares the V loads up to its
 * shortest end. vp2 holds V as bf16 pairs of consecutive keys, sp2[g] p as bf16 pairs. */
static inline __attribute__((always_inline)) void pv_group(const uint32_t *vp2,
                                                           const src_t *const sp2[QGROUP],
                                                           float *const og[QGROUP],
                                                           const int64_t *ends, const int G,
                                                           int64_t m0, int64_t d, int64_t v0) {
    vewf acc[QGROUP][AV];
    int64_t common = ends[0];
    for (int g = 0; g < G; g++) {
        for (int u = 0; u < AV; u++) acc[g][u] = EW(splat)(0.0f);
        common = ends[g] < common ? ends[g] : common;
    }
    const uint32_t *vr = vp2 + m0 * d + v0;
    int64_t m = m0;
    for (; m < common; m++, vr += d) dot2_rows(acc, vr, sp2, m, G);
    for (int g = 0; g < G; g++) {
        const uint32_t *vg = vr;
        for (int64_t mg = m; mg < ends[g]; mg++, vg += d) dot2_rows(acc + g, vg, sp2 + g, mg, 1);
        memcpy(og[g] + v0, acc[g], sizeof acc[g]);
    }
}

static void pv_pairs(const uint32_t *vp2, const src_t *const sp2[QGROUP],
                     float *const og[QGROUP], const int64_t *ends, int ng, int64_t m0,
                     int64_t d) {
    int64_t v0 = 0;
    for (; v0 + AV * LANES <= d; v0 += AV * LANES) {
        switch (ng) {
        case 1: pv_group(vp2, sp2, og, ends, 1, m0, d, v0); break;
        case 2: pv_group(vp2, sp2, og, ends, 2, m0, d, v0); break;
        case 3: pv_group(vp2, sp2, og, ends, 3, m0, d, v0); break;
        default: pv_group(vp2, sp2, og, ends, 4, m0, d, v0); break;
        }
    }
    for (; v0 < d; v0 += LANES) /* head_dim not a multiple of AV * LANES: one at a time */
        for (int g = 0; g < ng; g++) {
            vewf acc = EW(splat)(0.0f);
            const uint32_t *vr = vp2 + m0 * d + v0;
            for (int64_t m = m0; m < ends[g]; m++, vr += d) {
                vewu x;
                memcpy(&x, vr, sizeof x);
                acc = dot2_src(acc, sp2[g] + m * SRC_PER_PAIR, x);
            }
            memcpy(og[g] + v0, &acc, sizeof acc);
        }
}

#if SRC_PER_PAIR == 2
/* acc[g][u] += p of key ``at`` of src[g] x AV vectors of the key's value row ``v`` (bf16,
 * widened): with the probabilities already fp32 (src_t), a key pair's two multiply-adds
 * need no pair, so P @ V reads the value rows where they are in the cache instead of
 * first interleaving them by key pairs (write_pair): the same fused multiply-adds on the
 * same values in the same key order as dot2_src's, so the same bits. The pair's extra
 * key beside a query-head's ends had probability 0 (adds a zero: no change). */
static inline __attribute__((always_inline)) void dot1_rows(vewf acc[][AV], const uint16_t *v,
                                                            const src_t *const src[],
                                                            int64_t at, const int G) {
    const vewf x0 = (vewf)(EW(load_u16)(v) << 16), x1 = (vewf)(EW(load_u16)(v + LANES) << 16);
#if LANES == 16
    const vewf x2 = (vewf)(EW(load_u16)(v + 2 * LANES) << 16);
    const vewf x3 = (vewf)(EW(load_u16)(v + 3 * LANES) << 16);
#endif
    for (int g = 0; g < G; g++) {
        const vewf p = EW(splat)(src[g][at]);
        acc[g][0] = acc[g][0] + p * x0;
        acc[g][1] = acc[g][1] + p * x1;
#if LANES == 16
        acc[g][2] = acc[g][2] + p * x2;
        acc[g][3] = acc[g][3] + p * x3;
#endif
    }
}

/* pv_group over keys: keys k0 .. each query-head's own end, values read in place */
static inline __attribute__((always_inline)) void pv_keys_group(const uint16_t *const *vrow,
                                                                const src_t *const spk[QGROUP],
                                                                float *const og[QGROUP],
                                                                const int64_t *ends, const int G,
                                                                int64_t k0, int64_t v0) {
    vewf acc[QGROUP][AV];
    int64_t common = ends[0];
    for (int g = 0; g < G; g++) {
        for (int u = 0; u < AV; u++) acc[g][u] = EW(splat)(0.0f);
        common = ends[g] < common ? ends[g] : common;
    }
    int64_t k = k0;
    for (; k < common; k++) dot1_rows(acc, vrow[k] + v0, spk, k, G);
    for (int g = 0; g < G; g++) {
        for (int64_t kg = k; kg < ends[g]; kg++) dot1_rows(acc + g, vrow[kg] + v0, spk + g, kg, 1);
        memcpy(og[g] + v0, acc[g], sizeof acc[g]);
    }
}

/* pv_pairs over keys (spk[g]: query-head g's probabilities indexed by key) */
static void pv_keys(const uint16_t *const *vrow, const src_t *const spk[QGROUP],
                    float *const og[QGROUP], const int64_t *ends, int ng, int64_t k0, int64_t d) {
    int64_t v0 = 0;
    for (; v0 + AV * LANES <= d; v0 += AV * LANES) {
        switch (ng) {
        case 1: pv_keys_group(vrow, spk, og, ends, 1, k0, v0); break;
        case 2: pv_keys_group(vrow, spk, og, ends, 2, k0, v0); break;
        case 3: pv_keys_group(vrow, spk, og, ends, 3, k0, v0); break;
        default: pv_keys_group(vrow, spk, og, ends, 4, k0, v0); break;
        }
    }
    for (; v0 < d; v0 += LANES) /* head_dim not a multiple of AV * LANES: one at a time */
        for (int g = 0; g < ng; g++) {
            vewf acc = EW(splat)(0.0f);
            for (int64_t k = k0; k < ends[g]; k++)
                acc = acc + EW(splat)(spk[g][k]) * (vewf)(EW(load_u16)(vrow[k] + v0) << 16);
            memcpy(og[g] + v0, &acc, sizeof acc);
        }
}
#endif

/* Whether P @ V reads the value rows in place (pv_keys) rather than interleaving them by
 * key pairs first (write_pair, pv_pairs), for a (row, kv head) of ``nq`` query-heads: the
 * one place this is decided. Both give the same bits. In place saves the interleaving
 * but widens each value vector once per group of QGROUP query-heads, where the pairs
 * cost one interleaving shared by all of them: measured on AVX2 (Zen 3, 9/3 heads, dim
 * 64, context 300, 8 rows), in place is 6% faster at 1 query token a row (3 query-heads:
 * a decode), 3% at 2, even at 3, and 3-12% slower from 4 (a verify of 3+ drafts, a
 * prefill: 274 tokens 9-14% slower). So up to two groups. A build with vdpbf16ps takes
 * the pairs whole (SRC_PER_PAIR 1): never in place. */
static inline int reads_values_in_place(int64_t nq) {
#if SRC_PER_PAIR == 2
    return nq <= 2 * QGROUP;
#else
    (void)nq;
    return 0;
#endif
}

#if SRC_PER_PAIR == 1
/* (never called: reads_values_in_place is 0 here) */
static void pv_keys(const uint16_t *const *vrow, const src_t *const spk[QGROUP],
                    float *const og[QGROUP], const int64_t *ends, int ng, int64_t k0, int64_t d) {
    (void)vrow, (void)spk, (void)og, (void)ends, (void)ng, (void)k0, (void)d;
}
#endif

/* One key's dim pairs down a column of kt2 (the keys after the last whole LANES). */
static void memcpy_pairs_column(uint32_t *col, int64_t npad, const uint16_t *key, int64_t d2) {
    for (int64_t c = 0; c < d2; c++) memcpy(col + c * npad, key + 2 * c, sizeof(uint32_t));
}

/* Two consecutive keys' values as bf16 pairs (either may be NULL: zeros). */
static void write_pair(uint32_t *dst, const uint16_t *lo, const uint16_t *hi, int64_t d) {
    for (int64_t c = 0; c < d; c += LANES) {
        const vewu a = lo ? EW(load_u16)(lo + c) : EW(splat_u32)(0);
        const vewu b = hi ? EW(load_u16)(hi + c) << 16 : EW(splat_u32)(0);
        const vewu x = a | b;
        memcpy(dst + c, &x, sizeof x);
    }
}

#endif /* DRAFTWISE_PAGED_ATTENTION_PRODUCTS_H */
