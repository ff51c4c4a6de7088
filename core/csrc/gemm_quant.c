/*
 * y = x @ W^T (+ b) with W in a GGUF quantized type, kept quantized: the decoder's
 * projections and the LM head of GGUF models.
 *
 * Why: a decode or verify step reads every weight once, so its time is bytes streamed.
 * Q4_K_M is ~4.8 bits per weight where a bf16 copy is 16; the stored bytes are the stream.
 *
 * Layout and arithmetic: quant.h (tiles of eight output rows, int8 activation blocks of
 * 32, the per-chunk contract). This file holds the entry point, the row and tile loops,
 * and the scalar kernel (the portable path and the reference the SIMD kernels are tested
 * bitwise against); gemm_quant_avx2.c holds the AVX2 kernel, gemm_quant_avx512.c the
 * AVX512-VNNI one (dw_tile_kernel_for, below, chooses).
 *
 * Activations: each row is quantized to int8 per block of 32 with an fp32 scale (as
 * llama.cpp does, Q8_0-style but with an fp32 scale), and for Q4_K and Q6_K per block
 * of 256 (llama.cpp's Q8_K), once per call, each scheme only if a segment takes it,
 * shared by every weight segment of the call (a fused q|k|v may mix types).
 *
 * NVFP4 segments (type DW_NVFP4, gemm_nvfp4*.c) take the row widened to fp32 instead
 * (W4A16), computed once per call beside the int8 schemes a call's other parts need.
 *
 * Batch invariance by construction: a row's int8 blocks depend only on that row; each
 * output is one fp32 accumulator taking the chunks of K in order (quant.h); rows are
 * grouped up to five (eight on the VNNI two-tile kernel) at a time only to share the
 * weight decode, never the arithmetic; threads split whole tiles. So an output's bits
 * never depend on the row count, the row's position or the thread count.
 */
#include "kernels.h"
#include "quant_codes.h"
#include "threadpool.h"

#include <stdio.h>
#include <stdlib.h>

/* The scalar kernel of the super-block types (Q4_K, Q6_K: dw_act256 activations), the
 * contract of quant.h one output and one row at a time. */
static void tile_scalar256(int qtype, const uint8_t *tile, int64_t chunks,
                           const dw_act256 *const *x, int rows, float (*out)[DW_TILE]) {
    const int tile_block = DW_TILE * (qtype == DW_Q4_K ? Q4_K_BYTES : Q6_K_BYTES);
    const int64_t supers = chunks / (DW_SUPER / DW_CHUNK);
    for (int r = 0; r < rows; r++) {
        for (int n = 0; n < DW_TILE; n++) {
            float acc = 0.0f;
            for (int64_t sb = 0; sb < supers; sb++) {
                const uint8_t *blk = tile + sb * tile_block;
                const dw_act256 *a = x[r] + sb;
                int32_t isum = 0, imin = 0;
                for (int i = 0; i < DW_SUPER / 16; i++) { /* 16-k sub-blocks */
                    const int c = i / 2;
                    int32_t dot = 0;
                    for (int kk = 16 * (i % 2); kk < 16 * (i % 2) + 16; kk++)
                        dot += dw_quant_code(qtype, blk, c, kk / 4, n, kk % 4) * a->q[32 * c + kk];
                    if (qtype == DW_Q4_K) {
                        isum += dw_k_scale_min(blk, Q4_K_SC, n, c, 0) * dot;
                        if (i % 2) imin += dw_k_scale_min(blk, Q4_K_SC, n, c, 1) * a->b32[c];
                    } else {
                        isum += (int8_t)dw_tile_byte(blk, Q6_K_SC, n, i) * (dot - 32 * a->b16[i]);
                    }
                }
                if (qtype == DW_Q4_K) {
                    acc = fmaf((float)isum, dw_tile_half(blk, Q4_K_D, n) * a->d, acc);
                    acc = fmaf((float)imin, -(dw_tile_half(blk, Q4_K_DMIN, n) * a->d), acc);
                } else {
                    acc = fmaf((float)isum, dw_tile_half(blk, Q6_K_D, n) * a->d, acc);
                }
            }
            out[r][n] = acc;
        }
    }
}

