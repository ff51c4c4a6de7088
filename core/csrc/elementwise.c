/*
 * The per-token elementwise pieces of a llama decoder layer, in bf16.
 *
 * Why hand-written: each is 3-8 torch ops on a few KB (a decode step's [T, 576]), so
 * torch's per-op overhead is the whole cost (~12-18 us a call here); one C call is ~1 us.
 * They reproduce transformers' rounding points (every bf16 op rounds its result), so
 * rope is bitwise the torch path, and rms_norm and silu differ only where fp32 sums or
 * exp round differently before the bf16 rounding. Rows are independent: batch-invariant.
 */
#include "kernels.h"
#include "threadpool.h"

/* 1 / sqrt(mean(x^2) + eps) of one bf16 row, summed in fp32: 16 running sums and their
 * fixed tree (vec.h dw_sum16), then the tail: the one sum of squares both norms below
 * share, so they scale rows alike. */
static inline float row_inv_rms(const uint16_t *xr, int64_t dim, float eps) {
    dw_sum16 acc = dw_sum16_zero();
    int64_t c = 0;
    for (; c + 16 <= dim; c += 16) dw_sum16_add_squares_bf16(&acc, xr + c);
    float ss = dw_sum16_total(&acc);
    for (; c < dim; c++) ss += bf16_to_f32(xr[c]) * bf16_to_f32(xr[c]);
    return 1.0f / sqrtf(ss / (float)dim + eps);
}

/* transformers' RMSNorm: y = bf16(x * rsqrt(mean(x^2) + eps)); out = bf16(w * y). */
void dw_rms_norm_rows(const uint16_t *x, const uint16_t *w, uint16_t *out, int64_t rows,
                      int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * dim;
        uint16_t *orow = out + r * dim;
        const float inv = row_inv_rms(xr, dim, eps);
        const vewf vinv = EW(splat)(inv);
        int64_t c = 0;
        for (; c + EW_LANES <= dim; c += EW_LANES) {
            vewf y = EW(round_bf16)(EW(load_bf16)(xr + c) * vinv);
            EW(store_bf16)(orow + c, EW(load_bf16)(w + c) * y);
        }
        for (; c < dim; c++) {
            float y = bf16_to_f32(f32_to_bf16(bf16_to_f32(xr[c]) * inv));
            orow[c] = f32_to_bf16(bf16_to_f32(w[c]) * y);
        }
    }
}

/* The zero-centred RMSNorm of the GDN hybrids (Qwen3-Next / Qwen3.5, transformers'
 * Qwen3NextRMSNorm): out = bf16(x * rsqrt(mean(x^2) + eps) * (1 + w)), all in fp32 and
 * rounded once, where the llama norm rounds x-hat before the weight. */
static void rms_norm_zc_rows(const uint16_t *x, const uint16_t *w, uint16_t *out, int64_t rows,
                             int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * dim;
        uint16_t *orow = out + r * dim;
        const float inv = row_inv_rms(xr, dim, eps);
        const vewf vinv = EW(splat)(inv), one = EW(splat)(1.0f);
        int64_t c = 0;
        for (; c + EW_LANES <= dim; c += EW_LANES)
            EW(store_bf16)(orow + c, (EW(load_bf16)(xr + c) * vinv) * (one + EW(load_bf16)(w + c)));
        for (; c < dim; c++)
            orow[c] = f32_to_bf16((bf16_to_f32(xr[c]) * inv) * (1.0f + bf16_to_f32(w[c])));
    }
}

