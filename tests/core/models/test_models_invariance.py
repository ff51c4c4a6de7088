"""Batch invariance, bitwise, in bfloat16: a token's logits do not depend on the batch.

The product needs speculative greedy output to be token-identical to plain decoding, so a
query token must give the same bits whether it is decoded alone, is the first of 1 + k
tokens of a verify row, or shares the step with rows of other lengths (padding). In
bf16 this also makes a prefill equal to token-by-token decode. fp32 is only close: MKL's
fp32 GEMM rounds differently for different row counts.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from draftwise.models.attention import CHUNK, AttentionMetadata, paged_attention
from draftwise.models.batch import build_forward_batch
from draftwise.models.llama import linear
from draftwise.models.loader import load_model


def test_linear_rows_do_not_depend_on_row_count() -> None:
    """K=1536 (SmolLM's down_proj) is where oneDNN's 1-row GEMV rounds differently."""
    torch.manual_seed(0)
    for k, n in ((1536, 576), (576, 960)):
        w = (torch.randn(n, k) * 0.05).bfloat16()
        x = torch.randn(64, k).bfloat16()
        alone = torch.cat([linear(x[i : i + 1], w) for i in range(64)])
        for m in (2, 5, 64):
            batched = torch.cat([linear(x[i : i + m], w) for i in range(0, 64, m)])
            assert torch.equal(alone, batched), (k, n, m)
    assert torch.equal(linear(x[:1], w), F.linear(x[:2], w)[:1])


def _attention_case(heads: int, kv_heads: int, rows: dict[str, tuple[int, int]], cache) -> dict:
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
    meta = AttentionMetadata.build(batch, k_cache.shape[1])
    out = paged_attention(q, k, v, k_cache, v_cache, meta, d**-0.5)
    result, start = {}, 0
    for r in names:
        result[r] = out[start : start + rows[r][1]]
        start += rows[r][1]
    return result


@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4)])
def test_paged_attention_is_batch_invariant(heads: int, kv_heads: int) -> None:
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
    _attention_case(heads, kv_heads, {"a": (0, max_len), "b": (0, 40), "c": (0, max_len)}, cache)
    for p in (4, CHUNK - 1, CHUNK, 700, 1023, 1300):
        k = 4
        alone = [
            _attention_case(heads, kv_heads, {"a": (p + j, 1)}, cache)["a"] for j in range(k + 1)
        ]
        alone = torch.cat(alone)
        verify = _attention_case(heads, kv_heads, {"a": (p, k + 1)}, cache)["a"]
        assert torch.equal(verify, alone), p
        mixed = _attention_case(
            heads, kv_heads, {"b": (20, 9), "a": (p, k + 1), "c": (2100, 3)}, cache
        )["a"]
        assert torch.equal(mixed, alone), p
        single = _attention_case(heads, kv_heads, {"c": (2000, 1), "a": (p, 1)}, cache)["a"]
        assert torch.equal(single, alone[:1]), p


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
