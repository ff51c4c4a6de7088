"""The default model (SmolLM2-135M-Instruct Q4_1 GGUF) against transformers on the same file.

transformers dequantizes the GGUF to fp32; so do we for ``dtype="float32"``. Measured:
logits differ by at most ~1e-4 (logits are O(20)); greedy tokens are identical.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from draftwise.formats.default_model import DEFAULT_MODEL_FILE, default_model_path
from draftwise.models.loader import LoadedModel, load_model

pytestmark = pytest.mark.default_model

WORKLOAD = Path("/work/shared/workloads/cpu-smoke-8.jsonl")
FALLBACK_PROMPTS = [
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "Explain what a linked list is, in two sentences."}],
    [{"role": "user", "content": "List three uses of copper."}],
]


def prompts() -> list[list[dict[str, str]]]:
    """Three short conversations of the smoke workload (long ones cost prefill time)."""
    if not WORKLOAD.exists():
        return FALLBACK_PROMPTS
    rows = [json.loads(line)["messages"] for line in WORKLOAD.read_text().splitlines() if line]
    rows.sort(key=lambda m: len(m[-1]["content"]))
    return rows[:3]


@pytest.fixture(scope="module")
def ours() -> LoadedModel:
    return load_model(None, dtype="float32")


@pytest.fixture(scope="module")
def theirs() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    path = Path(default_model_path())
    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=DEFAULT_MODEL_FILE, dtype=torch.float32
    ).eval()


def test_loaded_model_facts(ours: LoadedModel) -> None:
    c = ours.config
    assert (c.architecture, c.hidden_size, c.num_hidden_layers) == ("LlamaForCausalLM", 576, 30)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    assert (c.vocab_size, c.rope_theta, c.tie_word_embeddings) == (49152, 100000.0, True)
    assert c.rms_norm_eps == pytest.approx(1e-5)
    assert ours.bos_token_id == 1 and ours.eos_token_ids == (2,)
    assert ours.format == "gguf" and ours.path.endswith(DEFAULT_MODEL_FILE)
    assert ours.model.lm_head_weight is ours.model.embed_weight
    assert ours.tokenizer is not None and ours.chat_template is not None
    ids = ours.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[:3] == [1, 9690, 198] and ids[-4:] == [1, 520, 9531, 198]  # ...assistant\n


def test_prompt_logits_match_transformers(ours: LoadedModel, theirs, paged_runner) -> None:
    ids = ours.encode_chat(prompts()[0])
    logits, _ = paged_runner(ours.model, block_size=16, num_blocks=32).step({0: ids})
    with torch.no_grad():
        ref = theirs(torch.tensor([ids])).logits[0]
    assert (logits[0] - ref).abs().max().item() < 5e-4
    assert torch.equal(logits[0].argmax(-1), ref.argmax(-1))


def test_greedy_matches_transformers(ours: LoadedModel, theirs, greedy_decode) -> None:
    for messages in prompts():
        ids = ours.encode_chat(messages)
        got = greedy_decode(ours.model, ids, 64, stop=ours.eos_token_ids)
        with torch.no_grad():
            ref = theirs.generate(
                torch.tensor([ids]), max_new_tokens=64, do_sample=False, eos_token_id=2
            )[0, len(ids) :].tolist()
        assert got == ref, messages[-1]["content"][:40]
        assert len(got) >= 32  # a real continuation, not an early stop
