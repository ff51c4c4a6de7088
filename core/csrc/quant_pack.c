/* Load-time and per-call helpers of the quantized GEMM (see quant.h): repacking GGUF
 * rows into tiles, dequantizing single rows (embedding lookups), and quantizing an
 * activation row to int8 blocks. The codes each kernel step reads are defined once here
 * (dw_quant_code) and used by the scalar kernel and by dequantization alike. */
#include "quant_codes.h"
#include "threadpool.h"

#include <math.h>

int dw_qtype_info_of(int qtype, dw_qtype_info *info) {
    switch (qtype) {
    case DW_Q4_0: *info = (dw_qtype_info){32, Q4_0_BYTES}; return 1;
    case DW_Q4_1: *info = (dw_qtype_info){32, Q4_1_BYTES}; return 1;
    case DW_Q5_0: *info = (dw_qtype_info){32, Q5_0_BYTES}; return 1;
    case DW_Q5_1: *info = (dw_qtype_info){32, Q5_1_BYTES}; return 1;
    case DW_Q8_0: *info = (dw_qtype_info){32, Q8_0_BYTES}; return 1;
    case DW_Q2_K: *info = (dw_qtype_info){256, Q2_K_BYTES}; return 1;
    case DW_Q3_K: *info = (dw_qtype_info){256, Q3_K_BYTES}; return 1;
    case DW_Q4_K: *info = (dw_qtype_info){256, Q4_K_BYTES}; return 1;
    case DW_Q5_K: *info = (dw_qtype_info){256, Q5_K_BYTES}; return 1;
    case DW_Q6_K: *info = (dw_qtype_info){256, Q6_K_BYTES}; return 1;
    default: return 0;
    }
}

/* A GGUF block field: ``len`` bytes at ``off``, interleaved ``unit`` bytes per row. */
typedef struct {
    int off, len, unit;
} field;

/* The fields of each type in stored order; ``plane`` marks Q5_0/Q5_1's high-bit word. */
static int fields_of(int qtype, field *f, int *plane_off) {
    *plane_off = -1;
    switch (qtype) {
    case DW_Q4_0:
        f[0] = (field){Q4_0_D, 2, 2}, f[1] = (field){Q4_0_QS, 16, 4};
        return 2;
    case DW_Q4_1:
        f[0] = (field){Q4_1_D, 2, 2}, f[1] = (field){Q4_1_M, 2, 2}, f[2] = (field){Q4_1_QS, 16, 4};
        return 3;
    case DW_Q5_0:
        *plane_off = Q5_0_QH;
        f[0] = (field){Q5_0_D, 2, 2}, f[1] = (field){Q5_0_QH, 4, 4}, f[2] = (field){Q5_0_QS, 16, 4};
        return 3;
    case DW_Q5_1:
        *plane_off = Q5_1_QH;
        f[0] = (field){Q5_1_D, 2, 2}, f[1] = (field){Q5_1_M, 2, 2};
        f[2] = (field){Q5_1_QH, 4, 4}, f[3] = (field){Q5_1_QS, 16, 4};
        return 4;
    case DW_Q8_0:
        f[0] = (field){Q8_0_D, 2, 2}, f[1] = (field){Q8_0_QS, 32, 4};
        return 2;
    case DW_Q2_K:
        f[0] = (field){Q2_K_SC, 16, 4}, f[1] = (field){Q2_K_QS, 64, 4};
        f[2] = (field){Q2_K_D, 2, 2}, f[3] = (field){Q2_K_DMIN, 2, 2};
        return 4;
    case DW_Q3_K:
        f[0] = (field){Q3_K_HM, 32, 4}, f[1] = (field){Q3_K_QS, 64, 4};
        f[2] = (field){Q3_K_SC, 12, 4}, f[3] = (field){Q3_K_D, 2, 2};
        return 4;
    case DW_Q4_K:
        f[0] = (field){Q4_K_D, 2, 2}, f[1] = (field){Q4_K_DMIN, 2, 2};
        f[2] = (field){Q4_K_SC, 12, 4}, f[3] = (field){Q4_K_QS, 128, 4};
        return 4;
    case DW_Q5_K:
        f[0] = (field){Q5_K_D, 2, 2}, f[1] = (field){Q5_K_DMIN, 2, 2};
        f[2] = (field){Q5_K_SC, 12, 4}, f[3] = (field){Q5_K_QH, 32, 4};
        f[4] = (field){Q5_K_QS, 128, 4};
        return 5;
    case DW_Q6_K:
        f[0] = (field){Q6_K_QL, 128, 4}, f[1] = (field){Q6_K_QH, 64, 4};
        f[2] = (field){Q6_K_SC, 16, 4}, f[3] = (field){Q6_K_D, 2, 2};
        return 4;
    default: return 0;
    }
}