/* The scalar kernel: the contract of quant.h, one output and one row at a time. */
static void tile_scalar(int qtype, const uint8_t *tile, int64_t chunks, const void *const *xv,
                        int rows, float (*out)[DW_TILE]) {
    if (dw_qtype_act_block(qtype) == DW_SUPER) {
        tile_scalar256(qtype, tile, chunks, (const dw_act256 *const *)xv, rows, out);
        return;
    }
    const dw_act *const *x = (const dw_act *const *)xv;
    dw_qtype_info info;
    dw_qtype_info_of(qtype, &info);
    const int cpb = info.block_k / DW_CHUNK, tile_block = DW_TILE * info.block_bytes;
    for (int r = 0; r < rows; r++) {
        for (int n = 0; n < DW_TILE; n++) {
            float acc = 0.0f;
            for (int64_t ci = 0; ci < chunks; ci++) {
                const uint8_t *blk = tile + (ci / cpb) * tile_block;
                const int c = (int)(ci % cpb);
                const dw_chunk_scales cs = dw_chunk_scales_of(qtype, blk, c, n);
                const dw_act *a = x[r] + ci;
                int32_t dot[2] = {0, 0};
                for (int kk = 0; kk < DW_CHUNK; kk++)
                    dot[kk / 16] += dw_quant_code(qtype, blk, c, kk / 4, n, kk % 4) * a->q[kk];
                const int32_t isum = cs.p[0] * dot[0] + cs.p[1] * dot[1];
                acc = fmaf((float)isum, cs.d * a->d, acc);
                if (cs.n_min == 1) acc = fmaf(cs.m[0], a->s[0], acc);
                if (cs.n_min == 2) {
                    acc = fmaf(cs.m[0], a->s[1], acc);
                    acc = fmaf(cs.m[1], a->s[2], acc);
                }
            }
            out[r][n] = acc;
        }
    }
}

#define SCALAR_KERNEL(T)                                                                          \
    static void tile_scalar_##T(const uint8_t *t, int64_t c, const void *const *x, int rows,      \
                                float (*out)[DW_TILE]) {                                          \
        tile_scalar(T, t, c, x, rows, out);                                                       \
    }
SCALAR_KERNEL(DW_Q4_0)
SCALAR_KERNEL(DW_Q4_1)
SCALAR_KERNEL(DW_Q5_0)
SCALAR_KERNEL(DW_Q5_1)
SCALAR_KERNEL(DW_Q8_0)
SCALAR_KERNEL(DW_Q2_K)
SCALAR_KERNEL(DW_Q3_K)
SCALAR_KERNEL(DW_Q4_K)
SCALAR_KERNEL(DW_Q5_K)
SCALAR_KERNEL(DW_Q6_K)

dw_tile_fn dw_tile_kernel_scalar(int qtype) {
    switch (qtype) {
    case DW_Q4_0: return tile_scalar_DW_Q4_0;
    case DW_Q4_1: return tile_scalar_DW_Q4_1;
    case DW_Q5_0: return tile_scalar_DW_Q5_0;
    case DW_Q5_1: return tile_scalar_DW_Q5_1;
    case DW_Q8_0: return tile_scalar_DW_Q8_0;
    case DW_Q2_K: return tile_scalar_DW_Q2_K;
    case DW_Q3_K: return tile_scalar_DW_Q3_K;
    case DW_Q4_K: return tile_scalar_DW_Q4_K;
    case DW_Q5_K: return tile_scalar_DW_Q5_K;
    case DW_Q6_K: return tile_scalar_DW_Q6_K;
    default: return NULL;
    }
}

/* The one place that chooses a tile kernel (quant.h, DW_PATH_*). */
dw_tile_fn dw_tile_kernel_for(int qtype, int path, const char **name, dw_tile2_fn *pair) {
    if (pair) *pair = NULL;
    if (path == DW_PATH_AUTO) {
        const char *env = getenv("DRAFTWISE_QUANT_SIMD");
        if (!env || !*env || !strcmp(env, "auto")) path = -1;
        else if (!strcmp(env, "avx2")) path = DW_PATH_AVX2;
        else if (!strcmp(env, "scalar")) path = DW_PATH_SCALAR;
        else {
            *name = "DRAFTWISE_QUANT_SIMD must be auto, avx2 or scalar (unset: the best the CPU has)";
            return NULL;
        }
    }
    dw_tile_fn fn = NULL;
    switch (path) {
    case -1: /* the best this CPU has for the type */
        if ((fn = dw_tile_kernel_avx512(qtype, pair))) *name = "avx512vnni";
        else if ((fn = dw_tile_kernel_avx2(qtype))) *name = "avx2";
        else fn = dw_tile_kernel_scalar(qtype), *name = "scalar";
        break;
    case DW_PATH_SCALAR: fn = dw_tile_kernel_scalar(qtype), *name = "scalar"; break;
    case DW_PATH_AVX2:
        fn = dw_tile_kernel_avx2(qtype), *name = "avx2";
        if (!fn) *name = "the AVX2 quantized GEMM needs a CPU with avx2, fma and f16c";
        break;
    case DW_PATH_AVX512:
        fn = dw_tile_kernel_avx512(qtype, pair), *name = "avx512vnni";
        if (!fn)
            *name = dw_cpu_has_avx512vnni()
                        ? "the AVX512-VNNI quantized GEMM does not cover this type (it runs AVX2)"
                        : "the AVX512-VNNI quantized GEMM needs a CPU with avx512f/bw/vl/vnni";
        break;
    default: *name = "linear_quant: unknown kernel path"; break;
    }
    return fn;
}

