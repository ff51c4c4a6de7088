/*
 * Paged causal attention over a bf16 KV cache, for CPU decode and verify.
 *
 * Why hand-written: the torch path (models/attention.py) gathers each row's context,
 * pads it and runs ~25 small ops per layer; for a decode or verify row that is ~180 us a
 * layer, most of a 135M model's non-GEMM time. This kernel reads the paged cache in place.
 *
 * Batch invariance by construction: every (token, head) result is computed by the same
 * instruction sequence whatever else is in the batch. Reductions have a fixed order that
 * depends only on that token's own context: dots run over head_dim sequentially per key
 * lane, the softmax denominator sums 16 key lanes in key order then a fixed tree, and
 * P @ V accumulates keys in order. No -ffast-math (no reassociation). All arithmetic is
 * on explicit 16-lane vectors (no auto-vectorised loops with scalar tails), so letting
 * the compiler fuse multiply-adds (-ffp-contract=fast) changes nothing between calls.
 *
 * Numerics follow transformers' eager bf16 attention: scores rounded to bf16 (a bf16
 * matmul's output), softmax in fp32, probabilities rounded to bf16, P @ V accumulated
 * in fp32 (one rounding at the end, where the torch path rounds per 256-key chunk).
 *
 * Layouts: q [T, H, D], k and v [T, KV, D] (token rows may be strided: views into the fused
 * qkv output), out [T, H, D]; caches [num_blocks, block_size, KV, D]; slot_mapping [T],
 * query_start_loc [B + 1], seq_lens [B], block_tables [B, W] int64. The kernel first
 * writes k and v at their slots; row r's query tokens are then the last
 * (qsl[r+1] - qsl[r]) of its seq_lens[r] positions.
 */
#include "kernels.h"

#include <stdlib.h>

typedef struct {
    const uint16_t *q, *k, *v; /* this step's [T, heads|kv_heads, dim], rows strided */
    uint16_t *out, *kc, *vc;
    const int64_t *slots, *qsl, *seq, *bt;
    int64_t q_stride, k_stride, v_stride; /* elements between consecutive tokens */
    int64_t tokens, width, rows, heads, kv_heads, dim, block_size, window;
    float scale;
} Args;

/* key positions the K/V walk requests ahead of the one it converts */
#define PREFETCH 24

static inline void prefetch_row(const uint16_t *p, int64_t bytes) {
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch((const char *)p + off, 0, 3);
}

/* The first key position a query at ``pos`` sees (sliding window, or 0). */
static inline int64_t first_key(const Args *a, int64_t pos) {
    return a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
}

/* Element offset of position ``pos``'s kv head ``g`` row in a cache, via the block table. */
static inline int64_t key_row(const Args *a, const int64_t *table, int64_t pos, int64_t g) {
    const int64_t bs = a->block_size;
    return ((table[pos / bs] * bs + pos % bs) * a->kv_heads + g) * a->dim;
}

/* Scratch for one (row, kv head), sized for the longest row and query. */
typedef struct {
    float *kt; /* [dim, npad] keys transposed to fp32 */
    float *vf; /* [npad, dim] values in fp32 */
    float *qf; /* [nq, dim] the queries in fp32 */
    float *s;  /* [nq, npad] scores, then bf16-rounded probabilities */
    float *o;  /* [nq, dim] fp32 output accumulators */
} Scratch;

/* query-heads that share key tiles in the score and P @ V loops */
#define QGROUP 4

/* Scores of G query-heads against four 16-key blocks starting at ``base`` (a column of
 * kt). Each (query-head, block) is one accumulator summing head dims in order, exactly as
 * when that query-head is alone; G only decides how many share each load of kt. */
