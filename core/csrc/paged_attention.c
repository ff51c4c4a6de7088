/*
 * Paged causal attention over a bf16 KV cache, for CPU decode and verify.
 *
 * Why hand-written: the torch path (models/attention.py) gathers each row's context,
 * pads it and runs ~25 small ops per layer; for a decode or verify row that is ~180 us a
 * layer, most of a 135M model's non-GEMM time. This kernel reads the paged cache in place.
 *
 * Batch invariance by construction: every (token, head) result is computed by the same
 * instruction sequence whatever else is in the batch. Reductions have a fixed order that
 * depends only on that token's own context: dots run over head_dim pairs in order per key
 * lane, the softmax denominator sums 16 key lanes in key order then a fixed tree, and
 * P @ V accumulates key pairs in order, pairs aligned to even absolute positions (never
 * to where the row's first query starts). No -ffast-math (no reassociation). All
 * arithmetic is on explicit vectors (no auto-vectorised loops with scalar tails), so
 * letting the compiler fuse multiply-adds (-ffp-contract=fast) changes nothing. Their
 * width is vec.h's EW_LANES: 16 with AVX-512, 8 on AVX2, where GCC spilled 16-lane
 * vectors through the stack (3-4x slower). A score is one key's lane and a P @ V sum
 * one dim's, and the denominator keeps its 16 sums at either width, so both widths
 * give the same bits.
 *
 * Numerics follow transformers' eager bf16 attention: scores rounded to bf16 (a bf16
 * matmul's output), softmax in fp32, probabilities rounded to bf16, P @ V accumulated
 * in fp32 (one rounding at the end, where the torch path rounds per 256-key chunk). Both
 * products take bf16 inputs two at a time (vec.h v16_dot2_bf16: vdpbf16ps on AVX512-BF16),
 * so K and V are never widened to fp32: K is only transposed (as 32-bit pairs), V only
 * interleaved by key pairs, and the dot products take half the instructions. The other
 * side of each product (a query, a probability) is broadcast: without vdpbf16ps it is
 * split into its two fp32 values once, where it is written (src_t below), not at every
 * use; with the key walk's block-table lookups done without a division a position, that
 * made the kernel ~20% faster on AVX2 (Zen 3: 8 rows at context 140, 20.7 -> 16.4 us a
 * row with the cache warm; 83 -> 65 at 600) with the same bits. With the probabilities
 * split, a decode's P @ V needs no value pairs either: it reads each key's value row in
 * the cache, in key order (reads_values_in_place decides where that pays), the same
 * multiply-adds again: an 8-row decode step of the default model 1.07x at context 300.
 *
 * A prefill chunk (a row of over QTILE query tokens) is computed in tiles of QTILE tokens:
 * its keys are loaded once per kv head into a buffer the threads share, then the tiles
 * spread over the pool, each with scores and probabilities small enough for L2 (a whole
 * 2,048-token chunk's went through memory; one item per kv head left one of two threads
 * idle a third of the time with SmolLM2's 3 kv heads): at context 4,096-6,144 a 2,048-token
 * chunk's attention went 1.4-1.9x faster on the 2-core VM, the same bits.
 *
 * Layouts: q [T, H, D], k and v [T, KV, D] (token rows may be strided: views into the fused
 * qkv output), out [T, H, D]; caches [num_blocks, block_size, KV, D]; slot_mapping [T],
 * query_start_loc [B + 1], seq_lens [B], block_tables [B, W] int64. The kernel first
 * writes k and v at their slots; row r's query tokens are then the last
 * (qsl[r+1] - qsl[r]) of its seq_lens[r] positions.
 *
 * Files: this one walks the cache, lays out each row's keys and values, runs the softmax
 * and spreads the work over the pool; the two products' inner loops (scores, P @ V) are
 * paged_attention_products.h, included below into this translation unit.
 */
#include "kernels.h"
#include "threadpool.h"

#include <stdatomic.h>
#include <stdlib.h>

/* this file's vector width: EW_LANES (vec.h), 8 on AVX2, 16 with AVX-512 */
#undef LANES
#define LANES EW_LANES

typedef dw_attention_args Args; /* kernels.h */

/* key positions the K/V walk requests ahead of the one it converts */
#define PREFETCH 24

static inline void prefetch_row(const uint16_t *p, int64_t bytes) {
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch((const char *)p + off, 0, 3);
}