/* One weight segment: output columns [start, start + rows) of y, in one type. */
typedef struct {
    dw_tile_fn fn;
    dw_tile2_fn fn2; /* two adjacent tiles at once, where the kernel has it (else NULL) */
    const uint8_t *data;
    int64_t start, rows, tiles, tile_bytes, first_tile; /* first_tile: global tile index */
    int act; /* the activations it takes: ACT32 (dw_act), ACT256 (dw_act256), ACT_F32 */
} segment;

enum { ACT32, ACT256, ACT_F32 };

#define MAX_SEGMENTS 8
/* Rows from which a call takes the two-tile kernel where the type has one. One row (a
 * decode) is bound by the weight stream, and one tile at a time reads a thread's tiles
 * as ONE sequential stream (prefetched far ahead into L2: quant_layout.h), where two
 * adjacent tiles at once read two streams a tile apart: measured on one thread, one row,
 * Q4_K 17920 x 1536, ~38 GB/s one tile at a time against ~26 for pairs. With more rows
 * the kernel's arithmetic becomes the limit and the pair's shared decode wins, but later
 * than first thought, and for Q6_K not at all: benchmarks/quant_gemm.py's interleaved
 * pair-on/off runs (AMD EPYC, AVX512-VNNI, one thread, 1536 x 8960, thread CPU time):
 * pairs cost Q6_K 2.8x at 2 rows, 2.2x at 5, 1.7x at 8, 1.2x at 16 and only break even
 * at 32-64; Q4_K 1.4x at 2 rows, 1.05x at 5, and win from 6 (0.91x at 6 and 8, 0.88x at
 * 32); the 32-blocks types 1.2x at 2 rows, even at 4 and win from 5 (0.75-0.85x). A
 * verify row of k + 1 = 2..5 tokens is exactly the range that paid the most: on the
 * Qwen2.5-Coder-1.5B Q4_K_M target (its LM head and half its ffn_down are Q6_K) a 2-token
 * forward cost 2.7x a decode on one thread, which made every draft a loss. The bits are
 * the same either way (batch invariance, above), so this is a speed choice only. */
static int64_t pair_min_rows(int qtype) {
    switch (qtype) {
    case DW_Q6_K: return INT64_MAX; /* never: the 256-bit body wins or ties at every size */
    case DW_Q4_K: return 6;
    default: return 5;
    }
}
/* Rows per pass over the tiles: their int8 blocks (K / 32 x 48 bytes each) stay in L2 */
#define ROW_BLOCK 32

typedef struct {
    segment seg[MAX_SEGMENTS];
    int nseg;
    const dw_act *act;       /* [m][chunks], when a segment takes them */
    const dw_act256 *act256; /* [m][chunks / 8], when a segment takes them */
    const float *actf;       /* [m][k] widened bf16 (NVFP4), when a segment takes them */
    const uint16_t *bias;
    void *y;
    int64_t m, chunks, y_stride, y_f32;
} job;

