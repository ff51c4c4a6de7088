"""Batch invariance, bitwise, in bfloat16: a token's logits do not depend on the batch.

The product needs speculative greedy output to be token-identical to plain decoding, so a
query token must give the same bits whether it is decoded alone, is the first of 1 + k
tokens of a verify row, or shares the step with rows of other lengths (padding). In
bf16 this also makes a prefill equal to token-by-token decode. fp32 is only close: MKL's
fp32 GEMM rounds differently for different row counts.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from draftwise.models import attention
from draftwise.models.attention import CHUNK, AttentionMetadata, paged_attention
from draftwise.models.batch import build_forward_batch
from draftwise.models.loader import load_model


def _attention_case(
    heads: int,
    kv_heads: int,
    rows: dict[str, tuple[int, int]],
    cache,
    backend: str = "torch",
    window: int | None = None,
) -> dict:
    """Run one attention step; ``rows[name] = (context_before, new_tokens)``."""
    d = 64
    k_cache, v_cache, table_of, q_all, k_all, v_all = cache
    names = list(rows)
    batch = build_forward_batch(
        [[0] * rows[r][1] for r in names],
        [rows[r][0] for r in names],
        [table_of[r] for r in names],
        k_cache.shape[1],
        [list(range(rows[r][1])) for r in names],
    )
    pos = batch.positions
    owner = torch.cat([torch.full((rows[r][1],), "abc".index(r)) for r in names])
    q = q_all[owner, pos].view(-1, heads, d)
    k = k_all[owner, pos].view(-1, kv_heads, d)
    v = v_all[owner, pos].view(-1, kv_heads, d)
    meta = AttentionMetadata.build(batch, k_cache.shape[1], (window,), backend=backend)
    out = paged_attention(q, k, v, k_cache, v_cache, meta, d**-0.5, window)
    result, start = {}, 0
    for r in names:
        result[r] = out[start : start + rows[r][1]]
        start += rows[r][1]
    return result


BACKENDS = [
    "torch",
    pytest.param(
        "native",
        marks=pytest.mark.skipif(attention._kernels is None, reason="C kernels not built"),
    ),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "window"), [(9, 3, None), (4, 4, None), (8, 2, 300)]
)
def test_paged_attention_is_batch_invariant(
    heads: int, kv_heads: int, window: int | None, backend: str
) -> None:
    """Alone vs verify row vs batched with shorter and much longer rows, across CHUNKs."""
    torch.manual_seed(0)
    d, bs, max_len = 64, 16, 2200
    blocks_per_row = max_len // bs + 1
    names = ["a", "b", "c"]
    perm = torch.randperm(3 * blocks_per_row).tolist()
    table_of = {r: perm[i * blocks_per_row : (i + 1) * blocks_per_row] for i, r in enumerate(names)}
    k_cache = torch.zeros(3 * blocks_per_row, bs, kv_heads, d, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    # per row, per position: the q/k/v that position's token has
    q_all = torch.randn(3, max_len, heads * d).bfloat16()
    k_all = torch.randn(3, max_len, kv_heads * d).bfloat16()
    v_all = torch.randn(3, max_len, kv_heads * d).bfloat16()
    cache = (k_cache, v_cache, table_of, q_all, k_all, v_all)
    def case(rows: dict[str, tuple[int, int]]) -> dict:
        return _attention_case(heads, kv_heads, rows, cache, backend, window)

    case({"a": (0, max_len), "b": (0, 40), "c": (0, max_len)})
    for p in (4, CHUNK - 1, CHUNK, 700, 1023, 1300):
        k = 4
        alone = torch.cat([case({"a": (p + j, 1)})["a"] for j in range(k + 1)])
        verify = case({"a": (p, k + 1)})["a"]
        assert torch.equal(verify, alone), p
        mixed = case({"b": (20, 9), "a": (p, k + 1), "c": (2100, 3)})["a"]
        assert torch.equal(mixed, alone), p
        single = case({"c": (2000, 1), "a": (p, 1)})["a"]
        assert torch.equal(single, alone[:1]), p
        # a prefill chunk that ends where the verify row ends computes the same bits
        chunk = case({"a": (p - 3 if p > 3 else 0, k + 1 + (3 if p > 3 else 0))})["a"]
        assert torch.equal(chunk[-(k + 1) :], alone), p
        # and a long chunk beside another row (the native kernel splits a row of over 16
        # tokens into tiles spread over its threads)
        lo = max(0, p - 40)
        long = case({"b": (20, 9), "a": (lo, p + k + 1 - lo)})["a"]
        assert torch.equal(long[-(k + 1) :], alone), p


@pytest.mark.skipif(attention._kernels is None, reason="C kernels not built")
def test_native_attention_and_silu_bits_do_not_depend_on_threads() -> None:
    """The pool splits attention by (row, kv group) and silu_mul by rows: whichever thread
    computes an item, and however many there are, the bits are the same."""
    from draftwise.models import kernels
    from draftwise.models.fused import silu_mul

    torch.manual_seed(1)
    heads, kv_heads, d, bs, max_len = 8, 2, 64, 16, 400
    blocks = max_len // bs + 1
    table_of = {r: list(range(i * blocks, (i + 1) * blocks)) for i, r in enumerate("abc")}
    k_cache = torch.zeros(3 * blocks, bs, kv_heads, d, dtype=torch.bfloat16)
    cache = (k_cache, torch.zeros_like(k_cache), table_of,
             torch.randn(3, max_len, heads * d).bfloat16(),
             torch.randn(3, max_len, kv_heads * d).bfloat16(),
             torch.randn(3, max_len, kv_heads * d).bfloat16())
    rows = {"a": (0, 300), "b": (0, 7), "c": (0, 1)}
    gate_up = torch.randn(40, 2 * 96).bfloat16()
    before = kernels._threads
    try:
        got = {}
        for threads in (1, 2, 3):
            kernels.set_kernel_threads(threads)
            out = _attention_case(heads, kv_heads, rows, cache, "native")
            got[threads] = (torch.cat([out[r] for r in "abc"]), silu_mul(gate_up, native=True))
    finally:
        kernels.set_kernel_threads(before)
    for threads in (2, 3):
        assert torch.equal(got[threads][0], got[1][0]), threads
        assert torch.equal(got[threads][1], got[1][1]), threads
    # a row alone (below the split size: one thread) equals its row in a split call
    assert torch.equal(silu_mul(gate_up[:1], native=True), got[2][1][:1])


@pytest.mark.skipif(attention._kernels is None, reason="C kernels not built")
@pytest.mark.parametrize(
    ("heads", "kv_heads", "d", "window"),
    [(9, 3, 64, None), (4, 4, 128, None), (8, 2, 64, 100), (6, 1, 16, None)],
)
def test_native_attention_matches_the_torch_reference(
    heads: int, kv_heads: int, d: int, window: int | None
) -> None:
    """Same math, different rounding points: equal within bf16 resolution, row by row."""
    torch.manual_seed(1)
    bs = 16
    rows = [(0, 37), (300, 5), (519, 1), (64, 16)]
    tables = [list(range(1 + i * 40, 1 + (i + 1) * 40)) for i in range(len(rows))]
    batch = build_forward_batch(
        [[0] * q for _, q in rows], [c for c, _ in rows], tables, bs,
        [list(range(q)) for _, q in rows],
    )
    t = sum(q for _, q in rows)
    k_cache = torch.randn(1 + 40 * len(rows), bs, kv_heads, d).bfloat16()
    v_cache = torch.randn_like(k_cache)
    q, k, v = (torch.randn(t, n, d).bfloat16() for n in (heads, kv_heads, kv_heads))
    outs = {}
    for backend in ("torch", "native"):
        meta = AttentionMetadata.build(batch, bs, (window,), backend=backend)
        outs[backend] = paged_attention(
            q, k, v, k_cache.clone(), v_cache.clone(), meta, d**-0.5, window
        ).float()
    err = (outs["native"] - outs["torch"]).abs()
    assert err.max() <= 2 ** -6 * outs["torch"].abs().max(), err.max()
    assert err.mean() < 1e-3


def test_c_kernels_are_built_where_a_compiler_exists() -> None:
    """The native tests above skip without the kernels; this makes a broken build fail."""
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler: the torch attention path is the one in use")
    assert attention._kernels is not None, "draftwise._cpu_kernels did not build (pip -v shows why)"


def test_attention_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """``native`` where it cannot run is an error naming why, never a quiet fallback."""
    monkeypatch.setenv(attention.BACKEND_ENV, "torch")
    assert attention.choose_backend(torch.bfloat16, 64, "cpu") == "torch"
    monkeypatch.setenv(attention.BACKEND_ENV, "native")
    with pytest.raises(RuntimeError, match="bf16 on CPU only"):
        attention.choose_backend(torch.float32, 64, "cpu")
    with pytest.raises(RuntimeError, match="multiple of 16"):
        attention.choose_backend(torch.bfloat16, 72, "cpu")
    monkeypatch.setenv(attention.BACKEND_ENV, "fast")
    with pytest.raises(ValueError, match="auto, native or torch"):
        attention.choose_backend(torch.bfloat16, 64, "cpu")
    monkeypatch.setenv(attention.BACKEND_ENV, "auto")
    expected = "torch" if attention._kernels is None else "native"
    assert attention.choose_backend(torch.bfloat16, 64, "cpu") == expected
    assert attention.choose_backend(torch.float32, 64, "cpu") == "torch"


def _scenarios(model, paged_runner, prefix_len: int, seed: int = 0):
    """Logits of the same 5 tokens computed five ways; returns them in a dict."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)

    def toks(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    prefix, step, other, third = toks(prefix_len), toks(5), toks(prefix_len // 2 + 9), toks(17)
    nb = (2 * prefix_len + 64) // 4 + 64
    out: dict[str, torch.Tensor] = {}
    r = paged_runner(model, num_blocks=nb)
    r.step({0: prefix})
    seq, hid = [], []
    for t in step:
        logits, hidden = r.step({0: [t]}, hidden_layers=(0,))
        seq.append(logits[0][0])
        hid.append(hidden[0][0])
    out["sequential"], out["sequential_hidden"] = torch.stack(seq), torch.stack(hid)
    r = paged_runner(model, num_blocks=nb)
    r.step({0: prefix})
    logits, hidden = r.step({0: step}, hidden_layers=(0,))
    out["verify"], out["verify_hidden"] = logits[0], hidden[0]
    r = paged_runner(model, num_blocks=nb)
    r.step({0: prefix})
    r.step({2: third})
    logits, _ = r.step({1: other, 0: step, 2: step[:2]})
    out["verify_batched"] = logits[0]
    r = paged_runner(model, num_blocks=nb)
    r.step({0: prefix})
    r.step({2: third})
    logits, _ = r.step({2: step[:3], 0: step[:1], 1: other})
    out["decode_batched"] = logits[0]
    r = paged_runner(model, num_blocks=nb)
    logits, _ = r.step({0: prefix + step})
    out["prefill"] = logits[0][prefix_len:]
    return out


def _assert_invariant(out: dict[str, torch.Tensor]) -> None:
    seq = out["sequential"]
    assert torch.equal(out["verify"], seq)
    assert torch.equal(out["verify_hidden"], out["sequential_hidden"])
    assert torch.equal(out["verify_batched"], seq)
    assert torch.equal(out["decode_batched"], seq[:1])
    assert torch.equal(out["prefill"], seq)  # holds in bf16 too (see module doc)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_tiny_models_bf16_bitwise(kind: str, tiny_checkpoint, paged_runner) -> None:
    model = load_model(str(tiny_checkpoint(kind)), dtype="bfloat16").model
    for prefix_len in (6, 61):
        _assert_invariant(_scenarios(model, paged_runner, prefix_len))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_quantized_gguf_bf16_bitwise(arch: str, tiny_gguf, paged_runner) -> None:
    """GGUF weights kept quantized (Q4_K_M's mix): the same five scenarios, bitwise."""
    from gguf import GGMLQuantizationType as Q

    t = tiny_gguf(arch=arch, matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=arch == "llama",
                  tensor_types={"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K, "output": Q.Q6_K},
                  hidden=256, heads=4, kv_heads=2, ffn=512)
    model = load_model(str(t.path), dtype="bfloat16").model
    assert model.weight_backend == "quant"
    for prefix_len in (6, 61):
        _assert_invariant(_scenarios(model, paged_runner, prefix_len))


def test_tiny_model_fp32_close_not_bitwise(tiny_checkpoint, paged_runner) -> None:
    model = load_model(str(tiny_checkpoint("llama")), dtype="float32").model
    out = _scenarios(model, paged_runner, 30)
    for key in ("verify", "verify_batched", "prefill"):
        assert (out[key] - out["sequential"]).abs().max().item() < 1e-4


@pytest.mark.default_model
def test_default_model_bf16_bitwise(paged_runner) -> None:
    model = load_model(None, dtype="bfloat16").model
    for prefix_len in (37, 300):
        _assert_invariant(_scenarios(model, paged_runner, prefix_len, seed=prefix_len))


@pytest.mark.skipif(attention._kernels is None, reason="C kernels not built")
def test_native_attention_refuses_out_of_bounds_batches() -> None:
    """The C kernel follows raw pointers: a malformed batch is a ValueError, never a crash."""
    bs = 16

    def batch(tables: list[list[int]], ctx: int):
        return build_forward_batch([[0]], [ctx], tables, bs, [[0]])

    AttentionMetadata.build(batch([[1, 2]], 20), bs, backend="native", num_blocks=8)  # fine
    b = batch([[1, 2]], 20)
    b.seq_lens_cpu = [40]  # claims more context than its two blocks hold
    with pytest.raises(ValueError, match="past its block table"):
        AttentionMetadata.build(b, bs, backend="native", num_blocks=8)
    with pytest.raises(ValueError, match="outside the cache"):
        AttentionMetadata.build(batch([[1, 9]], 20), bs, backend="native", num_blocks=8)
    b = batch([[1, 2]], 20)
    b.query_lens_cpu = [2]
    with pytest.raises(ValueError, match="do not add up"):
        AttentionMetadata.build(b, bs, backend="native", num_blocks=8)
