"""Oracle: the drafts draftwise proposes per step equal the DSpark equations, recomputed.

For every drafted row of every step the engine ran, the expected drafts are recomputed
from scratch, independently of the plugin's code: the HF target's
``output_hidden_states`` over the committed context (``hidden_states[id + 1]``, so -1 is
the embedding output), z-lab's ``DFlashDraftModel`` as the backbone (DSpark's body is
DFlash's) over ``[anchor, MASK x (B-1)]`` embedded with the draft's own table, the
draft's own ``lm_head`` on all B slots (next-token indexing), then the Markov pass of
``shared/reference/drafter-formats.md`` §2.2 written here in plain torch. Both sides run
in float32, so equal tokens are expected exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from draftwise import LLM, SamplingParams
from safetensors.torch import load_file
from spec_sampling import fixed_depth

from .conftest import MASK, save_dspark

PROMPTS = [[7, 3, 11, 5, 2, 9], list(range(20, 47))]


def record_drafts(llm: LLM, widths: list[int] | None = None
                  ) -> list[tuple[list[int], list[int]]]:
    """Wrap the proposer: (context tokens, drafts) for every drafted row of every step
    (and in ``widths`` each such row's allowed drafts, ``min(k, row.max_draft)``)."""
    proposer = llm.engine.spec.proposers[0]
    seen: list[tuple[list[int], list[int]]] = []
    original, plans = proposer.propose, proposer._plans
    planned: dict[int, int] = {}

    def plan(rows: Any) -> Any:
        out = plans(rows)
        planned.update({p.index: p.drafts for p in out})
        return out

    def propose(batch: Any) -> Any:
        planned.clear()
        out = original(batch)
        for i, row in enumerate(batch.rows):
            if out.num_draft_tokens[i] or (widths is not None and i in planned):
                seen.append(([int(t) for t in row.token_ids], out.row(i).tolist()))
                if widths is not None:
                    widths.append(planned[i])
        return out

    proposer._plans = plan
    proposer.propose = propose
    return seen


class Reference:
    """The DSpark equations over the saved files (module doc)."""

    def __init__(self, target_dir: Path, drafter_dir: Path) -> None:
        import transformers
        from dflash.model import DFlashDraftModel
        from transformers import Qwen3Config

        self.target = transformers.AutoModelForCausalLM.from_pretrained(
            target_dir, dtype=torch.float32).eval()
        cfg = json.loads((drafter_dir / "config.json").read_text())
        self.cfg = cfg
        self.t = {k: v.float() for k, v in load_file(str(drafter_dir / "model.safetensors")).items()}
        body_cfg = Qwen3Config(**{k: v for k, v in cfg.items() if k not in (
            "architectures", "layer_types", "target_layer_ids", "block_size", "mask_token_id")},
            dflash_config={"mask_token_id": MASK, "block_size": cfg["block_size"],
                           "target_layer_ids": cfg["target_layer_ids"]})
        self.body = DFlashDraftModel(body_cfg).eval()
        body = {k: v for k, v in self.t.items()
                if not k.startswith(("embed_tokens", "lm_head", "markov_head", "confidence_head"))}
        missing, unexpected = self.body.load_state_dict(body, strict=False)
        if unexpected or [m for m in missing if not m.startswith("rotary")]:
            raise AssertionError(f"body mismatch {missing} {unexpected}")

    def drafts(self, tokens: list[int], w: int, markov: bool = True,
               threshold: float = 0.0, keep: list[int] | None = None) -> list[int]:
        """The first ``w`` drafts; with a threshold, only those before the first slot whose
        confidence ``sigmoid(proj([h_j; W1[prev_j]]))`` is under it (DeepSpec's cut); with
        ``keep`` (target ids), each pick the corrected maximum over those tokens only (a
        reduced draft vocabulary: its head and W2 are these rows, W1 reads the target id)."""
        cfg, t = self.cfg, self.t
        b, n = cfg["block_size"], len(tokens)
        with torch.no_grad():
            out = self.target(torch.tensor([tokens[:-1]]), output_hidden_states=True)
            ctx = torch.cat([out.hidden_states[i + 1] for i in cfg["target_layer_ids"]], -1)
            block = torch.tensor([[tokens[-1]] + [MASK] * (b - 1)])
            noise = torch.nn.functional.embedding(block, t["embed_tokens.weight"])
            h = self.body(target_hidden=ctx, noise_embedding=noise,
                          position_ids=torch.arange(n - 1 + b)[None], use_cache=False)[0]
            base = h @ t["lm_head.weight"].T  # [B, V]: slot j predicts position n + j
            rank, kind = cfg["markov_rank"], cfg["markov_head_type"]
            prev, s, got = tokens[-1], torch.zeros(rank), []
            outside = torch.ones(base.shape[1], dtype=torch.bool)
            if keep is not None:
                outside[keep] = False
            for j in range(w):
                logits = base[j]
                if rank and markov:
                    e = t["markov_head.markov_w1.weight"][prev]
                    w2 = t["markov_head.markov_w2.weight"]
                    if kind == "vanilla":
                        logits = logits + w2 @ e
                    elif kind == "gated":
                        g = torch.sigmoid(t["markov_head.gate_proj.weight"] @ torch.cat([h[j], e])
                                          + t["markov_head.gate_proj.bias"])
                        logits = logits + w2 @ (g * e)
                    else:
                        z = (t["markov_head.joint_proj.weight"] @ torch.cat([s, e, h[j]])
                             + t["markov_head.joint_proj.bias"])
                        g, c, o = z[:rank], z[rank : 2 * rank], z[2 * rank :]
                        s = torch.sigmoid(g) * s + (1 - torch.sigmoid(g)) * torch.tanh(c)
                        logits = logits + w2 @ torch.tanh(o)
                if threshold and self.cut(h[j], prev) < threshold:
                    break
                if keep is not None:
                    logits = logits.masked_fill(outside, float("-inf"))
                prev = int(logits.argmax())
                got.append(prev)
        return got

    def cut(self, h: torch.Tensor, prev: int) -> float:
        """A slot's confidence score (§2.2), from the saved tensors."""
        t, x = self.t, h
        if self.cfg.get("confidence_head_with_markov"):
            x = torch.cat([h, t["markov_head.markov_w1.weight"][prev]])
        return float(torch.sigmoid(t["confidence_head.proj.weight"][0] @ x
                                   + t["confidence_head.proj.bias"][0]))


def run_engine(target_dir: Path, drafter_dir: Path, k: int = 7, n: int = 12,
               widths: list[int] | None = None, **extra: Any
               ) -> list[tuple[list[int], list[int]]]:
    """Every step's drafts at fixed depth: all B slots are checked against the equations."""
    llm = LLM(model=str(target_dir), dtype="float32", speculative_config=fixed_depth({
        "method": "dspark", "model": str(drafter_dir), "num_speculative_tokens": k, **extra}))
    seen = record_drafts(llm, widths)
    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sp)
    return seen


