/* DSpark's Markov pass (markov.c): a lane's pick without the full W2 product. The
 * certified screen (Cauchy-Schwarz bounds |W2[v] . u| <= |W2[v]| |u|, every block that a
 * bound cannot rule out computed exactly) and a window's guesses (the corrected maximum
 * over the base's best runs of 64), with the 16-lane helpers both use.
 *
 * Why a file of its own: markov.c is the pass (latents, the fused product, windows,
 * rounds and threads); this is the one place a pick is decided without the product, and
 * the one place the screen's widening (WIDEN) is applied. Included once, by markov.c,
 * after Head, bf() and fold(): static functions in the same translation unit, so the
 * same machine code as when they were written inline there.
 */
#ifndef DRAFTWISE_MARKOV_SCREEN_H
#define DRAFTWISE_MARKOV_SCREEN_H

static inline v16f loadf16(const float *p) {
    v16f x;
    memcpy(&x, p, sizeof x);
    return x;
}

#if defined(__AVX512F__)
#include <immintrin.h>
/* Which of 16 lanes hold a true comparison (all ones), as a bit mask. */
static inline unsigned mask16(v16i m) { return _mm512_movepi32_mask((__m512i)m); }
#else
static inline unsigned mask16(v16i m) {
    unsigned bits = 0;
    for (int l = 0; l < LANES; l++) bits |= (unsigned)(m[l] != 0) << l;
    return bits;
}
#endif

static inline int any16(v16i m) { return mask16(m) != 0; }

/* The largest of 16 lanes (a NaN lane may or may not win: callers only guess with it). */
#if defined(__AVX512F__)
static inline float max16(v16f x) { return _mm512_reduce_max_ps((__m512)x); }
#else
static inline float max16(v16f x) {
    float m = x[0];
    for (int l = 1; l < LANES; l++) m = x[l] > m ? x[l] : m;
    return m;
}
#endif

/* |W2[c]| |u| widened, plus the fp32 add's 1e-6 (|base| + 1): the screen's bound on how
 * far the bias can move token c (vector and scalar forms: only ever compared, never
 * required to round alike). */
static inline v16f bound16(v16f b, v16f norm, float un) {
    const v16f mag = (v16f)((v16u)b & 0x7fffffffu);
    return norm * un + v16_splat(1e-6f) * (mag + v16_splat(1.0f));
}

static inline float bound1(float b, float norm, float un) {
    return norm * un + 1e-6f * (fabsf(b) + 1.0f);
}

/* The certified pick of one lane (module doc), or -1. blocks: [ceil(v / 64)] scratch. */
static int64_t screen(const Head *hd, const float *base, const uint16_t *u, int64_t max_blocks,
                      int64_t *blocks, uint16_t *out) {
    const int64_t v = hd->v, r = hd->r, nblocks = (v + DW_BLOCK_N - 1) / DW_BLOCK_N;
    const float *norms = hd->norms;
    double ss = 0.0;
    for (int64_t i = 0; i < r; i++) ss += (double)bf(u[i]) * (double)bf(u[i]);
    const float un = (float)sqrt(ss) * WIDEN;
    if (!isfinite(un)) return -1;
    /* lb = max(base - bound): a non-finite base or bound (inf, NaN: x - x != 0) leaves
     * the pick to the full product */
    v16f lbv = v16_splat(-INFINITY);
    v16i bad = {0};
    int64_t c = 0;
    for (; c + LANES <= v; c += LANES) {
        const v16f b = loadf16(base + c), low = b - bound16(b, loadf16(norms + c), un);
        bad |= (low - low) != v16_splat(0.0f);
        const v16i gt = low > lbv;
        lbv = (v16f)((gt & (v16i)low) | (~gt & (v16i)lbv));
    }
    float lb = -INFINITY;
    for (int l = 0; l < LANES; l++) lb = lbv[l] > lb ? lbv[l] : lb;
    for (; c < v; c++) {
        const float low = base[c] - bound1(base[c], norms[c], un);
        if (!isfinite(low)) return -1;
        if (low > lb) lb = low;
    }
    if (any16(bad) || !isfinite(lb)) return -1;
    /* the blocks holding a token whose upper bound reaches lb */
    const v16f lbs = v16_splat(lb);
    int64_t alive = 0;
    for (int64_t nb = 0; nb < nblocks; nb++) {
        const int64_t c0 = nb * DW_BLOCK_N, c1 = c0 + DW_BLOCK_N < v ? c0 + DW_BLOCK_N : v;
        v16i up = {0};
        for (c = c0; c + LANES <= c1; c += LANES) {
            const v16f b = loadf16(base + c);
            up |= b + bound16(b, loadf16(norms + c), un) >= lbs;
        }
        int any = any16(up);
        for (; c < c1; c++) any |= base[c] + bound1(base[c], norms[c], un) >= lb;
        if (any) {
            if (alive == max_blocks) return -1;
            blocks[alive++] = nb;
        }
    }
    if (alive == 0) return -1;
    /* their exact outputs (the product's, bitwise), first maximum in column order */
    const DwGemm g = {.x = u, .p = hd->w2, .m = 1, .k = r, .n = v, .x_stride = r};
    float best = -INFINITY;
    int64_t at = blocks[0] * DW_BLOCK_N, nan_at = -1;
    for (int64_t i = 0; i < alive; i++) {
        const int64_t c0 = blocks[i] * DW_BLOCK_N;
        dw_gemm_bf16_block(&g, blocks[i], out, DW_BLOCK_N);
        fold(base, out, c0, c0 + DW_BLOCK_N < v ? DW_BLOCK_N : v - c0, &best, &at, &nan_at);
    }
    return nan_at >= 0 ? -1 : at;
}