PyObject *dw_rms_norm_zc(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[3];
    int64_t n[3];
    if (dw_parse(args, nargs, 6, 3, p, n, "rms_norm_zc") < 0) return NULL;
    const float eps = dw_f32_from_bits(n[2]);
    Py_BEGIN_ALLOW_THREADS rms_norm_zc_rows(p[0], p[1], p[2], n[0], n[1], eps);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* The residual add before a norm: delta = bf16(h + delta) in place (the new residual
 * stream), then out = rms_norm(delta). One pass instead of torch's add + norm. */
void dw_add_rms_norm_rows(const uint16_t *h, uint16_t *delta, const uint16_t *w, uint16_t *out,
                          int64_t rows, int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *hr = h + r * dim;
        uint16_t *dr = delta + r * dim;
        int64_t c = 0;
        for (; c + EW_LANES <= dim; c += EW_LANES)
            EW(store_bf16)(dr + c, EW(load_bf16)(hr + c) + EW(load_bf16)(dr + c));
        for (; c < dim; c++) dr[c] = f32_to_bf16(bf16_to_f32(hr[c]) + bf16_to_f32(dr[c]));
    }
    dw_rms_norm_rows(delta, w, out, rows, dim, eps);
}

PyObject *dw_add_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[4];
    int64_t n[3];
    if (dw_parse(args, nargs, 7, 4, p, n, "add_rms_norm") < 0) return NULL;
    const float eps = dw_f32_from_bits(n[2]);
    Py_BEGIN_ALLOW_THREADS dw_add_rms_norm_rows(p[0], p[1], p[2], p[3], n[0], n[1], eps);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

PyObject *dw_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[3];
    int64_t n[3];
    if (dw_parse(args, nargs, 6, 3, p, n, "rms_norm") < 0) return NULL;
    const float eps = dw_f32_from_bits(n[2]);
    Py_BEGIN_ALLOW_THREADS dw_rms_norm_rows(p[0], p[1], p[2], n[0], n[1], eps);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* out = bf16(bf16(silu(gate)) * up), gate_up = [gate | up] per row. silu(x) uses
 * exp(-|x|) so the exponent never overflows: x / (1 + e) for x >= 0, x e / (1 + e) else. */
typedef struct {
    const uint16_t *gu;
    uint16_t *out;
    int64_t inter;
} silu_job;

static void silu_mul_rows(void *ctx, int64_t begin, int64_t end) {
    const silu_job *j = ctx;
    const uint16_t *gu = j->gu;
    uint16_t *out = j->out;
    const int64_t inter = j->inter;
    for (int64_t r = begin; r < end; r++) {
        const uint16_t *g = gu + r * 2 * inter, *u = g + inter;
        uint16_t *o = out + r * inter;
        int64_t c = 0;
        for (; c + EW_LANES <= inter; c += EW_LANES) {
            vewf x = EW(load_bf16)(g + c);
            vewi neg = x < EW(splat)(0.0f);
            vewf ax = (vewf)((vewi)x & ~(vewi)EW(splat)(-0.0f)); /* |x| */
            vewf e = EW(exp_nonpos)(-ax);
            e = (vewf)((vewi)e & ~(ax > EW(splat)(87.0f))); /* exp underflows to 0 */
            vewf num = (vewf)((neg & (vewi)(x * e)) | (~neg & (vewi)x));
            vewf s = EW(round_bf16)(num / (EW(splat)(1.0f) + e));
            EW(store_bf16)(o + c, s * EW(load_bf16)(u + c));
        }
        for (; c < inter; c++) {
            float x = bf16_to_f32(g[c]);
            float e = expf(-fabsf(x));
            float s = bf16_to_f32(f32_to_bf16((x < 0 ? x * e : x) / (1.0f + e)));
            o[c] = f32_to_bf16(s * bf16_to_f32(u[c]));
        }
    }
}

void dw_silu_mul_run(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t inter,
                     int64_t threads) {
    silu_job j = {gate_up, out, inter};
    /* rows split across the pool once there is enough work to pay the hand-off (each row
     * alone is the same instructions, so the split never changes a bit): a prefill, or a
     * batched decode of wide rows (8 rows of a 1.5B model's 8960: 5% of a step's CPU
     * when this ran on one thread) */
    const int nt = rows >= 2 && rows * inter >= 32768 ? dw_threads(threads) : 1;
    dw_parallel_for(nt, rows, silu_mul_rows, &j);
}

