"""``draftwise check-config``: exit 0 and the resolved JSON, or exit 2 and the refusal."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from draftwise.cli import CliState, cli
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
    }
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


def test_output_checks_again(state: CliState) -> None:
    first = check(state, '{"method":"dflash","model":"/ckpt/d","num_speculative_tokens":15}')
    again = check(state, first.stdout)
    assert again.exit_code == 0 and again.stdout == first.stdout


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
