"""A reduced draft vocabulary (speculators' ``d2t``/``t2d``) through the whole engine.

``conftest.to_speculators(..., keep=ids)`` writes a DeepSpec drafter's weights as
speculators saves a reduced-vocabulary DSpark drafter: ``lm_head``/``markov_w2`` cut to
the kept rows, ``d2t`` offsets and the ``t2d`` mask. Such a drafter must draft exactly
what the same full-vocabulary drafter drafts when every pick is the corrected maximum
over the kept tokens only (W1 read at the previous TARGET id): recomputed from the
equations in fp32 (``test_oracle.Reference``), and in bf16 as the full drafter run with
its base logits outside the kept ids at -inf, for the native pass and the torch pass
alike. Greedy output is spec-off's. Malformed maps are refused by name. The convention
(offsets, ascending ids, a bool mask) is checked against speculators' own trainer
function (``train/vocab_mapping.py``), read by file path (``spec_oracle``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from draftwise import LLM
from draftwise.formats.errors import ModelFormatError
from draftwise.models import kernels
from draftwise_dspark.draft_vocab import DraftVocabError, from_speculators, scatter_q, to_target
from safetensors.torch import load_file, save_file

from ..conftest import generate, greedy
from .conftest import TRAIN_PROMPTS, random_keep, save_dspark, to_speculators
from .spec_oracle import trainer_function
from .test_oracle import Reference, record_drafts, run_engine

V = 512
#: 60% of the tiny vocabulary: most draft indices differ from their target ids, and some
#: of the target's continuations fall outside it
KEEP = random_keep(V, 0.6, seed=4)
PROMPTS = [*TRAIN_PROMPTS[:2], list(range(60, 90))]


def test_convention_is_the_speculators_trainers() -> None:
    """speculators' ``build_vocab_mappings_from_distribution`` (its trainer's d2t/t2d):
    the map read from its output sends draft index i to ``i + d2t[i]``, the i-th marked
    id of t2d, the kept ids ascending."""
    build = trainer_function("train/vocab_mapping.py", "build_vocab_mappings_from_distribution",
                             {"torch": torch})
    g = torch.Generator().manual_seed(0)
    freq = {int(t): int(c) for t, c in zip(torch.randperm(V, generator=g)[:300],
                                         torch.randint(1, 1000, (300,), generator=g))}
    d2t, t2d = build(freq, 200, V)
    vocab = from_speculators(d2t, t2d, 200, V)
    top = sorted(sorted(freq, key=lambda t: (-freq[t], t))[:200])
    assert vocab.ids.tolist() == top
    assert torch.equal(to_target(vocab, torch.arange(200)), torch.arange(200) + d2t)
    q = torch.rand(3, 200)
    full = scatter_q(vocab, q)
    assert full is not None and full.shape == (3, V)
    assert torch.equal(full[:, vocab.ids], q) and float(full[:, ~t2d].abs().sum()) == 0.0


@pytest.mark.parametrize(("spoil", "key"), [
    (lambda d, t: (d[:-1], t), "d2t"),
    (lambda d, t: (d, t[:-1]), "t2d"),
    (lambda d, t: (d.float(), t), "d2t"),
    (lambda d, t: (d, t.to(torch.uint8)), "t2d"),
    (lambda d, t: (torch.cat([d[:-1], d[-1:] + V]), t), "d2t"),
    (lambda d, t: (torch.cat([d[:1] - 1 - d[:1], d[1:]]), t), "d2t"),
])
def test_from_speculators_names_the_tensor(spoil: Any, key: str) -> None:
    ids = torch.tensor(KEEP)
    d2t, t2d = ids - torch.arange(len(KEEP)), torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    d, t = spoil(d2t, t2d)
    with pytest.raises(DraftVocabError) as err:
        from_speculators(d, t, len(KEEP), V)
    assert err.value.key == key


@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
def test_drafts_equal_the_equations_over_the_kept_tokens(target_dir, tmp_path, kind: str
                                                        ) -> None:
    """fp32 (the torch pass): every draft of every step is the reference's corrected
    maximum over KEEP, the previous token read from W1 at its target id."""
    src = save_dspark(tmp_path / kind, target_dir, kind=kind)
    reduced = to_speculators(src, tmp_path / f"{kind}-r", keep=KEEP)
    seen = run_engine(target_dir, reduced)
    ref = Reference(target_dir, src)
    assert len(seen) >= 6
    restricted = 0
    for tokens, drafts in seen:
        assert drafts == ref.drafts(tokens, len(drafts), keep=KEEP), f"ctx {tokens}"
        restricted += drafts != ref.drafts(tokens, len(drafts))
    assert restricted > 0, "the kept set must change some drafts, or this cannot fail"


def _drafts(target: Path, drafter: Path, native: bool, mask: list[int] | None = None
            ) -> tuple[list, list[list[int]], LLM]:
    """bf16 drafts of every step and the outputs; ``mask``: the draft's base logits
    outside those ids at -inf (a full-vocabulary drafter restricted by hand)."""
    import draftwise_dspark.proposer as proposer_mod

    with pytest.MonkeyPatch.context() as mp:
        if mask is not None:
            real = proposer_mod.linear
            outside = torch.ones(V, dtype=torch.bool)
            outside[mask] = False

            def masked(x: torch.Tensor, w: Any, *a: Any) -> torch.Tensor:
                y = real(x, w, *a)
                return y.masked_fill(outside, float("-inf")) if y.shape[-1] == V else y

            mp.setattr(proposer_mod, "linear", masked)
        return _run(target, drafter, native)


def _run(target: Path, drafter: Path, native: bool) -> tuple[list, list[list[int]], LLM]:
    # fixed depth: the reduced and the masked full drafter are compared step for step
    llm = LLM(model=str(target), dtype="bfloat16", max_num_seqs=3, speculative_config={
        "method": "dspark", "model": str(drafter), "num_speculative_tokens": 7,
        "draftwise": {"adaptive": False}})
    prop = llm.engine.spec.proposers[0]
    if native:
        assert prop.native is not None or not kernels.available("markov_pass")
    else:
        prop.native = None
    seen = record_drafts(llm)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy(16))
    return seen, [o.outputs[0].token_ids for o in outs], llm


@pytest.mark.parametrize("kind", ["trained", "gated", "rnn"])
def test_greedy_identity_native_and_torch_equal_the_masked_full_drafter(
        target_dir, trained_dir, tmp_path, kind: str) -> None:
    """bf16: the reduced drafter's drafts (native pass and torch pass) are the full
    drafter's with its base logits outside KEEP at -inf, every one a kept target id; the
    output is spec-off's, and the trained drafter gets drafts accepted."""
    src = trained_dir if kind == "trained" else save_dspark(  # rank 32: native (native.py)
        tmp_path / kind, target_dir, kind=kind, rank=32)
    reduced = to_speculators(src, tmp_path / "r", keep=KEEP)
    want = generate(target_dir, None, PROMPTS, n=16)[0]
    seen, out, llm = _drafts(target_dir, reduced, native=True)
    assert out == want
    stats = llm.engine.spec.proposer_stats()[0]
    if kernels.available("markov_pass"):
        assert stats["markov_native_picks"] > 0
    torch_seen, torch_out, _ = _drafts(target_dir, reduced, native=False)
    assert torch_seen == seen and torch_out == want
    masked, _, _ = _drafts(target_dir, src, native=False, mask=KEEP)
    assert masked == seen and len(seen) > 4
    kept = set(KEEP)
    assert all(t in kept for _, d in seen for t in d)
    if kind == "trained":
        assert llm.engine.spec.metrics.num_accepted_tokens > 0