/* The first key position a query at ``pos`` sees (sliding window, or 0). */
static inline int64_t first_key(const Args *a, int64_t pos) {
    return a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
}

/* Where kv head g's row of consecutive positions sits in a cache (element offsets, via the
 * block table), stepped one position at a time: the position is kept as (block, slot in
 * block), so a step costs no division */
typedef struct {
    const int64_t *table;
    int64_t blk, in, bs, row0; /* row0: (g) * dim, the head's offset in a slot */
    int64_t slot;              /* elements per cache slot: kv_heads * dim */
} kv_walk;

static inline kv_walk walk_at(const Args *a, const int64_t *table, int64_t pos, int64_t g) {
    return (kv_walk){table, pos / a->block_size, pos % a->block_size, a->block_size,
                     g * a->dim, a->kv_heads * a->dim};
}
static inline int64_t walk_row(const kv_walk *w) {
    return (w->table[w->blk] * w->bs + w->in) * w->slot + w->row0;
}
static inline void walk_next(kv_walk *w) {
    if (++w->in == w->bs) w->in = 0, w->blk++;
}

/* the broadcast side (src_t), the score and P @ V loops, the value pairs */
#include "paged_attention_products.h"

/* Scratch for one (row, kv head), sized for the longest row and query. */
typedef struct {
    uint32_t *kt2; /* [dim / 2, npad] keys transposed, head dims as bf16 pairs */
    src_t *q2; /* [nq, dim / 2] the queries, head dims as pairs (src_t) */
    float *s;  /* [nq, npad] scores, then probabilities */
    uint32_t *vp2; /* [npad / 2 + 1, dim] values as bf16 pairs of consecutive keys */
    const uint16_t **vrow; /* [npad] each key's value row in the cache (vp2's memory) */
    src_t *sp;  /* [nq, npad + 4] bf16 probabilities in the pair layout (src_t) */
    float *o;  /* [nq, dim] fp32 output accumulators */
} Scratch;

/* Where one row's keys sit for one kv head: the keys any of its queries sees and the
 * padded width of its transposed keys (kt2), scores (s) and probabilities (sp). */
typedef struct {
    int64_t q0, qlen, ctx, first_pos, nq, lo_all, nkeys, npad, odd0;
    int in_place;
} RowGeom;

static RowGeom row_geom(const Args *a, int64_t row) {
    RowGeom r;
    const int64_t rep = a->heads / a->kv_heads;
    r.q0 = a->qsl[row], r.qlen = a->qsl[row + 1] - r.q0, r.ctx = a->seq[row];
    r.first_pos = r.ctx - r.qlen, r.nq = r.qlen * rep;
    r.in_place = reads_values_in_place(r.nq);
    r.lo_all = first_key(a, r.first_pos); /* keys any query of this row can see */
    r.nkeys = r.ctx - r.lo_all;
    r.npad = (r.nkeys + LANES - 1) / LANES * LANES + 4 * LANES;
    r.odd0 = r.lo_all & 1;
    return r;
}

/* Row ``row``'s keys for kv head g, transposed into kt2 ([d/2, npad]), and its values as
 * bf16 pairs into vp2 (or, in place, each key's value row into vrow). */
