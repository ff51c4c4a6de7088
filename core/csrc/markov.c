/*
 * DSpark's greedy Markov pass in one call (draftwise_dspark.markov, .native): for every
 * drafting row, the block's positions left to right,
 *     pick_j = argmax_v(base_j[v] + bf16(W2 u_j)[v]),   u_j = latent(pick_{j-1}, h_j, s_j),
 * the first maximum winning (a NaN wins, as torch.argmax).
 *
 * Why a kernel: the torch pass is ~10 Python-driven torch calls per block position (the
 * latent, the certified screen or a top-64 guess, the pick, indexing), ~0.1 ms each, plus
 * for rnn a [V, r] W2 product; at benchmarks/dspark_step.py's shape that was 0.24-0.38
 * of the draft step. Here a position costs what its arithmetic and bytes cost.
 *
 * What runs, per lane (one row at one position, under a previous token):
 * - the latent: vanilla u = W1[prev]; gated u = sigmoid(G [h; e] + bG) * e; rnn
 *   [g, c, o] = J [s; e; h] + bJ, s' = sigmoid(g) s + (1 - sigmoid(g)) tanh(c),
 *   u = tanh(o). G and J are the packed GEMM (gemm_bf16.h), every op rounds to bf16 as
 *   torch's bf16 ops do, and sigmoid/tanh are tables of torch's own bf16 results for all
 *   65536 inputs (built by the caller), so u and s are bitwise the torch path's;
 * - the screen (where the caller enables it): Cauchy-Schwarz bounds |W2[v] . u| <=
 *   |W2[v]| |u| (widened 2^-6 past the accumulation and bf16 rounding, plus 1e-6 (|base|
 *   + 1) for the fp32 add); every 64-output block holding a token the bound cannot rule
 *   out is computed exactly and the first maximum over those blocks is the pick. It gives
 *   up (the lane goes to the product) past max_blocks blocks or on a non-finite value;
 * - else the lane's row of one W2 product over every pending lane of the round, fused with
 *   the base add and the argmax: each block's bf16 outputs are added to base in fp32 and
 *   folded into a running first-maximum per lane; no [lanes, V] logits are written.
 *
 * Windows: a round gives each row up to 1 + depth lanes, positions j..j+depth, lane d's
 * previous token being lane d-1's pick if the screen certified it, else a guess (the
 * corrected maximum over the base tokens at or above the guess_tokens-th highest maximum
 * of the runs of 64, which include the guess_tokens best, their bias from W2's dense rows
 * in fp32). After the product a row keeps its lanes left to right while each lane's
 * previous token equals the pick just kept, so every kept pick is the sequential pass's
 * (the same inputs through the same arithmetic); a wrong guess costs the rest of that
 * window, which the next round redoes. One W2 stream then serves several positions.
 *
 * Layout: base [N, V] fp32 and hidden [N, H] bf16 row-major, row r's slots consecutive
 * from the sum of the earlier counts; W2's dense rows [V, r] bf16; W2, G, J packed as
 * linear_bf16's (gemm_bf16.c); W1 [V1, r] bf16.
 *
 * A reduced draft vocabulary (draftwise_dspark.draft_vocab: speculators' d2t/t2d): V is
 * the draft's, V1 the verifier's, and d2t [V] int64 the target id of each draft index
 * (checked in [0, V1) by the caller). Picks (tok) stay draft indices; a pick becomes the
 * next lane's previous token, W1's row, as d2t[pick] (feed()), so prev_of and the anchors
 * are verifier ids. Without d2t (NULL) V1 = V and feed() is the identity.
 *
 * Batch invariance: a lane's latent, screen and product row are its own (the GEMM's rows
 * never depend on what shares the call, the screen and argmax are per lane), so a row's
 * picks never depend on the other rows, the window depth, the thread count or which lanes
 * shared a product: only the time does. The product's blocks are split over threads in
 * fixed chunks, each chunk's first maximum kept and the chunks merged in column order.
 *
 * Measured (benchmarks/dspark_step.py, AMD Zen 5, 2 cores shared with other load): share
 * of the draft step at the tiny shape (H 576, V 49152, r 256) 0.02-0.05 for vanilla and
 * gated (every pick certified: ~0.1-0.17 ms of screen a pass), 0.17-0.22 for rnn (B = 7,
 * one thread: products 0.95 ms at 1.36 a pass, latents 0.20, guesses 0.11); 0.002-0.007
 * and 0.05-0.07 at DeepSpec's published proportions (H 2560, V 151936). A product's
 * lane costs ~65 us at one thread (V x r vdpbf16ps at about peak), its W2 stream
 * 0.55-0.75 ms cold and 0.41-0.53 ms from L3 (benchmarks/dspark_markov_profile.py).
 *
 * Files: this one is the pass (latents, the fused product, windows, rounds, threads); the
 * certified screen and the guesses are markov_screen.h, included below into this
 * translation unit.
 */
