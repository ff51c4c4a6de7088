/* The packed bf16 GEMM of gemm_bf16.c as a C interface, for kernels that build on it
 * (markov.c): they run the very per-block code linear_bf16 runs, so their outputs are
 * bitwise what linear_bf16 returns for the same rows (see gemm_bf16.c's header on batch
 * invariance). */
#ifndef DRAFTWISE_GEMM_BF16_H
#define DRAFTWISE_GEMM_BF16_H

#include <stdint.h>

/* outputs per block of the packed layout (draftwise.models.linear.BLOCK_N) */
#define DW_BLOCK_N 64

typedef struct {
    const uint16_t *x;  /* [m, x_stride] bf16 */
    const uint16_t *p;  /* packed weight [ceil(n/64)][ceil(k/2)][64][2] */
    const uint16_t *b;  /* [n] bf16 or NULL */
    uint16_t *y;        /* [m, y_stride] bf16 (dw_gemm_bf16 only) */
    int64_t m, k, n, x_stride, y_stride;
} DwGemm;

/* y = x @ W^T + b, the blocks split over up to ``threads`` threads (linear_bf16). */
void dw_gemm_bf16(const DwGemm *g, int threads);

/* The outputs of block nb (columns 64 nb .. min(64 nb + 64, n) - 1) for every row of g,
 * as bf16: row r's at y + r * ys. g->y is not used. */
void dw_gemm_bf16_block(const DwGemm *g, int64_t nb, uint16_t *y, int64_t ys);

#endif
