/* The AVX512-VNNI tile kernels (gemm_quant_avx512.c), written once for a vector of
 * V_TILES tiles: included twice, with the V_* operations on 256 bits (one tile, eight
 * outputs) and on 512 bits (two adjacent tiles of a segment, sixteen outputs; the second
 * tile's bytes lie ``ts`` bytes after the first's). Every lane does the same operations
 * in either width, so both give the bits of the scalar kernel. SFX names a function per
 * width, V_OUT is the floats per row of ``out``. The including file defines the V_* operations;
 * this file undefines them at its end. */

/* bits [from, from + width) of every byte moved to [to, to + width), the rest cleared
 * (as gemm_quant_avx2.c: the 16-bit shifts only carry into bits the mask clears) */
ALWAYS VI SFX(move_bits)(VI v, int from, int to, int mask) {
    const VI s = from < to ? V_SLLI16(v, to - from) : from > to ? V_SRLI16(v, from - to) : v;
    return V_AND(s, V_B8(mask));
}
#define V_MOVE SFX(move_bits)
#define V_NIB(v, high) V_MOVE(v, (high) ? 4 : 0, 0, 0x0F)
/* byte b of each row's four, by a PICK32 / PICK32S pattern (see gemm_quant_avx512.c) */
#define V_PICK(pat, v, b) V_SHUF8(v, (pat)[b])

/* Step s of chunk c: the codes (dw_quant_code) of 8 V_TILES rows x four k. */
ALWAYS VI SFX(codes)(const int T, const int64_t ts, const uint8_t *b, const int c, const int s) {
    switch (T) {
    case DW_Q4_0: return V_NIB(V_LD(ts, b + 8 * Q4_0_QS + 32 * (s % 4)), s >= 4);
    case DW_Q4_1: return V_NIB(V_LD(ts, b + 8 * Q4_1_QS + 32 * (s % 4)), s >= 4);
    case DW_Q5_0:
        return V_OR(V_NIB(V_LD(ts, b + 8 * Q5_0_QS + 32 * (s % 4)), s >= 4),
                               V_MOVE(V_LD(ts, b + 8 * Q5_0_QH), s, 4, 0x10));
    case DW_Q5_1:
        return V_OR(V_NIB(V_LD(ts, b + 8 * Q5_1_QS + 32 * (s % 4)), s >= 4),
                               V_MOVE(V_LD(ts, b + 8 * Q5_1_QH), s, 4, 0x10));
    case DW_Q8_0: return V_LD(ts, b + 8 * Q8_0_QS + 32 * s);
    case DW_Q4_K: return V_NIB(V_LD(ts, b + 8 * Q4_K_QS + 32 * (8 * (c / 2) + s)), c % 2);
    default: { /* Q6_K */
        const int h = c / 4, f = c % 4;
        return V_OR(V_NIB(V_LD(ts, b + 8 * Q6_K_QL + 32 * (16 * h + 8 * (f % 2) + s)), f / 2),
                               V_MOVE(V_LD(ts, b + 8 * Q6_K_QH + 32 * (8 * h + s)), 2 * f, 4, 0x30));
    }
    }
}


/* How far ahead the weight stream is asked for, in whole tile blocks of ``tb`` bytes.
 * One tile (a one-row decode: gemm_quant.c, pair_min_rows) reads ONE sequential stream
 * and prefetches DW_PREFETCH_AHEAD into L2 (quant_layout.h). Two tiles read two streams
 * (the tiles ``ts`` apart) and prefetch PREFETCH_BYTES into L1: measured here, the far
 * L2 prefetch on two streams ran slower (~22 against ~25 GB/s for one row, k = 1536), and
 * the pair runs where several rows make the kernel, not the stream, the limit. */
ALWAYS int64_t SFX(prefetch_ahead)(const int64_t tb) {
    return ((V_TILES == 1 ? DW_PREFETCH_AHEAD : PREFETCH_BYTES) + tb - 1) / tb * tb;
}

