"""The MTP head's logits against an oracle built from transformers' own Qwen3-Next modules.

transformers has no MTP module, so the oracle is vLLM's ``Qwen3NextMultiTokenPredictor``
formula assembled from transformers' pieces: ``fc([pre_fc_norm_embedding(E[x_{i+1}]);
pre_fc_norm_hidden(h_i)])`` at position i, one ``Qwen3NextDecoderLayer`` (full attention,
causal over the pairs so far) loaded from ``mtp.layers.0.*``, ``mtp.norm`` and the target's
LM head. Every head forward of a short greedy run (the prompt's pairs, then each step's) is
checked against the oracle over the pairs fed up to it.

The engine-level tests only check that speculation stays lossless, which holds for any
head: swapping ``norm_hidden`` for ``norm_embedding`` passed all of them, and reads 10% of
the logit scale here (fp32: 3.6e-7 measured, bound 1e-4 of the scale; bf16 on the native
kernels: 0.65% measured, bound 3%).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from draftwise import LLM, SamplingParams
from draftwise_mtp.proposer import MtpProposer

ROOT = Path(__file__).resolve().parents[3]
PROMPT = [5, 17, 99, 3, 250, 42, 42, 7, 128, 64, 1, 2, 3]
BOUNDS = {"float32": 1e-4, "bfloat16": 0.03}  # of the oracle's largest |logit|

m = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


@pytest.fixture(scope="module")
def next_dir(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location(
        "build_tiny_hybrid", ROOT / "scripts" / "build_tiny_hybrid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(tmp_path_factory.mktemp("mtp-oracle"), "qwen3_next")


class Oracle:
    """The head's formula (module doc) over a sequence of (token, target hidden) pairs."""

    def __init__(self, path: Path) -> None:
        from safetensors.torch import load_file
        from transformers import AutoConfig

        self.hf = m.Qwen3NextForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        cfg = AutoConfig.from_pretrained(str(path))
        cfg.layer_types = ["full_attention"] * len(cfg.layer_types)
        cfg._attn_implementation = "eager"
        t = {k: v.float() for k, v in load_file(str(path / "model.safetensors")).items()}
        self.layer = m.Qwen3NextDecoderLayer(cfg, 0).float().eval()
        missing, unexpected = self.layer.load_state_dict(
            {k.removeprefix("mtp.layers.0."): v for k, v in t.items()
             if k.startswith("mtp.layers.0.")}, strict=False)
        assert not missing and not unexpected, (missing, unexpected)

        def norm(name: str) -> torch.nn.Module:
            n = m.Qwen3NextRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            n.weight.data = t[name]
            return n

        self.norm_e = norm("mtp.pre_fc_norm_embedding.weight")
        self.norm_h = norm("mtp.pre_fc_norm_hidden.weight")
        self.norm = norm("mtp.norm.weight")
        self.fc = t["mtp.fc.weight"]

    @torch.no_grad()
    def last_logits(self, ids: list[int], hidden: torch.Tensor) -> torch.Tensor:  # [vocab]
        """Logits at the last of the pairs ``(ids[i], hidden[i])`` at positions 0..n-1."""
        n = len(ids)
        emb = self.hf.model.embed_tokens(torch.tensor(ids))
        x = torch.cat((self.norm_e(emb), self.norm_h(hidden.float())), dim=-1) @ self.fc.T
        pos = torch.arange(n).unsqueeze(0)
        cos, sin = self.hf.model.rotary_emb(x.unsqueeze(0), pos)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        y = self.layer(x.unsqueeze(0), (cos, sin), attention_mask=mask, position_ids=pos)
        y = y[0] if isinstance(y, tuple) else y
        return self.hf.lm_head(self.norm(y[0]))[-1]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_head_logits_match_the_oracle(next_dir, monkeypatch, dtype: str) -> None:
    calls: list[tuple[list[list[int]], torch.Tensor, list[int], torch.Tensor]] = []
    real = MtpProposer._forward

    def spy(self: MtpProposer, ids: list[list[int]], hidden: torch.Tensor, starts: list[int],
            tables: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        logits, out = real(self, ids, hidden, starts, tables, layer)
        calls.append((ids, hidden.clone(), starts, logits.clone()))
        return logits, out

    monkeypatch.setattr(MtpProposer, "_forward", spy)
    # fixed depth: the head runs at every step, each call checked against the oracle
    llm = LLM(model=str(next_dir), dtype=dtype,
              speculative_config={"method": "mtp", "num_speculative_tokens": 1,
                                  "draftwise": {"adaptive": False}})
    head = llm.engine.spec.proposers[0].head
    assert head.native == (dtype == "bfloat16")  # bf16: the native kernels (this lane's)
    llm.generate({"prompt_token_ids": PROMPT},
                 SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    oracle = Oracle(next_dir)
    ids: list[int] = []
    hidden = torch.zeros(0, oracle.fc.shape[0])
    checked = 0
    for rows, h, starts, logits in calls:
        if len(rows) != 1:  # one request: one row per forward
            continue
        assert starts[0] <= len(ids), "the head skipped positions"
        ids = ids[: starts[0]] + rows[0]  # a rejected pair is fed again at its position
        hidden = torch.cat((hidden[: starts[0]], h.float()))
        ref = oracle.last_logits(ids, hidden)
        err = float((logits[0] - ref).abs().max())
        assert err <= BOUNDS[dtype] * float(ref.abs().max()), (len(ids), err)
        checked += 1
    assert checked >= 3