static void run_tiles(void *ctx, int64_t begin, int64_t end) {
    const job *j = ctx;
    if (j->m == 1 && begin < end) {
        /* a range starts cold: ask for its first DW_PREFETCH_AHEAD bytes at once, so the
         * kernel's own prefetch (that far ahead of it) is not its first request (one row,
         * one thread, Q4_K 2048 x 1536: ~63 -> ~60 us, 17920 x 1536 ~2-5% too) */
        int s = 0;
        while (begin >= j->seg[s].first_tile + j->seg[s].tiles) s++;
        const segment *g = &j->seg[s];
        dw_prefetch_block(g->data + (begin - g->first_tile) * g->tile_bytes, DW_PREFETCH_AHEAD);
    }
    for (int64_t r0 = 0; r0 < j->m; r0 += ROW_BLOCK) {
        const int64_t r1 = r0 + ROW_BLOCK < j->m ? r0 + ROW_BLOCK : j->m;
        int s = 0;
        for (int64_t t = begin; t < end;) {
            while (t >= j->seg[s].first_tile + j->seg[s].tiles) s++;
            const segment *g = &j->seg[s];
            const int64_t lt = t - g->first_tile, col = g->start + lt * DW_TILE;
            /* two tiles at once where the kernel has it and both are this thread's and this
             * segment's (the same bits as one at a time: threads still split whole tiles) */
            const int span = g->fn2 && t + 1 < end && lt + 1 < g->tiles ? 2 : 1;
            const int64_t left = g->rows - lt * DW_TILE;
            const int cols = (int)(left < span * DW_TILE ? left : span * DW_TILE);
            float bias[2 * DW_TILE] = {0};
            if (j->bias)
                for (int n = 0; n < cols; n++) bias[n] = bf16_to_f32(j->bias[col + n]);
            /* the block's rows in passes of as equal a size as the kernel's row limit
             * allows (16 rows: 4 x 4, not 5 + 5 + 5 + 1: a one-row pass is nearly a whole
             * decode's work) */
            const int64_t most = span == 2 ? DW_MAX_ROWS2 : DW_MAX_ROWS;
            const int64_t passes = (r1 - r0 + most - 1) / most;
            for (int64_t pi = 0, r = r0; pi < passes; pi++) {
                const int rows = (int)((r1 - r0) / passes + (pi < (r1 - r0) % passes));
                const void *x[DW_MAX_ROWS2];
                for (int i = 0; i < rows; i++)
                    x[i] = g->act == ACT256 ? (const void *)(j->act256 + (r + i) * (j->chunks / 8))
                           : g->act == ACT_F32 ? (const void *)(j->actf + (r + i) * j->chunks * DW_CHUNK)
                                               : (const void *)(j->act + (r + i) * j->chunks);
                float two[DW_MAX_ROWS2][2 * DW_TILE], one[DW_MAX_ROWS][DW_TILE];
                const uint8_t *tile = g->data + lt * g->tile_bytes;
                if (span == 2) g->fn2(tile, g->tile_bytes, j->chunks, x, rows, two);
                else g->fn(tile, j->chunks, x, rows, one);
                for (int i = 0; i < rows; i++) {
                    const float *o = span == 2 ? two[i] : one[i];
                    if (j->y_f32) {
                        float *y = (float *)j->y + (r + i) * j->y_stride + col;
                        for (int n = 0; n < cols; n++) y[n] = o[n] + bias[n];
                    } else {
                        uint16_t *y = (uint16_t *)j->y + (r + i) * j->y_stride + col;
                        for (int n = 0; n < cols; n++) y[n] = f32_to_bf16(o[n] + bias[n]);
                    }
                }
                r += rows;
            }
            t += span;
        }
    }
}

typedef struct {
    const uint16_t *x;
    dw_act *act;       /* NULL: no segment takes them */
    dw_act256 *act256; /* NULL: no segment takes them */
    float *actf;       /* NULL: no segment takes them */
    dw_act_fn fn;
    dw_act256_fn fn256;
    int64_t k, x_stride;
} act_job;

static void run_act(void *ctx, int64_t begin, int64_t end) {
    const act_job *a = ctx;
    for (int64_t r = begin; r < end; r++) {
        if (a->act) a->fn(a->x + r * a->x_stride, a->k, a->act + r * (a->k / DW_CHUNK));
        if (a->act256) a->fn256(a->x + r * a->x_stride, a->k, a->act256 + r * (a->k / DW_SUPER));
        if (a->actf) dw_widen_row(a->x + r * a->x_stride, a->k, a->actf + r * a->k);
    }
}

/* A per-thread buffer for the activations (three: one per scheme), grown as needed and
 * kept. */
static void *act_buffer(int which, size_t bytes) {
    static _Thread_local void *buf[3] = {NULL, NULL, NULL};
    static _Thread_local size_t cap[3] = {0, 0, 0};
    if (bytes > cap[which]) {
        free(buf[which]);
        buf[which] = malloc(bytes);
        cap[which] = buf[which] ? bytes : 0;
    }
    return buf[which];
}

