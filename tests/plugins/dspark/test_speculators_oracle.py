"""speculators 0.9.0's own DSpark heads are the oracle for the plugin's, on the same weights.

``MarkovHead.block_bias`` and ``ConfidenceHead`` from speculators'
``models/dspark/model_definitions.py`` (loaded by file path: ``spec_oracle``) get the
weights of a drafter saved in speculators' layout (full vocabulary, and reduced: W1 over
the verifier's ids, W2 over the draft's). The engine drafts with that drafter; every block
it drafted is captured (the slots' hidden states, base logits, anchor, drafts, q) and
replayed through speculators' head TEACHER-FORCED on the engine's own drafts as previous
ids (``[anchor, d_0 .. d_{n-2}]``, target ids, as speculators' ``forward`` feeds the block
tokens). Then, per position:

- the plugin's corrected logits (``MarkovHead.latent`` + ``bias``: its torch pass's
  calls, on the packed GEMM) equal ``base + block_bias`` within :data:`TOL` of the bias
  scale;
- greedy (the native C pass where built): each draft is the target id of the argmax of
  speculators' corrected logits, except where its top two are within the tolerance;
- sampled (temperature 1, the torch pass): q is speculators' ``softmax`` put at the
  draft tokens' target ids, zero elsewhere;
- the plugin's confidence score equals ``sigmoid(ConfidenceHead([h; W1[prev]]))``.

Tolerances. speculators' head runs here in bf16 (the checkpoint's dtype: bf16 after each
Linear, activation and product, as the plugin rounds), the plugin's on its packed bf16
GEMM; only the accumulation order of a Linear can differ, moving an output by one bf16
step (2^-8 relative) and, through the gate, the rnn state and W2, a bias by a few steps of
its own scale. Measured on this machine (torch 2.13, Zen 5): no difference at all, every
type, full and reduced (the kernels' fp32 sums round to the same bf16). :data:`TOL`, 2^-5
of the row's largest |bias| (3%), is the bound for other machines' torch kernels; a wrong
formula moves the bias by its own order (measured here: the rnn's gate and candidate
chunks swapped, 79-83% of max |bias|; the gate fed [e; h] instead of [h; e], 160%). A
greedy pick is checked wherever speculators' top two differ by more than twice the
measured error (then both argmaxes agree); q within that error (softmax moves no entry
by more than the largest logit change). The confidence head is fp32 on both sides: 1e-5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from draftwise import LLM, SamplingParams
from draftwise.models import kernels
from safetensors.torch import load_file

from .conftest import random_keep, save_dspark, to_speculators
from .spec_oracle import definitions

V, RANK = 512, 32
KEEP = random_keep(V, 0.6, seed=4)
PROMPTS = [[7, 3, 11, 5, 2, 9, 14, 1], list(range(60, 90))]
#: the corrected logits' tolerance, relative to the row's largest |bias| (module doc)
TOL = 2.0**-5


def capture(llm: LLM) -> list[dict[str, Any]]:
    """Every drafted block: hidden [n, H], base [n, Vd], anchor, drafts (target ids), q."""
    prop = llm.engine.spec.proposers[0]
    blocks: list[dict[str, Any]] = []
    real_pass, real_draft = prop._markov_pass, prop._draft
    inputs: list[Any] = []

    def markov_pass(rows, plans, hidden, base, anchors):
        inputs[:] = [[p.drafts for p in plans], hidden.clone(), base.clone(), list(anchors)]
        return real_pass(rows, plans, hidden, base, anchors)

    def draft(rows, plans):
        out = real_draft(rows, plans)
        counts, hidden, base, anchors = inputs
        at = 0
        for n, a, (toks, qs) in zip(counts, anchors, out):
            blocks.append({"hidden": hidden[at : at + n], "base": base[at : at + n],
                           "anchor": a, "drafts": list(toks), "q": qs})
            at += n
        return out

    prop._markov_pass, prop._draft = markov_pass, draft
    return blocks


def oracle_heads(drafter: Path, kind: str, draft_vocab: int, hidden: int) -> tuple[Any, Any]:
    """speculators' MarkovHead and ConfidenceHead holding the drafter's saved weights."""
    defs = definitions()
    t = load_file(str(drafter / "model.safetensors"))
    head = defs.MarkovHead(verifier_vocab_size=V, draft_vocab_size=draft_vocab,
                           markov_rank=RANK, hidden_size=hidden, head_type=kind)
    head.load_state_dict({k.removeprefix("markov_head."): x for k, x in t.items()
                          if k.startswith("markov_head.")})
    conf = defs.ConfidenceHead(hidden + RANK)
    conf.load_state_dict({k.removeprefix("confidence_head."): x.float() for k, x in t.items()
                          if k.startswith("confidence_head.")})
    return head.to(torch.bfloat16).eval(), conf.eval()


def engine(target: Path, drafter: Path, probabilistic: bool) -> tuple[LLM, list[dict]]:
    # fixed depth: every block's heads are checked, k deep, against speculators'
    llm = LLM(model=str(target), dtype="bfloat16", max_num_seqs=2, speculative_config={
        "method": "dspark", "model": str(drafter), "num_speculative_tokens": 7,
        "draft_sample_method": "probabilistic" if probabilistic else "greedy",
        "draftwise": {"adaptive": False}})
    blocks = capture(llm)
    sp = (SamplingParams(temperature=1.0, max_tokens=12, seed=3, ignore_eos=True)
          if probabilistic else SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sp)
    assert len(blocks) >= 4
    return llm, blocks


@pytest.mark.parametrize("reduced", [False, True], ids=["full", "reduced"])
@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
def test_heads_equal_speculators(target_dir, tmp_path, kind: str, reduced: bool) -> None:
    src = save_dspark(tmp_path / kind, target_dir, kind=kind, rank=RANK,
                      enable_confidence_head=True, confidence_head_with_markov=True,
                      confidence_std=0.3)
    keep = KEEP if reduced else None
    drafter = to_speculators(src, tmp_path / "spec", keep=keep)
    ids = torch.tensor(KEEP if reduced else range(V))
    outside = torch.ones(V, dtype=torch.bool)
    outside[ids] = False
    for probabilistic in (False, True):
        llm, blocks = engine(target_dir, drafter, probabilistic)
        draft = llm.engine.spec.proposers[0].draft
        if not probabilistic and kernels.available("markov_pass"):
            assert llm.engine.spec.proposer_stats()[0]["markov_native_picks"] > 0
        hidden_size = blocks[0]["hidden"].shape[1]
        head, conf = oracle_heads(drafter, kind, len(ids), hidden_size)
        ties = 0
        for b in blocks:
            n, h, base = len(b["drafts"]), b["hidden"], b["base"]
            prev = torch.tensor([b["anchor"], *b["drafts"][:-1]])
            with torch.no_grad():
                bias = head.block_bias(prev_token_ids=prev[None],
                                       hidden_states=h[None].to(torch.bfloat16))[0].float()
            theirs = base + bias
            ours, state = [], draft.markov.init_state(1, h.dtype, h.device)
            for j in range(n):
                u, state = draft.markov.latent(prev[j : j + 1], h[j : j + 1], state)
                ours.append(base[j] + draft.markov.bias(u)[0])
            scale = bias.abs().amax(dim=1)  # [n]
            err = (torch.stack(ours) - theirs).abs().amax(dim=1)
            assert bool((err <= TOL * scale).all()), (kind, reduced, (err / scale).tolist())
            if probabilistic:
                q = torch.stack(b["q"])  # [n, V]: the engine's q, target ids
                want = torch.zeros(n, V)
                want[:, ids] = theirs.softmax(-1)
                assert not bool(q[:, outside].any())
                # |softmax(a) - softmax(b)| <= max |a - b| elementwise
                atol = 1e-5 + float(err.max())
                assert torch.allclose(q, want, atol=atol, rtol=0.0), float((q - want).abs().max())
                assert all(int(d) in set(ids.tolist()) for d in b["drafts"])
            else:
                top2 = theirs.topk(2, dim=1)
                for j in range(n):
                    if float(top2.values[j, 0] - top2.values[j, 1]) <= 2 * float(err[j]):
                        ties += 1  # within the measured error: either pick is the oracle's
                        continue
                    assert b["drafts"][j] == int(ids[top2.indices[j, 0]]), (kind, reduced, j)
            with torch.no_grad():
                feats = torch.cat([h.float(), head.markov_w1.weight[prev].float()], -1)
                want_c = torch.sigmoid(conf(feats))
            got_c = draft.confidence(h, prev)
            assert torch.allclose(got_c, want_c, atol=1e-5, rtol=0.0)
        assert ties <= 2, "near-ties must be rare, or the pick check checks little"