static void load_keys(const Args *a, int64_t row, int64_t g, const RowGeom *r, uint32_t *kt2,
                      uint32_t *vp2, const uint16_t **vrow) {
    const int64_t d = a->dim, d2 = d / 2, nkeys = r->nkeys, npad = r->npad, odd0 = r->odd0;
    const int64_t *table = a->bt + row * a->width;
    /* The cache is cold here (the layer's weights streamed through since it was last
     * read), and a dependent row-by-row walk over it stalls on every miss: request the
     * rows PREFETCH positions ahead so many misses are in flight at once. */
    const int64_t row_bytes = d * (int64_t)sizeof(uint16_t);
    kv_walk at = walk_at(a, table, r->lo_all, g), ahead = at;
    for (int64_t j = 0; j < nkeys && j < PREFETCH; j++, walk_next(&ahead)) {
        const int64_t off = walk_row(&ahead);
        prefetch_row(a->kc + off, row_bytes), prefetch_row(a->vc + off, row_bytes);
    }
    /* V as bf16 pairs of consecutive keys, pairs starting at even absolute positions (so
     * a query-head's pairing never depends on the row's other queries): pair m holds
     * keys 2m - odd0 and 2m + 1 - odd0 (relative to lo_all; a key outside is zero) */
    const uint16_t *krow[LANES], *vprev = NULL;
    int64_t j = 0;
    for (; j < nkeys; j++, walk_next(&at)) {
        const int64_t off = walk_row(&at);
        const uint16_t *vp = a->vc + off;
        if (j + PREFETCH < nkeys) { /* ``ahead`` is at j + PREFETCH */
            const int64_t far = walk_row(&ahead);
            prefetch_row(a->kc + far, row_bytes), prefetch_row(a->vc + far, row_bytes);
            walk_next(&ahead);
        }
        if (r->in_place)
            vrow[j] = vp;
        else if ((j + odd0) & 1)
            write_pair(vp2 + ((j + odd0) >> 1) * d, vprev, vp, d), vprev = NULL;
        else
            vprev = vp;
        krow[j % LANES] = a->kc + off;
        if (j % LANES != LANES - 1) continue;
        /* LANES keys gathered: transpose their dim pairs into kt2, a square of pairs at a time */
        const int64_t j0 = j - (LANES - 1);
        for (int64_t c0 = 0; c0 < d2; c0 += LANES) {
            const int64_t np = d2 - c0 < LANES ? d2 - c0 : LANES;
            vewf t[LANES];
            if (np == LANES) /* a whole square (a fixed-size copy: no call) */
                for (int l = 0; l < LANES; l++) memcpy(&t[l], krow[l] + 2 * c0, sizeof t[l]);
            else
                for (int l = 0; l < LANES; l++) {
                    vewu x = EW(splat_u32)(0);
                    memcpy(&x, krow[l] + 2 * c0, (size_t)np * sizeof(uint32_t));
                    t[l] = (vewf)x;
                }
            EW(transpose)(t); /* bit moves only */
            for (int l = 0; l < np; l++) memcpy(kt2 + (c0 + l) * npad + j0, &t[l], sizeof t[l]);
        }
    }
    if (vprev) write_pair(vp2 + ((nkeys - 1 + odd0) >> 1) * d, vprev, NULL, d); /* odd end */
    for (int64_t jt = nkeys / LANES * LANES; jt < nkeys; jt++) /* the last, partial block */
        memcpy_pairs_column(kt2 + jt, npad, krow[jt % LANES], d2);
    for (int64_t c = 0; c < d2; c++)
        for (int64_t j = nkeys; j < npad; j++) kt2[c * npad + j] = 0;
}

/* Query tokens t0 .. t1 - 1 of one row, one kv head, over its loaded keys (load_keys):
 * every query token x every query head sharing that kv head. The loops run keys-outer so
 * a tile of keys (or values) is reused by all these queries while it is in L1; each
 * (query, head) still sums its keys in the same order as when alone, so which tokens
 * share a call changes no bit. ``w``'s q2, s, sp and o hold (t1 - t0) tokens' heads. */
