/*
 * y = x @ W^T (+ b) for bf16 x and W, fp32 accumulation, bf16 out: the decoder's
 * projections and the LM head, on CPUs with AVX512-BF16 (vdpbf16ps).
 *
 * Why hand-written: a decode or verify step multiplies 1-9 rows by every weight once, so
 * the step time is how fast one core streams the weights. oneDNN's packed bf16 GEMM
 * reaches ~22 GB/s on one core here at 5 rows; this kernel, whose whole weight is one
 * sequential stream (in huge pages, models/hugepages.py), reaches 38-41 GB/s at 1-5 rows:
 * what the core streams with no arithmetic at all.
 *
 * Layout (packed once at load by draftwise.models.linear): W [N, K] becomes
 * P[N/64][K/2][64][2], zero-padded to whole blocks: for each block of 64 outputs, each
 * pair of input columns is 64 (w[2k], w[2k+1]) pairs, i.e. four zmm registers, one per
 * 16 outputs. A row's x pair is broadcast and vdpbf16ps accumulates 64 outputs at once.
 *
 * Batch invariance by construction: every output element is one accumulator that starts
 * at the bias (or 0) and takes the K/2 pairs in order, whatever the number of rows, the
 * row's position in the batch, or the thread count. Rows are taken six at a time
 * (24 accumulators); a chunk of fewer rows runs the same per-row instruction sequence.
 *
 * Elsewhere (AVX2, NEON, plain x86-64: no vdpbf16ps) the same layout runs through the
 * portable 16-lane vectors of vec.h: each pair is two fused multiply-adds per output in
 * the same fixed order, so the guarantee is the same (the bits differ from the
 * AVX512-BF16 build's, as a build only ever uses one). A row keeps 4 vectors of
 * accumulators (8 ymm on AVX2), too many to hold several rows, so the K pairs are walked
 * in tiles of 16 KB of weights that stay in L1 while every row of a chunk takes them;
 * between tiles a row's accumulators wait in memory, which changes no rounding. On an
 * AVX2 Zen core this streams ~2x what oneDNN's bf16 path does at 1-5 rows and, unlike
 * it, is batch-invariant.
 */
#include "kernels.h"
#include "gemm_bf16.h"
#include "threadpool.h"

#define BLOCK_N DW_BLOCK_N

typedef DwGemm Gemm;

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>

#define MAX_ROWS 6
/* With one or two rows the hardware prefetcher keeps up with the arithmetic; from three
 * rows on, more work per cache line leaves too few misses in flight, and an explicit
 * prefetch 4 KB ahead made a 5-row verify forward ~8% faster (a 1-row decode ~5% slower,
 * hence the threshold). Measured on AMD Zen 5, benchmarks/forward_step.py. */
#define PREFETCH_BYTES 4096
#define PREFETCH_MIN_ROWS 3

static inline __m512 load_bias(const uint16_t *b, int64_t col, int64_t n) {
    if (!b) return _mm512_setzero_ps();
    uint16_t tmp[16] = {0};
    for (int64_t j = 0; j < 16 && col + j < n; j++) tmp[j] = b[col + j];
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)tmp)), 16));
}

/* Rows r0..r0+R-1 times one 64-output block, into y (row r0's first output of the block;
 * row stride ys). R is a constant in each instantiation, so the accumulators live in
 * registers. */
