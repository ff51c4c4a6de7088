"""The Medusa-style example plugin of docs/writing-a-plugin.md section 5.4 runs as documented.

``docs/examples/medusa_lite/`` is a pip-installable package; here it is installed as the
plugin tests install their fake distributions (``make_dist``: a ``.dist-info`` with the
entry points its ``pyproject.toml`` declares, the package put on ``sys.path``), so the
engine discovers it through the same entry-point path a ``pip install`` gives. Checked:
greedy output with speculation on equals speculation off on a tiny checkpoint, with drafts
made and some accepted; every row handed carries ``[n, hidden]`` with ``n = len(token_ids)
- 1 - num_kv_computed >= 1`` (what section 5.4 promises, so the example's defensive branch
never runs); and with zero heads head 0 drafts ``token_ids[-1]`` (the newest hidden row's
LM head gives the token already chosen, the alignment section 5.4 states).
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spec_sampling import fixed_depth
from tiny_checkpoints import save_tiny

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "medusa_lite"
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 8, 7, 6, 5], [3, 3, 3, 3]]


@pytest.fixture
def medusa_lite(make_dist, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The example, discoverable as the installed distribution its pyproject declares."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    make_dist(project["name"], project["version"], project["entry-points"]["draftwise"], {})
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import medusa_lite.proposer

    yield medusa_lite.proposer
    for name in [m for m in sys.modules if m == "medusa_lite" or m.startswith("medusa_lite.")]:
        del sys.modules[name]


def _generate(path: str, spec: dict[str, Any] | None) -> tuple[list[list[int]], Any]:
    from draftwise import LLM, SamplingParams

    llm = LLM(model=path, dtype="float32", speculative_config=spec)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    return [o.outputs[0].token_ids for o in outs], llm


@pytest.mark.parametrize("std", [0.0, 0.05])
def test_greedy_identity_with_the_example_plugin(tmp_path: Path, medusa_lite, monkeypatch,
                                                 std: float) -> None:
    rows: list[tuple[int, int, int]] = []  # (hidden rows, len(token_ids), num_kv_computed)
    heads_vs_last: list[bool] = []
    propose = medusa_lite.MedusaLiteProposer.propose

    def spy(self, batch):
        out = propose(self, batch)
        for i, row in enumerate(batch.rows):
            rows.append((row.hidden[self.layer].shape[0], len(row.token_ids),
                         row.num_kv_computed))
            if out.num_draft_tokens[i]:
                heads_vs_last.append(int(out.row(i)[0]) == int(row.token_ids[-1]))
        return out

    monkeypatch.setattr(medusa_lite.MedusaLiteProposer, "propose", spy)
    path = str(save_tiny("llama", tmp_path / "m", seed=3))
    off, _ = _generate(path, None)
    on, llm = _generate(path, fixed_depth({"method": "medusa_lite", "num_speculative_tokens": 3,
                                           "medusa_init_std": std}))
    assert on == off
    stats = llm.engine.spec.proposer_stats()
    assert stats[0]["method"] == "medusa_lite" and stats[0]["head_forwards"] > 0
    assert stats[0]["rows_without_hidden"] == 0
    assert rows and all(n >= 1 and n == length - 1 - first for n, length, first in rows)
    assert llm.engine.spec.metrics.num_accepted_tokens > 0  # the drafts mattered
    assert llm.engine.kv.num_used_blocks == 0 and llm.engine.spec.num_tracked_requests == 0
    if std == 0.0:  # zero heads: each drafts the LM head's token of the newest position
        assert heads_vs_last and all(heads_vs_last)


def test_the_pages_excerpt_is_the_files_own_code() -> None:
    """docs/writing-a-plugin.md section 5.4 quotes the proposer with docstrings and counters
    left out: every line it shows must be the file's, in the file's order (issue 42, D7),
    so the quoted code cannot drift from the code this module runs."""
    page = (EXAMPLE.parents[1] / "writing-a-plugin.md").read_text().splitlines()
    marker = next(i for i, line in enumerate(page)
                  if line.startswith("<!-- doc-test: skip fragment: an excerpt of "
                                     "docs/examples/medusa_lite/medusa_lite/proposer.py"))
    assert page[marker + 1] == "```python"
    end = page.index("```", marker + 2)
    shown = [line.rstrip() for line in page[marker + 2 : end] if line.strip()]
    source = [line.rstrip() for line in
              (EXAMPLE / "medusa_lite" / "proposer.py").read_text().splitlines()]
    at = 0
    for line in shown:
        assert line in source[at:], f"not in proposer.py (after line {at}): {line!r}"
        at = source.index(line, at) + 1
    assert len(shown) > 30  # the excerpt is the class, not a line or two
