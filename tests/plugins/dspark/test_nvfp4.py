"""NVFP4 DSpark drafters in both published layouts, through the whole engine.

``tests/nvfp4_checkpoints.export_nvfp4`` quantizes a tiny DeepSpec-layout drafter as
ModelOpt does and packs the codes with ``compressed_tensors``' own packer, writing each
tool's tensors and declaration, and the dequantized weights as a bf16 twin. Every Linear
is quantized (the DFlash body's ``fc``/``*_proj``, and the heads: ``lm_head``,
``markov_w2``, ``gate_proj``/``joint_proj``, ``confidence_head.proj``) unless excluded;
``embed_tokens`` and ``markov_w1`` are embeddings and stay dense, as the exporters leave
them.

Tolerance: zero. The loader dequantizes once to the model dtype and every dequantized
value (an e2m1 code times an fp8 scale times a power-of-two global) is exact in bf16, so
the NVFP4 drafter's Markov-corrected logits must equal its twin's bitwise at every step
(a swapped nibble order, a divisor read as a multiplier or a misplaced scale changes
them); against the bf16 source the drafts only have to agree mostly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from draftwise import LLM
from draftwise.formats.errors import ModelFormatError
from draftwise_dspark.loader import DSparkLoader
from nvfp4_checkpoints import export_nvfp4

from .conftest import save_dspark
from .test_engine import PROMPTS, assert_clean, fixed, generate, spec

pytest.importorskip("compressed_tensors")

HEADS = ("lm_head.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight")


def dspark_linear(name: str) -> bool:
    """The fixture's own rule: which DeepSpec weights are Linear modules (§2.1)."""
    return name == "fc.weight" or name.endswith("_proj.weight") or name in HEADS


@pytest.fixture(scope="module")
def want(target_dir: Path) -> list[list[int]]:
    return generate(target_dir, None, PROMPTS)[0]


def logits_of(target_dir: Path, drafter: Path, monkeypatch: pytest.MonkeyPatch
              ) -> tuple[list[list[int]], list[torch.Tensor], LLM]:
    """Greedy outputs and every Markov step's corrected logits (the certified pick and the
    native pass off, so each step's full logits reach the torch pick), at fixed depth so
    that the twins' steps pair up."""
    import draftwise_dspark.proposer as mod

    seen: list[torch.Tensor] = []
    real = mod.pick_draft_tokens

    def record(logits: torch.Tensor, *a: Any, **kw: Any) -> Any:
        seen.append(logits.clone())
        return real(logits, *a, **kw)

    monkeypatch.setattr(mod, "pick_draft_tokens", record)
    monkeypatch.setattr(mod.DSparkProposer, "_try_certify", lambda self: False)
    monkeypatch.setattr(mod, "native_pass", lambda *a: None)
    got, llm = generate(target_dir, fixed(drafter), PROMPTS, max_num_seqs=4)
    monkeypatch.undo()
    return got, seen, llm


CASES = [
    ("modelopt", "trained", ("lm_head",)),
    ("compressed-tensors", "trained", ("layers.1.mlp",)),
    ("modelopt", "gated", ()),
    ("compressed-tensors", "rnn", ("layers.0.self_attn",)),
]


@pytest.mark.parametrize(("convention", "kind", "exclude"), CASES)
def test_nvfp4_drafter_is_identical_and_drafts_its_twin(
        target_dir, trained_dir, want, tmp_path, monkeypatch, convention, kind, exclude) -> None:
    src = trained_dir if kind == "trained" else save_dspark(
        tmp_path / "src", target_dir, kind=kind, enable_confidence_head=kind == "rnn",
        confidence_head_with_markov=True)
    nv = export_nvfp4(src, tmp_path / "nv", convention, exclude, twin=tmp_path / "twin",
                      linear=dspark_linear)
    got, seen, llm = logits_of(target_dir, nv, monkeypatch)
    assert got == want
    assert llm.engine.spec.metrics.num_draft_tokens > 0
    assert DSparkLoader().detect(str(nv)).format == f"safetensors (NVFP4, {convention})"
    assert_clean(llm)
    twin_got, twin_seen, _ = logits_of(target_dir, tmp_path / "twin", monkeypatch)
    assert twin_got == want and len(seen) == len(twin_seen) > 0
    assert all(torch.equal(a, b) for a, b in zip(seen, twin_seen))
    if kind == "trained":
        assert llm.engine.spec.metrics.num_accepted_tokens > 0
    _, src_seen, _ = logits_of(target_dir, src, monkeypatch)
    assert not all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(seen, src_seen)), \
        "the fixture must quantize something"


def _nv(target_dir: Path, tmp_path: Path, convention: str, kind: str = "rnn",
        exclude: tuple[str, ...] = ()) -> Path:
    src = save_dspark(tmp_path / "src", target_dir, kind=kind)
    return export_nvfp4(src, tmp_path / "nv", convention, exclude, linear=dspark_linear)


def test_declaration_checked_against_the_heads_both_ways(target_dir, tmp_path) -> None:
    nv = _nv(target_dir, tmp_path / "a", "modelopt")
    side = json.loads((nv / "hf_quant_config.json").read_text())
    side["quantization"]["exclude_modules"] = ["markov_head.markov_w2"]
    (nv / "hf_quant_config.json").write_text(json.dumps(side))
    with pytest.raises(ModelFormatError, match="markov_head.markov_w2 is excluded from "
                       "quantization by the declaration but stored packed"):
        LLM(model=str(target_dir), speculative_config=spec(nv))
    part = _nv(target_dir, tmp_path / "b", "compressed-tensors",
               exclude=("markov_head.joint_proj",))
    cfg = json.loads((part / "config.json").read_text())
    cfg["quantization_config"]["ignore"] = []
    (part / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="markov_head.joint_proj is declared NVFP4 "
                       r"\(compressed-tensors\) but has no packed "
                       "markov_head.joint_proj.weight_packed"):
        LLM(model=str(target_dir), speculative_config=spec(part))


@pytest.mark.parametrize("embedding", ["markov_head.markov_w1", "embed_tokens"])
def test_a_packed_embedding_is_refused_by_name(target_dir, tmp_path, embedding) -> None:
    def linear(name: str) -> bool:
        return dspark_linear(name) or name == f"{embedding}.weight"

    src = save_dspark(tmp_path / "src", target_dir)
    nv = export_nvfp4(src, tmp_path / "nv", "modelopt", linear=linear)
    with pytest.raises(ModelFormatError, match=f"{embedding} is stored NVFP4-packed"):
        LLM(model=str(target_dir), speculative_config=spec(nv))