static void attend_queries(const Args *a, int64_t g, const RowGeom *r, const uint32_t *kt2,
                           const uint32_t *vp2, const uint16_t *const *vrow, int64_t t0,
                           int64_t t1, const Scratch *w) {
    const int64_t d = a->dim, h = a->heads, rep = h / a->kv_heads;
    const int64_t q0 = r->q0 + t0, first_pos = r->first_pos + t0, nq = (t1 - t0) * rep;
    const int64_t npad = r->npad, odd0 = r->odd0, lo_all = r->lo_all;
    const int in_place = r->in_place;
    float *s = w->s, *o = w->o;
    src_t *q2 = w->q2, *sp = w->sp;
    const int64_t d2 = d / 2; /* head dims as bf16 pairs (head_dim is a multiple of 16) */
    const int64_t spw = npad + 4; /* sp entries per query-head (even: rows stay 4-aligned) */
    /* query-head qi = i * rep + hh sees keys j0[qi] .. j0[qi] + n[qi] - 1 (relative to lo_all) */
    int64_t max_blocks = 0;
    for (int64_t qi = 0; qi < nq; qi++) {
        const int64_t t = q0 + qi / rep, head = g * rep + qi % rep;
        const uint16_t *qp = a->q + t * a->q_stride + head * d;
        put_src(src_row(q2, qi, d), 0, qp, d); /* dim pairs */
        const int64_t pos = first_pos + qi / rep;
        const int64_t nb = (pos - first_key(a, pos) + 1 + LANES - 1) / LANES;
        max_blocks = nb > max_blocks ? nb : max_blocks;
    }
#define QRANGE(qi, J0, N)                              \
    const int64_t pos_ = first_pos + (qi) / rep;       \
    const int64_t lo_ = first_key(a, pos_);            \
    const int64_t J0 = lo_ - lo_all, N = pos_ - lo_ + 1

    /* scores: AV blocks of LANES keys per pass, all query-heads per tile; query-heads
     * that start at the same key share each tile load (up to QGROUP at a time) */
    for (int64_t b = 0; b < max_blocks; b += AV) {
        int64_t qi = 0;
        while (qi < nq) {
            QRANGE(qi, j0, n);
            if (b >= (n + LANES - 1) / LANES) { qi++; continue; }
            int64_t grp[QGROUP], nbs[QGROUP];
            int ng = 0;
            for (int64_t qj = qi; qj < nq && ng < QGROUP; qj++) {
                QRANGE(qj, j0b, nb_);
                if (j0b != j0) break;
                nbs[ng] = (nb_ + LANES - 1) / LANES;
                grp[ng++] = qj;
            }
            score_tiles(kt2 + j0 + b * LANES, q2, grp, nbs, ng, d2, npad, a->scale, s, b);
            qi += ng;
        }
    }
    /* softmax per query-head: exact max, exp, 16-sum denominator, bf16 probabilities */
    for (int64_t qi = 0; qi < nq; qi++) {
        QRANGE(qi, j0, n);
        float *sq = s + qi * npad;
        const int64_t nb = (n + LANES - 1) / LANES;
        const int64_t n16 = (n + 15) / 16 * 16; /* the denominator's 16 sums (below) */
        for (int64_t j = n; j < n16; j++) sq[j] = -INFINITY;
        vewf vm = EW(splat)(-INFINITY); /* max is exact: any order gives the same */
        for (int64_t b = 0; b < nb; b++) {
            vewf x;
            memcpy(&x, sq + b * LANES, sizeof x);
            vewi gt = x > vm;
            vm = (vewf)((gt & (vewi)x) | (~gt & (vewi)vm));
        }
        float mm[LANES], m = -INFINITY;
        memcpy(mm, &vm, sizeof mm);
        for (int l = 0; l < LANES; l++) m = mm[l] > m ? mm[l] : m;
        /* exp, then the denominator as 16 running sums (sum l takes keys l, l + 16, ...)
         * and a fixed tree over them, at either vector width: the same bits */
        for (int64_t b = 0; b < n16 / LANES; b++) {
            vewf x;
            memcpy(&x, sq + b * LANES, sizeof x);
            vewf e = EW(exp_nonpos)(x - EW(splat)(m));
            vewf keep = (vewf)((vewi)(x > EW(splat)(-INFINITY)) & (vewi)e);
            memcpy(sq + b * LANES, &keep, sizeof keep);
        }
        dw_sum16 den = dw_sum16_zero();
        for (int64_t b = 0; b < n16; b += 16) dw_sum16_add(&den, sq + b);
        const vewf denom = EW(splat)(dw_sum16_total(&den));
        /* bf16 probabilities into sp at this query-head's place in the pair layout, with
         * a zero beside each end that shares a pair with a key it does not see */
        src_t *spq = src_row(sp, qi, spw);
        const int64_t first = odd0 + j0, last = first + n;
        const uint16_t zero = 0;
        if (first & 1) put_src(spq, first - 1, &zero, 1);
        for (int64_t b = 0; b < nb; b++) {
            vewf e;
            memcpy(&e, sq + b * LANES, sizeof e);
            put_src_rounded(spq, first + b * LANES, EW(round_bf16)(e / denom));
        }
        if (last & 1) put_src(spq, last, &zero, 1);
    }
    /* P @ V over key pairs, in order, for up to QGROUP query-heads that start at the same
     * key (each still ends at its own last pair); V pairs stay in L1 across the group */
    int64_t qi = 0;
    while (qi < nq) {
        QRANGE(qi, j0, n);
        (void)n;
        const src_t *sp2[QGROUP];
        float *og[QGROUP];
        int64_t ends[QGROUP];
        int ng = 0;
        for (int64_t qj = qi; qj < nq && ng < QGROUP; qj++) {
            QRANGE(qj, j0b, nb_);
            if (j0b != j0) break;
            og[ng] = o + qj * d;
            sp2[ng] = src_row(sp, qj, spw);
            if (in_place) /* indexed by key, and the keys it sees */
                sp2[ng] += odd0, ends[ng++] = j0b + nb_;
            else /* by pair, and the pairs */
                ends[ng++] = (odd0 + j0b + nb_ + 1) >> 1;
        }
        if (in_place)
            pv_keys(vrow, sp2, og, ends, ng, j0, d);
        else
            pv_pairs(vp2, sp2, og, ends, ng, (odd0 + j0) >> 1, d);
        qi += ng;
    }
#undef QRANGE
    for (int64_t qi = 0; qi < nq; qi++) {
        const int64_t t = q0 + qi / rep, head = g * rep + qi % rep;
        uint16_t *op = a->out + (t * h + head) * d;
        for (int64_t c = 0; c < d; c++) op[c] = f32_to_bf16(o[qi * d + c]);
    }
}