/* y = x @ W^T (+ b) without the GIL (kernels.h, dw_gemm_call): the body of linear_quant,
 * also run by the decoder stack (decoder_stack.c). The segment table is checked here on
 * every call (a few compares); returns 0, or DW_ERR_VALUE with *err saying why, or
 * DW_ERR_MEMORY. */
int dw_linear_quant_run(const dw_gemm_call *c, const char **err) {
    static _Thread_local char why[160];
    const int64_t *table = c->table;
    const int64_t nseg = c->nseg, m = c->m, k = c->k, n = c->n;
    const int scalar = c->path == DW_PATH_SCALAR;
    if (nseg < 1 || nseg > MAX_SEGMENTS || m < 0 || k <= 0 || k % DW_CHUNK || n <= 0 ||
        c->x_stride < k || c->y_stride < n) {
        *err = "linear_quant: bad sizes, strides or segment count";
        return DW_ERR_VALUE;
    }
    job j = {.nseg = (int)nseg, .bias = c->bias, .y = c->y, .m = m, .chunks = k / DW_CHUNK,
             .y_stride = c->y_stride, .y_f32 = c->y_f32};
    int64_t col = 0, tiles = 0;
    for (int i = 0; i < nseg; i++) {
        const int64_t *e = table + 4 * i;
        dw_qtype_info info;
        segment *g = &j.seg[i];
        if (e[0] == DW_NVFP4 && e[2] == col && e[3] > 0 && e[1]) {
            g->act = ACT_F32;
            g->fn = scalar ? NULL : dw_nvfp4_kernel_simd();
            if (!g->fn) g->fn = dw_nvfp4_kernel_scalar();
            g->data = (const uint8_t *)(intptr_t)e[1];
            g->start = e[2], g->rows = e[3], g->first_tile = tiles;
            g->tiles = (e[3] + DW_TILE - 1) / DW_TILE;
            g->tile_bytes = DW_NVFP4_HEADER + k / DW_CHUNK * DW_NVFP4_BLOCK;
            col += e[3], tiles += g->tiles;
            continue;
        }
        if (!dw_qtype_info_of((int)e[0], &info) || k % info.block_k || e[2] != col || e[3] <= 0 ||
            !e[1]) {
            snprintf(why, sizeof why, "linear_quant: bad segment %d (type %lld)", i,
                     (long long)e[0]);
            *err = why;
            return DW_ERR_VALUE;
        }
        g->act = dw_qtype_act_block((int)e[0]) == DW_SUPER ? ACT256 : ACT32;
        const char *name = NULL;
        if (!(g->fn = dw_tile_kernel_for((int)e[0], c->path, &name, &g->fn2))) {
            snprintf(why, sizeof why, "linear_quant: %s", name);
            *err = why;
            return DW_ERR_VALUE;
        }
        if (m < pair_min_rows((int)e[0])) g->fn2 = NULL;
        g->data = (const uint8_t *)(intptr_t)e[1];
        g->start = e[2], g->rows = e[3], g->first_tile = tiles;
        g->tiles = (e[3] + DW_TILE - 1) / DW_TILE;
        g->tile_bytes = (k / info.block_k) * DW_TILE * info.block_bytes;
        col += e[3], tiles += g->tiles;
    }
    if (col != n) {
        *err = "linear_quant: segments do not cover the outputs";
        return DW_ERR_VALUE;
    }
    if (m == 0) return 0;
    int need32 = 0, need256 = 0, needf = 0;
    for (int i = 0; i < nseg; i++)
        need32 |= j.seg[i].act == ACT32, need256 |= j.seg[i].act == ACT256, needf |= j.seg[i].act == ACT_F32;
    if (need32 && !(j.act = act_buffer(0, (size_t)(m * j.chunks) * sizeof(dw_act))))
        return DW_ERR_MEMORY;
    if (need256 && !(j.act256 = act_buffer(1, (size_t)(m * (k / DW_SUPER)) * sizeof(dw_act256))))
        return DW_ERR_MEMORY;
    if (needf && !(j.actf = act_buffer(2, (size_t)(m * k) * sizeof(float)))) return DW_ERR_MEMORY;
    act_job a = {.x = c->x, .act = (dw_act *)j.act, .act256 = (dw_act256 *)j.act256,
                 .actf = (float *)j.actf,
                 .fn = scalar ? NULL : dw_act_row_simd(), .fn256 = scalar ? NULL : dw_act256_row_simd(),
                 .k = k, .x_stride = c->x_stride};
    if (!a.fn) a.fn = dw_quant_act_row;
    if (!a.fn256) a.fn256 = dw_quant_act256_row;
    const int nt = dw_threads(c->threads);
    dw_parallel_for(m >= 8 ? nt : 1, m, run_act, &a);
    /* several chunks per thread: a thread whose core is busy elsewhere leaves its chunks
     * to the others instead of holding up the step. Four for a decode or verify (a claim
     * is not free next to a few microseconds of work); sixteen for more rows, where a
     * chunk is long: the last one is what a thread that finished first waits for, and
     * a smaller one keeps its tiles in L2 between the 32-row blocks */
    const int64_t per_thread = m > 8 ? 16 : 4;
    int64_t grain = (tiles + per_thread * nt - 1) / (per_thread * nt);
    /* a kernel that takes two tiles at once gets whole pairs (an odd chunk runs one alone) */
    for (int i = 0; i < nseg; i++)
        if (j.seg[i].fn2 && grain % 2) grain++;
    dw_parallel_for_grain(nt, tiles, grain, run_tiles, &j);
    return 0;
}