/* Q5_0/Q5_1's high bits: GGUF's word has bit i for k = i; the tile's has, in byte j,
 * bit s for k = 4 s + j (so step s of the kernel shifts bit s of every byte into place). */
static uint32_t high_bit_plane(uint32_t qh) {
    uint32_t out = 0;
    for (int k = 0; k < 32; k++) out |= (qh >> k & 1u) << (8 * (k % 4) + k / 4);
    return out;
}

/* Interleave ``groups`` units of ``unit`` (2 or 4) bytes from eight rows: unit-sized
 * copies with a constant size, so they compile to single loads and stores. */
static void interleave(uint8_t *out, const uint8_t *const *in, int groups, int unit) {
    for (int g = 0; g < groups; g++) {
        for (int n = 0; n < DW_TILE; n++, out += unit) {
            if (unit == 4) {
                uint32_t v = 0;
                if (in[n]) memcpy(&v, in[n] + 4 * g, 4);
                memcpy(out, &v, 4);
            } else {
                uint16_t v = 0;
                if (in[n]) memcpy(&v, in[n] + 2 * g, 2);
                memcpy(out, &v, 2);
            }
        }
    }
}

/* Tiles [begin, end) of one weight (see dw_quant_pack). */
typedef struct {
    int qtype;
    const uint8_t *const *rows;
    int64_t nrows, k;
    uint8_t *dst;
} pack_job;

static void pack_tiles(void *ctx, int64_t begin, int64_t end) {
    const pack_job *j = ctx;
    dw_qtype_info info;
    field f[5];
    int plane;
    dw_qtype_info_of(j->qtype, &info);
    const int nf = fields_of(j->qtype, f, &plane), bb = info.block_bytes;
    const int64_t blocks = j->k / info.block_k;
    for (int64_t t = begin; t < end; t++) {
        uint8_t *dst = j->dst + t * blocks * DW_TILE * bb;
        const uint8_t *src[DW_TILE];
        for (int n = 0; n < DW_TILE; n++)
            src[n] = t * DW_TILE + n < j->nrows ? j->rows[t * DW_TILE + n] : NULL;
        for (int64_t b = 0; b < blocks; b++, dst += DW_TILE * bb) {
            for (int i = 0; i < nf; i++) {
                const uint8_t *in[DW_TILE];
                for (int n = 0; n < DW_TILE; n++) in[n] = src[n] ? src[n] + b * bb + f[i].off : NULL;
                uint8_t *out = dst + DW_TILE * f[i].off;
                interleave(out, in, f[i].len / f[i].unit, f[i].unit);
                if (f[i].off == plane) {
                    for (int n = 0; n < DW_TILE; n++) {
                        uint32_t qh;
                        memcpy(&qh, out + 4 * n, 4);
                        qh = high_bit_plane(qh);
                        memcpy(out + 4 * n, &qh, 4);
                    }
                }
            }
        }
    }
}

void dw_quant_pack(int qtype, const uint8_t *const *rows, int64_t nrows, int64_t k, uint8_t *dst,
                   int threads) {
    dw_qtype_info info;
    if (!dw_qtype_info_of(qtype, &info)) return;
    pack_job j = {qtype, rows, nrows, k, dst};
    dw_parallel_for(threads, (nrows + DW_TILE - 1) / DW_TILE, pack_tiles, &j);
}

