/* Where each field of a type sits in a tile block (see quant.h): the GGUF block's fields
 * in their stored order, each eight times as wide (eight rows interleaved), so a field
 * at byte o of the GGUF block starts at byte 8 * o of the tile block. The kernels
 * (scalar and SIMD) and the packer all read these offsets from here. */
#ifndef DRAFTWISE_QUANT_LAYOUT_H
#define DRAFTWISE_QUANT_LAYOUT_H

#include "quant.h"

/* byte offsets of the GGUF block fields (x8 in a tile block) and block sizes */
#define Q4_0_D 0
#define Q4_0_QS 2
#define Q4_0_BYTES 18
#define Q4_1_D 0
#define Q4_1_M 2
#define Q4_1_QS 4
#define Q4_1_BYTES 20
#define Q5_0_D 0
#define Q5_0_QH 2
#define Q5_0_QS 6
#define Q5_0_BYTES 22
#define Q5_1_D 0
#define Q5_1_M 2
#define Q5_1_QH 4
#define Q5_1_QS 8
#define Q5_1_BYTES 24
#define Q8_0_D 0
#define Q8_0_QS 2
#define Q8_0_BYTES 34
#define Q2_K_SC 0
#define Q2_K_QS 16
#define Q2_K_D 80
#define Q2_K_DMIN 82
#define Q2_K_BYTES 84
#define Q3_K_HM 0
#define Q3_K_QS 32
#define Q3_K_SC 96
#define Q3_K_D 108
#define Q3_K_BYTES 110
#define Q4_K_D 0
#define Q4_K_DMIN 2
#define Q4_K_SC 4
#define Q4_K_QS 16
#define Q4_K_BYTES 144
#define Q5_K_D 0
#define Q5_K_DMIN 2
#define Q5_K_SC 4
#define Q5_K_QH 16
#define Q5_K_QS 48
#define Q5_K_BYTES 176
#define Q6_K_QL 0
#define Q6_K_QH 128
#define Q6_K_SC 192
#define Q6_K_D 208
#define Q6_K_BYTES 210

/* Bytes of one GGUF block of type T (one per-row copy; a tile block is DW_TILE of them):
 * what the SIMD kernels step by, with T a compile-time constant there. */
static inline __attribute__((always_inline)) int dw_block_bytes(const int T) {
    switch (T) {
    case DW_Q4_0: return Q4_0_BYTES;
    case DW_Q4_1: return Q4_1_BYTES;
    case DW_Q5_0: return Q5_0_BYTES;
    case DW_Q5_1: return Q5_1_BYTES;
    case DW_Q8_0: return Q8_0_BYTES;
    case DW_Q2_K: return Q2_K_BYTES;
    case DW_Q3_K: return Q3_K_BYTES;
    case DW_Q4_K: return Q4_K_BYTES;
    case DW_Q5_K: return Q5_K_BYTES;
    default: return Q6_K_BYTES;
    }
}

/* The prefetch of the one-tile kernels (AVX2, and AVX512-VNNI's 256-bit body, which a
 * one-row decode runs: gemm_quant.c, pair_min_rows): a thread reads its tiles front to
 * back as ONE stream, and asks for the tile block DW_PREFETCH_AHEAD bytes ahead (rounded
 * up to whole blocks: a K-quant block's scales sit at its end, so a block is fetched
 * whole) into L2 (prefetcht1), not L1. On this project's Zen 5 VM (whose hardware
 * prefetcher adds little) a one-row Q4_K GEMV on one thread went from ~27-31 GB/s (2 KB
 * ahead into L1) to ~36-39 GB/s, past the ~30 GB/s of a plain streaming read; 6-12 KB
 * measured within noise of each other, 4 KB lower. Into L1 the misses in flight are few
 * (L1's fill buffers), and the lines it brings crowd out the activations. */
#define DW_PREFETCH_AHEAD 8192

/* Prefetch the tile block of ``bytes`` at p into L2 (see DW_PREFETCH_AHEAD). */
static inline __attribute__((always_inline)) void dw_prefetch_block(const uint8_t *p, int64_t bytes) {
    for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(p + line, 0, 2);
}

/* In a tile block, byte i of row n's copy of an array field at GGUF offset o: arrays are
 * interleaved four bytes per row (one 32-byte vector per four bytes of the field). */
static inline uint8_t dw_tile_byte(const uint8_t *blk, int o, int n, int i) {
    return blk[8 * o + 32 * (i / 4) + 4 * n + i % 4];
}

/* Row n's fp16 field at GGUF offset o, as fp32 (fp16 fields: two bytes per row). */
static inline float dw_tile_half(const uint8_t *blk, int o, int n) {
    return dw_half_to_float(dw_load_u16(blk + 8 * o + 2 * n));
}

/* Q4_K / Q5_K: the 6-bit scale (which = 0) or min (which = 1) of sub-block j (0..7)
 * from row n's 12 packed scale bytes at GGUF offset o. */
static inline int dw_k_scale_min(const uint8_t *blk, int o, int n, int j, int which) {
    const int lo = which ? 4 : 0;
    if (j < 4) return dw_tile_byte(blk, o, n, j + lo) & 63;
    const int packed = dw_tile_byte(blk, o, n, j + 4), high = dw_tile_byte(blk, o, n, j - 4 + lo) >> 6;
    return (which ? packed >> 4 : packed & 0xF) | (high << 4);
}

/* Q3_K: the signed 6-bit scale of sub-block i (0..15) of row n. */
static inline int dw_q3_scale(const uint8_t *blk, int n, int i) {
    const int lo = dw_tile_byte(blk, Q3_K_SC, n, i % 8) >> (i >= 8 ? 4 : 0);
    const int hi = dw_tile_byte(blk, Q3_K_SC, n, 8 + i % 4) >> (2 * (i / 4));
    return ((lo & 0xF) | ((hi & 3) << 4)) - 32;
}

#endif
