"""dflash with structured output: greedy spec-on == spec-off with a grammar active.

The tiny target's tokens are words (token ``i >= 11`` is the text ``w<i>``), so a regex
that is an alternation of token texts is (nearly) a per-position token mask. The grammar bans two
tokens of the greedy continuations (their 9th and 10th), so the output changes there
while the trained drafter's drafts before it are accepted: the mask applies inside an
accepted block, drafts the grammar refuses are cut, and the matcher rolls back with
rejected ones.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from draftwise import LLM, SamplingParams
from draftwise.structured import StructuredOutputsParams

from .conftest import TOKENS, TRAIN_PROMPTS

BANNED = (354, 280)
#: the copy's token texts: llguidance needs every byte as a token, so ids 0-10 are the
#: digits and "w" (the greedy continuations use none of them)
TEXTS = [str(i) for i in range(10)] + ["w"] + TOKENS[11:]
WORDS = "|".join(TEXTS[i] for i in range(11, 510) if i not in BANNED)
GRAMMAR = f"({WORDS})+"


def run(target: Path, config: dict | None) -> tuple[list[list[int]], list[str], LLM]:
    params = SamplingParams(temperature=0.0, max_tokens=20,
                            structured_outputs=StructuredOutputsParams(regex=GRAMMAR))
    llm = LLM(model=str(target), dtype="bfloat16", speculative_config=config, max_num_seqs=2)
    outs = llm.generate([{"prompt_token_ids": p} for p in TRAIN_PROMPTS[:2]], params)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    assert llm.engine.kv.num_used_blocks == 0
    return [o.outputs[0].token_ids for o in outs], [o.outputs[0].text for o in outs], llm


@pytest.fixture(scope="module")
def target(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target declaring an EOS (``[UNK]``, 511: what a finished grammar allows),
    its words as a byte-level BPE (:data:`TEXTS`: what llguidance reads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    path = tmp_path_factory.mktemp("df-so") / "target"
    shutil.copytree(target_dir, path)
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(TEXTS)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path / "tokenizer.json"))
    cfg = json.loads((path / "config.json").read_text())
    cfg["eos_token_id"] = 511
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def off(target: Path) -> list[list[int]]:
    got, text, _ = run(target, None)
    for toks, t in zip(got, text):
        assert not set(toks) & set(BANNED)
        assert re.fullmatch(GRAMMAR, t), (t, toks)
    free = LLM(model=str(target), dtype="bfloat16").generate(
        [{"prompt_token_ids": p} for p in TRAIN_PROMPTS[:2]],
        SamplingParams(temperature=0.0, max_tokens=20))
    assert got != [o.outputs[0].token_ids for o in free], "the grammar must change the output"
    return got


@pytest.mark.parametrize("k", [3, 7])
@pytest.mark.parametrize("version", [1, 2])
def test_greedy_identical_with_grammar(target: Path, trained_dir: Path, trained2_dir: Path,
                                       off, version: int, k: int) -> None:
    drafter = trained_dir if version == 1 else trained2_dir
    got, _, llm = run(target, {"method": "dflash", "model": str(drafter),
                                   "num_speculative_tokens": k})
    assert got == off
    m = llm.engine.spec.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens
    assert llm.engine.spec.num_tracked_requests == 0
