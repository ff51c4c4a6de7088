/* GGUF-quantized weights for the native GEMM (gemm_quant.c): types, the tile layout the
 * kernels stream, and the int8 activation records they multiply with.
 *
 * Weights stay in their stored GGUF type. At load (quant_pack.c) every eight output rows
 * become one TILE: block by block along K, each field of the eight GGUF blocks is
 * interleaved, fp16 scales two bytes per row (eight scales = one vcvtph2ps) and every
 * byte array four bytes per row (one 32-byte vector = eight rows x four bytes). No byte
 * is widened or decoded: a tile holds exactly the bytes of its eight GGUF blocks (Q5_0
 * and Q5_1 re-order the bits of their 32-bit high-bit word, nothing more), so the stream
 * is the file's own bits per weight.
 *
 * The kernels vectorise over the eight outputs of a tile (one fp32 lane each) and walk K
 * in chunks of 32 (one activation block). A chunk has eight STEPS of four k each; step
 * s of a chunk is one 32-byte vector whose lane n holds output n's four unsigned codes
 * for k = 4s..4s+3, decoded from the tile with a few shifts and masks. The activation
 * row is quantized to int8 per block of 32 (one fp32 scale), so a step is one
 * vpmaddubsw of the codes with the row's four int8 values broadcast to every lane.
 *
 * One chunk, output n, activation row x (the exact contract; the scalar and SIMD
 * paths both implement it and are compared bitwise by the tests):
 *   I     = sum_h P_h * sum_{k in half h} q_k * x_k             (exact int32)
 *   acc   = fma((float)I, D * x.d, acc)
 *   acc   = fma(M_t, x.s[t], acc)   for each of the type's min terms t, in order
 * where q are the unsigned codes (Q8_0: the signed bytes), P_h an integer sub-block
 * scale (1 for the 32-blocks), D the fp16 block or super-block scale as fp32, M_t a
 * per-output fp32 offset term (e.g. -8 * D for Q4_0, m for Q4_1, -dmin * m for Q4_K),
 * and x.s the block's scaled activation sums. The output is acc after the last chunk
 * (plus the bias), rounded once. Nothing in it depends on how many rows are multiplied,
 * which row this is, or which thread runs the tile: bitwise batch invariance.
 *
 * Q4_K and Q6_K instead take SUPER-BLOCK activations (llama.cpp's Q8_K scheme, with an
 * fp32 scale): the row is quantized to int8 per block of 256 (one scale X.d) with the
 * integer sums of every 16 (X.b16) and 32 (X.b32) values, and a weight super-block
 * stays integer to its end, one or two float steps per 256 k and row instead of two or
 * three per 32 (what makes a verify of several rows cost little more than a decode):
 *   Q4_K: I  = sum_c sc_c * sum_{k in chunk c} q_k X.q_k                   (exact int32)
 *         Im = sum_c m_c * X.b32[c]                                          (exact int32)
 *         acc = fma((float)I, D * X.d, acc);  acc = fma((float)Im, -(Dmin * X.d), acc)
 *   Q6_K: I  = sum_i p_i * (sum_{k in 16-block i} q_k X.q_k - 32 X.b16[i])   (exact int32)
 *         acc = fma((float)I, D * X.d, acc)
 * (sc_c, m_c the 6-bit sub-block scales and mins, p_i Q6_K's signed 8-bit scales, q_k
 * the unsigned codes). dw_qtype_act_block says which scheme a type takes.
 */
#ifndef DRAFTWISE_QUANT_H
#define DRAFTWISE_QUANT_H

#include <stdint.h>
#include <string.h>

/* GGML's type numbers (gguf.GGMLQuantizationType), so Python passes them through. */
enum {
    DW_Q4_0 = 2,
    DW_Q4_1 = 3,
    DW_Q5_0 = 6,
    DW_Q5_1 = 7,
    DW_Q8_0 = 8,
    DW_Q2_K = 10,
    DW_Q3_K = 11,
    DW_Q4_K = 12,
    DW_Q5_K = 13,
    DW_Q6_K = 14,
    /* not a GGML type: NVFP4 from safetensors (ModelOpt / compressed-tensors), repacked by
     * dw_nvfp4_pack into the layout below (GGML's own NVFP4, 40, is another block format) */
    DW_NVFP4 = 256,
};

#define DW_TILE 8    /* outputs per tile: one 8-lane fp32 vector */
#define DW_CHUNK 32  /* k per activation block */

/* One activation block: 32 int8 values with |q| <= 127 and their fp32 scale d (x ~ d q),
 * plus the block sums the offset terms need, pre-scaled: s[0] = d * sum(q[0..31]),
 * s[1] = d * sum(q[0..15]), s[2] = d * sum(q[16..31]). */
typedef struct {
    int8_t q[DW_CHUNK];
    float d;
    float s[3];
} dw_act;