@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
def test_drafts_equal_the_equations_every_step(target_dir, tmp_path, kind: str) -> None:
    drafter = save_dspark(tmp_path / kind, target_dir, kind=kind)
    seen = run_engine(target_dir, drafter)
    ref = Reference(target_dir, drafter)
    assert len(seen) >= 6
    corrected = 0
    for tokens, drafts in seen:
        assert 1 <= len(drafts) <= 7
        assert drafts == ref.drafts(tokens, len(drafts)), f"ctx {tokens}"
        corrected += drafts != ref.drafts(tokens, len(drafts), markov=False)
    assert max(len(d) for _, d in seen) == 7, "next-token indexing: all B slots draft"
    assert corrected > 0, "the Markov bias must change some drafts, or this cannot fail"


@pytest.mark.parametrize("with_markov", [True, False])
def test_confidence_cut_equals_the_equations(target_dir, tmp_path, with_markov: bool) -> None:
    """The verified drafts are the prefix before the first slot the confidence head
    scores under the threshold, recomputed from the saved tensors; the cut happens at
    varied places (not always, not never), so a wrong feature or rule fails."""
    drafter = save_dspark(tmp_path / "conf", target_dir, kind="gated",
                          enable_confidence_head=True, confidence_head_with_markov=with_markov,
                          confidence_std=0.3)
    t = 0.5
    widths: list[int] = []
    seen = run_engine(target_dir, drafter, n=24, widths=widths,
                      draftwise={"confidence_threshold": t})
    ref = Reference(target_dir, drafter)
    lengths = []
    for (tokens, drafts), w in zip(seen, widths):
        assert drafts == ref.drafts(tokens, w, threshold=t), f"ctx {tokens}"
        lengths.append(len(drafts))
    assert len(set(lengths)) >= 3 and min(lengths) < 7, lengths