#include "kernels.h"
#include "gemm_bf16.h"
#include "threadpool.h"

#include <stdlib.h>
#include <time.h>

enum { KIND_VANILLA = 0, KIND_GATED = 1, KIND_RNN = 2 };
enum { STAT_SCREENED, STAT_CERTIFIED, STAT_PRODUCTS, STAT_PRODUCT_LANES, STAT_GUESSES,
       STAT_GUESSES_HELD, STAT_LANES, STAT_NS_LATENT, STAT_NS_SCREEN, STAT_NS_GUESS,
       STAT_NS_PRODUCT, STAT_COUNT };

/* The pass's own profile (STAT_NS_*: wall ns per phase), ~25 ns a reading. */
static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* blocks of W2 per chunk of the product: the unit a thread claims and whose first maximum
 * is kept per lane (1 MB of weights at r = 256) */
#define CHUNK_BLOCKS 32
/* lanes one product takes (its per-lane state lives on the stack); more run as several */
#define MAX_PRODUCT_LANES 64
/* the screen's widening of |W2[v]| |u| (draftwise_dspark.markov._WIDEN) */
#define WIDEN (1.0f + 1.0f / 64.0f)

typedef struct {
    int kind;
    int64_t v, r, h, threads;
    const uint16_t *w1;      /* [v, r] */
    const uint16_t *w2;      /* packed [v, r] */
    const uint16_t *w2_rows; /* [v, r] dense, for the guesses */
    const float *norms;      /* [v] |W2[t]| */
    const uint16_t *lat_w;   /* packed G [r, h + r] or J [3r, 2r + h] */
    const uint16_t *lat_b;   /* their bias */
    const uint16_t *sig, *tanh_t; /* [65536] each: torch's bf16 sigmoid / tanh by input bits */
    const uint16_t *hidden;  /* [N, h] */
    const float *base;       /* [N, v] */
    const int64_t *d2t;      /* [v] W1's row of each draft index (module doc), or NULL */
    int64_t v1;              /* W1's rows */
} Head;

/* The previous token (W1's row) that a pick is, for the next position. */
static inline int64_t feed(const Head *hd, int64_t pick) {
    return hd->d2t ? hd->d2t[pick] : pick;
}

typedef struct {
    int64_t row, slot, prev, pick;
    int certified;
} Lane;

static inline float bf(uint16_t x) { return bf16_to_f32(x); }

/* u (and, for rnn, the next state) of one lane: module doc. x: [2r + h], gco: [3r]. The
 * projection (1.7 MB at the benchmark's rnn shape) runs on the calling thread: the lanes'
 * latents form a chain, and handing 12 blocks to the pool saved less than a worker
 * descheduled by other load then cost (measured on the shared 2-core machine). */