/* This step's keys and values into their cache slots (before any row reads them). */
static void write_kv(const Args *a) {
    const size_t row = sizeof(uint16_t) * (size_t)(a->kv_heads * a->dim);
    for (int64_t t = 0; t < a->tokens; t++) {
        const int64_t slot = a->slots[t];
        memcpy(a->kc + slot * a->kv_heads * a->dim, a->k + t * a->k_stride, row);
        memcpy(a->vc + slot * a->kv_heads * a->dim, a->v + t * a->v_stride, row);
    }
}

/* One scratch buffer per thread, grown as needed and kept: a fresh malloc per call of a
 * few hundred KB is returned to the OS on free and page-faults back in on every layer. */
static float *scratch_floats(size_t n) {
    static _Thread_local float *buf = NULL;
    static _Thread_local size_t cap = 0;
    if (n > cap) {
        free(buf);
        cap = n + n / 2;
        buf = malloc(sizeof(float) * cap);
        if (!buf) cap = 0;
    }
    return buf;
}

/* A row with more query tokens than this (a prefill chunk) is split into tiles of this
 * many tokens: a tile's scores and probabilities (QTILE * heads-per-kv-head rows of the
 * context's width) stay in L2 where a whole chunk's (2,048 tokens at context 6,500: 150 MB
 * a kv head) went through memory three times, and the tiles spread over the pool where
 * one item per kv head left a thread idle (3 kv heads on 2 threads: 2/3 busy). Each
 * (query, head) is computed by the same instruction sequence as before, so tiling
 * changes no bit. */
#define QTILE 16

/* One job of the pool. Untiled: items are (row, kv group) pairs, each computed whole by
 * one thread with that thread's scratch. Tiled (a row over QTILE tokens): ``tiles`` lists
 * the items, a tiled row's keys already loaded into ``shared`` by load_items. Either way
 * which thread runs an item changes no bit. */
typedef struct {
    const Args *a;
    size_t need;
    int64_t npad, nq, pairs;
    const int64_t *tiles; /* [n, 4]: row, kv head, first token, end token; NULL: untiled */
    uint32_t *shared;     /* tiled rows' kt2 then vp2, per (row, kv head) */
    const int64_t *off;   /* [rows * kv_heads] their offsets in shared (words), -1: none */
    int failed; /* a scratch allocation failed (written by any thread, read after) */
} attend_job;

static Scratch thread_scratch(const attend_job *j, float *buf) {
    const int64_t d = j->a->dim;
    Scratch w = {.kt2 = (uint32_t *)buf};
    w.vp2 = w.kt2 + (d / 2 + 1) * j->npad;
    /* the in-place P @ V's row pointers (SRC_PER_PAIR 2) in vp2's memory, which it does
     * not use: npad pointers fit in its (npad / 2 + 1) * dim words, 32-byte aligned */
    w.vrow = (const uint16_t **)(void *)w.vp2;
    w.q2 = (src_t *)(w.vp2 + j->pairs * d);
    w.o = (float *)src_row(w.q2, j->nq, d);
    w.s = w.o + j->nq * d;
    w.sp = (src_t *)(w.s + j->nq * j->npad);
    return w;
}