/* Raise the Python exception of a dw_*_run failure (DW_ERR_VALUE: ValueError(err)). */
PyObject *dw_raise(int rc, const char *err) {
    if (rc == DW_ERR_MEMORY) return PyErr_NoMemory();
    PyErr_SetString(PyExc_ValueError, err ? err : "draftwise kernel: bad arguments");
    return NULL;
}

/* linear_quant(x, segments, bias_or_0, y, nseg, rows, k, n, x_stride, y_stride, y_f32,
 * threads, path): segments is int64 [nseg, 4] of (ggml type, packed data pointer, first
 * output column, output columns), together covering [0, n) in order; path a DW_PATH_*
 * (quant.h: 0 the best the CPU has, 1 scalar, 2 avx2, 3 avx512vnni). */
PyObject *dw_linear_quant(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[4];
    int64_t v[9];
    if (dw_parse(args, nargs, 13, 4, p, v, "linear_quant") < 0) return NULL;
    const dw_gemm_call c = {.x = p[0], .table = p[1], .bias = p[2], .y = p[3], .nseg = v[0],
                            .m = v[1], .k = v[2], .n = v[3], .x_stride = v[4], .y_stride = v[5],
                            .y_f32 = v[6] != 0, .threads = v[7], .path = (int)v[8]};
    const char *err = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = dw_linear_quant_run(&c, &err);
    Py_END_ALLOW_THREADS
    if (rc != 0) return dw_raise(rc, err);
    Py_RETURN_NONE;
}

/* quant_pack(type, row_pointers, dst, rows, k, threads): GGUF rows (int64 array of
 * addresses, 0 for a zero row) to tiles at dst (models.quant.packed_bytes bytes). */
PyObject *dw_quant_pack_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[2];
    int64_t v[3];
    /* argument order: type first, then pointers: parse type separately */
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "quant_pack takes 6 arguments");
        return NULL;
    }
    const long long qtype = PyLong_AsLongLong(args[0]);
    if (PyErr_Occurred()) return NULL;
    if (dw_parse(args + 1, 5, 5, 2, p, v, "quant_pack") < 0) return NULL;
    dw_qtype_info info;
    if (!dw_qtype_info_of((int)qtype, &info) || v[0] <= 0 || v[1] <= 0 || v[1] % info.block_k) {
        PyErr_SetString(PyExc_ValueError, "quant_pack: unsupported type or bad sizes");
        return NULL;
    }
    const uint8_t *const *rows = p[0];
    const int threads = dw_threads(v[2]);
    Py_BEGIN_ALLOW_THREADS dw_quant_pack((int)qtype, rows, v[0], v[1], p[1], threads);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* quant_dequant_rows(type, packed, ids, out, count, k, out_f32): rows ``ids`` (int64) of a
 * packed weight to out [count, k] (bf16, or fp32 when out_f32). The caller checks ids. */
