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

/* markov.c: DSpark's greedy Markov pass on the packed GEMM (every build: gemm_bf16.h) */
PyObject *dw_markov_pass(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

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