/* One row, one kv head, whole: its keys into this thread's scratch, then every query. */
static void attend_group(const Args *a, int64_t row, int64_t g, const Scratch *w) {
    const RowGeom r = row_geom(a, row);
    if (r.qlen <= 0) return;
    load_keys(a, row, g, &r, w->kt2, w->vp2, w->vrow);
    attend_queries(a, g, &r, w->kt2, w->vp2, w->vrow, 0, r.qlen, w);
}

static void attend_items(void *ctx, int64_t begin, int64_t end) {
    attend_job *j = ctx;
    const Args *a = j->a;
    float *buf = scratch_floats(j->need);
    if (!buf) {
        j->failed = 1;
        return;
    }
    const Scratch w = thread_scratch(j, buf);
    for (int64_t i = begin; i < end; i++) {
        if (!j->tiles) {
            attend_group(a, i / a->kv_heads, i % a->kv_heads, &w);
            continue;
        }
        const int64_t *t = j->tiles + 4 * i, row = t[0], g = t[1];
        const int64_t at = j->off[row * a->kv_heads + g];
        if (at < 0) {
            attend_group(a, row, g, &w);
            continue;
        }
        const RowGeom r = row_geom(a, row);
        const uint32_t *kt2 = j->shared + at, *vp2 = kt2 + (a->dim / 2 + 1) * r.npad;
        attend_queries(a, g, &r, kt2, vp2, NULL, t[2], t[3], &w);
    }
}

/* The tiled path's first phase: each tiled (row, kv head)'s keys into ``shared``. */
static void load_items(void *ctx, int64_t begin, int64_t end) {
    attend_job *j = ctx;
    const Args *a = j->a;
    for (int64_t i = begin; i < end; i++) {
        const int64_t *t = j->tiles + 4 * i, row = t[0], g = t[1];
        const RowGeom r = row_geom(a, row);
        uint32_t *kt2 = j->shared + j->off[row * a->kv_heads + g];
        load_keys(a, row, g, &r, kt2, kt2 + (a->dim / 2 + 1) * r.npad, NULL);
    }
}

int dw_attention_shape_ok(int64_t heads, int64_t kv_heads, int64_t dim) {
    return dim % 16 == 0 && dim > 0 && dim <= 512 && kv_heads > 0 && heads % kv_heads == 0;
}

/* The tiled path's scratch shared between threads: kept between calls, like a thread's
 * (a call that finds it taken, by another engine's thread, allocates its own). */
static atomic_flag shared_busy = ATOMIC_FLAG_INIT;
static uint32_t *shared_buf = NULL;
static size_t shared_cap = 0;

static uint32_t *take_shared(size_t words, int *kept) {
    *kept = !atomic_flag_test_and_set_explicit(&shared_busy, memory_order_acquire);
    if (!*kept) return malloc(sizeof(uint32_t) * words);
    if (words > shared_cap) {
        free(shared_buf);
        shared_cap = words + words / 2;
        shared_buf = malloc(sizeof(uint32_t) * shared_cap);
        if (!shared_buf) shared_cap = 0;
    }
    if (!shared_buf) atomic_flag_clear_explicit(&shared_busy, memory_order_release);
    return shared_buf;
}

static void give_shared(uint32_t *buf, int kept) {
    if (kept)
        atomic_flag_clear_explicit(&shared_busy, memory_order_release);
    else
        free(buf);
}

/* A batch with a row over QTILE tokens: its keys loaded once per kv head (in parallel),
 * then its tiles and the other rows' whole items spread over the pool. */
