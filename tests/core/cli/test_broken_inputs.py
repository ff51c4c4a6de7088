"""``generate`` and ``serve`` on a broken file or config: one named line, exit 2, no traceback.

Everything here fails before a weight is read (and before a server binds), so it is fast.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner, Result
from draftwise.cli import CliState, cli
from draftwise.plugins import PluginHost, load_entry_point_plugins


@pytest.fixture(scope="module")
def state() -> CliState:
    return CliState(load_entry_point_plugins(PluginHost(), selection=None))


def invoke(state: CliState, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), obj=state)


def assert_one_line_refusal(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def gguf_with_a_bad_token(path: Path) -> Path:
    """A GGUF whose second token string is not UTF-8 (gguf-py raised UnicodeDecodeError)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "c"])
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    field = gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"]
    at = field.offset + sum(int(p.nbytes) for p in field.parts[: field.data[1]])
    raw = bytearray(path.read_bytes())
    raw[at] = 0xFF
    path.write_bytes(bytes(raw))
    return path


def hf_dir(path: Path, config: bytes) -> Path:
    path.mkdir()
    (path / "config.json").write_bytes(config)
    return path


@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize(
    ("make", "fragments"),
    [
        (lambda d: gguf_with_a_bad_token(d / "bad.gguf"),
         ("bad.gguf", "'tokenizer.ggml.tokens'[1] is not UTF-8")),
        (lambda d: (d / "junk.gguf").write_bytes(b"NOPE" + bytes(64)) and d / "junk.gguf",
         ("junk.gguf", "not a GGUF file")),
        (lambda d: (d / "cut.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 10**9))
         and d / "cut.gguf", ("cut.gguf", "truncated or corrupt")),
        (lambda d: hf_dir(d / "latin", '{"architectures": ["LlamaForCausalLM"], "x": "\xe9"}'
                          .encode("latin-1")), ("config.json", "not UTF-8 text: byte 0xe9")),
        (lambda d: hf_dir(d / "words", json.dumps(
            {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 4,
             "hidden_size": "sixty-four"}).encode()),
         ("config.json", "'hidden_size' is \"sixty-four\"")),
        (lambda d: hf_dir(d / "nested", b'{"architectures": [["LlamaForCausalLM"]]}'),
         ("config.json", "'architectures'")),
        (lambda d: hf_dir(d / "digits", b'{"hidden_size": ' + b"9" * 5000 + b"}"),
         ("config.json", "5,000 digits")),
        (lambda d: d / "missing.gguf", ("missing.gguf", "no such file")),
    ],
    ids=["bad-token", "not-gguf", "truncated", "latin-1", "words", "nested", "digits",
         "missing"],
)
def test_broken_model_is_one_named_line(state, tmp_path, command, make, fragments) -> None:
    model = make(tmp_path)
    args = ["--prompt", "hi"] if command == "generate" else ["--port", "0"]
    assert_one_line_refusal(invoke(state, command, "--model", str(model), *args), *fragments)


@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ('{"method": "ngram", "num_speculative_tokens": ' + "9" * 5000 + "}", "5,000 digits"),
        ('{"method": "ngram", "x": ' + "[" * 985 + "]" * 985 + "}", "nested deeper than 64"),
        ('{"method": "ngr\udce9m"}', "lone surrogate U+DCE9"),
        ('{"method": "ngram", "num_speculative_tokens": 1e999}', "too large for a float"),
    ],
    ids=["digits", "deep", "argv-bytes", "inf"],
)
def test_broken_speculative_config_is_one_named_line(state, command, config, fragment) -> None:
    args = ["--prompt", "hi"] if command == "generate" else ["--port", "0"]
    result = invoke(state, command, "--speculative-config", config, *args)
    assert_one_line_refusal(result, fragment)