static inline __attribute__((always_inline)) void block(const Gemm *g, int64_t nb, int64_t r0,
                                                          const int R, uint16_t *y, int64_t ys) {
    const int64_t kpairs = (g->k + 1) / 2, even = g->k / 2, col = nb * BLOCK_N;
    const uint16_t *w = g->p + nb * kpairs * (BLOCK_N * 2);
    __m512 acc[MAX_ROWS][4];
    for (int j = 0; j < 4; j++) {
        const __m512 b = load_bias(g->b, col + 16 * j, g->n);
        for (int r = 0; r < R; r++) acc[r][j] = b;
    }
    const uint16_t *xr[MAX_ROWS];
    for (int r = 0; r < R; r++) xr[r] = g->x + (r0 + r) * g->x_stride;
    int64_t kp = 0;
    for (; kp < even; kp++, w += BLOCK_N * 2) {
        if (R >= PREFETCH_MIN_ROWS) { /* R is a constant: no branch at run time */
            for (int line = 0; line < 4; line++)
                _mm_prefetch((const char *)w + PREFETCH_BYTES + 64 * line, _MM_HINT_T0);
        }
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + 32);
        const __m512bh w2 = (__m512bh)_mm512_loadu_si512(w + 64);
        const __m512bh w3 = (__m512bh)_mm512_loadu_si512(w + 96);
        for (int r = 0; r < R; r++) {
            uint32_t v;
            memcpy(&v, xr[r] + 2 * kp, sizeof v);
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)v);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, w1);
            acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, w2);
            acc[r][3] = _mm512_dpbf16_ps(acc[r][3], a, w3);
        }
    }
    if (kp < kpairs) { /* odd K: the last pair is (x[K-1], 0), like the zero-padded weight */
        for (int r = 0; r < R; r++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)xr[r][2 * kp]);
            for (int j = 0; j < 4; j++)
                acc[r][j] = _mm512_dpbf16_ps(acc[r][j], a, (__m512bh)_mm512_loadu_si512(w + 32 * j));
        }
    }
    for (int j = 0; j < 4; j++) {
        const int64_t c = col + 16 * j;
        if (c >= g->n) break;
        const __mmask16 mask = g->n - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (g->n - c)) - 1);
        for (int r = 0; r < R; r++)
            _mm256_mask_storeu_epi16(y + r * ys + 16 * j, mask,
                                     (__m256i)_mm512_cvtneps_pbh(acc[r][j]));
    }
}

static void block_rows(const Gemm *g, int64_t nb, int64_t r0, int64_t rows, uint16_t *y,
                       int64_t ys) {
    switch (rows) {
    case 1: block(g, nb, r0, 1, y, ys); break;
    case 2: block(g, nb, r0, 2, y, ys); break;
    case 3: block(g, nb, r0, 3, y, ys); break;
    case 4: block(g, nb, r0, 4, y, ys); break;
    case 5: block(g, nb, r0, 5, y, ys); break;
    default: block(g, nb, r0, 6, y, ys); break;
    }
}

/* Every row of g times block nb, six rows at a time: the block's weights come from memory
 * once and stay in L1/L2 while every chunk of rows uses them. */
void dw_gemm_bf16_block(const Gemm *g, int64_t nb, uint16_t *y, int64_t ys) {
    for (int64_t r0 = 0; r0 < g->m; r0 += MAX_ROWS)
        block_rows(g, nb, r0, g->m - r0 < MAX_ROWS ? g->m - r0 : MAX_ROWS, y + r0 * ys, ys);
}

#else /* portable: vec.h's 16-lane vectors, same packed layout */

#define ROW_CHUNK 16
#define K_TILE 64 /* pairs: 64 x 256 B = 16 KB of one block's weights */

static inline v16u load_u32x16(const uint16_t *p) {
    v16u v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The 16 biases of outputs col..col+15 as fp32 (0 past n, or without a bias). */
static inline v16f load_bias16(const uint16_t *b, int64_t col, int64_t n) {
    v16f out = v16_splat(0.0f);
    if (!b) return out;
    for (int64_t j = 0; j < LANES && col + j < n; j++) out[j] = bf16_to_f32(b[col + j]);
    return out;
}

/* One row's 64 accumulators over pairs [kt, kend): acc += x pair . w pair, pair by pair. */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* Explicit AVX2: the eight ymm accumulators stay in registers (GCC spills the generic
 * 16-lane vectors of this loop to the stack, ~10x slower). Each pair is two FMAs per
 * output, even element first, like v16_dot2_bf16. */
static inline void row_tile(v16f acc[4], const uint16_t *x, const uint16_t *wb, int64_t kt,
                            int64_t kend, int64_t even) {
    __m256 a[8];
    memcpy(a, acc, sizeof a);
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    for (int64_t kp = kt; kp < kend; kp++) {
        const uint16_t *w = wb + kp * (BLOCK_N * 2);
        uint32_t v;
        if (kp < even) memcpy(&v, x + 2 * kp, sizeof v);
        else v = x[2 * kp]; /* odd K: (x[K-1], 0), like the zero-padded weight */
        const __m256i xv = _mm256_set1_epi32((int)v);
        const __m256 xe = _mm256_castsi256_ps(_mm256_slli_epi32(xv, 16));
        const __m256 xo = _mm256_castsi256_ps(_mm256_and_si256(xv, hi));
        for (int j = 0; j < 8; j++) {
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(w + 16 * j));
            a[j] = _mm256_fmadd_ps(xe, _mm256_castsi256_ps(_mm256_slli_epi32(wv, 16)), a[j]);
            a[j] = _mm256_fmadd_ps(xo, _mm256_castsi256_ps(_mm256_and_si256(wv, hi)), a[j]);
        }
    }
    memcpy(acc, a, sizeof a);
}
#else
static inline void row_tile(v16f acc[4], const uint16_t *x, const uint16_t *wb, int64_t kt,
                            int64_t kend, int64_t even) {
    v16f a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    for (int64_t kp = kt; kp < kend; kp++) {
        const uint16_t *w = wb + kp * (BLOCK_N * 2);
        uint32_t v;
        if (kp < even) memcpy(&v, x + 2 * kp, sizeof v);
        else v = x[2 * kp]; /* odd K: (x[K-1], 0), like the zero-padded weight */
        const v16u a = v16_splat_u32(v);
        a0 = v16_dot2_bf16(a0, a, load_u32x16(w));
        a1 = v16_dot2_bf16(a1, a, load_u32x16(w + 32));
        a2 = v16_dot2_bf16(a2, a, load_u32x16(w + 64));
        a3 = v16_dot2_bf16(a3, a, load_u32x16(w + 96));
    }
    acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
}
#endif