def _rewrite(directory: Path, config: dict[str, Any] | None = None, **tensors: Any) -> Path:
    """Change a saved drafter: config keys, tensors (None deletes one)."""
    if config:
        cfg = json.loads((directory / "config.json").read_text())
        cfg.update(config)
        (directory / "config.json").write_text(json.dumps(cfg))
    t = load_file(str(directory / "model.safetensors"))
    for name, value in tensors.items():
        if value is None:
            del t[name]
        else:
            t[name] = value(t[name]) if callable(value) else value
    save_file(t, str(directory / "model.safetensors"))
    return directory


def _moved_mark(t2d: torch.Tensor) -> torch.Tensor:
    """t2d with its last mark moved to an unmarked id (the count unchanged)."""
    out = t2d.clone()
    out[int(t2d.nonzero()[-1])] = False
    out[int((~t2d).nonzero()[0])] = True
    return out


def _swapped(d2t: torch.Tensor) -> torch.Tensor:
    """d2t whose first two draft tokens map to each other's ids (not ascending)."""
    ids = d2t + torch.arange(len(d2t))
    ids[[0, 1]] = ids[[1, 0]]
    return ids - torch.arange(len(d2t))


N = len(KEEP)


@pytest.mark.parametrize(("config", "tensors", "message"), [
    (None, {"d2t": lambda d: d[:-1]}, rf"'d2t' has shape \[{N - 1}\], expected \[{N}\]"),
    (None, {"t2d": lambda t: t[:-1]}, rf"'t2d' has shape \[{V - 1}\], expected \[{V}\]"),
    (None, {"d2t": lambda d: d + V}, "outside the verifier's vocab_size 512"),
    (None, {"d2t": lambda d: torch.cat([d[:1] - 1 - d[:1], d[1:]])}, "to target id -1"),
    (None, {"t2d": lambda t: t | ~t}, f"t2d marks 512 target tokens, but draft_vocab_size is {N}"),
    (None, {"t2d": _moved_mark}, "the two maps disagree"),
    (None, {"d2t": _swapped}, "the two maps disagree"),
    (None, {"d2t": lambda d: d.float()}, "tensor 'd2t' is stored as F32; speculators writes I64"),
    (None, {"t2d": lambda t: t.to(torch.uint8)}, "tensor 't2d' is stored as U8"),
    (None, {"t2d": None}, f"draft_vocab_size={N} is below vocab_size=512.* no 't2d'"),
    ({"draft_vocab_size": N - 1}, {}, rf"'lm_head.weight' has shape \[{N}, .*expected \[{N - 1}"),
    ({"draft_vocab_size": 0}, {}, "draft_vocab_size=0 must be an integer from 1 to"),
])
def test_malformed_maps_refused_by_name(target_dir, dspark_dir, tmp_path, config, tensors,
                                        message) -> None:
    bad = _rewrite(to_speculators(dspark_dir, tmp_path / "bad", keep=KEEP), config, **tensors)
    with pytest.raises(ModelFormatError, match=message):
        LLM(model=str(target_dir), speculative_config={
            "method": "dspark", "model": str(bad), "num_speculative_tokens": 7})
