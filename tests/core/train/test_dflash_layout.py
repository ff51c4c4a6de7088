"""A drafter trained by ``draftwise train dflash`` loads in z-lab's ``dflash`` package
(``DFlashDraftModel.from_pretrained`` of the saved folder: its config reader, its state
dict) and drafts, step by step, what the dflash plugin drafts; z-lab's own decode loop
(``spec_generate``) with it gives the target's greedy output.

``test_dflash_net.py`` checks the training forward against z-lab's module on a random net
and the engine against the training forward; this is the saved trained folder against
z-lab's loader and z-lab's drafting code (``tests/plugins/dflash/test_oracle.py``'s
``reference_drafts``: target ``hidden_states``, ``extract_context_feature``, the block
forward, ``compute_logits``, argmax). Both sides float32: equal tokens exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from draftwise import LLM, SamplingParams

from tests.plugins.dflash.test_oracle import hf_pair, record_drafts, reference_drafts

from .conftest import PROMPTS, TAPS


def test_zlab_loads_the_trained_drafter_and_drafts_the_same_tokens(tiny_target: str,
                                                                   trained: Path) -> None:
    k = json.loads((trained / "config.json").read_text())["dflash_config"]["block_size"] - 1
    llm = LLM(model=tiny_target, dtype="float32", speculative_config={
        "method": "dflash", "model": str(trained), "num_speculative_tokens": k,
        "draftwise": {"adaptive": False}})
    seen = record_drafts(llm)
    sp = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    prompts = [p.text for p in PROMPTS[:3]] + ["zz top"]
    outs = llm.generate(prompts, sp)
    target, ref = hf_pair(Path(tiny_target), trained)
    assert list(ref.target_layer_ids) == list(TAPS) and ref.block_size == k + 1
    assert len(seen) >= 10
    for tokens, drafts in seen:
        assert drafts == reference_drafts(target, ref, tokens, len(drafts)), f"ctx {tokens}"
    # z-lab's own loop: lossless, and the trained drafter is accepted there too
    for out in outs:
        prompt = list(out.prompt_token_ids)
        got = ref.spec_generate(target, torch.tensor([prompt]), max_new_tokens=20,
                                stop_token_ids=None)
        assert got[0, len(prompt):].tolist() == list(out.outputs[0].token_ids)
