"""draftwise.jsontext: every JSON text the engine reads, strict and bounded."""

from __future__ import annotations

import json

import pytest
from draftwise import jsontext
from draftwise.jsontext import MAX_DEPTH, MAX_INT_DIGITS, JSONTextError, depth_of, loads
from hypothesis import given, settings
from hypothesis import strategies as st


def refused(text: str | bytes, kind: str, **kwargs: int) -> JSONTextError:
    with pytest.raises(JSONTextError) as err:
        loads(text, **kwargs)
    assert err.value.kind == kind, err.value
    return err.value


def test_valid_text_parses_as_json_does() -> None:
    text = '{"a": [1, -2.5, "x\\"]{", {"b": null}], "c": true, "d": 12345678901234567890}'
    assert loads(text) == json.loads(text)
    assert loads(text.encode()) == json.loads(text)


@pytest.mark.parametrize("digits", [MAX_INT_DIGITS + 1, 4301, 5000])
def test_long_integers_are_named_with_their_position(digits: int) -> None:
    err = refused('{"k": ' + "9" * digits + "}", "integer")
    assert f"{digits:,} digits" in str(err) and "line 1, column 7" in str(err)
    assert loads("-" + "9" * MAX_INT_DIGITS) == -int("9" * MAX_INT_DIGITS)


def test_non_finite_numbers_and_constants() -> None:
    refused('{"k": 1e999}', "number")
    refused('{"k": -1e400}', "number")
    refused('{"k": NaN}', "constant")
    refused("[Infinity]", "constant")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 985, 100_000])
def test_depth_is_checked_before_parsing(depth: int) -> None:
    err = refused("[" * depth + "]" * depth, "depth")
    assert err.pos == MAX_DEPTH  # the first bracket past the limit
    assert loads("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"s": "[" * 500 + "\\\"{" * 100})
    assert loads(text) == json.loads(text)


def test_encoding() -> None:
    err = refused('{"a": "caf\xe9"}'.encode("latin-1"), "encoding")
    assert "byte 0xe9 at offset 10" in str(err)
    err = refused('{"a": "caf\udce9"}', "encoding")
    assert "U+DCE9" in str(err) and "byte 0xe9" in str(err)
    refused('{"a": "\ud800"}', "encoding")
    assert loads('{"a": "\\ud800"}') == {"a": "\ud800"}  # escaped in JSON: the caller decides


def test_duplicates_size_and_syntax() -> None:
    err = refused('{"a": 1, "a": 2}', "duplicate")
    assert err.key == "a"
    refused("[1, 2, 3]", "size", max_chars=5)
    err = refused('{"a": 1,}', "syntax")
    assert err.decode_error is not None and err.lineno == 1 and err.colno == 9
    refused(b"\xef\xbb\xbf{}", "syntax")  # a BOM is not JSON (transformers refuses it too)


def test_depth_of_parsed_values() -> None:
    deep: dict = {}
    cur = deep
    for _ in range(3000):
        cur["a"] = {}
        cur = cur["a"]
    assert depth_of(deep) == MAX_DEPTH + 1  # stops counting past the limit
    assert depth_of({"a": [1, {"b": ()}]}) == 4
    assert depth_of(7) == 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_roundtrip_of_valid_json(value: object) -> None:
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: refused by name
        with pytest.raises(JSONTextError):
            loads(text)
        return
    assert loads(text) == json.loads(text)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=64))
def test_any_input_parses_or_is_a_named_error(data: bytes | str) -> None:
    try:
        jsontext.loads(data)
    except JSONTextError:
        pass