static void latent(const Head *hd, int64_t prev, const uint16_t *hrow, const uint16_t *s_in,
                   uint16_t *u, uint16_t *s_out, uint16_t *x, uint16_t *gco) {
    const int64_t r = hd->r, h = hd->h;
    const uint16_t *e = hd->w1 + prev * r;
    if (hd->kind == KIND_VANILLA) {
        memcpy(u, e, sizeof(uint16_t) * (size_t)r);
        return;
    }
    DwGemm g = {.x = x, .p = hd->lat_w, .b = hd->lat_b, .y = gco, .m = 1};
    if (hd->kind == KIND_GATED) { /* torch.cat([h, e]) */
        memcpy(x, hrow, sizeof(uint16_t) * (size_t)h);
        memcpy(x + h, e, sizeof(uint16_t) * (size_t)r);
        g.k = g.x_stride = h + r;
        g.n = g.y_stride = r;
        dw_gemm_bf16(&g, 1);
        for (int64_t i = 0; i < r; i++) u[i] = f32_to_bf16(bf(hd->sig[gco[i]]) * bf(e[i]));
        return;
    }
    /* rnn: torch.cat([s, e, h]) */
    memcpy(x, s_in, sizeof(uint16_t) * (size_t)r);
    memcpy(x + r, e, sizeof(uint16_t) * (size_t)r);
    memcpy(x + 2 * r, hrow, sizeof(uint16_t) * (size_t)h);
    g.k = g.x_stride = 2 * r + h;
    g.n = g.y_stride = 3 * r;
    dw_gemm_bf16(&g, 1);
    for (int64_t i = 0; i < r; i++) {
        /* gate * s + (1 - gate) * tanh(c): each torch op rounds to bf16 */
        const float gate = bf(hd->sig[gco[i]]);
        const float kept = bf(f32_to_bf16(gate * bf(s_in[i])));
        const float rest_gate = bf(f32_to_bf16(1.0f - gate));
        const float rest = bf(f32_to_bf16(rest_gate * bf(hd->tanh_t[gco[r + i]])));
        s_out[i] = f32_to_bf16(kept + rest);
        u[i] = hd->tanh_t[gco[2 * r + i]];
    }
}

/* First maximum of base + bias over columns [c0, c0 + n) of one row, bias bf16 (NaN
 * wins, its first index): the scalar rule every path below reduces to. */
static void fold(const float *base, const uint16_t *bias, int64_t c0, int64_t n, float *best,
                 int64_t *at, int64_t *nan_at) {
    for (int64_t c = 0; c < n; c++) {
        const float x = base[c0 + c] + bf(bias[c]);
        if (x != x) {
            if (*nan_at < 0) *nan_at = c0 + c;
        } else if (x > *best) {
            *best = x, *at = c0 + c;
        }
    }
}

/* the certified screen, the window's guesses and their 16-lane helpers */
#include "markov_screen.h"

/* One W2 product over m <= MAX_PRODUCT_LANES lanes fused with the base add and the
 * first-maximum pick. */
typedef struct {
    DwGemm g;             /* x: the lanes' latents [m, r] */
    const float **bases;  /* [m] each lane's base row */
    int64_t v, nchunks;
    float *best;          /* [m, nchunks] each chunk's first maximum */
    int64_t *at;          /* [m, nchunks] its column */
    int *nan;             /* [m, nchunks] a NaN seen in the chunk */
} Product;

/* Chunks of CHUNK_BLOCKS blocks within [begin, end) (the pool hands out whole chunks, or
 * the whole range when it runs inline). Per lane, 16 running maxima with their first
 * columns (a lane's columns c = k mod 16), reduced at the chunk's end by (value, lower
 * column): the chunk's first maximum. */
