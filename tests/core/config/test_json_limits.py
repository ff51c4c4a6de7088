"""The speculative config's JSON limits, on every surface: text, bytes and Python dicts.

The error formatter quotes values back (``show``); nothing it is given, however deep or
long, may raise instead of the named refusal.
"""

from __future__ import annotations

from typing import Any

import pytest
from draftwise.config import parse_speculative_config
from draftwise.config.errors import ConfigError, InvalidJSONError, InvalidValueError, show
from draftwise.jsontext import MAX_DEPTH


def nested(depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cur = out
    for _ in range(depth - 1):
        cur["a"] = {}
        cur = cur["a"]
    return out


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"method":"ngram","num_speculative_tokens":' + "9" * 4301 + "}", "4,301 digits"),
        ('{"method":"ngram","num_speculative_tokens":' + "9" * 5000 + "}", "5,000 digits"),
        ('{"method":"ngram","num_speculative_tokens":' + "[" * 985 + "]" * 985 + "}",
         f"nested deeper than {MAX_DEPTH} levels"),
        ("[" * 100_000, f"nested deeper than {MAX_DEPTH} levels"),
        ('{"method":"ngram","num_speculative_tokens":1e999}', "too large for a float"),
        ('{"method":"ngram"}' + " " * (1024 * 1024), "over the limit of 1,048,576"),
        (b'{"method":"ngr\xe9m"}', "not UTF-8 text: byte 0xe9 at offset 14"),
        ('{"method":"ngr\udce9m"}', "lone surrogate U+DCE9"),
    ],
)
def test_text_limits_are_named(installed_registry, text: str | bytes, fragment: str) -> None:
    with pytest.raises(InvalidJSONError) as err:
        parse_speculative_config(text, installed_registry)
    assert fragment in str(err.value)


def test_python_dicts_get_the_same_depth_limit(installed_registry) -> None:
    with pytest.raises(InvalidJSONError, match="nested deeper than 64"):
        parse_speculative_config({"method": "ngram", **nested(985)}, installed_registry)
    with pytest.raises(InvalidJSONError, match="nested deeper than 64"):
        parse_speculative_config(nested(3000), installed_registry)
    value: Any = []
    for _ in range(985):
        value = [value]
    cfg = {"method": "ngram", "num_speculative_tokens": value}
    with pytest.raises(InvalidJSONError, match="nested deeper than 64"):
        parse_speculative_config(cfg, installed_registry)


def test_huge_python_int_is_quoted_short(installed_registry) -> None:
    cfg = {"method": "ngram", "num_speculative_tokens": 10**5000}
    with pytest.raises(InvalidValueError) as err:
        parse_speculative_config(cfg, installed_registry)
    assert "<an integer of about 5,001 digits>" in str(err.value)


@pytest.mark.parametrize(
    "value",
    [10**5000, nested(3000), [[[[[[[[[[[[1]]]]]]]]]]]], "x" * 10_000, {1, 2}, object()],
    ids=["huge-int", "deep-dict", "deep-list", "long-str", "set", "object"],
)
def test_show_never_raises_and_stays_short(value: Any) -> None:
    assert len(show(value)) <= 80


def test_every_refusal_is_a_config_error(installed_registry) -> None:
    for text in ("", "nul", "[" * 70, '{"a": 1, "a": 2}', "NaN", '"\udcff"'):
        with pytest.raises(ConfigError):
            parse_speculative_config(text, installed_registry)