PyObject *dw_quant_dequant_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "quant_dequant_rows takes 7 arguments");
        return NULL;
    }
    const long long qtype = PyLong_AsLongLong(args[0]);
    if (PyErr_Occurred()) return NULL;
    void *p[3];
    int64_t v[3];
    if (dw_parse(args + 1, 6, 6, 3, p, v, "quant_dequant_rows") < 0) return NULL;
    dw_qtype_info info;
    const int64_t count = v[0], k = v[1];
    const int nvfp4 = qtype == DW_NVFP4;
    if (nvfp4 ? count < 0 || k <= 0 || k % DW_CHUNK
              : !dw_qtype_info_of((int)qtype, &info) || count < 0 || k <= 0 || k % info.block_k) {
        PyErr_SetString(PyExc_ValueError, "quant_dequant_rows: unsupported type or bad sizes");
        return NULL;
    }
    float *row = malloc((size_t)k * sizeof(float));
    if (!row) return PyErr_NoMemory();
    const int64_t *ids = p[1];
    for (int64_t i = 0; i < count; i++) {
        if (nvfp4) dw_nvfp4_dequant_row(p[0], k, ids[i], row);
        else dw_quant_dequant_row((int)qtype, p[0], k, ids[i], row);
        if (v[2]) {
            memcpy((float *)p[2] + i * k, row, (size_t)k * sizeof(float));
        } else {
            uint16_t *o = (uint16_t *)p[2] + i * k;
            for (int64_t c = 0; c < k; c++) o[c] = f32_to_bf16(row[c]);
        }
    }
    free(row);
    Py_RETURN_NONE;
}

/* quant_simd([type[, path]]): the tile kernel a call runs ("avx512vnni", "avx2" or
 * "scalar"): for ``type`` (a GGML type, or 256 for NVFP4), or with no type the best path
 * of the machine (DRAFTWISE_QUANT_SIMD applied); path as linear_quant's last argument. */
PyObject *dw_quant_simd(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long long qtype = -1, path = DW_PATH_AUTO;
    if (nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "quant_simd takes at most 2 arguments");
        return NULL;
    }
    if (nargs >= 1 && (qtype = PyLong_AsLongLong(args[0])) == -1 && PyErr_Occurred()) return NULL;
    if (nargs == 2 && (path = PyLong_AsLongLong(args[1])) == -1 && PyErr_Occurred()) return NULL;
    if (qtype == DW_NVFP4)
        return PyUnicode_FromString(path != DW_PATH_SCALAR && dw_nvfp4_kernel_simd() ? "avx2" : "scalar");
    /* no type: Q4_K stands for the machine (every SIMD path covers it) */
    const char *name = NULL;
    if (!dw_tile_kernel_for(qtype < 0 ? DW_Q4_K : (int)qtype, (int)path, &name, NULL)) {
        PyErr_Format(PyExc_ValueError, "quant_simd: %s", name ? name : "not a type the kernels run");
        return NULL;
    }
    return PyUnicode_FromString(name);
}

/* quant_act_block(type): 32 or 256, the activation block (one scale) the type takes. */
PyObject *dw_quant_act_block_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "quant_act_block takes 1 argument");
        return NULL;
    }
    const long long qtype = PyLong_AsLongLong(args[0]);
    if (PyErr_Occurred()) return NULL;
    dw_qtype_info info;
    if (!dw_qtype_info_of((int)qtype, &info)) {
        PyErr_SetString(PyExc_ValueError, "quant_act_block: not a type the kernels run");
        return NULL;
    }
    return PyLong_FromLong(dw_qtype_act_block((int)qtype));
}

/* nvfp4_pack(code_rows, scale_rows, multipliers, dst, rows, k, threads): NVFP4 rows (int64
 * addresses of k / 2 code bytes and k / 16 fp8 scale bytes each, 0 for a zero row; fp32
 * multipliers per row) into tiles at dst (dw_nvfp4_bytes bytes: the caller sizes it). */
PyObject *dw_nvfp4_pack_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[4];
    int64_t v[3];
    if (dw_parse(args, nargs, 7, 4, p, v, "nvfp4_pack") < 0) return NULL;
    if (v[0] <= 0 || v[1] <= 0 || v[1] % DW_CHUNK) {
        PyErr_SetString(PyExc_ValueError, "nvfp4_pack: rows >= 1 and k a multiple of 32");
        return NULL;
    }
    const int threads = dw_threads(v[2]);
    Py_BEGIN_ALLOW_THREADS
    dw_nvfp4_pack(p[0], p[1], p[2], v[0], v[1], p[3], threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
