"""MTP with structured output: greedy spec-on == spec-off with a grammar active, on the
tiny Qwen3.5 hybrid (GDN layers: the recurrent state rolls back with rejected drafts).

The tiny head is random, so its drafts are mostly rejected (or cut by the grammar before
the forward): this covers the mask at the first verified position with the matcher and
the recurrent state rolled back. The grammar bans the greedy continuation's 4th token, so
it changes the output. Token texts: ids 0-10 the digits and "w" (llguidance needs every
byte as a token), id ``i`` above that ``w<i>``; EOS is 255.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from draftwise import LLM, SamplingParams
from draftwise.structured import StructuredOutputsParams
from spec_features import assert_grammar_identical

ROOT = Path(__file__).resolve().parents[3]
PROMPT = [5, 17, 99, 3, 250, 42, 42, 7, 128, 64, 1, 2, 3]
TEXTS = [str(i) for i in range(10)] + ["w"] + [f"w{i}" for i in range(11, 255)] + ["[EOS]"]
EOS = 255


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    spec = importlib.util.spec_from_file_location(
        "build_tiny_hybrid", ROOT / "scripts" / "build_tiny_hybrid.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = mod.build(tmp_path_factory.mktemp("hybrid-mtp-so"), "qwen3_5")
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(TEXTS)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path / "tokenizer.json"))
    cfg = json.loads((path / "config.json").read_text())
    cfg["eos_token_id"] = EOS
    if "text_config" in cfg:
        cfg["text_config"]["eos_token_id"] = EOS
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def run(path: Path, config: dict | None, grammar: str | None) -> tuple[list[int], str, LLM]:
    so = None if grammar is None else StructuredOutputsParams(regex=grammar)
    params = SamplingParams(temperature=0.0, max_tokens=16, structured_outputs=so)
    llm = LLM(model=str(path), dtype="bfloat16", speculative_config=config)
    out = llm.generate({"prompt_token_ids": PROMPT}, params)[0]
    assert out.error is None, out.error
    assert llm.engine.kv.num_used_blocks == 0
    return out.outputs[0].token_ids, out.outputs[0].text, llm


@pytest.fixture(scope="module")
def grammar(hybrid_dir: Path) -> str:
    free, _, _ = run(hybrid_dir, None, None)
    banned = {free[3]} | set(range(11))
    return "(" + "|".join(TEXTS[i] for i in range(EOS) if i not in banned) + ")+"


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_identical_with_grammar(hybrid_dir: Path, grammar: str, k: int) -> None:
    free, _, _ = run(hybrid_dir, None, None)
    off, text, _ = run(hybrid_dir, None, grammar)
    assert off != free, "the grammar must change the output, or the test cannot fail"
    assert re.fullmatch(grammar, text.removesuffix("[EOS]")), text
    # fixed depth: the head must draft under the grammar, which adaptive depth (the
    # default) may not do where this machine prices the head's drafts out
    on, _, llm = run(hybrid_dir, {"method": "mtp", "num_speculative_tokens": k,
                                  "draftwise": {"adaptive": False}}, grammar)
    assert on == off
    assert llm.engine.spec.metrics.num_draft_tokens > 0
    assert llm.engine.spec.num_tracked_requests == 0


def test_greedy_identical_with_grammar_and_drafts_accepted(hybrid_dir: Path) -> None:
    """Three allowed tokens (the digits 1-3), each penalised once used: the head drafts with
    the request's processing, so its drafts are often what the target must say and are
    accepted; the grammar (a 2 after every 1) applies inside accepted blocks."""
    extra = {"allowed_token_ids": (1, 2, 3), "frequency_penalty": 2.0, "presence_penalty": 2.0}
    assert_grammar_identical(hybrid_dir, {"method": "mtp", "num_speculative_tokens": 3},
                             [PROMPT], "(12|3)+", extra=extra, max_tokens=19)