static inline __attribute__((always_inline)) void score_group(const float *base,
                                                              const float *const qv[QGROUP],
                                                              const int G, int64_t d,
                                                              int64_t npad, v16f acc[QGROUP][4]) {
    for (int g = 0; g < G; g++)
        for (int u = 0; u < 4; u++) acc[g][u] = v16_splat(0.0f);
    for (int64_t c = 0; c < d; c++, base += npad) {
        v16f k0, k1, k2, k3; /* named, not an array: an array is spilled to the stack */
        memcpy(&k0, base, sizeof k0);
        memcpy(&k1, base + LANES, sizeof k1);
        memcpy(&k2, base + 2 * LANES, sizeof k2);
        memcpy(&k3, base + 3 * LANES, sizeof k3);
        for (int g = 0; g < G; g++) {
            const v16f qc = v16_splat(qv[g][c]);
            acc[g][0] = acc[g][0] + qc * k0, acc[g][1] = acc[g][1] + qc * k1;
            acc[g][2] = acc[g][2] + qc * k2, acc[g][3] = acc[g][3] + qc * k3;
        }
    }
}

static void score_tiles(const float *base, const float *qf, const int64_t *grp,
                        const int64_t *nbs, int ng, int64_t d, int64_t npad, float scale,
                        float *s, int64_t b) {
    const float *qv[QGROUP];
    for (int g = 0; g < ng; g++) qv[g] = qf + grp[g] * d;
    v16f acc[QGROUP][4];
    switch (ng) {
    case 1: score_group(base, qv, 1, d, npad, acc); break;
    case 2: score_group(base, qv, 2, d, npad, acc); break;
    case 3: score_group(base, qv, 3, d, npad, acc); break;
    default: score_group(base, qv, 4, d, npad, acc); break;
    }
    for (int g = 0; g < ng; g++)
        for (int u = 0; u < 4 && b + u < nbs[g]; u++) {
            const v16f x = v16_round_bf16(acc[g][u]) * v16_splat(scale);
            memcpy(s + grp[g] * npad + (b + u) * LANES, &x, sizeof x);
        }
}

/* o[q] += sum_j p[q][j] v[j] over keys jt .. ends[g]-1 of each query-head in the group, for
 * four 16-dim vectors starting at dim v0: keys in order, so each query-head's sums are
 * the same as alone; the group shares the V loads up to its shortest end. */
static inline __attribute__((always_inline)) void pv_group(const float *vbase, const float *s,
                                                           float *o, const int64_t *grp,
                                                           const int64_t *ends, const int G,
                                                           int64_t jt, int64_t d, int64_t npad,
                                                           int64_t v0) {
    v16f acc[QGROUP][4];
    const float *sq[QGROUP];
    int64_t common = ends[0];
    for (int g = 0; g < G; g++) {
        memcpy(acc[g], o + grp[g] * d + v0, sizeof acc[g]);
        sq[g] = s + grp[g] * npad;
        common = ends[g] < common ? ends[g] : common;
    }
    const float *vr = vbase + jt * d + v0;
    int64_t j = jt;
    for (; j < common; j++, vr += d) {
        v16f x0, x1, x2, x3;
        memcpy(&x0, vr, sizeof x0);
        memcpy(&x1, vr + LANES, sizeof x1);
        memcpy(&x2, vr + 2 * LANES, sizeof x2);
        memcpy(&x3, vr + 3 * LANES, sizeof x3);
        for (int g = 0; g < G; g++) {
            const v16f wj = v16_splat(sq[g][j]);
            acc[g][0] = acc[g][0] + wj * x0, acc[g][1] = acc[g][1] + wj * x1;
            acc[g][2] = acc[g][2] + wj * x2, acc[g][3] = acc[g][3] + wj * x3;
        }
    }
    for (int g = 0; g < G; g++) {
        const float *vg = vr;
        for (int64_t jg = j; jg < ends[g]; jg++, vg += d) {
            v16f x0, x1, x2, x3;
            memcpy(&x0, vg, sizeof x0);
            memcpy(&x1, vg + LANES, sizeof x1);
            memcpy(&x2, vg + 2 * LANES, sizeof x2);
            memcpy(&x3, vg + 3 * LANES, sizeof x3);
            const v16f wj = v16_splat(sq[g][jg]);
            acc[g][0] = acc[g][0] + wj * x0, acc[g][1] = acc[g][1] + wj * x1;
            acc[g][2] = acc[g][2] + wj * x2, acc[g][3] = acc[g][3] + wj * x3;
        }
        memcpy(o + grp[g] * d + v0, acc[g], sizeof acc[g]);
    }
}

