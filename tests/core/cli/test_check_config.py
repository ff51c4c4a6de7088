"""``draftwise check-config``: exit 0 and the resolved JSON, or exit 2 and the refusal."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from tiny_checkpoints import save_tiny, save_tiny_hybrid

from draftwise.cli import CliState, cli
from draftwise.config.adaptive import AdaptiveConfig
from draftwise.plugins import PluginHost, load_entry_point_plugins


@pytest.fixture(scope="module")
def state() -> CliState:
    return CliState(load_entry_point_plugins(PluginHost(), selection=None))


def check(state: CliState, *args: str, stdin: str | None = None):
    return CliRunner().invoke(cli, ["check-config", *args], obj=state, input=stdin)


def test_resolved_config_printed(state: CliState) -> None:
    result = check(state, '{"method":"ngram","num_speculative_tokens":4}')
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "draft_sample_method": "greedy",
        "rejection_sample_method": "standard",
        "prompt_lookup_min": 5,
        "prompt_lookup_max": 5,
        # no "draftwise" key: adaptive depth with every default, printed so the user sees it
        "draftwise": {"adaptive": AdaptiveConfig().model_dump(mode="json")},
    }
    assert result.stderr == ""


def test_adaptive_false_prints_fixed_depth(state: CliState) -> None:
    result = check(state, '{"method":"ngram","num_speculative_tokens":4,'
                          '"draftwise":{"adaptive":false}}')
    assert result.exit_code == 0
    assert json.loads(result.stdout)["draftwise"] == {"adaptive": False}
    assert result.stderr == ""


def test_refusal_exits_2_with_the_message_on_stderr(state: CliState) -> None:
    result = check(state, '{"method":"ngram","num_speculatve_tokens":4}')
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(
        "error: unknown key 'num_speculatve_tokens'; did you mean 'num_speculative_tokens'?"
    )


def test_bad_json_exits_2(state: CliState) -> None:
    result = check(state, "{method:ngram}")
    assert result.exit_code == 2
    assert "line 1, column 2 (char 1)" in result.stderr
    assert "put the whole object in single quotes" in result.stderr


def test_notices_go_to_stderr(state: CliState) -> None:
    result = check(state, '{"method":"deepseek_mtp","num_speculative_tokens":1}')
    assert result.exit_code == 0
    assert json.loads(result.stdout)["method"] == "mtp"
    lines = result.stderr.splitlines()
    assert lines[0] == (
        "notice: method 'deepseek_mtp' is an alias of 'mtp' (vLLM deprecates it in favour of "
        "'mtp'); using 'mtp'"
    )
    assert all(line.startswith("notice: ") for line in lines)


def test_stdin(state: CliState) -> None:
    result = check(state, "-", stdin='{"model": "[ngram]", "num_speculative_tokens": 2}')
    assert result.exit_code == 0 and json.loads(result.stdout)["method"] == "ngram"


def test_null(state: CliState) -> None:
    result = check(state, "null")
    assert result.exit_code == 0 and result.stdout == "null\n"


def test_output_checks_again(state: CliState, tiny_draft: Path) -> None:
    config = {"method": "draft_model", "model": str(tiny_draft), "num_speculative_tokens": 15}
    first = check(state, json.dumps(config))
    assert first.exit_code == 0, first.stderr
    again = check(state, first.stdout)
    assert again.exit_code == 0 and again.stdout == first.stdout


# -- the drafter's own files, and its fit with --model, from headers alone -----------------


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("qwen2", tmp_path_factory.mktemp("cc-target"))  # vocab 512, hidden 128


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("qwen2", tmp_path_factory.mktemp("cc-draft"), num_hidden_layers=1)


@pytest.fixture(scope="module")
def other_vocab_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("qwen2", tmp_path_factory.mktemp("cc-other"), vocab_size=256,
                     num_hidden_layers=1)


@pytest.fixture
def no_tensor_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any read of tensor data (either format) or a model load fails the test."""
    from draftwise.formats.gguf import GGUFCheckpoint
    from draftwise.formats.safetensors_dir import SafetensorsCheckpoint
    from draftwise.models import loader

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("check-config read tensor data")

    for cls, names in ((SafetensorsCheckpoint, ("iter_tensors", "iter_raw")),
                       (GGUFCheckpoint, ("raw", "dequantize", "load_hf", "iter_hf"))):
        for name in names:
            monkeypatch.setattr(cls, name, refuse)
    monkeypatch.setattr(loader, "load_model", refuse)


def timed_check(state: CliState, *args: str):
    start = time.perf_counter()
    result = check(state, *args)
    return result, time.perf_counter() - start


@pytest.mark.usefixtures("no_tensor_reads")
def test_missing_draft_file_is_refused(state: CliState) -> None:
    result, seconds = timed_check(
        state, '{"method":"draft_model","model":"nope.gguf","num_speculative_tokens":4}')
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == "error: nope.gguf: no such file or directory\n"
    assert seconds < 1.0