/* The k-th largest of x[0..n) (0-based, k < n), x reordered (quickselect). */
static float kth_largest(float *x, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const float pivot = x[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (x[i] > pivot) i++;
            while (x[j] < pivot) j--;
            if (i <= j) {
                const float t = x[i];
                x[i++] = x[j], x[j--] = t;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else break;
    }
    return x[k];
}

/* The guessed pick of a lane whose product is pending (module doc): only a guess, so its
 * fp32 dot products may round unlike the kernel (the window's check keeps picks exact).
 * Its candidates are every token at or above the t-th highest maximum of the runs of 64
 * (t distinct tokens reach it, so this holds the t best base tokens, and only those runs
 * are searched); each scored with its W2 row. runmax, sel: [ceil(v / 64)]; cand:
 * [64 * t]. */
static int64_t guess(const Head *hd, const float *base, const uint16_t *u, int64_t t,
                     float *runmax, float *sel, int64_t *cand, float *uf) {
    const int64_t v = hd->v, r = hd->r, runs = (v + 63) / 64;
    for (int64_t k = 0; k < runs; k++) {
        const int64_t c0 = 64 * k;
        float m = -INFINITY;
        if (c0 + 64 <= v) {
            v16f x = loadf16(base + c0);
            for (int q = 1; q < 4; q++) {
                const v16f y = loadf16(base + c0 + 16 * q);
                const v16i gt = y > x;
                x = (v16f)((gt & (v16i)y) | (~gt & (v16i)x));
            }
            m = max16(x);
        } else {
            for (int64_t c = c0; c < v; c++) m = base[c] > m ? base[c] : m;
        }
        runmax[k] = sel[k] = m == m ? m : -INFINITY;
    }
    const float least = kth_largest(sel, runs, (t < runs ? t : runs) - 1);
    int64_t n = 0;
    for (int64_t k = 0; k < runs && n + 64 <= 64 * t; k++) {
        if (runmax[k] < least) continue;
        const int64_t c1 = 64 * k + 64 < v ? 64 * k + 64 : v;
        for (int64_t c = 64 * k; c < c1; c++)
            if (base[c] >= least) cand[n++] = c;
    }
    for (int64_t k = 0; k < n; k++) /* the candidates' rows: 512 B each at r = 256 */
        for (int64_t b = 0; b < r * (int64_t)sizeof(uint16_t); b += 64)
            __builtin_prefetch((const char *)(hd->w2_rows + cand[k] * r) + b);
    for (int64_t i = 0; i < r; i++) uf[i] = bf(u[i]);
    float best = -INFINITY;
    int64_t at = n ? cand[0] : 0;
    for (int64_t k = 0; k < n; k++) {
        const uint16_t *w = hd->w2_rows + cand[k] * r;
        v16f acc = v16_splat(0.0f);
        int64_t i = 0;
        for (; i + LANES <= r; i += LANES) {
            v16f uv;
            memcpy(&uv, uf + i, sizeof uv);
            acc += v16_load_bf16(w + i) * uv;
        }
        float dot = v16_sum(acc);
        for (; i < r; i++) dot += bf(w[i]) * uf[i];
        const float x = base[cand[k]] + dot;
        if (x > best) best = x, at = cand[k];
    }
    return at;
}

#endif /* DRAFTWISE_MARKOV_SCREEN_H */
