"""A drafter trained by ``draftwise train dspark`` loads in speculators 0.9.0's own
``DSparkDraftModel.from_pretrained`` (its config schema, its state-dict rules, its
verifier-weights step), and that model drafts what the dspark plugin drafts.

For every block the engine drafted (fixed depth, greedy), the reference recomputes it from
scratch with speculators' modules: the HF target's ``hidden_states`` at
``aux_hidden_state_layer_ids`` over the committed context, ``fc``/``hidden_norm``, the
decoder ``layers`` over ``[anchor, MASK x (B-1)]`` (eager attention, no mask: the block
sees the whole context and itself), ``norm``, ``lm_head``, then the left-to-right Markov
pass (``MarkovHead.block_bias`` on the picks so far, teacher-forced on its own picks) with
each pick mapped to a target id through speculators' loaded ``d2t``. Both run float32 on
the same bf16-valued weights; the engine's drafts must equal the reference's exactly
except at a near-tie (top two within :data:`TIE` of each other), where the comparison of
that block stops (the picks after it read another previous token).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from draftwise import LLM, SamplingParams

from tests.plugins.dflash.test_oracle import record_drafts
from tests.plugins.dspark.spec_oracle import dspark_model_class

from .conftest import PROMPTS, VOCAB

#: logits closer than this are a tie either implementation may break its own way (the
#: engine's float32 GEMMs sum in another order than torch's reference Linear)
TIE = 1e-3


def speculators_drafts(target: Any, model: Any, tokens: list[int], k: int) -> tuple[list[int], int]:
    """speculators' greedy drafts for one block (context ``tokens[:-1]``, anchor
    ``tokens[-1]``) and how many of them are decided (the first near-tie ends them)."""
    n, b = len(tokens), model.block_size
    with torch.no_grad():
        hs = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
        ctx = torch.cat([hs[i] for i in model.target_layer_ids], -1)
        ctx = model.hidden_norm(model.fc(ctx))
        x = model.embed_tokens(torch.tensor([[tokens[-1]] + [model.mask_token_id] * (b - 1)]))
        pos = torch.arange(n - 1 + b)[None]
        pe = model.rotary_emb(x, pos)
        for layer in model.layers:
            x = layer(hidden_states=x, target_hidden=ctx, attention_mask=None, position_ids=pos,
                      position_embeddings=pe, use_cache=False)
        h = model.norm(x)  # [1, B, H]
        base = model.lm_head(h)[0]  # [B, Vd]
        prev, drafts = [tokens[-1]], []
        for j in range(k):
            bias = model.markov_head.block_bias(prev_token_ids=torch.tensor([prev]),
                                                hidden_states=h[:, : j + 1])[0, j]
            logits = base[j] + bias
            top = logits.topk(2)
            if float(top.values[0] - top.values[1]) <= TIE:
                return drafts, j
            pick = int(top.indices[0])
            tid = pick if model.d2t is None else pick + int(model.d2t[pick])
            drafts.append(tid)
            prev.append(tid)
    return drafts, k


@pytest.mark.parametrize("which", ["reduced", "full"])
def test_speculators_loads_the_trained_drafter_and_drafts_the_same_tokens(
        tiny_target: str, dspark_trained: Path, dspark_trained_full: Path, which: str) -> None:
    import transformers

    drafter = dspark_trained if which == "reduced" else dspark_trained_full
    llm = LLM(model=tiny_target, dtype="float32", speculative_config={
        "method": "dspark", "model": str(drafter), "draftwise": {"adaptive": False}})
    seen = record_drafts(llm)
    prompts = [p.text for p in PROMPTS[:3]] + ["an unseen prompt"]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    target = transformers.AutoModelForCausalLM.from_pretrained(tiny_target,
                                                               dtype=torch.float32).eval()
    with dspark_model_class() as cls:
        model = cls.from_pretrained(str(drafter), dtype=torch.float32).eval()
        vocab = model.draft_vocab_size
        for layer in model.layers:
            layer.self_attn.config._attn_implementation = "eager"
        assert vocab == (VOCAB if which == "reduced" else 512)
        assert (model.d2t is None) == (which == "full")
        assert not model.embed_tokens.weight.isnan().any()  # read from the verifier
        checked = ties = 0
        assert len(seen) >= 10
        for tokens, drafts in seen:
            want, decided = speculators_drafts(target, model, tokens, len(drafts))
            assert drafts[:decided] == want, f"ctx {tokens}"
            checked += decided
            ties += decided < len(drafts)
    assert ties <= 2 and checked >= 30, (ties, checked)