static void product_chunks(void *ctx, int64_t begin, int64_t end) {
    const Product *pr = ctx;
    const int64_t m = pr->g.m, v = pr->v;
    uint16_t out[MAX_PRODUCT_LANES * DW_BLOCK_N];
    v16f best[MAX_PRODUCT_LANES];
    v16i at[MAX_PRODUCT_LANES], nan[MAX_PRODUCT_LANES];
    const v16i step = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int64_t ch = begin / CHUNK_BLOCKS; ch * CHUNK_BLOCKS < end; ch++) {
        const int64_t b0 = ch * CHUNK_BLOCKS;
        const int64_t b1 = b0 + CHUNK_BLOCKS < end ? b0 + CHUNK_BLOCKS : end;
        for (int64_t l = 0; l < m; l++) {
            best[l] = v16_splat(-INFINITY);
            at[l] = step + (int32_t)(b0 * DW_BLOCK_N);
            nan[l] = step - step;
        }
        for (int64_t nb = b0; nb < b1; nb++) {
            const int64_t c0 = nb * DW_BLOCK_N;
            const int64_t cols = c0 + DW_BLOCK_N < v ? DW_BLOCK_N : v - c0;
            dw_gemm_bf16_block(&pr->g, nb, out, DW_BLOCK_N);
            for (int64_t l = 0; l < m; l++) {
                const float *b = pr->bases[l] + c0;
                const uint16_t *o = out + l * DW_BLOCK_N;
                for (int64_t c = 0; c < cols; c += LANES) {
                    v16f x;
                    if (c + LANES <= cols) {
                        memcpy(&x, b + c, sizeof x);
                        x = x + v16_load_bf16(o + c);
                    } else { /* the vocabulary's last columns: -inf never replaces a maximum */
                        for (int k = 0; k < LANES; k++)
                            x[k] = c + k < cols ? b[c + k] + bf(o[c + k]) : -INFINITY;
                    }
                    const v16i gt = x > best[l];
                    best[l] = (v16f)((gt & (v16i)x) | (~gt & (v16i)best[l]));
                    at[l] = (gt & (step + (int32_t)(c0 + c))) | (~gt & at[l]);
                    nan[l] |= x != x;
                }
            }
        }
        for (int64_t l = 0; l < m; l++) {
            float mb = best[l][0];
            int64_t ma = at[l][0];
            int any_nan = nan[l][0] != 0;
            for (int k = 1; k < LANES; k++) {
                any_nan |= nan[l][k] != 0;
                if (best[l][k] > mb || (best[l][k] == mb && at[l][k] < ma))
                    mb = best[l][k], ma = at[l][k];
            }
            pr->best[l * pr->nchunks + ch] = mb;
            pr->at[l * pr->nchunks + ch] = ma;
            pr->nan[l * pr->nchunks + ch] = any_nan;
        }
    }
}

/* A lane whose product row held a NaN: torch.argmax's answer is the first NaN, found on
 * the lane's whole row again (only with NaN weights or logits). */
static int64_t first_nan(const Head *hd, const float *base, const uint16_t *u, uint16_t *out) {
    const DwGemm g = {.x = u, .p = hd->w2, .m = 1, .k = hd->r, .n = hd->v, .x_stride = hd->r};
    float best = -INFINITY;
    int64_t at = 0, nan_at = -1;
    for (int64_t nb = 0; nb * DW_BLOCK_N < hd->v && nan_at < 0; nb++) {
        const int64_t c0 = nb * DW_BLOCK_N;
        dw_gemm_bf16_block(&g, nb, out, DW_BLOCK_N);
        fold(base, out, c0, c0 + DW_BLOCK_N < hd->v ? DW_BLOCK_N : hd->v - c0, &best, &at,
             &nan_at);
    }
    return nan_at;
}

/* The picks of m lanes (their latents in u [m, r]) by one fused W2 product. */
static void product(const Head *hd, const uint16_t *u, const float **bases, int64_t m,
                    int64_t *picks, float *best, int64_t *at, int *nan, uint16_t *out) {
    const int64_t nblocks = (hd->v + DW_BLOCK_N - 1) / DW_BLOCK_N;
    Product pr = {.g = {.x = u, .p = hd->w2, .m = m, .k = hd->r, .n = hd->v, .x_stride = hd->r},
                  .bases = bases, .v = hd->v,
                  .nchunks = (nblocks + CHUNK_BLOCKS - 1) / CHUNK_BLOCKS,
                  .best = best, .at = at, .nan = nan};
    dw_parallel_for_grain((int)hd->threads, nblocks, CHUNK_BLOCKS, product_chunks, &pr);
    for (int64_t l = 0; l < m; l++) {
        const int64_t o = l * pr.nchunks;
        float mb = best[o];
        int64_t ma = at[o];
        int any_nan = nan[o];
        for (int64_t ch = 1; ch < pr.nchunks; ch++) { /* column order: strictly greater wins */
            any_nan |= nan[o + ch];
            if (best[o + ch] > mb) mb = best[o + ch], ma = at[o + ch];
        }
        picks[l] = any_nan ? first_nan(hd, bases[l], u + l * hd->r, out) : ma;
    }
}