static void pv_tiles(const float *vbase, const float *s, float *o, const int64_t *grp,
                     const int64_t *ends, int ng, int64_t jt, int64_t d, int64_t npad) {
    int64_t v0 = 0;
    for (; v0 + 4 * LANES <= d; v0 += 4 * LANES) {
        switch (ng) {
        case 1: pv_group(vbase, s, o, grp, ends, 1, jt, d, npad, v0); break;
        case 2: pv_group(vbase, s, o, grp, ends, 2, jt, d, npad, v0); break;
        case 3: pv_group(vbase, s, o, grp, ends, 3, jt, d, npad, v0); break;
        default: pv_group(vbase, s, o, grp, ends, 4, jt, d, npad, v0); break;
        }
    }
    for (; v0 < d; v0 += LANES) /* head_dim not a multiple of 64: one vector at a time */
        for (int g = 0; g < ng; g++) {
            v16f acc;
            memcpy(&acc, o + grp[g] * d + v0, sizeof acc);
            const float *vr = vbase + jt * d + v0, *sq = s + grp[g] * npad;
            for (int64_t j = jt; j < ends[g]; j++, vr += d) {
                v16f x;
                memcpy(&x, vr, sizeof x);
                acc = acc + v16_splat(sq[j]) * x;
            }
            memcpy(o + grp[g] * d + v0, &acc, sizeof acc);
        }
}

/* One row, one kv head: every query token x every query head sharing that kv head. The
 * loops run keys-outer so a tile of keys (or values) is reused by all queries while it is
 * in L1; each (query, head) still sums its keys in the same order as when alone. */
