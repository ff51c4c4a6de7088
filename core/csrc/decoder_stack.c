/*
 * A run of llama-family decoder layers in one C call, on GGUF-quantized weights.
 *
 * Why: a decode step of a 28-layer model made ~10 Python -> C calls a layer (two norms,
 * four GEMMs, rope, attention, silu), each with its wrapper's checks and a fresh torch
 * output: ~100 us a layer of Python around ~1 ms of GEMM, ~8% of a 1.5B Q4_K_M decode
 * step. Here the layer loop is C: one call runs layers [first, last) and the Python
 * side only checks the step once (models/kernels.py, decoder_layers).
 *
 * Same bits as the per-op path: each step below is the very function the corresponding
 * Python entry point runs (kernels.h, "GIL-free bodies"), with the arguments
 * models/llama.py's DecoderLayer._run_native passes, in its order:
 *   x = rms_norm(h) (the first layer of the model) or (h, x) = add_rms_norm(h, delta)
 *   qkv = linear_quant(x); rope(q|k of qkv); attn = paged_attention(qkv)
 *   (h, x) = add_rms_norm(h, linear_quant(attn)); delta = linear_quant(silu_mul(linear_quant(x)))
 * add_rms_norm writes h + delta into delta's memory, as the Python path does; so the
 * residual alternates between the caller's two buffers: after the call ``out_h`` holds
 * h and ``out_d`` holds the last layer's delta (not added: the caller's next norm adds it).
 * Nothing depends on the batch beyond what those kernels already guarantee.
 *
 * Layout of ``plan``: int64 [layers, DW_PLAN_FIELDS] (the enum below: weight and norm
 * addresses, segment tables, window), built and checked once at load by the Python side;
 * ``caches``: int64 [layers, 2] K and V cache addresses (each layer [blocks, block_size,
 * kv_heads, head_dim] bf16). Intermediates live in a per-thread scratch buffer that is
 * grown and kept.
 */
#include "kernels.h"
#include "quant.h"
#include "threadpool.h"

#include <stdlib.h>

enum {
    P_INPUT_NORM, P_POST_NORM,
    P_QKV, P_QKV_NSEG, P_QKV_BIAS,
    P_O, P_O_NSEG, P_O_BIAS,
    P_GATE_UP, P_GATE_UP_NSEG, P_GATE_UP_BIAS,
    P_DOWN, P_DOWN_NSEG, P_DOWN_BIAS,
    P_WINDOW,
    DW_PLAN_FIELDS
};

/* Scratch kept per thread up to this many bf16 values (8 MB: a decode or verify step of a
 * 1.5B model needs ~60 KB a token); a longer prefill chunk takes its own and frees it,
 * so one long prompt does not stay resident for the life of the process. */
#define KEEP_SCRATCH (4 << 20)

/* The scratch for a call's intermediates (bf16): the kept per-thread buffer, grown as
 * needed, or (past KEEP_SCRATCH) a fresh one the caller frees (*owned set). */
static uint16_t *scratch(size_t n, uint16_t **owned) {
    static _Thread_local uint16_t *buf = NULL;
    static _Thread_local size_t cap = 0;
    *owned = NULL;
    if (n > KEEP_SCRATCH) return *owned = malloc(n * sizeof(uint16_t));
    if (n > cap) {
        free(buf);
        buf = malloc(n * sizeof(uint16_t));
        cap = buf ? n : 0;
    }
    return buf;
}

typedef struct {
    const int64_t *plan, *caches;
    const uint16_t *h;
    uint16_t *delta; /* NULL: the model's first layer (a plain norm) */
    uint16_t *out_h, *out_d;
    const uint16_t *cos, *sin;
    dw_attention_args attn; /* the step's fields; q/k/v, out and the caches set per layer */
    int64_t first, last, tokens, hidden, inter, threads;
    float eps;
    int path;
} stack;

/* One GEMM of the layer: y[T, n] = x[T, k] @ W^T (+ bias), W at plan fields f, f+1, f+2. */
static int gemm(const stack *s, const int64_t *lp, int f, const uint16_t *x, int64_t k,
                uint16_t *y, int64_t n, const char **err) {
    const dw_gemm_call c = {.x = x, .table = (const int64_t *)(intptr_t)lp[f],
                            .bias = (const uint16_t *)(intptr_t)lp[f + 2], .y = y,
                            .nseg = lp[f + 1], .m = s->tokens, .k = k, .n = n, .x_stride = k,
                            .y_stride = n, .y_f32 = 0, .threads = s->threads, .path = s->path};
    return dw_linear_quant_run(&c, err);
}

static int layers(const stack *s, uint16_t *x, const char **err);

static int run_layers(const stack *s, const char **err) {
    const int64_t t = s->tokens, width = (s->attn.heads + 2 * s->attn.kv_heads) * s->attn.dim;
    uint16_t *owned;
    uint16_t *x = scratch((size_t)(t * (s->hidden + width + s->attn.heads * s->attn.dim +
                                        3 * s->inter)), &owned);
    if (!x) return DW_ERR_MEMORY;
    const int rc = layers(s, x, err);
    free(owned);
    return rc;
}

