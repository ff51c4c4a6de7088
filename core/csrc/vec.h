/* Shared helpers for the CPU kernels: 16-lane float vectors (GCC/Clang vector extensions,
 * so the same source builds for AVX-512, AVX2 or NEON) and bf16 <-> fp32 conversions
 * that round exactly like torch's. */
#ifndef DRAFTWISE_VEC_H
#define DRAFTWISE_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
typedef float v16f __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t v16i __attribute__((vector_size(LANES * sizeof(int32_t))));
typedef uint32_t v16u __attribute__((vector_size(LANES * sizeof(uint32_t))));

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest even, NaN kept quiet: torch's float -> bfloat16 conversion. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)0x7fc0;
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* The lane-independent helpers (bf16 rounding, broadcast, exp, bf16 loads and stores),
 * defined once for each vector width by this macro: P the prefix, VF/VI/VU the float,
 * int32 and uint32 vector types, N their lanes. Each lane's result depends on that lane
 * alone, so a kernel gets the same bits at either width. */
#define DW_VEC_HELPERS(P, VF, VI, VU, N)                                                   \
    static inline VF P##_round_bf16(VF x) {                                                \
        VU bits = (VU)x;                                                                   \
        VU rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;                 \
        VU nan = (VU)((bits & 0x7fffffffu) > 0x7f800000u); /* all-ones where NaN */        \
        return (VF)((rounded & ~nan) | (0x7fc00000u & nan));                               \
    }                                                                                      \
    /* broadcasts: vector + scalar is one broadcast (a lane-by-lane fill was compiled to \
     * lane inserts in the attention's inner loop: 1.4x slower there) */                  \
    static inline VU P##_splat_u32(uint32_t x) { return (VU){0} + x; }                     \
    static inline VF P##_splat(float x) {                                                  \
        uint32_t bits;                                                                     \
        memcpy(&bits, &x, sizeof bits);                                                    \
        return (VF)P##_splat_u32(bits);                                                    \
    }                                                                                      \
    /* exp(x) for x <= 0 (scores minus their max): Cody-Waite range reduction and a        \
     * degree-6 polynomial, ~2 ulp. */                                                     \
    static inline VF P##_exp_nonpos(VF x) {                                                \
        const VF lo = P##_splat(-87.0f);                                                   \
        VI below = x < lo;                                                                 \
        x = (VF)((below & (VI)lo) | (~below & (VI)x));                                     \
        const VF magic = P##_splat(12582912.0f); /* 1.5 * 2^23: round to nearest integer */ \
        VF n = (x * P##_splat(1.44269504088896341f) + magic) - magic;                      \
        VF r = x - n * P##_splat(0.693359375f);                                            \
        r = r - n * P##_splat(-2.12194440e-4f);                                            \
        VF p = P##_splat(1.9875691500e-4f);                                                \
        p = p * r + P##_splat(1.3981999507e-3f);                                           \
        p = p * r + P##_splat(8.3334519073e-3f);                                           \
        p = p * r + P##_splat(4.1665795894e-2f);                                           \
        p = p * r + P##_splat(1.6666665459e-1f);                                           \
        p = p * r + P##_splat(5.0000001201e-1f);                                           \
        p = p * (r * r) + r + P##_splat(1.0f);                                             \
        VI e = (__builtin_convertvector(n, VI) + 127) << 23;                               \
        return p * (VF)e;                                                                  \
    }                                                                                      \
    /* N bf16 values as fp32 (exact) */                                                    \
    static inline VF P##_load_bf16(const uint16_t *p) {                                    \
        uint16_t tmp[N];                                                                   \
        memcpy(tmp, p, sizeof tmp);                                                        \
        VU bits;                                                                           \
        for (int l = 0; l < (N); l++) bits[l] = (uint32_t)tmp[l] << 16;                    \
        return (VF)bits;                                                                   \
    }                                                                                      \
    /* N fp32 values stored as bf16, rounded to nearest even */                            \
    static inline void P##_store_bf16(uint16_t *p, VF x) {                                 \
        typedef uint16_t half_t __attribute__((vector_size(2 * (N))));                     \
        const half_t h = __builtin_convertvector((VU)P##_round_bf16(x) >> 16, half_t);     \
        memcpy(p, &h, sizeof h);                                                           \
    }                                                                                      \
    /* N uint16 values zero-extended to 32 bits */                                         \
    static inline VU P##_load_u16(const uint16_t *p) {                                     \
        uint16_t tmp[N];                                                                   \
        memcpy(tmp, p, sizeof tmp);                                                        \
        VU x;                                                                              \
        for (int l = 0; l < (N); l++) x[l] = tmp[l];                                       \
        return x;                                                                          \
    }

/* acc + a.lo * b.lo + a.hi * b.hi per lane, where each 32-bit lane of a and b holds two
 * bf16 values (lo in the low half): two fused multiply-adds (where the build has
 * AVX512-BF16, v16_dot2_bf16 is one vdpbf16ps instead; a build always uses one, so
 * results never depend on the batch). */
#define DW_VEC_DOT2(P, VF, VU)                                                             \
    static inline VF P##_dot2_bf16(VF acc, VU a, VU b) {                                   \
        const VF alo = (VF)(a << 16), ahi = (VF)(a & 0xffff0000u);                         \
        const VF blo = (VF)(b << 16), bhi = (VF)(b & 0xffff0000u);                         \
        return acc + alo * blo + ahi * bhi;                                                \
    }

DW_VEC_HELPERS(v16, v16f, v16i, v16u, 16)

/* 8-lane vectors: GCC lowers a 16-lane generic vector badly where the hardware's are 8
 * wide (AVX2: through the stack; an argmax over 49k floats took 110 us, 7.8 us at 8
 * lanes). See EW_LANES below. */