/* Ask for the block ``ahead`` bytes past block ``b`` (at byte ``at`` of its tile). */
ALWAYS void SFX(prefetch)(const uint8_t *b, const int64_t at, const int64_t ahead,
                          const int64_t tb, const int64_t ts) {
    if (V_TILES == 1) {
        dw_prefetch_block(b + ahead, tb);
        return;
    }
    /* two tiles: past its tile's end a stream asks for the NEXT pair's tile (the bytes
     * right after the first tile are the second's, already streaming) */
    const int64_t skip = at + ahead >= ts ? ts : 0;
    for (int64_t line = 0; line < tb; line += 64) {
        _mm_prefetch((const char *)b + skip + ahead + line, _MM_HINT_T0);
        _mm_prefetch((const char *)b + skip + ts + ahead + line, _MM_HINT_T0);
    }
}

/* The blocks of 32 (dw_act rows). */
ALWAYS void SFX(tile_kernel32)(const int T, const int R, const uint8_t *tile,
                               const int64_t ts, int64_t chunks, const void *const *xv, float *out) {
    const dw_act *const *x = (const dw_act *const *)xv;
    const int64_t tb = (int64_t)DW_TILE * dw_block_bytes(T);
#define DECL(r)                                                                                   \
    VF acc##r = V_ZF();                                                                           \
    const dw_act *x##r = R > r ? x[r] : NULL;
    FOR_ROWS(DECL)
#undef DECL
    const int64_t ahead = SFX(prefetch_ahead)(tb);
    for (int64_t ci = 0; ci < chunks; ci++) {
        const uint8_t *b = tile + ci * tb;
        SFX(prefetch)(b, ci * tb, ahead, tb, ts);
        VF d, m = V_ZF();
        switch (T) {
        case DW_Q4_0: d = V_HALF(ts, b + 8 * Q4_0_D), m = V_MULF(d, V_SET1F(-8.0f)); break;
        case DW_Q5_0: d = V_HALF(ts, b + 8 * Q5_0_D), m = V_MULF(d, V_SET1F(-16.0f)); break;
        case DW_Q4_1: d = V_HALF(ts, b + 8 * Q4_1_D), m = V_HALF(ts, b + 8 * Q4_1_M); break;
        case DW_Q5_1: d = V_HALF(ts, b + 8 * Q5_1_D), m = V_HALF(ts, b + 8 * Q5_1_M); break;
        default: d = V_HALF(ts, b + 8 * Q8_0_D); break;
        }
#define DECL(r) VI e##r = V_ZI(), o##r = V_ZI();
        FOR_ROWS(DECL)
#undef DECL
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            const VI v = SFX(codes)(T, ts, b, 0, s);
            const VI va = T == DW_Q8_0 ? V_ABS8(v) : v;
#define STEP(r)                                                                                   \
    if (R > r) {                                                                                  \
        VI xb = V_B4(x##r[ci].q + 4 * s);                                                         \
        if (T == DW_Q8_0) xb = V_SIGN8(xb, v);                                                    \
        if (s % 2 && R <= 4) { o##r = V_DPBUSD(o##r, va, xb); KEEP(o##r); }                                 \
        else { e##r = V_DPBUSD(e##r, va, xb); KEEP(e##r); }                                       \
    }
            FOR_ROWS(STEP)
#undef STEP
        }
#define FINISH(r)                                                                                 \
    if (R > r) {                                                                                  \
        const dw_act *a = x##r + ci;                                                              \
        const VI isum = V_ADD32(e##r, o##r);                                                      \
        acc##r = V_FMA(V_CVT(isum), V_MULF(d, V_SET1F(a->d)), acc##r);                            \
        if (T != DW_Q8_0) acc##r = V_FMA(m, V_SET1F(a->s[0]), acc##r);                            \
    }
        FOR_ROWS(FINISH)
#undef FINISH
    }
#define STORE(r) if (R > r) V_STORE(out + r * V_OUT, acc##r);
    FOR_ROWS(STORE)
#undef STORE
}

/* The super-block types (Q4_K, Q6_K: dw_act256 rows). */
ALWAYS void SFX(tile_kernel256)(const int T, const int R, const uint8_t *tile,
                                const int64_t ts, int64_t chunks, const void *const *xv, float *out) {
    const int64_t tb = (int64_t)DW_TILE * dw_block_bytes(T), supers = chunks / 8;
#define DECL(r)                                                                                   \
    VF acc##r = V_ZF();                                                                           \
    const dw_act256 *x##r = R > r ? (const dw_act256 *)xv[r] : NULL;
    FOR_ROWS(DECL)
#undef DECL
    const int64_t ahead = SFX(prefetch_ahead)(tb);
    for (int64_t bi = 0; bi < supers; bi++) {
        const uint8_t *b = tile + bi * tb;
        SFX(prefetch)(b, bi * tb, ahead, tb, ts);
        VI sc[4];
        VF d, dmin = V_ZF();
        if (T == DW_Q4_K) { /* sc[0..1]: scales of sub-blocks 0-3, 4-7; sc[2..3]: their mins */
            const VI a = V_LD(ts, b + 8 * Q4_K_SC), bb = V_LD(ts, b + 8 * Q4_K_SC + 32), c = V_LD(ts, b + 8 * Q4_K_SC + 64);
            d = V_HALF(ts, b + 8 * Q4_K_D), dmin = V_HALF(ts, b + 8 * Q4_K_DMIN);
            sc[0] = V_AND(a, V_B8(63));
            sc[1] = V_OR(V_AND(c, V_B8(0x0F)), V_MOVE(a, 6, 4, 0x30));
            sc[2] = V_AND(bb, V_B8(63));
            sc[3] = V_OR(V_NIB(c, 1), V_MOVE(bb, 6, 4, 0x30));
        } else { /* Q6_K: 16 signed scales */
            d = V_HALF(ts, b + 8 * Q6_K_D);
            for (int g = 0; g < 4; g++) sc[g] = V_LD(ts, b + 8 * Q6_K_SC + 32 * g);
        }
#define DECL(r) VI isum##r = V_ZI();
        FOR_ROWS(DECL)
#undef DECL
        if (T == DW_Q4_K) {
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                /* the chunk's scale as (sc, 0) 16-bit pairs: vpdpwssd of a 16-k sum (whose
                 * value fits int16, so its high half is its sign) gives sc * sum exactly */
                const VI p = V_PICK(PICK32, sc[c / 4], c % 4);
#define DECL(r) VI h0_##r = V_ZI(), h1_##r = V_ZI();
                FOR_ROWS(DECL)
#undef DECL
#pragma GCC unroll 8
                for (int s = 0; s < 8; s++) {
                    const VI v = SFX(codes)(T, ts, b, c, s);
#define STEP(r)                                                                                   \
    if (R > r) {                                                                                  \
        const VI xb = V_B4(x##r[bi].q + 32 * c + 4 * s);                                          \
        if (s < 4 || R > 4) { h0_##r = V_DPBUSD(h0_##r, v, xb); KEEP(h0_##r); }                            \
        else { h1_##r = V_DPBUSD(h1_##r, v, xb); KEEP(h1_##r); }                                  \
    }
                    FOR_ROWS(STEP)
#undef STEP
                    if (R > 4 && s == 3) {
#define HALF(r)                                                                                   \
    if (R > r) {                                                                                  \
        isum##r = V_DPWSSD(isum##r, h0_##r, p);                                                   \
        h0_##r = V_ZI();                                                                          \
    }
                        FOR_ROWS(HALF)
#undef HALF
                    }
                }
#define SCALE(r)                                                                                  \
    if (R > r) {                                                                                  \
        isum##r = V_DPWSSD(isum##r, h0_##r, p);                                                   \
        if (R <= 4) isum##r = V_DPWSSD(isum##r, h1_##r, p);                                       \
        KEEP(isum##r);                                                                            \
    }
                FOR_ROWS(SCALE)
#undef SCALE
            }
            /* the mins: (m_2j, m_2j+1) pairs against the row's 32-sums, integer */
            VI mp[4];
            for (int j = 0; j < 4; j++) mp[j] = V_SHUF8(sc[2 + j / 2], PAIR16[j % 2]);
#define FINISH(r)                                                                                 \
    if (R > r) {                                                                                  \
        const dw_act256 *a = x##r + bi;                                                           \
        VI im = V_MADD16(mp[0], V_BPAIR(a->b32));                                                 \
        for (int j = 1; j < 4; j++) im = V_ADD32(im, V_MADD16(mp[j], V_BPAIR(a->b32 + 2 * j)));   \
        const VF xd = V_SET1F(a->d);                                                              \
        acc##r = V_FMA(V_CVT(isum##r), V_MULF(d, xd), acc##r);                                    \
        acc##r = V_FMA(V_CVT(im), V_NEG(V_MULF(dmin, xd)), acc##r);                               \
    }
            FOR_ROWS(FINISH)
#undef FINISH
        } else {
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                const int c = i / 2;
                /* the sub-block's signed scale, sign-extended to 32 bits */
                const VI p = V_SRAI32(V_PICK(PICK32S, sc[i / 4], i % 4), 24);
#define DECL(r) VI h_##r = V_ZI();
                FOR_ROWS(DECL)
#undef DECL
#pragma GCC unroll 4
                for (int s = 4 * (i % 2); s < 4 * (i % 2) + 4; s++) {
                    const VI v = SFX(codes)(T, ts, b, c, s);
#define STEP(r)                                                                                   \
    if (R > r) {                                                                                  \
        h_##r = V_DPBUSD(h_##r, v, V_B4(x##r[bi].q + 32 * c + 4 * s));                            \
        KEEP(h_##r);                                                                              \
    }
                    FOR_ROWS(STEP)
#undef STEP
                }
#define SCALE(r)                                                                                  \
    if (R > r) {                                                                                  \
        isum##r = V_ADD32(isum##r, V_MULLO32(h_##r, p));                                          \
        KEEP(isum##r);                                                                            \
    }
                FOR_ROWS(SCALE)
#undef SCALE
            }
            /* the -32 offset: (p_2j, p_2j+1) pairs against the row's 16-sums, integer */
            VI pp[8];
            for (int j = 0; j < 8; j++) pp[j] = V_SRAI16(V_SHUF8(sc[j / 2], PAIR16S[j % 2]), 8);
#define FINISH(r)                                                                                 \
    if (R > r) {                                                                                  \
        const dw_act256 *a = x##r + bi;                                                           \
        VI ib = V_MADD16(pp[0], V_BPAIR(a->b16));                                                 \
        for (int j = 1; j < 8; j++) ib = V_ADD32(ib, V_MADD16(pp[j], V_BPAIR(a->b16 + 2 * j)));   \
        const VI tot = V_SUB32(isum##r, V_SLLI32(ib, 5));                                         \
        acc##r = V_FMA(V_CVT(tot), V_MULF(d, V_SET1F(a->d)), acc##r);                             \
    }
            FOR_ROWS(FINISH)
#undef FINISH
        }
    }
#define STORE(r) if (R > r) V_STORE(out + r * V_OUT, acc##r);
    FOR_ROWS(STORE)
#undef STORE
}

ALWAYS void SFX(tile_kernel)(const int T, const int R, const uint8_t *tile, const int64_t ts,
                             int64_t chunks, const void *const *xv, float *out) {
    if (T == DW_Q4_K || T == DW_Q6_K) SFX(tile_kernel256)(T, R, tile, ts, chunks, xv, out);
    else SFX(tile_kernel32)(T, R, tile, ts, chunks, xv, out);
}

/* the end of this width */
#undef V_TILES
#undef V_OUT
#undef SFX
#undef VI
#undef VF
#undef V_LD
#undef V_HALF
#undef V_B4
#undef V_BPAIR
#undef V_B8
#undef V_ZI
#undef V_ZF
#undef V_SET1F
#undef V_OR
#undef V_AND
#undef V_SRLI16
#undef V_SLLI16
#undef V_ADD32
#undef V_SUB32
#undef V_SLLI32
#undef V_SRAI32
#undef V_SRAI16
#undef V_MULLO32
#undef V_MADD16
#undef V_DPBUSD
#undef V_DPWSSD
#undef V_CVT
#undef V_MULF
#undef V_FMA
#undef V_STORE
#undef V_ABS8
#undef V_SIGN8
#undef V_NEG
#undef V_SHUF8
#undef V_MOVE
#undef V_NIB
#undef V_PICK