/* The layers on scratch x (sized by run_layers). */
static int layers(const stack *s, uint16_t *x, const char **err) {
    const int64_t t = s->tokens, hid = s->hidden, inter = s->inter;
    const int64_t heads = s->attn.heads, kvh = s->attn.kv_heads, d = s->attn.dim;
    const int64_t width = (heads + 2 * kvh) * d, qw = heads * d;
    uint16_t *qkv = x + t * hid, *attn = qkv + t * width, *gu = attn + t * qw, *act = gu + t * 2 * inter;
    const uint16_t *h = s->h;
    uint16_t *delta = s->delta;
    int rc;
    for (int64_t i = s->first; i < s->last; i++) {
        const int64_t *lp = s->plan + i * DW_PLAN_FIELDS;
        const uint16_t *in_norm = (const uint16_t *)(intptr_t)lp[P_INPUT_NORM];
        if (delta == NULL) {
            dw_rms_norm_rows(h, in_norm, x, t, hid, s->eps);
        } else {
            dw_add_rms_norm_rows(h, delta, in_norm, x, t, hid, s->eps);
            h = delta;
        }
        if ((rc = gemm(s, lp, P_QKV, x, hid, qkv, width, err))) return rc;
        dw_rope_rows(qkv, s->cos, s->sin, NULL, t, heads + kvh, d, width);
        dw_attention_args a = s->attn;
        a.q = qkv, a.k = qkv + qw, a.v = qkv + qw + kvh * d;
        a.q_stride = a.k_stride = a.v_stride = width;
        a.out = attn;
        a.kc = (uint16_t *)(intptr_t)s->caches[2 * i];
        a.vc = (uint16_t *)(intptr_t)s->caches[2 * i + 1];
        a.window = lp[P_WINDOW];
        if ((rc = dw_paged_attention_run(&a, (int)s->threads))) return rc;
        /* the o projection goes to out_h, the down projection to out_d: never the buffer
         * h is in (h is the caller's input, or the buffer the last add wrote) */
        if ((rc = gemm(s, lp, P_O, attn, qw, s->out_h, hid, err))) return rc;
        dw_add_rms_norm_rows(h, s->out_h, (const uint16_t *)(intptr_t)lp[P_POST_NORM], x, t, hid,
                             s->eps);
        h = s->out_h;
        if ((rc = gemm(s, lp, P_GATE_UP, x, hid, gu, 2 * inter, err))) return rc;
        dw_silu_mul_run(gu, act, t, inter, s->threads);
        if ((rc = gemm(s, lp, P_DOWN, act, inter, s->out_d, hid, err))) return rc;
        delta = s->out_d;
    }
    return 0;
}

/* decoder_layers(plan, caches, h, delta_or_0, out_h, out_d, cos, sin, slot_mapping,
 * query_start_loc, seq_lens, block_tables, first, last, tokens, width, rows, hidden, heads,
 * kv_heads, head_dim, inter, block_size, eps_bits, scale_bits, threads, path): layers
 * [first, last) on h [tokens, hidden] (plus the previous layer's delta), leaving h in out_h
 * and the last delta in out_d. The Python side checked every pointer and size. */
PyObject *dw_decoder_layers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[12];
    int64_t n[15];
    if (dw_parse(args, nargs, 27, 12, p, n, "decoder_layers") < 0) return NULL;
    stack s = {
        .plan = p[0], .caches = p[1], .h = p[2], .delta = p[3], .out_h = p[4], .out_d = p[5],
        .cos = p[6], .sin = p[7],
        .attn = {.slots = p[8], .qsl = p[9], .seq = p[10], .bt = p[11], .tokens = n[2],
                 .width = n[3], .rows = n[4], .heads = n[6], .kv_heads = n[7], .dim = n[8],
                 .block_size = n[10], .scale = dw_f32_from_bits(n[12])},
        .first = n[0], .last = n[1], .tokens = n[2], .hidden = n[5], .inter = n[9],
        .eps = dw_f32_from_bits(n[11]), .threads = dw_threads(n[13]),
        .path = (int)n[14],
    };
    if (!dw_attention_shape_ok(s.attn.heads, s.attn.kv_heads, s.attn.dim) || s.attn.dim > 1024 ||
        s.attn.dim % 2 || s.first < 0 || s.last < s.first || s.tokens < 1 || s.hidden < 1 ||
        s.inter < 1 || s.attn.block_size < 1) {
        PyErr_SetString(PyExc_ValueError, "decoder_layers: bad sizes");
        return NULL;
    }
    const char *err = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = run_layers(&s, &err);
    Py_END_ALLOW_THREADS
    if (rc != 0) return dw_raise(rc, err);
    Py_RETURN_NONE;
}