typedef float v8f __attribute__((vector_size(8 * sizeof(float))));
typedef int32_t v8i __attribute__((vector_size(8 * sizeof(int32_t))));
typedef uint32_t v8u __attribute__((vector_size(8 * sizeof(uint32_t))));
DW_VEC_HELPERS(v8, v8f, v8i, v8u, 8)
DW_VEC_DOT2(v8, v8f, v8u)

/* Fixed pairwise tree over the 16 lanes. */
static inline float v16_sum(v16f x) {
    float a[LANES];
    memcpy(a, &x, sizeof a);
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) a[i] = a[i] + a[i + w];
    return a[0];
}

/* v16_dot2_bf16: one vdpbf16ps where the build has AVX512-BF16 (see DW_VEC_DOT2) */
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
static inline v16f v16_dot2_bf16(v16f acc, v16u a, v16u b) {
    return (v16f)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b);
}
#else
DW_VEC_DOT2(v16, v16f, v16u)
#endif

/* Transpose a 16x16 fp32 tile held as 16 row vectors, in place: four stages that swap
 * the off-diagonal b x b sub-blocks (b = 8, 4, 2, 1), 64 two-vector shuffles in all
 * instead of 256 scalar moves. Exact (moves only). */
#define DW_SWAP_STAGE(VF, N, r, b, LO, HI)                                               \
    for (int i_ = 0; i_ < (N); i_++) {                                                   \
        if (i_ & (b)) continue;                                                          \
        const VF a_ = (r)[i_], c_ = (r)[i_ + (b)];                                       \
        (r)[i_] = __builtin_shufflevector(a_, c_, LO);                                   \
        (r)[i_ + (b)] = __builtin_shufflevector(a_, c_, HI);                             \
    }
/* lo[c] = c & b ? c_[c ^ b] : a_[c]; hi[c] = c & b ? c_[c] : a_[c ^ b] (c_ indexes from 16) */
#define V16_LO8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define V16_HI8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define V16_LO4 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define V16_HI4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define V16_LO2 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define V16_HI2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define V16_LO1 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define V16_HI1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31

static inline void v16_transpose(v16f r[LANES]) {
    DW_SWAP_STAGE(v16f, 16, r, 8, V16_LO8, V16_HI8)
    DW_SWAP_STAGE(v16f, 16, r, 4, V16_LO4, V16_HI4)
    DW_SWAP_STAGE(v16f, 16, r, 2, V16_LO2, V16_HI2)
    DW_SWAP_STAGE(v16f, 16, r, 1, V16_LO1, V16_HI1)
}

/* Transpose an 8x8 fp32 tile held as 8 row vectors, in place: stages b = 4, 2, 1 of the
 * same rule at 8 lanes (c_ indexes from 8). Exact (moves only). */
#define V8_LO4 0, 1, 2, 3, 8, 9, 10, 11
#define V8_HI4 4, 5, 6, 7, 12, 13, 14, 15
#define V8_LO2 0, 1, 8, 9, 4, 5, 12, 13
#define V8_HI2 2, 3, 10, 11, 6, 7, 14, 15
#define V8_LO1 0, 8, 2, 10, 4, 12, 6, 14
#define V8_HI1 1, 9, 3, 11, 5, 13, 7, 15
static inline void v8_transpose(v8f r[8]) {
    DW_SWAP_STAGE(v8f, 8, r, 4, V8_LO4, V8_HI4)
    DW_SWAP_STAGE(v8f, 8, r, 2, V8_LO2, V8_HI2)
    DW_SWAP_STAGE(v8f, 8, r, 1, V8_LO1, V8_HI1)
}

/* The width of the loops whose lanes are independent (elementwise kernels, argmax, the
 * attention kernel's per-key and per-dim lanes): 16 only where the build has AVX-512
 * (and off x86, as before), else 8 (see v8f above). */
#if defined(__AVX512F__) || !(defined(__x86_64__) || defined(__i386__))
#define EW_LANES 16
typedef v16f vewf;
typedef v16i vewi;
typedef v16u vewu;
#define EW(name) v16_##name
#else
#define EW_LANES 8
typedef v8f vewf;
typedef v8i vewi;
typedef v8u vewu;
#define EW(name) v8_##name
#endif

/* 16 running fp32 sums at EW_LANES width (sum l takes the l-th of every 16 values added)
 * and the fixed pairwise tree over them (v16_sum's): the one way the kernels reduce a
 * row (the norms' sum of squares, the softmax denominator), with the same bits at 16
 * lanes (one vector) and at 8 (two, whose sum is the tree's first stage). */
typedef struct {
    vewf part[16 / EW_LANES];
} dw_sum16;

static inline dw_sum16 dw_sum16_zero(void) {
    dw_sum16 s;
    for (int k = 0; k < 16 / EW_LANES; k++) s.part[k] = EW(splat)(0.0f);
    return s;
}

/* the next 16 values, from x (fp32) */
static inline void dw_sum16_add(dw_sum16 *s, const float *x) {
    for (int k = 0; k < 16 / EW_LANES; k++) {
        vewf v;
        memcpy(&v, x + k * EW_LANES, sizeof v);
        s->part[k] = s->part[k] + v;
    }
}

/* the next 16 values' squares, from x (bf16) */
static inline void dw_sum16_add_squares_bf16(dw_sum16 *s, const uint16_t *x) {
    for (int k = 0; k < 16 / EW_LANES; k++) {
        const vewf v = EW(load_bf16)(x + k * EW_LANES);
        s->part[k] = s->part[k] + v * v;
    }
}

static inline float dw_sum16_total(const dw_sum16 *s) {
    v16f all;
    memcpy(&all, s->part, sizeof all);
    return v16_sum(all);
}

#endif