/* One super-block of activations (Q4_K, Q6_K): 256 int8 values (|q| <= 127) with their
 * fp32 scale d (x ~ d q) and the integer sums of each 16 (b16) and each 32 (b32). */
#define DW_SUPER 256
typedef struct {
    int8_t q[DW_SUPER];
    float d;
    int16_t b16[16];
    int16_t b32[8];
    int8_t pad[12]; /* 320 bytes: whole cache lines */
} dw_act256;

/* Facts about a type: k per GGUF block, bytes per GGUF block (a tile block is eight). */
typedef struct {
    int block_k;
    int block_bytes;
} dw_qtype_info;

/* 0 when the type is not one the kernels run. */
int dw_qtype_info_of(int qtype, dw_qtype_info *info);

/* Repack rows of GGUF blocks into tiles: ``rows`` row pointers (NULL: a zero row, for
 * the padding of the last tile), each ``k`` weights long; dst receives
 * ceil(rows / 8) tiles of (k / block_k) tile blocks. Tiles are split between threads. */
void dw_quant_pack(int qtype, const uint8_t *const *rows, int64_t nrows, int64_t k, uint8_t *dst,
                   int threads);

/* Dequantize output row ``n`` of a packed weight to fp32 (embedding lookups, tests). */
void dw_quant_dequant_row(int qtype, const uint8_t *packed, int64_t k, int64_t n, float *out);

/* Quantize one activation row (k bf16 values, k a multiple of 32) into k / 32 blocks. */
void dw_quant_act_row(const uint16_t *x, int64_t k, dw_act *out);
/* The same into k / 256 super-blocks (k a multiple of 256). */
void dw_quant_act256_row(const uint16_t *x, int64_t k, dw_act256 *out);
/* The same two in SIMD where the build and CPU have it (NULL otherwise): the same bits. */
typedef void (*dw_act_fn)(const uint16_t *x, int64_t k, dw_act *out);
typedef void (*dw_act256_fn)(const uint16_t *x, int64_t k, dw_act256 *out);
dw_act_fn dw_act_row_simd(void);
dw_act256_fn dw_act256_row_simd(void);
/* The activation block a type multiplies with: 256 (dw_act256) or 32 (dw_act). */
int dw_qtype_act_block(int qtype);

/* The tile kernel: 8 outputs x ``rows`` (1..DW_MAX_ROWS) activation rows over the whole
 * K (``chunks`` = k / 32), results to out[r][0..7] (fp32, before the bias). x[r] points
 * at row r's activation blocks: dw_act, or dw_act256 where dw_qtype_act_block is 256. */
#define DW_MAX_ROWS 5
typedef void (*dw_tile_fn)(const uint8_t *tile, int64_t chunks, const void *const *x, int rows,
                           float (*out)[DW_TILE]);

/* The portable C implementation of every type (the reference), and the SIMD ones where
 * the build and CPU have them (NULL otherwise): AVX2 (gemm_quant_avx2.c, every type) and
 * AVX512-VNNI (gemm_quant_avx512.c: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K). All
 * follow the contract above bit for bit. */
dw_tile_fn dw_tile_kernel_scalar(int qtype);
dw_tile_fn dw_tile_kernel_avx2(int qtype);
/* Two adjacent tiles of a segment at once (the second ``tile_bytes`` after the first):
 * 16 outputs x ``rows`` (1..DW_MAX_ROWS2: 32 registers hold more rows' sums), results to
 * out[r][0..15]; the bits of two dw_tile_fn calls. */
#define DW_MAX_ROWS2 8
typedef void (*dw_tile2_fn)(const uint8_t *tile, int64_t tile_bytes, int64_t chunks,
                            const void *const *x, int rows, float (*out)[2 * DW_TILE]);
/* *pair (when not NULL): the two-tile kernel of the type (512 bits), or NULL */
dw_tile_fn dw_tile_kernel_avx512(int qtype, dw_tile2_fn *pair);
int dw_cpu_has_avx2(void);       /* avx2 + fma + f16c */
int dw_cpu_has_avx512vnni(void); /* the above + avx512f/bw/vl/vnni */

/* Which tile kernel a call runs (gemm_quant.c, dw_tile_kernel_for, is the one place that
 * chooses). DW_PATH_AUTO: the best the CPU has for the type (AVX512-VNNI, else AVX2, else
 * scalar), unless the environment variable DRAFTWISE_QUANT_SIMD names a path ("avx2",
 * "scalar" or "auto"): the A/B switch of the benchmarks. The others force a path and are
 * refused where the CPU lacks it. Every path gives the same bits. */
