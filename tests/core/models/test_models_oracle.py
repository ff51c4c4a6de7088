"""Our llama family against transformers on tiny random checkpoints it saved.

Tolerances (logits are O(4) here):
- float32: max |ours - transformers| <= 1e-4 (measured ~3e-6);
- bfloat16: max |ours - transformers bf16| <= 0.1, and our distance to transformers fp32
  is at most 1.5x transformers' own bf16-vs-fp32 distance plus 0.02 (measured: ours
  ~0.04-0.06, transformers' own ~0.05-0.06).
Each is checked for a 3-row batched prefill, and for a prefill of 3 tokens followed by
token-by-token decode of 3 rows of different lengths through a block_size-4 paged cache
with scattered block ids, so every row crosses several blocks.
"""

from __future__ import annotations

import pytest
import torch
from draftwise.models.loader import load_model

KINDS = ["llama", "qwen2", "qwen3", "mistral", "mistral_swa", "llama_tied_scaled"]
LENGTHS = (13, 7, 22)


def hf_logits(directory, rows: list[list[int]], dtype: torch.dtype) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    with torch.no_grad():
        return [hf(torch.tensor([r])).logits[0].float() for r in rows]


def rows_for(vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in LENGTHS]


def ours_prefill(model, rows, paged_runner) -> list[torch.Tensor]:
    logits, _ = paged_runner(model).step(dict(enumerate(rows)))
    return [logits[i] for i in range(len(rows))]


def ours_decode(model, rows, paged_runner) -> list[torch.Tensor]:
    runner = paged_runner(model)
    got: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(rows))}
    logits, _ = runner.step({i: r[:3] for i, r in enumerate(rows)})
    for i, bucket in got.items():
        bucket.append(logits[i])
    for t in range(3, max(LENGTHS)):
        logits, _ = runner.step({i: [r[t]] for i, r in enumerate(rows) if t < len(r)})
        for i, value in logits.items():
            got[i].append(value)
    return [torch.cat(got[i]) for i in range(len(rows))]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


@pytest.mark.parametrize("kind", KINDS)
def test_fp32_matches_transformers(kind: str, tiny_checkpoint, paged_runner) -> None:
    d = tiny_checkpoint(kind)
    loaded = load_model(str(d), dtype="float32")
    assert loaded.format == "safetensors" and loaded.model.dtype == torch.float32
    rows = rows_for(loaded.config.vocab_size)
    ref = hf_logits(d, rows, torch.float32)
    assert max_diff(ours_prefill(loaded.model, rows, paged_runner), ref) < 1e-4
    assert max_diff(ours_decode(loaded.model, rows, paged_runner), ref) < 1e-4


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral_swa"])
def test_bf16_matches_transformers(kind: str, tiny_checkpoint, paged_runner) -> None:
    d = tiny_checkpoint(kind)
    loaded = load_model(str(d))  # auto = bfloat16
    assert loaded.model.dtype == torch.bfloat16
    rows = rows_for(loaded.config.vocab_size, seed=1)
    ref16 = hf_logits(d, rows, torch.bfloat16)
    ref32 = hf_logits(d, rows, torch.float32)
    own_noise = max_diff(ref16, ref32)
    for got in (
        ours_prefill(loaded.model, rows, paged_runner),
        ours_decode(loaded.model, rows, paged_runner),
    ):
        assert max_diff(got, ref16) < 0.1
        assert max_diff(got, ref32) < 1.5 * own_noise + 0.02


def test_hidden_states_are_decoder_layer_outputs(tiny_checkpoint, paged_runner) -> None:
    from transformers import AutoModelForCausalLM

    d = tiny_checkpoint("qwen3")
    loaded = load_model(str(d), dtype="float32")
    rows = rows_for(loaded.config.vocab_size)[:1]
    _, hidden = paged_runner(loaded.model).step({0: rows[0]}, hidden_layers=(0, 1))
    hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor(rows), output_hidden_states=True).hidden_states
    assert set(hidden) == {0, 1}
    for layer in (0, 1):  # HF's hidden_states[L + 1] is the output of layer L
        assert hidden[layer].shape == (len(rows[0]), loaded.config.hidden_size)
        assert (hidden[layer] - ref[layer + 1][0]).abs().max().item() < 1e-4


def test_accessors_for_cache_and_drafters(tiny_checkpoint) -> None:
    loaded = load_model(str(tiny_checkpoint("qwen3")), dtype="float32")
    m, c = loaded.model, loaded.config
    assert (m.num_layers, m.num_kv_heads, m.head_dim) == (3, 2, 48)
    ids = torch.tensor([1, 2, 3])
    e = m.embed(ids)
    assert e.shape == (3, c.hidden_size) and torch.equal(e, m.embed_weight[ids])
    logits = m.lm_head(m.final_norm(e))
    assert logits.dtype == torch.float32 and logits.shape == (3, c.vocab_size)
    tied = load_model(str(tiny_checkpoint("llama_tied_scaled")), dtype="float32").model
    assert tied.lm_head_weight is tied.embed_weight