static int run_tiled(const Args *a, int threads, attend_job *j) {
    const int64_t kvh = a->kv_heads, d = a->dim;
    int64_t n = 0, nload = 0;
    size_t words = 0;
    for (int64_t r = 0; r < a->rows; r++) {
        const int64_t q = a->qsl[r + 1] - a->qsl[r];
        n += kvh * (q > QTILE ? (q + QTILE - 1) / QTILE : 1);
    }
    int64_t *tiles = malloc(sizeof(int64_t) * 4 * (size_t)(n + a->rows * kvh));
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(a->rows * kvh));
    if (!tiles || !off) {
        free(tiles), free(off);
        return DW_ERR_MEMORY;
    }
    int64_t *loads = tiles + 4 * n; /* the first phase's items, same layout */
    int64_t i = 0;
    for (int64_t r = 0; r < a->rows; r++) {
        const int64_t q = a->qsl[r + 1] - a->qsl[r];
        const RowGeom geom = row_geom(a, r);
        for (int64_t g = 0; g < kvh; g++) {
            off[r * kvh + g] = -1;
            if (q <= QTILE) {
                int64_t *t = tiles + 4 * i++;
                t[0] = r, t[1] = g, t[2] = 0, t[3] = q;
                continue;
            }
            off[r * kvh + g] = (int64_t)words;
            words += (size_t)((d / 2 + 1) * geom.npad + (geom.npad / 2 + 1) * d);
            int64_t *l = loads + 4 * nload++;
            l[0] = r, l[1] = g, l[2] = 0, l[3] = q;
            for (int64_t t0 = 0; t0 < q; t0 += QTILE) {
                int64_t *t = tiles + 4 * i++;
                t[0] = r, t[1] = g, t[2] = t0, t[3] = t0 + QTILE < q ? t0 + QTILE : q;
            }
        }
    }
    int kept = 0;
    uint32_t *shared = take_shared(words, &kept);
    if (!shared) {
        free(tiles), free(off);
        return DW_ERR_MEMORY;
    }
    j->shared = shared, j->off = off;
    j->tiles = loads;
    dw_parallel_for_grain(threads, nload, 1, load_items, j);
    j->tiles = tiles;
    dw_parallel_for_grain(threads, n, 1, attend_items, j);
    give_shared(shared, kept);
    free(tiles), free(off);
    return j->failed ? DW_ERR_MEMORY : 0;
}

int dw_paged_attention_run(const Args *a, int threads) {
    write_kv(a);
    int64_t max_keys = 0, max_q = 0;
    for (int64_t r = 0; r < a->rows; r++) {
        const int64_t q = a->qsl[r + 1] - a->qsl[r];
        if (a->seq[r] > max_keys) max_keys = a->seq[r];
        if (q > max_q) max_q = q;
    }
    const int tiled = max_q > QTILE;
    const int64_t npad = (max_keys + LANES - 1) / LANES * LANES + 4 * LANES;
    /* query-heads one item computes at once: a whole row's, or a tile's */
    const int64_t nq = (tiled ? QTILE : max_q) * (a->heads / a->kv_heads), d = a->dim;
    const int64_t pairs = npad / 2 + 1;
    /* kt2 is over-allocated by a row: the score loop reads up to 4 blocks past a row's end */
    /* (q2 and sp: half a float a bf16 value as pairs, one as fp32 values: SRC_PER_PAIR) */
    const size_t need = (size_t)((d / 2 + 1) * npad + pairs * d + nq * d / 2 * SRC_PER_PAIR +
                                 nq * d + nq * npad + nq * (npad + 4) / 2 * SRC_PER_PAIR + 1);
    attend_job j = {a, need, npad, nq, pairs, NULL, NULL, NULL, 0};
    if (tiled) return run_tiled(a, threads, &j);
    /* one item per (row, kv group): a batch's rows split across the pool (one item at a
     * time: items differ in size by their context lengths) */
    dw_parallel_for_grain(threads, a->rows * a->kv_heads, 1, attend_items, &j);
    return j.failed ? DW_ERR_MEMORY : 0;
}

PyObject *dw_paged_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[10];
    int64_t n[13];
    if (dw_parse(args, nargs, 23, 10, p, n, "paged_attention") < 0) return NULL;
    Args a = {
        .q = p[0], .k = p[1], .v = p[2], .out = p[3], .kc = p[4], .vc = p[5],
        .slots = p[6], .qsl = p[7], .seq = p[8], .bt = p[9],
        .q_stride = n[0], .k_stride = n[1], .v_stride = n[2], .tokens = n[3], .width = n[4],
        .rows = n[5], .heads = n[6], .kv_heads = n[7], .dim = n[8], .block_size = n[9],
        .window = n[10], .scale = dw_f32_from_bits(n[11]),
    };
    if (!dw_attention_shape_ok(a.heads, a.kv_heads, a.dim)) {
        PyErr_SetString(PyExc_ValueError,
                        "head_dim must be a multiple of 16 (<= 512), heads a multiple of kv_heads");
        return NULL;
    }
    const int threads = dw_threads(n[12]);
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = dw_paged_attention_run(&a, threads);
    Py_END_ALLOW_THREADS if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