def test_markov_rank_zero_is_the_deepspec_dflash_block7_layout(target_dir, tmp_path) -> None:
    """§1.7: DeepSpec's dflash_*_block7 checkpoints are DSpark-class with markov_rank 0."""
    drafter = save_dspark(tmp_path / "r0", target_dir, rank=0, target_layer_ids=(0, 2))
    seen = run_engine(target_dir, drafter)
    ref = Reference(target_dir, drafter)
    assert seen
    for tokens, drafts in seen:
        assert drafts == ref.drafts(tokens, len(drafts)), f"ctx {tokens}"


def test_embedding_tap_is_not_layer_zero(target_dir, tmp_path) -> None:
    """-1 is the embedding output: reading it as decoder layer 0 drafts other tokens."""
    drafter = save_dspark(tmp_path / "emb", target_dir)
    shifted = save_dspark(tmp_path / "l0", target_dir, target_layer_ids=(0, 1))
    seen = run_engine(target_dir, shifted)
    ref = Reference(target_dir, drafter)  # same weights, taps (-1, 1)
    differ = sum(drafts != ref.drafts(tokens, len(drafts)) for tokens, drafts in seen)
    assert differ > len(seen) // 2, "a tap read from the wrong layer must change the drafts"


def reference_loop(ref: Reference, prompt: list[int], n: int) -> tuple[list[int], list[int]]:
    """DeepSpec's greedy decode loop over the equations: draft B, verify with the HF
    target in one forward, keep the matching prefix plus the target's next token."""
    b = ref.cfg["block_size"]
    tokens = list(prompt)
    with torch.no_grad():
        tokens.append(int(ref.target(torch.tensor([tokens])).logits[0, -1].argmax()))
        lengths: list[int] = []
        while len(tokens) - len(prompt) < n:
            drafts = ref.drafts(tokens, b)
            logits = ref.target(torch.tensor([tokens + drafts])).logits[0, len(tokens) - 1 :]
            nxt = logits.argmax(-1).tolist()
            a = 0
            while a < b and drafts[a] == nxt[a]:
                a += 1
            tokens += drafts[:a] + [nxt[a]]
            lengths.append(a + 1)
    return tokens[len(prompt) :][:n], lengths


def test_acceptance_lengths_equal_the_reference_loop(target_dir, trained_dir) -> None:
    """Per full-block step, tokens produced (accepted + 1) equal the reference loop's (at
    fixed depth, as the reference loop drafts)."""
    from .conftest import TRAIN_PROMPTS

    ref = Reference(target_dir, trained_dir)
    n = 24
    for prompt in TRAIN_PROMPTS[:2]:
        want, ref_lengths = reference_loop(ref, prompt, n)
        llm = LLM(model=str(target_dir), dtype="float32", speculative_config={
            "method": "dspark", "model": str(trained_dir), "num_speculative_tokens": 7,
            "draftwise": {"adaptive": False}})
        proposer = llm.engine.spec.proposers[0]
        steps: list[tuple[int, int]] = []
        real = proposer.on_verified

        def on_verified(outcome, real=real, steps=steps):
            steps.extend(zip(outcome.num_draft_tokens, (len(t) for t in outcome.output_token_ids)))
            real(outcome)

        proposer.on_verified = on_verified
        out = llm.generate({"prompt_token_ids": prompt},
                           SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))[0]
        assert out.outputs[0].token_ids == want
        full = []
        for drafted, produced in steps:  # the full blocks, before the end shortens them
            if drafted != 7:
                break
            full.append(produced)
        assert len(full) >= 2
        assert full == ref_lengths[: len(full)]
        assert max(full) > 1, "the trained drafter must get drafts accepted"
