/* The contract of quant.h written out per type, one weight at a time: which code a
 * kernel step reads for (chunk c of a block, step s, row n, byte j: k = 32 c + 4 s + j),
 * and each chunk's scales. The scalar kernel and dequantization are built on these; the
 * SIMD kernel computes the same numbers eight rows at a time, and the tests hold the two
 * bitwise equal and both equal to gguf-py's dequantization. */
#ifndef DRAFTWISE_QUANT_CODES_H
#define DRAFTWISE_QUANT_CODES_H

#include "quant_layout.h"

/* A chunk's scales for one row: w_k = d * p[h] * q_k + (min term), h = which 16 of 32.
 * n_min = 1: one min term m[0] times the activation's s[0]; n_min = 2: m[h] times s[1 + h]. */
typedef struct {
    float d;
    int p[2];
    float m[2];
    int n_min;
} dw_chunk_scales;

static inline int nibble(uint8_t b, int high) { return high ? b >> 4 : b & 0xF; }

/* The code of weight k = 32 c + 4 s + j of row n in tile block ``blk`` (unsigned, except
 * Q8_0's signed bytes). */
static inline int dw_quant_code(int qtype, const uint8_t *blk, int c, int s, int n, int j) {
    switch (qtype) {
    case DW_Q4_0: return nibble(dw_tile_byte(blk, Q4_0_QS, n, 4 * (s % 4) + j), s >= 4);
    case DW_Q4_1: return nibble(dw_tile_byte(blk, Q4_1_QS, n, 4 * (s % 4) + j), s >= 4);
    case DW_Q5_0:
        return nibble(dw_tile_byte(blk, Q5_0_QS, n, 4 * (s % 4) + j), s >= 4) |
               ((dw_tile_byte(blk, Q5_0_QH, n, j) >> s & 1) << 4);
    case DW_Q5_1:
        return nibble(dw_tile_byte(blk, Q5_1_QS, n, 4 * (s % 4) + j), s >= 4) |
               ((dw_tile_byte(blk, Q5_1_QH, n, j) >> s & 1) << 4);
    case DW_Q8_0: return (int8_t)dw_tile_byte(blk, Q8_0_QS, n, 4 * s + j);
    case DW_Q2_K: /* 128-k halves of 32 bytes, four 2-bit fields per byte */
        return dw_tile_byte(blk, Q2_K_QS, n, 32 * (c / 4) + 4 * s + j) >> (2 * (c % 4)) & 3;
    case DW_Q3_K:
        return (dw_tile_byte(blk, Q3_K_QS, n, 32 * (c / 4) + 4 * s + j) >> (2 * (c % 4)) & 3) |
               ((dw_tile_byte(blk, Q3_K_HM, n, 4 * s + j) >> c & 1) << 2);
    case DW_Q4_K: return nibble(dw_tile_byte(blk, Q4_K_QS, n, 32 * (c / 2) + 4 * s + j), c % 2);
    case DW_Q5_K:
        return nibble(dw_tile_byte(blk, Q5_K_QS, n, 32 * (c / 2) + 4 * s + j), c % 2) |
               ((dw_tile_byte(blk, Q5_K_QH, n, 4 * s + j) >> c & 1) << 4);
    case DW_Q6_K: { /* low 4 bits: 64-byte halves, nibble pairs k and k + 64 */
        const int h = c / 4, f = c % 4;
        const int lo = nibble(dw_tile_byte(blk, Q6_K_QL, n, 64 * h + 32 * (f % 2) + 4 * s + j), f / 2);
        const int hi = dw_tile_byte(blk, Q6_K_QH, n, 32 * h + 4 * s + j) >> (2 * f) & 3;
        return lo | hi << 4;
    }
    default: return 0;
    }
}

static inline dw_chunk_scales dw_chunk_scales_of(int qtype, const uint8_t *blk, int c, int n) {
    dw_chunk_scales r = {0.0f, {1, 1}, {0.0f, 0.0f}, 1};
    switch (qtype) {
    case DW_Q4_0: r.d = dw_tile_half(blk, Q4_0_D, n), r.m[0] = r.d * -8.0f; break;
    case DW_Q4_1: r.d = dw_tile_half(blk, Q4_1_D, n), r.m[0] = dw_tile_half(blk, Q4_1_M, n); break;
    case DW_Q5_0: r.d = dw_tile_half(blk, Q5_0_D, n), r.m[0] = r.d * -16.0f; break;
    case DW_Q5_1: r.d = dw_tile_half(blk, Q5_1_D, n), r.m[0] = dw_tile_half(blk, Q5_1_M, n); break;
    case DW_Q8_0: r.d = dw_tile_half(blk, Q8_0_D, n), r.n_min = 0; break;
    case DW_Q2_K:
        r.d = dw_tile_half(blk, Q2_K_D, n), r.n_min = 2;
        for (int h = 0; h < 2; h++) {
            const int b = dw_tile_byte(blk, Q2_K_SC, n, 2 * c + h);
            r.p[h] = b & 0xF;
            r.m[h] = -(dw_tile_half(blk, Q2_K_DMIN, n) * (float)(b >> 4));
        }
        break;
    case DW_Q3_K:
        r.d = dw_tile_half(blk, Q3_K_D, n), r.n_min = 2;
        for (int h = 0; h < 2; h++) {
            r.p[h] = dw_q3_scale(blk, n, 2 * c + h);
            r.m[h] = r.d * ((float)r.p[h] * -4.0f);
        }
        break;
    case DW_Q4_K:
    case DW_Q5_K: {
        const int o = qtype == DW_Q4_K ? Q4_K_SC : Q5_K_SC;
        r.d = dw_tile_half(blk, Q4_K_D, n); /* d and dmin sit at the same offsets in both */
        r.p[0] = r.p[1] = dw_k_scale_min(blk, o, n, c, 0);
        r.m[0] = -(dw_tile_half(blk, Q4_K_DMIN, n) * (float)dw_k_scale_min(blk, o, n, c, 1));
        break;
    }
    case DW_Q6_K:
        r.d = dw_tile_half(blk, Q6_K_D, n), r.n_min = 2;
        for (int h = 0; h < 2; h++) {
            r.p[h] = (int8_t)dw_tile_byte(blk, Q6_K_SC, n, 2 * c + h);
            r.m[h] = r.d * ((float)r.p[h] * -32.0f);
        }
        break;
    default: break;
    }
    return r;
}

#endif