enum { DW_PATH_AUTO = 0, DW_PATH_SCALAR = 1, DW_PATH_AVX2 = 2, DW_PATH_AVX512 = 3 };
/* The kernel of ``qtype`` on ``path`` (AUTO resolved as above), its name ("avx512vnni",
 * "avx2", "scalar") to *name; NULL with *name an error message when refused. *pair (when
 * not NULL): the path's two-tile kernel where it has one, else NULL. */
dw_tile_fn dw_tile_kernel_for(int qtype, int path, const char **name, dw_tile2_fn *pair);

/* ---- NVFP4 (W4A16): 4-bit e2m1 weights, bf16 activations, fp32 arithmetic ----
 *
 * A tile is a 32-byte header (eight fp32 row multipliers: ModelOpt's weight_scale_2, or
 * 1 / compressed-tensors' weight_global_scale, per output row, so fused shards keep their
 * own) and then one 144-byte block per 32 k:
 *   bytes 32 v + dw_nvfp4_pos(j, n) (v, j < 4, n < 8): row n's codes of k = 8 v + j (low
 *     nibble) and k = 8 v + 4 + j (high nibble), the stored nibbles moved, never decoded;
 *   bytes 128 + 8 g + n (g < 2): row n's fp8-e4m3 scale of the 16 k of group g, as stored.
 * 4.5 bits per weight, like the file. Nothing is widened at load.
 *
 * Activations stay bf16 (W4A16), widened exactly to fp32. Weight codes decode to
 * c = 2 e2m1 (an integer in [-12, 12], so c * x is exact in fp32) and a scale byte to
 * s = fp8 / 2 (exact). Per output row n and activation row x, for each 16-k group, four
 * chains over its quarters (k = 16 g + 4 q + i, i = 0..3):
 *   p_q = c_0 x_0;  p_q = fma(c_i, x_i, p_q) for i = 1, 2, 3
 *   dot = (p_0 + p_1) + (p_2 + p_3);   acc = fma(dot, s_g, acc)
 * groups in k order, and the output is acc * multiplier (before the bias). The scalar and
 * AVX2 kernels do exactly these IEEE operations, so they agree bitwise, and nothing
 * depends on the batch, the row's position or the thread count. */
#define DW_NVFP4_HEADER 32     /* bytes of row multipliers at a tile's start */
#define DW_NVFP4_BLOCK 144     /* bytes per 32 k of a tile */

/* Where row n's byte j sits in 32 code bytes: 16 (n / 4) + 4 j + n % 4, the order in
 * which the AVX2 kernel's byte and word unpacks leave eight rows of one k in one vector's
 * lanes (gemm_nvfp4_avx2.c). */
static inline int dw_nvfp4_pos(int j, int n) { return 16 * (n / 4) + 4 * j + n % 4; }

/* Bytes of a packed NVFP4 weight: ceil(rows / 8) tiles of header + k / 32 blocks. */
int64_t dw_nvfp4_bytes(int64_t rows, int64_t k);
/* Repack ``rows`` rows: codes[r] -> k / 2 stored bytes, scales[r] -> k / 16 fp8 bytes,
 * mult[r] the row's fp32 multiplier (NULL code pointer: a zero row). Tiles split between
 * threads. */
void dw_nvfp4_pack(const uint8_t *const *codes, const uint8_t *const *scales, const float *mult,
                   int64_t rows, int64_t k, uint8_t *dst, int threads);
/* Output row n of a packed NVFP4 weight as fp32: c * s * multiplier per weight. */
void dw_nvfp4_dequant_row(const uint8_t *packed, int64_t k, int64_t n, float *out);
/* Widen one bf16 activation row to fp32 (the NVFP4 kernels' input). */
void dw_widen_row(const uint16_t *x, int64_t k, float *out);
/* The NVFP4 tile kernels: x[r] points at row r's k fp32 values; out as dw_tile_fn. */
dw_tile_fn dw_nvfp4_kernel_scalar(void);
dw_tile_fn dw_nvfp4_kernel_simd(void);

/* fp8 e4m3 (fn: no inf; 0x7f / 0xff are NaN, refused at load) / 2, exact and without a
 * subnormal float on the way (so DAZ/FTZ cannot change it): a normal byte's exponent is
 * rebased by 119 = 127 - 7 - 1 in the bits, a subnormal one (exponent 0) is its mantissa
 * M times 2^-10. */
static inline float dw_e4m3_half(uint8_t b) {
    const uint32_t m = b & 0x7fu;
    float f;
    if (m > 7) {
        const uint32_t bits = (m << 20) + (119u << 23);
        memcpy(&f, &bits, sizeof f);
    } else {
        f = (float)m * 0x1p-10f;
    }
    return b & 0x80u ? -f : f;
}

/* fp16 bits -> fp32, exact (subnormals, inf and NaN included), like vcvtph2ps. */
static inline float dw_half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = 113;
        while (!(man & 0x400u)) man <<= 1, e--;
        bits = sign | ((uint32_t)e << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t dw_load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

#endif