/* The call's settings and outputs (dw_markov_pass's arguments). */
typedef struct {
    int64_t rows, depth, lane_cap, screen, give_up, max_blocks, guess_tokens;
    const int64_t *counts, *anchors; /* [rows] */
    int64_t *tok, *prev_of;          /* [N] */
    int64_t *stats;                  /* [STAT_COUNT] */
} Pass;

/* Scratch of one pass, one allocation. */
typedef struct {
    Lane *lanes;
    uint16_t *u, *s, *row_s, *up, *x, *gco, *out;
    int64_t *j, *prev, *first, *blocks, *cand, *picks, *at, *pending;
    const float **bases;
    float *sel, *uf, *best, *runmax;
    int *nan;
} Work;

static void *carve(char **at, size_t bytes) {
    void *p = *at;
    *at += (bytes + 63) & ~(size_t)63;
    return p;
}

static char *work_alloc(const Head *hd, const Pass *ps, int64_t cap, Work *w) {
    const int64_t r = hd->r, rows = ps->rows, nblocks = (hd->v + DW_BLOCK_N - 1) / DW_BLOCK_N;
    const int64_t nchunks = (nblocks + CHUNK_BLOCKS - 1) / CHUNK_BLOCKS, t = ps->guess_tokens;
    const size_t u16 = sizeof(uint16_t), i64 = sizeof(int64_t), pl = MAX_PRODUCT_LANES;
    const size_t sizes[] = {
        sizeof(Lane) * cap, u16 * cap * r, u16 * cap * r, u16 * rows * r, u16 * pl * r,
        u16 * (2 * r + hd->h), u16 * 3 * r, u16 * DW_BLOCK_N, i64 * rows, i64 * rows,
        i64 * rows, i64 * nblocks, i64 * 64 * t, i64 * pl, i64 * pl * nchunks, i64 * pl,
        sizeof(float *) * pl, sizeof(float) * nblocks, sizeof(float) * r,
        sizeof(float) * pl * nchunks, sizeof(int) * pl * nchunks, sizeof(float) * nblocks};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        total += (sizes[i] + 63) & ~(size_t)63;
    char *mem = calloc(1, total), *at = mem; /* zeroed: the rnn state starts at 0 */
    if (!mem) return NULL;
    size_t i = 0;
    w->lanes = carve(&at, sizes[i++]);
    w->u = carve(&at, sizes[i++]), w->s = carve(&at, sizes[i++]);
    w->row_s = carve(&at, sizes[i++]), w->up = carve(&at, sizes[i++]);
    w->x = carve(&at, sizes[i++]), w->gco = carve(&at, sizes[i++]);
    w->out = carve(&at, sizes[i++]);
    w->j = carve(&at, sizes[i++]), w->prev = carve(&at, sizes[i++]);
    w->first = carve(&at, sizes[i++]), w->blocks = carve(&at, sizes[i++]);
    w->cand = carve(&at, sizes[i++]), w->picks = carve(&at, sizes[i++]);
    w->at = carve(&at, sizes[i++]), w->pending = carve(&at, sizes[i++]);
    w->bases = carve(&at, sizes[i++]);
    w->sel = carve(&at, sizes[i++]), w->uf = carve(&at, sizes[i++]);
    w->best = carve(&at, sizes[i++]), w->nan = carve(&at, sizes[i++]);
    w->runmax = carve(&at, sizes[i++]);
    return mem;
}

/* One round's lanes for one row (module doc: windows), from position j with the row's
 * true previous token and state. Returns the lanes made. */