@pytest.mark.usefixtures("no_tensor_reads")
def test_missing_drafter_directory_is_refused(state: CliState, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-drafter"
    result, seconds = timed_check(
        state, json.dumps({"method": "dflash", "model": str(missing)}))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {missing}: no such file or directory. Instead: ")
    assert seconds < 1.0


@pytest.mark.usefixtures("no_tensor_reads")
def test_a_directory_that_is_not_a_drafter_is_refused(state: CliState, tiny_target: Path) -> None:
    """A plain Qwen2 checkpoint handed to dflash: its own config says what it is."""
    result, seconds = timed_check(
        state, json.dumps({"method": "dflash", "model": str(tiny_target)}))
    assert result.exit_code == 2, result.output
    assert "not a DFlash drafter" in result.stderr and "Instead: " in result.stderr
    assert seconds < 1.0


@pytest.mark.usefixtures("no_tensor_reads")
def test_vocabulary_mismatch_with_the_target_is_refused(
    state: CliState, tiny_target: Path, other_vocab_draft: Path
) -> None:
    config = {"method": "draft_model", "model": str(other_vocab_draft),
              "num_speculative_tokens": 4}
    result, seconds = timed_check(state, "--model", str(tiny_target), json.dumps(config))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(
        f"error: model={str(other_vocab_draft)!r} is refused: the draft's vocabulary has 256 "
        "tokens and the target's 512")
    assert 'Instead: set "use_heterogeneous_vocab": true' in result.stderr
    assert seconds < 1.0
    # what would work does
    config["use_heterogeneous_vocab"] = True
    assert check(state, "--model", str(tiny_target), json.dumps(config)).exit_code == 0
    # without --model nothing is compared (generate may be given any target)
    del config["use_heterogeneous_vocab"]
    assert check(state, json.dumps(config)).exit_code == 0


@pytest.mark.usefixtures("no_tensor_reads")
def test_a_fitting_draft_passes_with_its_target(
    state: CliState, tiny_target: Path, tiny_draft: Path
) -> None:
    config = {"method": "draft_model", "model": str(tiny_draft), "num_speculative_tokens": 4}
    result = check(state, "--model", str(tiny_target), json.dumps(config))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"] == str(tiny_draft)


@pytest.mark.usefixtures("no_tensor_reads")
def test_a_missing_target_is_refused(state: CliState, tmp_path: Path) -> None:
    result = check(state, "--model", str(tmp_path / "t.gguf"),
                   '{"method":"ngram","num_speculative_tokens":2}')
    assert result.exit_code == 2
    assert result.stderr == f"error: {tmp_path / 't.gguf'}: no such file or directory\n"


def test_a_head_inside_the_target_needs_model_to_be_checked(state: CliState) -> None:
    result = check(state, '{"method":"mtp","num_speculative_tokens":1}')
    assert result.exit_code == 0
    assert "give --model to check it" in result.stderr


def test_generate_refuses_the_mismatch_before_loading_the_target(
    monkeypatch: pytest.MonkeyPatch, tiny_target: Path, other_vocab_draft: Path
) -> None:
    """The same check, in bootstrap, before ``load_model`` is ever called."""
    from draftwise.bootstrap import build_engine_parts
    from draftwise.config import RefusedValueError
    from draftwise.engine_args import EngineArgs
    from draftwise.models import loader

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the target was loaded before the draft was checked")

    monkeypatch.setattr(loader, "load_model", refuse)
    args = EngineArgs(model=str(tiny_target), speculative_config={
        "method": "draft_model", "model": str(other_vocab_draft), "num_speculative_tokens": 4})
    with pytest.raises(RefusedValueError, match="vocabulary has 256 tokens and the target's 512"):
        build_engine_parts(args)


def test_missing_argument_is_a_usage_error(state: CliState) -> None:
    assert check(state).exit_code == 2


@pytest.mark.parametrize(
    ("stdin", "fragment"),
    [
        (b'{"method": "ngr\xe9m"}', "not UTF-8 text: byte 0xe9 at offset 15"),
        (b'{"method": "ngram", "num_speculative_tokens": ' + b"9" * 5000 + b"}",
         "an integer of 5,000 digits (at most 100)"),
        (b'{"method": "ngram", "num_speculative_tokens": ' + b"[" * 985 + b"]" * 985 + b"}",
         "nested deeper than 64 levels"),
    ],
    ids=["latin-1", "5000-digits", "985-deep"],
)
def test_broken_stdin_is_a_one_line_refusal(state: CliState, stdin: bytes, fragment: str) -> None:
    result = CliRunner().invoke(cli, ["check-config", "-"], obj=state, input=stdin)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stderr.startswith("error: ") and fragment in result.stderr
    assert len(result.stderr.splitlines()) == 1 and result.stdout == ""


def test_argument_with_undecodable_bytes_is_refused(state: CliState) -> None:
    # what Python makes of a latin-1 byte in argv (surrogateescape)
    result = check(state, '{"method": "ngr\udce9m"}')
    assert result.exit_code == 2
    assert "lone surrogate U+DCE9 (byte 0xe9" in result.stderr


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_hybrid(tmp_path_factory.mktemp("cc-hybrid"))  # hidden 64, MTP head


@pytest.mark.usefixtures("no_tensor_reads")
def test_a_head_inside_a_hybrid_target_is_read_from_its_header(
    state: CliState, hybrid: Path
) -> None:
    result = check(state, "--model", str(hybrid), '{"method":"mtp"}')
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["num_speculative_tokens"] == 1  # the head's depth


@pytest.mark.usefixtures("no_tensor_reads")
def test_an_mtp_head_of_another_hidden_size_is_refused(
    state: CliState, hybrid: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    wide = save_tiny_hybrid(tmp_path_factory.mktemp("cc-wide"), hidden_size=128)
    config = json.dumps({"method": "mtp", "model": str(wide)})
    result, seconds = timed_check(state, "--model", str(hybrid), config)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(
        f"error: {wide}: the MTP head's hidden_size is 128 and the target's 64")
    assert "Instead: " in result.stderr
    assert seconds < 1.0
