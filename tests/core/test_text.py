"""The one rule for text every surface shares: valid Unicode, or a refusal naming the field."""

from __future__ import annotations

import pytest
from draftwise.errors import RequestError
from draftwise.text import check_text, describe_invalid, invalid_text_at, printable


@pytest.mark.parametrize(("text", "index"), [
    ("plain", None), ("café 你好 👍🏽", None), ("", None), ("\x00nul is text", None),
    ("a\ud800b", 1), ("\udfff", 0), ("ok\udce9", 2),
])
def test_invalid_text_at_finds_the_first_lone_surrogate(text, index):
    assert invalid_text_at(text) == index


def test_an_undecodable_argv_byte_is_named_as_the_byte():
    arg = b"caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of argv
    assert "undecodable byte 0xE9" in describe_invalid(arg, invalid_text_at(arg))
    assert "byte" not in describe_invalid("\ud800", 0)


def test_check_text_raises_a_request_error_naming_the_field():
    check_text("prompt", "fine")
    with pytest.raises(RequestError) as info:
        check_text("messages[1].content", "x\ud800")
    assert info.value.field == "messages[1].content"
    assert "U+D800 at character 1" in str(info.value)


def test_printable_escapes_surrogates_so_a_message_can_be_encoded():
    assert printable("k\ud800") == "k\\ud800"
    printable("k\ud800").encode("utf-8")
