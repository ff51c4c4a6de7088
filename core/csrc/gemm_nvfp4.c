/*
 * NVFP4 weights (safetensors, ModelOpt or compressed-tensors) in the quantized GEMM family:
 * the load-time repack, row dequantization, the activation widening and the scalar tile
 * kernel (the portable path and the reference the AVX2 kernel, gemm_nvfp4_avx2.c, is
 * tested bitwise against). The entry point, row passes and thread split are
 * gemm_quant.c's, shared with the GGUF types.
 *
 * Why: an NVFP4 checkpoint is 4.5 bits per weight (e2m1 codes plus one fp8 scale per 16);
 * widening it to bf16 at load would make every decode step stream 3.6x the bytes.
 *
 * Layout and arithmetic: quant.h ("NVFP4 (W4A16)"). Activations are NOT quantized (W4A16,
 * as the format is published for weight-only use): each row is widened from bf16 to fp32
 * once per call and the products c * x are exact, so the only rounding is the fixed-order
 * fp32 accumulation. Batch invariance is the family's: a row's fp32 values depend only on
 * that row, each output is one accumulator over K in a fixed order, threads split whole
 * tiles.
 */
#include "quant.h"
#include "threadpool.h"

#include <math.h>

/* 2 x e2m1 by code: bit 3 the sign, bits 0-2 the magnitude (-0 is +0: an int8 in AVX2) */
static const float E2M1X2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

int64_t dw_nvfp4_bytes(int64_t rows, int64_t k) {
    return (rows + DW_TILE - 1) / DW_TILE * (DW_NVFP4_HEADER + k / DW_CHUNK * DW_NVFP4_BLOCK);
}

typedef struct {
    const uint8_t *const *codes, *const *scales;
    const float *mult;
    int64_t rows, k;
    uint8_t *dst;
} pack_job;

/* the stored code of weight k of a row: byte k / 2, low nibble for even k */
static inline int stored_code(const uint8_t *row, int64_t k) { return row[k / 2] >> (4 * (k % 2)) & 0xF; }

static void pack_tiles(void *ctx, int64_t begin, int64_t end) {
    const pack_job *j = ctx;
    const int64_t tile_bytes = DW_NVFP4_HEADER + j->k / DW_CHUNK * DW_NVFP4_BLOCK;
    for (int64_t t = begin; t < end; t++) {
        uint8_t *dst = j->dst + t * tile_bytes;
        const uint8_t *c[DW_TILE], *s[DW_TILE];
        float mult[DW_TILE];
        for (int n = 0; n < DW_TILE; n++) {
            const int64_t r = t * DW_TILE + n;
            const int live = r < j->rows && j->codes[r];
            c[n] = live ? j->codes[r] : NULL, s[n] = live ? j->scales[r] : NULL;
            mult[n] = live ? j->mult[r] : 0.0f;
        }
        memcpy(dst, mult, sizeof mult);
        uint8_t *blk = dst + DW_NVFP4_HEADER;
        for (int64_t b = 0; b < j->k / DW_CHUNK; b++, blk += DW_NVFP4_BLOCK) {
            for (int n = 0; n < DW_TILE; n++) {
                for (int v = 0; v < 4; v++) {
                    for (int i = 0; i < 4; i++) {
                        const int64_t k0 = DW_CHUNK * b + 8 * v + i;
                        blk[32 * v + dw_nvfp4_pos(i, n)] =
                            c[n] ? (uint8_t)(stored_code(c[n], k0) | stored_code(c[n], k0 + 4) << 4) : 0;
                    }
                }
                for (int g = 0; g < 2; g++) blk[128 + 8 * g + n] = s[n] ? s[n][2 * b + g] : 0;
            }
        }
    }
}

void dw_nvfp4_pack(const uint8_t *const *codes, const uint8_t *const *scales, const float *mult,
                   int64_t rows, int64_t k, uint8_t *dst, int threads) {
    pack_job j = {codes, scales, mult, rows, k, dst};
    dw_parallel_for(threads, (rows + DW_TILE - 1) / DW_TILE, pack_tiles, &j);
}

/* Code of weight k = 16 g + 4 q + i (q: quarter, i < 4) of row n in a tile block. */
static inline int tile_code(const uint8_t *blk, int g, int q, int i, int n) {
    const int v = 2 * g + q / 2;
    return blk[32 * v + dw_nvfp4_pos(i, n)] >> (4 * (q % 2)) & 0xF;
}

void dw_nvfp4_dequant_row(const uint8_t *packed, int64_t k, int64_t n, float *out) {
    const uint8_t *tile = packed + n / DW_TILE * (DW_NVFP4_HEADER + k / DW_CHUNK * DW_NVFP4_BLOCK);
    const int lane = (int)(n % DW_TILE);
    float mult;
    memcpy(&mult, tile + 4 * lane, sizeof mult);
    const uint8_t *blk = tile + DW_NVFP4_HEADER;
    for (int64_t b = 0; b < k / DW_CHUNK; b++, blk += DW_NVFP4_BLOCK)
        for (int g = 0; g < 2; g++) {
            const float s = dw_e4m3_half(blk[128 + 8 * g + lane]);
            for (int q = 0; q < 4; q++)
                for (int i = 0; i < 4; i++) *out++ = E2M1X2[tile_code(blk, g, q, i, lane)] * s * mult;
        }
}

void dw_widen_row(const uint16_t *x, int64_t k, float *out) {
    for (int64_t i = 0; i < k; i++) {
        const uint32_t bits = (uint32_t)x[i] << 16;
        memcpy(out + i, &bits, sizeof bits);
    }
}

/* The contract of quant.h, one output and one row at a time. */
static void tile_scalar(const uint8_t *tile, int64_t chunks, const void *const *xv, int rows,
                        float (*out)[DW_TILE]) {
    const float *mult = (const float *)(const void *)tile;
    for (int r = 0; r < rows; r++) {
        const float *x = xv[r];
        for (int n = 0; n < DW_TILE; n++) {
            const uint8_t *blk = tile + DW_NVFP4_HEADER;
            float acc = 0.0f;
            for (int64_t b = 0; b < chunks; b++, blk += DW_NVFP4_BLOCK) {
                for (int g = 0; g < 2; g++) {
                    const float *xg = x + DW_CHUNK * b + 16 * g;
                    float p[4];
                    for (int q = 0; q < 4; q++) {
                        p[q] = E2M1X2[tile_code(blk, g, q, 0, n)] * xg[4 * q];
                        for (int i = 1; i < 4; i++)
                            p[q] = fmaf(E2M1X2[tile_code(blk, g, q, i, n)], xg[4 * q + i], p[q]);
                    }
                    const float dot = (p[0] + p[1]) + (p[2] + p[3]);
                    acc = fmaf(dot, dw_e4m3_half(blk[128 + 8 * g + n]), acc);
                }
            }
            out[r][n] = acc * mult[n];
        }
    }
}

dw_tile_fn dw_nvfp4_kernel_scalar(void) { return tile_scalar; }
