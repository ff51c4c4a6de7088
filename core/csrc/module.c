/* draftwise._cpu_kernels: hand-written CPU kernels, built at install when a C compiler
 * exists (setup.py). Each has a torch reference in draftwise.models and tests that pin
 * the two together. */
#include "kernels.h"

static PyMethodDef methods[] = {
    {"paged_attention", (PyCFunction)(void (*)(void))dw_paged_attention, METH_FASTCALL,
     "paged_attention(q, k, v, out, k_cache, v_cache, slot_mapping, query_start_loc, seq_lens, "
     "block_tables, q_stride, k_stride, v_stride, tokens, width, rows, heads, kv_heads, "
     "head_dim, block_size, window, scale_bits, threads)"},
    {"rms_norm", (PyCFunction)(void (*)(void))dw_rms_norm, METH_FASTCALL,
     "rms_norm(x, weight, out, rows, dim, eps_bits): bf16, transformers' rounding"},
    {"rms_norm_zc", (PyCFunction)(void (*)(void))dw_rms_norm_zc, METH_FASTCALL,
     "rms_norm_zc(x, weight, out, rows, dim, eps_bits): zero-centred, x-hat * (1 + w) in fp32"},
    {"add_rms_norm", (PyCFunction)(void (*)(void))dw_add_rms_norm, METH_FASTCALL,
     "add_rms_norm(h, delta, weight, out, rows, dim, eps_bits): delta = h + delta in place, "
     "out = rms_norm(delta)"},
    {"silu_mul", (PyCFunction)(void (*)(void))dw_silu_mul, METH_FASTCALL,
     "silu_mul(gate_up, out, rows, inter, threads): out = silu(gate) * up, bf16"},
    {"rope", (PyCFunction)(void (*)(void))dw_rope, METH_FASTCALL,
     "rope(x, cos, sin_signed, positions, tokens, heads, head_dim, x_row_stride): in place"},
    {"argmax_f32", (PyCFunction)(void (*)(void))dw_argmax_f32, METH_FASTCALL,
     "argmax_f32(x, out_int64, rows, cols): torch.argmax(x, -1) of contiguous fp32 rows"},
    {"linear_quant", (PyCFunction)(void (*)(void))dw_linear_quant, METH_FASTCALL,
     "linear_quant(x, segments, bias_or_0, y, nseg, rows, in_features, out_features, "
     "x_stride, y_stride, y_f32, threads, path): y = x @ W^T + b, W GGUF-quantized in "
     "tiles (quant.h); segments int64 [nseg, 4] = (ggml type, data, first column, columns)"},
    {"quant_pack", (PyCFunction)(void (*)(void))dw_quant_pack_py, METH_FASTCALL,
     "quant_pack(ggml_type, row_pointers, dst, rows, k, threads): GGUF rows (int64 "
     "addresses, 0 for zero padding) into tiles at dst"},
    {"quant_dequant_rows", (PyCFunction)(void (*)(void))dw_quant_dequant_rows, METH_FASTCALL,
     "quant_dequant_rows(ggml_type, packed, ids, out, count, k, out_f32): rows of a packed "
     "weight to bf16 (or fp32)"},
    {"quant_simd", (PyCFunction)(void (*)(void))dw_quant_simd, METH_FASTCALL,
     "quant_simd([ggml_type[, path]]): the tile kernel the quantized GEMM runs (avx512vnni, avx2 or scalar)"},
    {"quant_act_block", (PyCFunction)(void (*)(void))dw_quant_act_block_py, METH_FASTCALL,
     "quant_act_block(ggml_type): values per int8 activation block (and scale) the type's "
     "kernel multiplies with: 32, or 256 for the super-block types"},
    {"nvfp4_pack", (PyCFunction)(void (*)(void))dw_nvfp4_pack_py, METH_FASTCALL,
     "nvfp4_pack(code_rows, scale_rows, multipliers, dst, rows, k, threads): NVFP4 rows "
     "(int64 addresses, 0 for zero padding; fp32 multipliers) into tiles at dst (quant.h); "
     "linear_quant runs them as type 256"},
    {"gguf_strings", (PyCFunction)(void (*)(void))dw_gguf_strings, METH_FASTCALL,
     "gguf_strings(buffer, offset, count): a GGUF string array as (list of str, end offset), "
     "or None where a string runs past the buffer or is not UTF-8 (the caller names it)"},
    {"markov_pass", (PyCFunction)(void (*)(void))dw_markov_pass, METH_FASTCALL,
     "markov_pass(w1, w2_packed, w2_rows_or_0, norms_or_0, latent_w_or_0, latent_b_or_0, "
     "tables, hidden, base, counts, anchors, tok_out, prev_out, stats_out, d2t_or_0, kind, "
     "vocab, rank, hidden_size, rows, slots, depth, lane_cap, screen, give_up, max_blocks, "
     "guess_tokens, threads, w1_rows): DSpark's greedy Markov pass (markov.c)"},
    {"decoder_layers", (PyCFunction)(void (*)(void))dw_decoder_layers, METH_FASTCALL,
     "decoder_layers(plan, caches, h, delta_or_0, out_h, out_d, cos, sin, slot_mapping, "
     "query_start_loc, seq_lens, block_tables, first, last, tokens, width, rows, hidden, "
     "heads, kv_heads, head_dim, inter, block_size, eps_bits, scale_bits, threads, path): "
     "llama decoder layers [first, last) on GGUF-quantized weights (decoder_stack.c)"},
#ifdef DW_HAVE_LINEAR_BF16
    {"linear_bf16", (PyCFunction)(void (*)(void))dw_linear_bf16, METH_FASTCALL,
     "linear_bf16(x, packed, bias_or_0, y, rows, in_features, out_features, x_stride, "
     "y_stride, threads): y = x @ W^T + b, W packed [N/64][K/2][64][2]"},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cpu_kernels", "Hand-written CPU kernels (see core/csrc).", -1,
    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cpu_kernels(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    /* which instruction path linear_bf16 was built with (reported at start-up and in bench) */
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    const char *isa = "avx512bf16";
#elif defined(__AVX2__) && defined(__FMA__)
    const char *isa = "avx2-fma";
#else
    const char *isa = "portable";
#endif
    if (PyModule_AddStringConstant(m, "linear_bf16_isa", isa) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