static void attend_group(const Args *a, int64_t row, int64_t g, const Scratch *w) {
    const int64_t d = a->dim, kvh = a->kv_heads, h = a->heads, rep = h / kvh;
    const int64_t q0 = a->qsl[row], qlen = a->qsl[row + 1] - q0, ctx = a->seq[row];
    if (qlen <= 0) return;
    const int64_t first_pos = ctx - qlen, nq = qlen * rep;
    /* keys any query of this row can see */
    const int64_t lo_all = first_key(a, first_pos);
    const int64_t nkeys = ctx - lo_all;
    const int64_t npad = (nkeys + LANES - 1) / LANES * LANES + 4 * LANES;
    const int64_t *table = a->bt + row * a->width;
    float *kt = w->kt, *vf = w->vf, *s = w->s, *qf = w->qf, *o = w->o;
    /* The cache is cold here (the layer's weights streamed through since it was last
     * read), and a dependent row-by-row walk over it stalls on every miss: request the
     * rows PREFETCH positions ahead so many misses are in flight at once. */
    const int64_t row_bytes = d * (int64_t)sizeof(uint16_t);
    for (int64_t j = 0; j < nkeys && j < PREFETCH; j++) {
        const int64_t off = key_row(a, table, lo_all + j, g);
        prefetch_row(a->kc + off, row_bytes), prefetch_row(a->vc + off, row_bytes);
    }
    const uint16_t *krow[LANES];
    int64_t j = 0;
    for (; j < nkeys; j++) {
        const int64_t off = key_row(a, table, lo_all + j, g);
        const uint16_t *vp = a->vc + off;
        if (j + PREFETCH < nkeys) {
            const int64_t ahead = key_row(a, table, lo_all + j + PREFETCH, g);
            prefetch_row(a->kc + ahead, row_bytes), prefetch_row(a->vc + ahead, row_bytes);
        }
        float *vr = vf + j * d;
        for (int64_t c = 0; c < d; c += LANES) {
            const v16f x = v16_load_bf16(vp + c);
            memcpy(vr + c, &x, sizeof x);
        }
        krow[j % LANES] = a->kc + off;
        if (j % LANES != LANES - 1) continue;
        /* 16 keys gathered: transpose them into kt 16 x 16 at a time */
        const int64_t j0 = j - (LANES - 1);
        for (int64_t c0 = 0; c0 < d; c0 += LANES) {
            v16f t[LANES];
            for (int l = 0; l < LANES; l++) t[l] = v16_load_bf16(krow[l] + c0);
            v16_transpose(t);
            for (int l = 0; l < LANES; l++) memcpy(kt + (c0 + l) * npad + j0, &t[l], sizeof t[l]);
        }
    }
    for (int64_t jt = nkeys / LANES * LANES; jt < nkeys; jt++) /* the last, partial 16 */
        for (int64_t c = 0; c < d; c++) kt[c * npad + jt] = bf16_to_f32(krow[jt % LANES][c]);
    for (int64_t c = 0; c < d; c++)
        for (int64_t j = nkeys; j < npad; j++) kt[c * npad + j] = 0.0f;
    /* query-head qi = i * rep + hh sees keys j0[qi] .. j0[qi] + n[qi] - 1 (relative to lo_all) */
    int64_t max_blocks = 0;
    for (int64_t qi = 0; qi < nq; qi++) {
        const int64_t t = q0 + qi / rep, head = g * rep + qi % rep;
        const uint16_t *qp = a->q + t * a->q_stride + head * d;
        for (int64_t c = 0; c < d; c++) qf[qi * d + c] = bf16_to_f32(qp[c]);
        const int64_t pos = first_pos + qi / rep;
        const int64_t nb = (pos - first_key(a, pos) + 1 + LANES - 1) / LANES;
        max_blocks = nb > max_blocks ? nb : max_blocks;
    }
#define QRANGE(qi, J0, N)                              \
    const int64_t pos_ = first_pos + (qi) / rep;       \
    const int64_t lo_ = first_key(a, pos_);            \
    const int64_t J0 = lo_ - lo_all, N = pos_ - lo_ + 1

    /* scores: four blocks of 16 keys per pass, all query-heads per tile; query-heads
     * that start at the same key share each tile load (up to QGROUP at a time) */
    for (int64_t b = 0; b < max_blocks; b += 4) {
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
            score_tiles(kt + j0 + b * LANES, qf, grp, nbs, ng, d, npad, a->scale, s, b);
            qi += ng;
        }
    }
    /* softmax per query-head: exact max, exp, 16-lane denominator, bf16 probabilities */
    for (int64_t qi = 0; qi < nq; qi++) {
        QRANGE(qi, j0, n);
        (void)j0;
        float *sq = s + qi * npad;
        const int64_t nb = (n + LANES - 1) / LANES;
        for (int64_t j = n; j < nb * LANES; j++) sq[j] = -INFINITY;
        v16f vm = v16_splat(-INFINITY); /* max is exact: any order gives the same */
        for (int64_t b = 0; b < nb; b++) {
            v16f x;
            memcpy(&x, sq + b * LANES, sizeof x);
            v16i gt = x > vm;
            vm = (v16f)((gt & (v16i)x) | (~gt & (v16i)vm));
        }
        float mm[LANES], m = -INFINITY;
        memcpy(mm, &vm, sizeof mm);
        for (int l = 0; l < LANES; l++) m = mm[l] > m ? mm[l] : m;
        v16f den = v16_splat(0.0f);
        for (int64_t b = 0; b < nb; b++) {
            v16f x;
            memcpy(&x, sq + b * LANES, sizeof x);
            v16f e = v16_exp_nonpos(x - v16_splat(m));
            v16f keep = (v16f)((v16i)(x > v16_splat(-INFINITY)) & (v16i)e);
            memcpy(sq + b * LANES, &keep, sizeof keep);
            den = den + keep;
        }
        const v16f denom = v16_splat(v16_sum(den));
        for (int64_t b = 0; b < nb; b++) {
            v16f e;
            memcpy(&e, sq + b * LANES, sizeof e);
            e = v16_round_bf16(e / denom);
            memcpy(sq + b * LANES, &e, sizeof e);
        }
    }
    /* P @ V: keys in order for every output dim, in tiles of 64 keys shared by all
     * query-heads; 64 dims (4 vectors) of accumulators at a time, for up to QGROUP
     * query-heads that start at the same key (each still ends at its own last key) */
    memset(o, 0, sizeof(float) * (size_t)(nq * d));
    const int64_t tile = 64, max_keys = max_blocks * LANES;
    for (int64_t jt = 0; jt < max_keys; jt += tile) {
        int64_t qi = 0;
        while (qi < nq) {
            QRANGE(qi, j0, n);
            if (jt >= n) { qi++; continue; }
            int64_t grp[QGROUP], ends[QGROUP];
            int ng = 0;
            for (int64_t qj = qi; qj < nq && ng < QGROUP; qj++) {
                QRANGE(qj, j0b, nb_);
                if (j0b != j0) break;
                ends[ng] = jt + tile < nb_ ? jt + tile : nb_;
                grp[ng++] = qj;
            }
            pv_tiles(vf + j0 * d, s, o, grp, ends, ng, jt, d, npad);
            qi += ng;
        }
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

static int run(const Args *a) {
    write_kv(a);
    int64_t max_keys = 0, max_q = 0;
    for (int64_t r = 0; r < a->rows; r++) {
        if (a->seq[r] > max_keys) max_keys = a->seq[r];
        if (a->qsl[r + 1] - a->qsl[r] > max_q) max_q = a->qsl[r + 1] - a->qsl[r];
    }
    const int64_t npad = (max_keys + LANES - 1) / LANES * LANES + 4 * LANES;
    const int64_t nq = max_q * (a->heads / a->kv_heads), d = a->dim;
    /* kt is over-allocated by a row: the score loop reads up to 4 blocks past a row's end */
    const size_t need = (size_t)((d + 1) * npad + npad * d + 2 * nq * d + nq * npad);
    float *buf = scratch_floats(need);
    if (!buf) return -1;
    Scratch w = {.kt = buf};
    w.vf = w.kt + (d + 1) * npad;
    w.qf = w.vf + npad * d;
    w.o = w.qf + nq * d;
    w.s = w.o + nq * d;
    for (int64_t r = 0; r < a->rows; r++)
        for (int64_t g = 0; g < a->kv_heads; g++) attend_group(a, r, g, &w);
    return 0;
}

PyObject *dw_paged_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[10];
    int64_t n[12];
    if (dw_parse(args, nargs, 22, 10, p, n, "paged_attention") < 0) return NULL;
    Args a = {
        .q = p[0], .k = p[1], .v = p[2], .out = p[3], .kc = p[4], .vc = p[5],
        .slots = p[6], .qsl = p[7], .seq = p[8], .bt = p[9],
        .q_stride = n[0], .k_stride = n[1], .v_stride = n[2], .tokens = n[3], .width = n[4],
        .rows = n[5], .heads = n[6], .kv_heads = n[7], .dim = n[8], .block_size = n[9],
        .window = n[10], .scale = dw_f32_from_bits(n[11]),
    };
    if (a.dim % LANES != 0 || a.dim > 512 || a.kv_heads <= 0 || a.heads % a.kv_heads != 0) {
        PyErr_SetString(PyExc_ValueError,
                        "head_dim must be a multiple of 16 (<= 512), heads a multiple of kv_heads");
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = run(&a);
    Py_END_ALLOW_THREADS if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