static int64_t row_lanes(const Head *hd, const Pass *ps, Work *w, int64_t row, int64_t width,
                         int64_t m, int *screen_on, int64_t *misses) {
    const int64_t r = hd->r;
    int64_t prev = w->prev[row], made = 0;
    const uint16_t *s = w->row_s + row * r;
    for (int64_t d = 0; d < width; d++) {
        Lane *ln = &w->lanes[m + d];
        uint16_t *u = w->u + (m + d) * r, *s_out = w->s + (m + d) * r;
        *ln = (Lane){.row = row, .slot = w->first[row] + w->j[row] + d, .prev = prev, .pick = -1};
        int64_t t0 = now_ns();
        latent(hd, prev, hd->hidden + ln->slot * hd->h, s, u, s_out, w->x, w->gco);
        ps->stats[STAT_NS_LATENT] += now_ns() - t0;
        s = s_out;
        made++;
        const float *base = hd->base + ln->slot * hd->v;
        if (*screen_on) {
            t0 = now_ns();
            ps->stats[STAT_SCREENED]++;
            ln->pick = screen(hd, base, u, ps->max_blocks, w->blocks, w->out);
            ln->certified = ln->pick >= 0;
            *misses = ln->certified ? 0 : *misses + 1;
            if (*misses >= ps->give_up) *screen_on = 0; /* a drafter the bound cannot serve */
            ps->stats[STAT_NS_SCREEN] += now_ns() - t0;
        }
        if (d + 1 == width) break;
        if (ln->pick >= 0) {
            prev = feed(hd, ln->pick);
        } else if (hd->w2_rows) {
            t0 = now_ns();
            prev = feed(hd, guess(hd, base, u, ps->guess_tokens, w->runmax, w->sel, w->cand,
                                  w->uf));
            ps->stats[STAT_NS_GUESS] += now_ns() - t0;
        } else {
            break; /* no dense rows to guess from: one position per product */
        }
    }
    return made;
}

/* The pending lanes' picks, MAX_PRODUCT_LANES at a time per W2 product. */
static void run_products(const Head *hd, const Pass *ps, Work *w, int64_t m) {
    const int64_t r = hd->r;
    for (int64_t k = 0; k < m;) {
        int64_t g = 0;
        for (; k < m && g < MAX_PRODUCT_LANES; k++) {
            if (w->lanes[k].pick >= 0) continue;
            memcpy(w->up + g * r, w->u + k * r, sizeof(uint16_t) * (size_t)r);
            w->bases[g] = hd->base + w->lanes[k].slot * hd->v;
            w->pending[g++] = k;
        }
        if (!g) continue;
        const int64_t t0 = now_ns();
        product(hd, w->up, w->bases, g, w->picks, w->best, w->at, w->nan, w->out);
        ps->stats[STAT_NS_PRODUCT] += now_ns() - t0;
        for (int64_t i = 0; i < g; i++) w->lanes[w->pending[i]].pick = w->picks[i];
        ps->stats[STAT_PRODUCTS]++;
        ps->stats[STAT_PRODUCT_LANES] += g;
    }
}

/* Keep each row's lanes left to right while each ran under the pick just kept. */
static void commit(const Head *hd, const Pass *ps, Work *w, int64_t m) {
    const int64_t r = hd->r;
    for (int64_t a = 0; a < m;) {
        const int64_t row = w->lanes[a].row;
        int64_t b = a + 1;
        while (b < m && w->lanes[b].row == row) b++;
        int64_t last = a;
        for (int64_t d = a; d < b; d++) {
            const Lane *ln = &w->lanes[d];
            if (d > a) {
                const int held = ln->prev == feed(hd, w->lanes[d - 1].pick);
                if (!w->lanes[d - 1].certified) { /* its previous token was a guess */
                    ps->stats[STAT_GUESSES]++;
                    ps->stats[STAT_GUESSES_HELD] += held;
                }
                if (!held) break;
            }
            ps->tok[ln->slot] = ln->pick;
            ps->prev_of[ln->slot] = ln->prev;
            ps->stats[STAT_CERTIFIED] += ln->certified;
            ps->stats[STAT_LANES]++;
            last = d;
        }
        w->prev[row] = feed(hd, w->lanes[last].pick);
        w->j[row] += last - a + 1;
        if (hd->kind == KIND_RNN)
            memcpy(w->row_s + row * r, w->s + last * r, sizeof(uint16_t) * (size_t)r);
        a = b;
    }
}

