"""The draft's LM head over a vocabulary prefix (``lm_head_tokens``): same logits where kept.

The cut head must give, for every kept token, the very logit the model's own head gives
(a GGUF head is repacked from the file's own rows in its stored type, a dense one is
sliced), ``-inf`` for every other token, and keep the end-of-sequence and special ids
whatever the prefix. Through the engine it stays greedy-identical to speculation off and
its drafts never leave the kept ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from draftwise import LLM, SamplingParams
from draftwise.models.loader import load_model
from draftwise.models.quant import QuantWeight
from draftwise_draft_model.head import build_subset_head, kept_ids
from draftwise_draft_model.proposer import DraftModelProposer
from tiny_gguf import tiny_gguf  # noqa: F401 - the fixture

PROMPTS = [[7, 3, 11, 5, 2, 9], list(range(20, 57)), [(i * 37) % 500 + 3 for i in range(23)]]


def test_kept_ids_are_the_prefix_and_the_specials_in_order() -> None:
    ids = kept_ids(4, 10, [9, 2, 12, -1, 9])
    assert ids.tolist() == [0, 1, 2, 3, 9]  # 2 was in the prefix; 12 and -1 are outside


def check_head(loaded: Any, n: int) -> None:
    """Kept ids: the full head's logit bit for bit; the rest -inf."""
    head = build_subset_head(loaded, n)
    assert head is not None
    want_ids = set(range(n)) | set(loaded.eos_token_ids)
    assert want_ids <= set(head.ids.tolist())
    hidden = torch.randn(3, loaded.config.hidden_size, generator=torch.Generator().manual_seed(0))
    hidden = hidden.to(loaded.model.dtype)
    full = loaded.model.lm_head(hidden)
    cut = head.logits(hidden)
    assert cut.shape == full.shape and cut.dtype == torch.float32
    assert torch.equal(cut[:, head.ids], full[:, head.ids])
    off = torch.ones(full.shape[1], dtype=torch.bool)
    off[head.ids] = False
    assert bool(torch.isneginf(cut[:, off]).all())
    assert int(off.sum()) == full.shape[1] - head.num_tokens > 0
    # a context's tokens the prefix lacks get their own row's logit (fp32: close, not bitwise)
    vocab = full.shape[1]
    context = np.array([3, vocab - 1, vocab - 2, vocab - 1, n + 1, vocab + 7, -1], np.int64)
    extra = head.context(context)
    outside = {vocab - 1, vocab - 2, n + 1} - set(head.ids.tolist())
    assert outside and sorted(extra.ids.tolist()) == sorted(outside)
    with_ctx = head.logits(hidden, extra)
    assert torch.equal(with_ctx[:, head.ids], full[:, head.ids])
    torch.testing.assert_close(with_ctx[:, extra.ids], full[:, extra.ids], rtol=0.05, atol=0.05)
    assert int(torch.isneginf(with_ctx[0]).sum()) == int(off.sum()) - extra.ids.numel()


@pytest.mark.parametrize(("tied", "qtype"), [(False, Q.Q8_0), (True, Q.Q4_0), (False, Q.Q6_K)])
def test_gguf_head_keeps_the_stored_rows(tiny_gguf, tied: bool, qtype: Q) -> None:
    hidden = 256 if qtype == Q.Q6_K else 64  # K-quants need 256 columns
    ggml = tiny_gguf(matrix_type=qtype, embed_type=qtype, tied=tied, hidden=hidden, ffn=256)
    loaded = load_model(str(ggml.path), dtype="bfloat16")
    assert isinstance(loaded.model.lm_head_weight, QuantWeight)
    check_head(loaded, 200)


def test_dense_head_is_sliced(draft_dir: Path) -> None:
    check_head(load_model(str(draft_dir), dtype="bfloat16"), 300)


def test_a_prefix_covering_the_vocabulary_keeps_the_models_head(draft_dir: Path) -> None:
    assert build_subset_head(load_model(str(draft_dir), dtype="bfloat16"), 10_000) is None


def test_a_prefix_covering_the_vocabulary_says_so_at_startup(
    target_dir: Path, draft_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Accepted, but not silently: the startup line says the full head runs."""
    with caplog.at_level("INFO", logger="draftwise"):
        LLM(model=str(target_dir), dtype="bfloat16",
            speculative_config=spec(draft_dir, 2, lm_head_tokens=10_000))
    assert "lm_head_tokens=10000 keeps every token: the full LM head runs" in caplog.text


def spec(draft: Path, k: int, **extra: Any) -> dict[str, Any]:
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k, **extra}


def run(target: Path, config: dict | None, prompts: list[list[int]], **kw: Any):
    llm = LLM(model=str(target), dtype="bfloat16", speculative_config=config, **kw)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [o.outputs[0].token_ids for o in outs], llm


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_identical_and_drafts_stay_in_the_kept_ids(
    target_dir: Path, draft_dir: Path, monkeypatch: pytest.MonkeyPatch, k: int
) -> None:
    drafted: list[int] = []
    real = DraftModelProposer.propose

    def spy(self: DraftModelProposer, batch: Any) -> Any:
        out = real(self, batch)
        drafted.extend(out.token_ids.tolist())
        return out

    monkeypatch.setattr(DraftModelProposer, "propose", spy)
    want, _ = run(target_dir, None, PROMPTS, max_num_seqs=3)
    # fixed depth: which ids get drafted is checked, so every row drafts every step
    got, llm = run(target_dir, spec(draft_dir, k, lm_head_tokens=256,
                                    draftwise={"adaptive": False}), PROMPTS, max_num_seqs=3)
    assert got == want
    context = {t for row in PROMPTS + want for t in row}  # what the cut head also scores
    assert drafted and set(drafted) <= set(range(256)) | context
    assert any(t >= 256 for t in drafted), "context tokens past the prefix are drafted too"
    assert any(t >= 256 and t not in p for row, p in zip(want, PROMPTS) for t in row), \
        "the target must emit tokens the cut head could not score"
    m = llm.engine.spec.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens
