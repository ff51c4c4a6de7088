"""Tiny GGUF files written with gguf-py's GGUFWriter, the way llama.cpp's converter writes.

``write_tiny_gguf`` keeps the HF-layout fp32 weights it started from, so tests can check
the loader's dequantization and Q/K un-permutation against a direct reference. The file
also carries a small byte-level BPE vocabulary and a chat template, so it loads end to end.

Types gguf-py can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16) are quantized from the fp32
weights; the others (K-quants, IQ types) get random blocks (:func:`random_blocks`: any
bit pattern is a valid block once its fp16 scales are finite), and the recorded HF weight
is then their dequantization.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

#: byte offsets of the fp16 scale fields in each type's block (gguf-py's block layouts)
FP16_FIELDS = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
    Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
    Q.IQ4_NL: (0,),
}
#: per-type scale giving dequantized weights of roughly unit size (codes x sub-scales)
_UNIT = {Q.Q2_K: 1 / 12, Q.Q3_K: 1 / 64, Q.Q4_K: 1 / 128, Q.Q5_K: 1 / 256, Q.Q6_K: 1 / 1024,
         Q.IQ4_NL: 1 / 64}
QUANTIZABLE = frozenset({Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.BF16})


def random_blocks(qtype: Q, rows: int, cols: int, rng: np.random.Generator,
                  scale: float = 0.08) -> np.ndarray:  # [rows, row_bytes] uint8
    """Random GGUF blocks of ``qtype`` whose fp16 scales are finite, near ``scale``."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    unit = _UNIT.get(qtype, 1 / 16) * scale
    for o in FP16_FIELDS[qtype]:
        d = (unit * (0.5 + rng.random((rows, cols // block)))).astype(np.float16)
        raw[:, :, o : o + 2] = d.view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGE_WORDS = ["the", "he", "in", "er", "an", "on", "re", "at", "hello", "world", "is", "it"]
TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_chars() -> list[str]:
    """GPT-2's printable spelling of bytes 0..255."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): specials, 256 bytes, then merged words."""
    tokens = SPECIALS + byte_chars()
    types = [3] * len(SPECIALS) + [1] * 256
    merges: list[str] = []
    for word in MERGE_WORDS + ["Ġ" + w for w in MERGE_WORDS]:
        cur = word[0]
        for ch in word[1:]:
            merged = cur + ch
            if merged not in tokens:
                merges.append(f"{cur} {ch}")
                tokens.append(merged)
                types.append(1)
            cur = merged
    return tokens, types, merges


@dataclass
class TinyGGUF:
    """A written file and the HF-layout fp32 weights it was made from."""

    path: Path
    arch: str
    hf: dict[str, np.ndarray] = field(default_factory=dict)
    qtype: dict[str, Q] = field(default_factory=dict)  # by GGUF name


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py ``permute`` (HF halves -> adjacent pairs)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of :func:`permute_qk` (adjacent pairs back to HF halves)."""
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    matrix_type: Q = Q.Q8_0,
    embed_type: Q = Q.F16,
    tensor_types: dict[str, Q] | None = None,
    tied: bool = True,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 128,
    seed: int = 0,
    extra_kv: dict[str, int] | None = None,
    extra_tensor: str | None = None,
    declared_ffn: int | None = None,
) -> TinyGGUF:
    """Write a small model; qwen2 gets q/k/v biases, qwen3 q/k norms. ``tensor_types`` overrides
    the stored type per GGUF tensor kind (``tensor_types={"attn_v": Q.Q6_K, "output": Q.Q6_K}``)."""
    rng = np.random.default_rng(seed)
    tokens, types, merges = tiny_vocab()
    vocab = len(tokens)
    head_dim = hidden // heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(declared_ffn or ffn)  # a wrong value makes mis-shaped tensors
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    for key, value in (extra_kv or {}).items():
        w.add_uint32(key, value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)

    out = TinyGGUF(path, arch)

    def put(gguf_name: str, hf_name: str, arr: np.ndarray, qtype: Q) -> None:
        kind = gguf_name.split(".")[-2]
        qtype = (tensor_types or {}).get(kind, qtype) if arr.ndim == 2 else qtype
        permute = None
        if arch == "llama" and kind == "attn_q":
            permute = heads
        elif arch == "llama" and kind == "attn_k":
            permute = kv_heads
        if arr.ndim == 2 and qtype not in QUANTIZABLE | {Q.F32, Q.F16}:
            raw = random_blocks(qtype, arr.shape[0], arr.shape[1], rng)
            w.add_tensor(gguf_name, raw, raw_shape=raw.shape, raw_dtype=qtype)
            arr = gguf.quants.dequantize(raw, qtype).astype(np.float32).reshape(arr.shape)
            if permute is not None:  # the stored blocks are the permuted layout
                arr = unpermute_qk(arr, permute)
            out.hf[hf_name], out.qtype[gguf_name] = arr, qtype
            return
        out.hf[hf_name] = arr
        stored = arr if permute is None else permute_qk(arr, permute)
        if arr.ndim == 1 or qtype == Q.F32:
            w.add_tensor(gguf_name, stored.astype(np.float32))
            qtype = Q.F32
        elif qtype == Q.F16:
            w.add_tensor(gguf_name, stored.astype(np.float16))
        else:
            w.add_tensor(gguf_name, gguf.quants.quantize(stored, qtype), raw_dtype=qtype)
        out.qtype[gguf_name] = qtype

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.08).astype(np.float32)

    def vec(n: int, base: float = 1.0, scale: float = 0.1) -> np.ndarray:
        return (base + scale * rng.standard_normal(n)).astype(np.float32)

    put("token_embd.weight", "model.embed_tokens.weight", mat(vocab, hidden), embed_type)
    for i in range(layers):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        put(b + "attn_norm.weight", p + "input_layernorm.weight", vec(hidden), Q.F32)
        put(b + "attn_q.weight", p + "self_attn.q_proj.weight", mat(hidden, hidden), matrix_type)
        put(
            b + "attn_k.weight",
            p + "self_attn.k_proj.weight",
            mat(kv_heads * head_dim, hidden),
            matrix_type,
        )
        put(
            b + "attn_v.weight",
            p + "self_attn.v_proj.weight",
            mat(kv_heads * head_dim, hidden),
            matrix_type,
        )
        if arch == "qwen2":
            put(b + "attn_q.bias", p + "self_attn.q_proj.bias", vec(hidden, 0.0), Q.F32)
            put(
                b + "attn_k.bias", p + "self_attn.k_proj.bias", vec(kv_heads * head_dim, 0.0), Q.F32
            )
            put(
                b + "attn_v.bias", p + "self_attn.v_proj.bias", vec(kv_heads * head_dim, 0.0), Q.F32
            )
        if arch == "qwen3":
            put(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", vec(head_dim), Q.F32)
            put(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", vec(head_dim), Q.F32)
        put(
            b + "attn_output.weight",
            p + "self_attn.o_proj.weight",
            mat(hidden, hidden),
            matrix_type,
        )
        put(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", vec(hidden), Q.F32)
        put(b + "ffn_gate.weight", p + "mlp.gate_proj.weight", mat(ffn, hidden), matrix_type)
        put(b + "ffn_up.weight", p + "mlp.up_proj.weight", mat(ffn, hidden), matrix_type)
        put(b + "ffn_down.weight", p + "mlp.down_proj.weight", mat(hidden, ffn), matrix_type)
    put("output_norm.weight", "model.norm.weight", vec(hidden), Q.F32)
    if not tied:
        put("output.weight", "lm_head.weight", mat(vocab, hidden), matrix_type)
    if extra_tensor:
        w.add_tensor(extra_tensor, np.zeros(hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Callable[..., TinyGGUF]:
    """``tiny_gguf(arch="qwen2", matrix_type=Q.Q4_0)`` -> a fresh file in tmp_path."""
    count = iter(range(1000))

    def make(**kwargs: object) -> TinyGGUF:
        name = f"tiny-{kwargs.get('arch', 'llama')}-{next(count)}.gguf"
        return write_tiny_gguf(tmp_path / name, **kwargs)  # type: ignore[arg-type]

    return make


def retype(src: Path, dst: Path, tensors: list[str], number: int) -> None:
    """Copy a GGUF, changing the declared type number in these tensors' infos (a file
    that declares a type its bytes are not, or a number no reader knows)."""
    data = bytearray(src.read_bytes())
    for tensor in tensors:
        name = tensor.encode()
        at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
        n_dims = int.from_bytes(data[at : at + 4], "little")
        at += 4 + 8 * n_dims
        data[at : at + 4] = number.to_bytes(4, "little")
    dst.write_bytes(bytes(data))
