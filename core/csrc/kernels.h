/* The Python-callable entry points of draftwise._cpu_kernels (one per .c file). Each
 * takes raw data pointers and sizes as Python ints (METH_FASTCALL): the Python side
 * (draftwise/models/attention.py, draftwise/models/fused.py) checks dtypes, devices and
 * contiguity before calling, so the C side trusts its arguments. */
#ifndef DRAFTWISE_KERNELS_H
#define DRAFTWISE_KERNELS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "vec.h"

PyObject *dw_paged_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dw_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dw_rms_norm_zc(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dw_add_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dw_silu_mul(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dw_rope(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dw_argmax_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* gemm_quant.c: GGUF-quantized weights (every build; SIMD where the build has AVX2) */
PyObject *dw_linear_quant(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dw_quant_pack_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dw_quant_dequant_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dw_quant_simd(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dw_quant_act_block_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dw_nvfp4_pack_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* gemm_bf16.c: vdpbf16ps on AVX512-BF16 builds, AVX2 FMAs or the portable vec.h path elsewhere */
#define DW_HAVE_LINEAR_BF16 1
PyObject *dw_linear_bf16(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* gguf_strings.c: a GGUF string array into a list of str (formats/gguf_header.py) */
PyObject *dw_gguf_strings(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* markov.c: DSpark's greedy Markov pass on the packed GEMM (every build: gemm_bf16.h) */
PyObject *dw_markov_pass(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* ---- the GIL-free bodies the decoder stack (decoder_stack.c) composes ----
 * Each Python entry point above parses its arguments and runs one of these with the GIL
 * released; decoder_stack.c runs the same functions in the order models/llama.py calls
 * the entry points, so a layer gives the same bits either way. */
enum { DW_ERR_VALUE = -1, DW_ERR_MEMORY = -2 };
/* Raise a *_run failure: DW_ERR_MEMORY as MemoryError, else ValueError(err). */
PyObject *dw_raise(int rc, const char *err);

/* One linear_quant call (gemm_quant.c): y[m, n] (bf16, or fp32 when y_f32) = x[m, k] (bf16,
 * rows x_stride apart) @ W^T + bias (bf16 or NULL), W the segment table (int64 [nseg, 4]). */
typedef struct {
    const uint16_t *x;
    const int64_t *table;
    const uint16_t *bias;
    void *y;
    int64_t nseg, m, k, n, x_stride, y_stride;
    int y_f32;
    int64_t threads;
    int path;
} dw_gemm_call;
int dw_linear_quant_run(const dw_gemm_call *c, const char **err);

/* elementwise.c: rms_norm and add_rms_norm of ``rows`` contiguous rows; silu_mul of a fused
 * [gate | up] (split over ``threads`` where it pays); rope in place (pos NULL: row t is
 * token t's table row). */
void dw_rms_norm_rows(const uint16_t *x, const uint16_t *w, uint16_t *out, int64_t rows,
                      int64_t dim, float eps);
void dw_add_rms_norm_rows(const uint16_t *h, uint16_t *delta, const uint16_t *w, uint16_t *out,
                          int64_t rows, int64_t dim, float eps);
void dw_silu_mul_run(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t inter,
                     int64_t threads);
void dw_rope_rows(uint16_t *x, const uint16_t *cos, const uint16_t *sin, const int64_t *pos,
                  int64_t tokens, int64_t heads, int64_t d, int64_t stride);

/* paged_attention.c: one call's arguments (the layouts are that file's header). */
typedef struct {
    const uint16_t *q, *k, *v; /* this step's [T, heads|kv_heads, dim], rows strided */
    uint16_t *out, *kc, *vc;
    const int64_t *slots, *qsl, *seq, *bt;
    int64_t q_stride, k_stride, v_stride; /* elements between consecutive tokens */
    int64_t tokens, width, rows, heads, kv_heads, dim, block_size, window;
    float scale;
} dw_attention_args;
/* 0, or DW_ERR_MEMORY (scratch); the shapes are checked by the caller (dw_attention_shape_ok) */
int dw_paged_attention_run(const dw_attention_args *a, int threads);
/* Whether the kernel takes these heads (head_dim a multiple of 16 up to 512, GQA groups). */
int dw_attention_shape_ok(int64_t heads, int64_t kv_heads, int64_t dim);

/* decoder_stack.c */
PyObject *dw_decoder_layers(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* Parse n leading pointer args then the rest as int64; returns 0 or -1 with an exception. */
static inline int dw_parse(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected,
                           int n_ptrs, void **ptrs, int64_t *ints, const char *name) {
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", name, expected, nargs);
        return -1;
    }
    for (int i = 0; i < n_ptrs; i++) {
        ptrs[i] = PyLong_AsVoidPtr(args[i]);
        if (PyErr_Occurred()) return -1;
    }
    for (Py_ssize_t i = n_ptrs; i < expected; i++) {
        ints[i - n_ptrs] = PyLong_AsLongLong(args[i]);
        if (PyErr_Occurred()) return -1;
    }
    return 0;
}

/* A float that crossed from Python as its float32 bit pattern (models.kernels.f32_bits). */
static inline float dw_f32_from_bits(int64_t bits) {
    uint32_t b = (uint32_t)bits;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

#endif