/* The whole pass; -1 when scratch memory could not be had. */
static int run_pass(const Head *hd, const Pass *ps) {
    const int64_t rows = ps->rows, cap = ps->lane_cap > rows ? ps->lane_cap : rows;
    Work w;
    char *mem = work_alloc(hd, ps, cap, &w);
    if (!mem) return -1;
    for (int64_t row = 0, at = 0; row < rows; at += ps->counts[row++]) {
        w.first[row] = at;
        w.prev[row] = ps->anchors[row];
    }
    int screen_on = ps->screen && hd->norms != NULL;
    int64_t misses = 0;
    for (;;) {
        int64_t live = 0;
        for (int64_t row = 0; row < rows; row++) live += w.j[row] < ps->counts[row];
        if (!live) break;
        const int64_t per = ps->lane_cap / live > 1 ? ps->lane_cap / live : 1;
        int64_t m = 0;
        for (int64_t row = 0; row < rows; row++) {
            int64_t width = ps->counts[row] - w.j[row];
            if (width <= 0) continue;
            if (width > ps->depth + 1) width = ps->depth + 1;
            if (width > per) width = per;
            m += row_lanes(hd, ps, &w, row, width, m, &screen_on, &misses);
        }
        run_products(hd, ps, &w, m);
        commit(hd, ps, &w, m);
    }
    free(mem);
    return 0;
}

PyObject *dw_markov_pass(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[15];
    int64_t n[14];
    if (dw_parse(args, nargs, 29, 15, p, n, "markov_pass") < 0) return NULL;
    const Head hd = {.kind = (int)n[0], .v = n[1], .r = n[2], .h = n[3],
                     .threads = dw_threads(n[12]),
                     .w1 = p[0], .w2 = p[1], .w2_rows = p[2], .norms = p[3], .lat_w = p[4],
                     .lat_b = p[5], .sig = p[6], .tanh_t = (const uint16_t *)p[6] + 65536,
                     .hidden = p[7], .base = p[8], .d2t = p[14], .v1 = n[13]};
    const Pass ps = {.rows = n[4], .depth = n[6], .lane_cap = n[7], .screen = n[8],
                     .give_up = n[9], .max_blocks = n[10], .guess_tokens = n[11],
                     .counts = p[9], .anchors = p[10], .tok = p[11], .prev_of = p[12],
                     .stats = p[13]};
    if (hd.kind < KIND_VANILLA || hd.kind > KIND_RNN || hd.v < 1 || hd.v >= (1ll << 31)
        || hd.r < 1 || hd.h < 1 || ps.rows < 0 || ps.depth < 0 || ps.lane_cap < 1
        || ps.give_up < 1 || ps.max_blocks < 1 || ps.guess_tokens < 1 || ps.guess_tokens > hd.v
        || (hd.kind != KIND_VANILLA && !hd.lat_w) || hd.v1 < 1 || (!hd.d2t && hd.v1 != hd.v)) {
        PyErr_SetString(PyExc_ValueError, "markov_pass: bad sizes or settings");
        return NULL;
    }
    int64_t total = 0;
    for (int64_t row = 0; row < ps.rows; row++) {
        if (ps.counts[row] < 0 || ps.anchors[row] < 0 || ps.anchors[row] >= hd.v1) {
            PyErr_SetString(PyExc_ValueError, "markov_pass: a count below 0 or an anchor "
                                              "outside the vocabulary");
            return NULL;
        }
        total += ps.counts[row];
    }
    if (total != n[5]) {
        PyErr_SetString(PyExc_ValueError, "markov_pass: the counts do not sum to the slots");
        return NULL;
    }
    memset(ps.stats, 0, sizeof(int64_t) * STAT_COUNT);
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = run_pass(&hd, &ps);
    Py_END_ALLOW_THREADS if (rc < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