void dw_quant_dequant_row(int qtype, const uint8_t *packed, int64_t k, int64_t n, float *out) {
    dw_qtype_info info;
    if (!dw_qtype_info_of(qtype, &info)) return;
    const int64_t blocks = k / info.block_k, tile = n / DW_TILE;
    const int lane = (int)(n % DW_TILE), cpb = info.block_k / DW_CHUNK;
    const uint8_t *blk = packed + tile * blocks * DW_TILE * info.block_bytes;
    for (int64_t b = 0; b < blocks; b++, blk += DW_TILE * info.block_bytes) {
        for (int c = 0; c < cpb; c++) {
            const dw_chunk_scales cs = dw_chunk_scales_of(qtype, blk, c, lane);
            for (int kk = 0; kk < DW_CHUNK; kk++) {
                const int h = kk / 16, q = dw_quant_code(qtype, blk, c, kk / 4, lane, kk % 4);
                /* w = D P_h q + M_h: the contract's terms for a one-hot activation */
                const float m = cs.n_min == 2 ? cs.m[h] : cs.n_min == 1 ? cs.m[0] : 0.0f;
                *out++ = cs.d * (float)(cs.p[h] * q) + m;
            }
        }
    }
}

void dw_quant_act_row(const uint16_t *x, int64_t k, dw_act *out) {
    for (int64_t c = 0; c < k / DW_CHUNK; c++, x += DW_CHUNK, out++) {
        float v[DW_CHUNK], amax = 0.0f;
        int bad = 0;
        for (int i = 0; i < DW_CHUNK; i++) {
            uint32_t bits = (uint32_t)x[i] << 16;
            memcpy(&v[i], &bits, sizeof bits);
            bad |= !(fabsf(v[i]) <= 3.402823466e38f); /* inf or NaN */
            const float m = fabsf(v[i]);
            amax = m > amax ? m : amax; /* not fmaxf: a libm call here; NaN is ``bad`` */
        }
        /* a NaN or inf in the block: a NaN scale makes the outputs NaN, as a float GEMM's */
        const float d = bad ? NAN : amax / 127.0f, id = !bad && amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum_lo = 0, sum_hi = 0;
        for (int i = 0; i < DW_CHUNK; i++) {
            float r = nearbyintf(v[i] * id);
            r = bad ? 0.0f : r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
            const int q = (int)r;
            out->q[i] = (int8_t)q;
            if (i < 16) sum_lo += q;
            else sum_hi += q;
        }
        out->d = d;
        out->s[0] = d * (float)(sum_lo + sum_hi);
        out->s[1] = d * (float)sum_lo;
        out->s[2] = d * (float)sum_hi;
    }
}

int dw_qtype_act_block(int qtype) { return qtype == DW_Q4_K || qtype == DW_Q6_K ? DW_SUPER : DW_CHUNK; }

void dw_quant_act256_row(const uint16_t *x, int64_t k, dw_act256 *out) {
    for (int64_t c = 0; c < k / DW_SUPER; c++, x += DW_SUPER, out++) {
        float v[DW_SUPER], amax = 0.0f;
        int bad = 0;
        for (int i = 0; i < DW_SUPER; i++) {
            uint32_t bits = (uint32_t)x[i] << 16;
            memcpy(&v[i], &bits, sizeof bits);
            bad |= !(fabsf(v[i]) <= 3.402823466e38f); /* inf or NaN */
            const float m = fabsf(v[i]);
            amax = m > amax ? m : amax;
        }
        /* as dw_quant_act_row: a NaN or inf makes the scale, so the outputs, NaN */
        const float d = bad ? NAN : amax / 127.0f, id = !bad && amax > 0.0f ? 127.0f / amax : 0.0f;
        memset(out, 0, sizeof *out);
        for (int i = 0; i < DW_SUPER; i++) {
            float r = nearbyintf(v[i] * id);
            r = bad ? 0.0f : r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
            const int q = (int)r;
            out->q[i] = (int8_t)q;
            out->b16[i / 16] = (int16_t)(out->b16[i / 16] + q);
            out->b32[i / 32] = (int16_t)(out->b32[i / 32] + q);
        }
        out->d = d;
    }
}