PyObject *dw_silu_mul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[2];
    int64_t n[3];
    if (dw_parse(args, nargs, 5, 2, p, n, "silu_mul") < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS dw_silu_mul_run(p[0], p[1], n[0], n[1], n[2]);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* In place: x = bf16(bf16(x * cos) + bf16(swap_halves(x) * sin_signed)), the tables
 * [positions, head_dim] indexed by each token's position (pos NULL: row t is token t's);
 * x rows may be strided (the q|k part of a fused qkv output). */
void dw_rope_rows(uint16_t *x, const uint16_t *cos, const uint16_t *sin, const int64_t *pos,
                  int64_t tokens, int64_t heads, int64_t d, int64_t stride) {
    const int64_t half = d / 2;
    float buf[1024];
    for (int64_t t = 0; t < tokens; t++) {
        const int64_t row = pos ? pos[t] : t;
        const uint16_t *ct = cos + row * d, *st = sin + row * d;
        for (int64_t h = 0; h < heads; h++) {
            uint16_t *xh = x + t * stride + h * d;
            for (int64_t c = 0; c < d; c++) buf[c] = bf16_to_f32(xh[c]);
            for (int64_t c = 0; c < d; c++) {
                const float sw = buf[c < half ? c + half : c - half];
                const float a = bf16_to_f32(f32_to_bf16(buf[c] * bf16_to_f32(ct[c])));
                const float b = bf16_to_f32(f32_to_bf16(sw * bf16_to_f32(st[c])));
                xh[c] = f32_to_bf16(a + b);
            }
        }
    }
}

PyObject *dw_rope(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[4];
    int64_t n[4];
    if (dw_parse(args, nargs, 8, 4, p, n, "rope") < 0) return NULL;
    if (n[2] > 1024 || n[2] % 2) {
        PyErr_SetString(PyExc_ValueError, "rope: head_dim must be even and <= 1024");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS dw_rope_rows(p[0], p[1], p[2], p[3], n[0], n[1], n[2], n[3]);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* torch.argmax over each row of fp32 [rows, cols]: the first index of the maximum, or of
 * the first NaN when there is one (torch ranks NaN above everything). EW_LANES lanes keep
 * a running max and its first index; lanes then merge by (value, lower index). */
static int64_t argmax_row(const float *x, int64_t n) {
    vewf best = EW(splat)(-INFINITY);
    vewi idx, best_idx, nan;
    for (int l = 0; l < EW_LANES; l++) idx[l] = l;
    best_idx = idx;
    nan = idx - idx;
    int64_t c = 0;
    for (; c + EW_LANES <= n; c += EW_LANES) {
        vewf v;
        memcpy(&v, x + c, sizeof v);
        const vewi gt = v > best;
        best = (vewf)((gt & (vewi)v) | (~gt & (vewi)best));
        best_idx = (gt & idx) | (~gt & best_idx);
        nan |= v != v;
        idx += EW_LANES;
    }
    /* a lane that never beat -inf holds only -inf, and its index l is its first: correct */
    float m = best[0];
    int64_t at = best_idx[0];
    for (int l = 1; l < EW_LANES; l++)
        if (best[l] > m || (best[l] == m && best_idx[l] < at)) m = best[l], at = best_idx[l];
    if (c == 0 && n > 0) m = x[0], at = 0, c = 1; /* fewer than EW_LANES columns */
    int any_nan = 0;
    for (int l = 0; l < EW_LANES; l++) any_nan |= nan[l] != 0;
    for (; c < n; c++) {
        any_nan |= x[c] != x[c];
        if (x[c] > m) m = x[c], at = c;
    }
    if (any_nan)
        for (int64_t i = 0; i < n; i++)
            if (x[i] != x[i]) return i;
    return at;
}

PyObject *dw_argmax_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[2];
    int64_t n[2];
    if (dw_parse(args, nargs, 4, 2, p, n, "argmax_f32") < 0) return NULL;
    const float *x = p[0];
    int64_t *out = p[1];
    for (int64_t r = 0; r < n[0]; r++) out[r] = argmax_row(x + r * n[1], n[1]);
    Py_RETURN_NONE;
}
