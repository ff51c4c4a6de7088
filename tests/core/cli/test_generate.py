"""``draftwise generate`` refuses bad options before it loads any weights."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from draftwise.cli.generate import generate


@pytest.fixture
def no_engine(monkeypatch):
    def build_engine(*args, **kwargs):
        raise AssertionError("the engine must not be built for a refused option")

    monkeypatch.setattr("draftwise.cli.common.build_engine", build_engine)


@pytest.mark.parametrize(("args", "option", "words"), [
    (["--top-k", str(2**63), "--temperature", "1"], "--top-k", "int64"),
    (["--top-k", "-5"], "--top-k", "at least 1"),
    (["--temperature", "inf"], "--temperature", "finite"),
    (["--temperature", "nan"], "--temperature", "finite"),
    (["--seed", str(2**64)], "--seed", "64 bits"),
    (["--max-tokens", str(2**63)], "--max-tokens", "int64"),
    (["--top-p", "0"], "--top-p", "(0, 1]"),
    (["--presence-penalty", "3"], "--presence-penalty", "[-2.0, 2.0]"),
    (["--frequency-penalty", "-2.5"], "--frequency-penalty", "[-2.0, 2.0]"),
    (["--repetition-penalty", "0"], "--repetition-penalty", "> 0"),
    (["--logit-bias", '{"a": 1}'], "--logit-bias", "token ids"),
    (["--logit-bias", "{oops"], "--logit-bias", "not JSON"),
    (["--min-tokens", "300", "--max-tokens", "10"], "--min-tokens", "max_tokens=10"),
    (["--bad-words", " "], "--bad-words", "non-empty"),
    (["--logprobs", "30"], "--logprobs", "[0, 20]"),
])
def test_sampling_bounds_are_usage_errors_naming_the_option(no_engine, args, option, words):
    result = CliRunner().invoke(generate, ["--prompt", "hi", *args])
    assert result.exit_code == 2, result.output
    assert option in result.output and words in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("option", ["--prompt", "--system"])
def test_non_utf8_argument_is_a_usage_error(no_engine, option):
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python decodes such argv
    args = ["--prompt", "hi", option, bad] if option == "--system" else ["--prompt", bad]
    result = CliRunner().invoke(generate, args)
    assert result.exit_code == 2, result.output
    assert option in result.output and "undecodable byte 0xE9" in result.output


def test_real_non_utf8_argv_exits_2_without_a_traceback():
    """The bytes as a shell passes them (``--prompt $'caf\\xe9'``), through the console entry."""
    import subprocess
    import sys

    code = "import sys; from draftwise.cli import main; sys.argv[0] = 'draftwise'; main()"
    proc = subprocess.run([sys.executable, "-c", code, "generate", "--prompt", b"caf\xe9"],
                          capture_output=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert b"undecodable byte 0xE9" in proc.stderr
    assert b"Traceback" not in proc.stderr