/* One 64-output block for every row, into y (row stride ys): rows in chunks of ROW_CHUNK,
 * K in tiles of K_TILE pairs; each output's accumulator takes the pairs in order whatever
 * the chunking. */
void dw_gemm_bf16_block(const Gemm *g, int64_t nb, uint16_t *y, int64_t ys) {
    const int64_t kpairs = (g->k + 1) / 2, even = g->k / 2, col = nb * BLOCK_N;
    const uint16_t *wb = g->p + nb * kpairs * (BLOCK_N * 2);
    v16f bias[4];
    for (int j = 0; j < 4; j++) bias[j] = load_bias16(g->b, col + LANES * j, g->n);
    for (int64_t r0 = 0; r0 < g->m; r0 += ROW_CHUNK) {
        const int64_t rc = g->m - r0 < ROW_CHUNK ? g->m - r0 : ROW_CHUNK;
        v16f acc[ROW_CHUNK][4];
        for (int64_t r = 0; r < rc; r++)
            for (int j = 0; j < 4; j++) acc[r][j] = bias[j];
        for (int64_t kt = 0; kt < kpairs; kt += K_TILE) {
            const int64_t kend = kt + K_TILE < kpairs ? kt + K_TILE : kpairs;
            for (int64_t r = 0; r < rc; r++) {
                const uint16_t *x = g->x + (r0 + r) * g->x_stride;
                row_tile(acc[r], x, wb, kt, kend, even);
            }
        }
        for (int64_t r = 0; r < rc; r++) {
            uint16_t *yr = y + (r0 + r) * ys;
            for (int j = 0; j < 4; j++) {
                const int64_t c = col + LANES * j;
                if (c >= g->n) break;
                uint16_t tmp[LANES];
                v16_store_bf16(tmp, acc[r][j]);
                memcpy(yr + LANES * j, tmp,
                       sizeof(uint16_t) * (size_t)(g->n - c < LANES ? g->n - c : LANES));
            }
        }
    }
}

#endif

/* Blocks [begin, end). Threads split the blocks, so the thread count changes who computes
 * an output, never how. */
static void run_blocks(void *ctx, int64_t begin, int64_t end) {
    const Gemm *g = ctx;
    for (int64_t nb = begin; nb < end; nb++)
        dw_gemm_bf16_block(g, nb, g->y + nb * BLOCK_N, g->y_stride);
}

void dw_gemm_bf16(const Gemm *g, int threads) {
    const int64_t blocks = (g->n + BLOCK_N - 1) / BLOCK_N;
    dw_parallel_for(dw_threads(threads), blocks, run_blocks, (void *)g);
}

PyObject *dw_linear_bf16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[4];
    int64_t n[6];
    if (dw_parse(args, nargs, 10, 4, p, n, "linear_bf16") < 0) return NULL;
    Gemm g = {.x = p[0], .p = p[1], .b = p[2], .y = p[3],
              .m = n[0], .k = n[1], .n = n[2], .x_stride = n[3], .y_stride = n[4]};
    if (g.m < 0 || g.k <= 0 || g.n <= 0 || g.x_stride < g.k || g.y_stride < g.n) {
        PyErr_SetString(PyExc_ValueError, "linear_bf16: bad sizes or strides");
        return NULL;
    }
    const int threads = dw_threads(n[5]);
    Py_BEGIN_ALLOW_THREADS dw_gemm_bf16(&g, threads);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}
