"""``draftwise train data`` on a tiny checkpoint: what it records, and that it resumes.

The recorded states are checked against the target itself, not against the recorder's own
code path: for a greedy response, the LM head over the recorded ``final`` state at each
position picks exactly the next recorded token (an off-by-one tap or position fails), and
the final norm of the last-layer tap is the ``final`` state. An interrupted run resumed
with the same command gives byte-identical shards to an uninterrupted one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from draftwise.errors import DraftwiseError
from draftwise.train.data import DataPlan, generate_data
from draftwise.train.prompts import Prompt, PromptFileError, builtin_prompts, read_prompts
from draftwise.train.shards import read_manifest, read_sequences
from tiny_checkpoints import save_tiny, write_byte_tokenizer

PROMPTS = [Prompt(text=t) for t in ("abcabc", "hello there", "the cat sat", "xyz", "aaaa",
                                    "012345", "def f(x):", "once upon")]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_byte_tokenizer(save_tiny("llama", tmp_path_factory.mktemp("t"), seed=7,
                                              std=0.3)))


def plan(model: str, out: Path, **kw: object) -> DataPlan:
    base: dict = dict(model=model, out=out, taps=(0, 1), max_tokens=12, batch=3,
                      sampled_share=0.0, shard_tokens=40)
    return DataPlan(**{**base, **kw})


def test_greedy_states_predict_the_recorded_tokens(model: str, tmp_path: Path) -> None:
    from draftwise.models.loader import load_model

    target = load_model(model).model
    layers = target.config.num_hidden_layers
    report = generate_data(plan(model, tmp_path / "d", taps=(0, layers - 1)), PROMPTS)
    assert report.stopped == "prompts" and report.progress.prompts_done == len(PROMPTS)
    seqs = list(read_sequences(tmp_path / "d"))
    assert len(seqs) == len(PROMPTS)
    for s in seqs:
        ids, r = np.asarray(s.token_ids), s.response_start
        assert len(ids) > r  # a response was recorded
        final = torch.from_numpy(np.asarray(s.states["final"], dtype=np.float32))
        picks = target.lm_head(final[r - 1:-1].to(target.dtype)).argmax(-1).numpy()
        assert (picks == ids[r:]).all()
        last = torch.from_numpy(np.asarray(s.states[f"tap{layers - 1}"], dtype=np.float32))
        normed = target.final_norm(last.to(target.dtype)).float()
        assert torch.allclose(normed, final, atol=2e-2)  # float16 on disk


def test_responses_equal_the_engines_own_greedy_output(model: str, tmp_path: Path) -> None:
    from draftwise import LLM, SamplingParams

    generate_data(plan(model, tmp_path / "d"), PROMPTS[:4])
    llm = LLM(model=model)
    outs = llm.generate([p.text for p in PROMPTS[:4]],
                        SamplingParams(temperature=0.0, max_tokens=12))
    for s, out in zip(read_sequences(tmp_path / "d"), outs):
        assert list(s.token_ids[s.response_start:]) == list(out.outputs[0].token_ids)
        assert list(s.token_ids[:s.response_start]) == list(out.prompt_token_ids)


def test_an_interrupted_run_resumes_to_the_same_data(model: str, tmp_path: Path) -> None:
    whole = generate_data(plan(model, tmp_path / "whole", sampled_share=0.5), PROMPTS)
    first = generate_data(plan(model, tmp_path / "split", sampled_share=0.5, tokens=60),
                          PROMPTS)
    assert first.stopped == "tokens" and first.progress.prompts_done < len(PROMPTS)
    again = generate_data(plan(model, tmp_path / "split", sampled_share=0.5), PROMPTS)
    assert again.progress.prompts_done == len(PROMPTS)
    a, b = list(read_sequences(tmp_path / "whole")), list(read_sequences(tmp_path / "split"))
    assert [list(s.token_ids) for s in a] == [list(s.token_ids) for s in b]
    for sa, sb in zip(a, b):
        for name in sa.states:
            assert np.array_equal(np.asarray(sa.states[name]), np.asarray(sb.states[name]))
    assert read_manifest(tmp_path / "split")["tokens"] == whole.progress.tokens


def test_other_taps_on_an_existing_folder_are_refused(model: str, tmp_path: Path) -> None:
    generate_data(plan(model, tmp_path / "d"), PROMPTS[:2])
    with pytest.raises(DraftwiseError, match="manifest records"):
        generate_data(plan(model, tmp_path / "d", taps=(1,)), PROMPTS)
    with pytest.raises(DraftwiseError, match="taps"):
        generate_data(plan(model, tmp_path / "e", taps=(99,)), PROMPTS)


def test_a_broken_manifest_is_refused_by_name(model: str, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "manifest.json").write_text("{not json")
    with pytest.raises(DraftwiseError, match="unreadable"):
        generate_data(plan(model, tmp_path / "d"), PROMPTS)
    (tmp_path / "d" / "manifest.json").write_text("[1, 2]")
    with pytest.raises(DraftwiseError, match="not a draftwise data manifest"):
        list(read_sequences(tmp_path / "d"))


def test_prompt_files_and_the_builtin_mix(tmp_path: Path) -> None:
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "a"}\n\n{"messages": [{"role": "user", "content": "b"}]}\n')
    assert read_prompts(good) == [Prompt(text="a"),
                                  Prompt(messages=({"role": "user", "content": "b"},))]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(PromptFileError, match="bad.jsonl:2"):
        read_prompts(bad)
    mix = builtin_prompts(seed=3)
    assert mix == builtin_prompts(seed=3) and mix != builtin_prompts(seed=4)
    contents = [p.messages[0]["content"] for p in mix if p.messages]
    assert len(mix) > 1000 and len(contents) == len(mix)
    assert any(c.startswith("Write a Python function") for c in contents[:50])
    assert any(c.startswith("Explain what this Python function") for c in contents[:50])


def test_the_command_line(model: str, tmp_path: Path) -> None:
    from draftwise.cli import cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in PROMPTS[:3]))
    result = CliRunner().invoke(cli, ["train", "data", "--model", model, "--out",
                                      str(tmp_path / "d"), "--prompts", str(prompts),
                                      "--max-tokens", "8", "--taps", "0,1", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    assert summary["prompts_done"] == 3 and summary["taps"] == [0, 1]
    bad = CliRunner().invoke(cli, ["train", "data", "--model", model, "--out",
                                   str(tmp_path / "e"), "--prompts", str(prompts),
                                   "--taps", "0,7"])
    assert bad.exit_code == 2 and "taps [0, 7]" in bad.output


def test_a_shard_is_written_once_the_oldest_buffered_sequence_is_old(tmp_path: Path) -> None:
    """A slow target (the 1.5B: ~15 tokens/s) must not keep hours of data in memory: a
    shard is written by age as well as by size, and the manifest advances with it."""
    from draftwise.train.shards import ShardWriter

    now = [0.0]
    writer = ShardWriter(tmp_path, ("tap0", "final"), 4, shard_tokens=1 << 20,
                         shard_seconds=60.0, clock=lambda: now[0])
    states = {"tap0": np.zeros((3, 4)), "final": np.ones((3, 4))}
    writer.add([1, 2, 3], 1, states)
    now[0] = 59.0
    writer.prompts_finished(1)
    assert read_manifest(tmp_path) is None  # young and small: still buffered
    writer.add([4, 5, 6], 2, states)
    now[0] = 60.0
    writer.prompts_finished(1)
    manifest = read_manifest(tmp_path)
    assert [s["tokens"] for s in manifest["shards"]] == [6] and manifest["prompts_done"] == 2
    writer.add([7, 8, 9], 1, states)  # the clock restarts with the next shard's first sequence
    now[0] = 119.0
    writer.prompts_finished(1)
    assert len(read_manifest(tmp_path)["shards"]) == 1
