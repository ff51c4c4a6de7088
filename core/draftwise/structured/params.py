"""What a request asks its output to match: vLLM's ``StructuredOutputsParams``, checked.

Exactly one constraint per request, under vLLM's names: ``json`` (a JSON schema, dict or
text), ``json_object`` (any JSON object: OpenAI's ``response_format={"type":
"json_object"}``), ``regex``, ``choice`` (one of a list of strings) or ``grammar`` (GBNF /
EBNF as llama.cpp, vLLM and xgrammar write it, or Lark). Each becomes one llguidance
grammar text (:meth:`StructuredOutputsParams.grammar_text`), checked here without a
tokenizer, so a bad schema or regex is refused by its field's name before any request
state exists. The tokenizer-bound part (the matcher) lives in ``compiler.py``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from draftwise.structured.bounds import (
    MAX_CHOICES,
    check_choices,
    check_json_schema,
    check_lark,
    check_regex,
    library_limits,
)

#: a grammar text past this many characters is refused (compiling is linear in it, but a
#: request body's limit is the only other bound); nesting is bounded by ``bounds.py``
MAX_GRAMMAR_CHARS = 1 << 20


class StructuredOutputsParams(BaseModel):
    """One output constraint (vLLM's field names); every bad value names its field."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    #: a JSON schema; passed as ``json=`` (vLLM's name, which BaseModel.json shadows here)
    json_schema: dict[str, Any] | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    _text: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _one_constraint(self) -> StructuredOutputsParams:
        """Exactly one constraint, and its grammar compiles (checked without a tokenizer)."""
        given = [name for name, attr in _KINDS.items() if getattr(self, attr) not in (None, False)]
        if len(given) != 1:
            names = ", ".join(_KINDS)
            got = ", ".join(given) if given else "none"
            raise ValueError(f"exactly one of {names} must be set, got {got}")
        kind = given[0]
        self._text = _grammar_text(kind, getattr(self, _KINDS[kind]))
        _check_grammar(kind, self._text)
        return self

    @property
    def kind(self) -> str:
        """Which constraint is set: ``json``, ``json_object``, ``regex``, ``choice``, ``grammar``."""
        return next(n for n, attr in _KINDS.items() if getattr(self, attr) not in (None, False))

    def grammar_text(self) -> str:
        """The llguidance grammar text this constraint compiles to (the cache key too)."""
        return self._text


#: constraint name (vLLM's) -> attribute
_KINDS = {"json": "json_schema", "json_object": "json_object", "regex": "regex",
          "choice": "choice", "grammar": "grammar"}


def _grammar_text(kind: str, value: Any) -> str:
    """The llguidance grammar of one constraint; malformed or unbounded input raises
    ValueError (``bounds.py`` measures each document before the library parses it)."""
    import llguidance
    from llguidance.gbnf_to_lark import any_to_lark

    from_schema = llguidance.LLMatcher.grammar_from_json_schema
    # JSON: OpenAI's and vLLM's outputs allow whitespace between items; the model picks
    options = {"whitespace_flexible": True}
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(_sized("json", value))
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"json: the schema is not valid JSON: {exc}") from None
        if not isinstance(value, dict | bool):
            raise ValueError(f"json: a JSON schema is an object, got {type(value).__name__}")
        check_json_schema(value)
        try:
            text = json.dumps(value)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"json: the schema cannot be serialised: {exc}") from None
        return _sized("json", from_schema(_sized("json", text), defaults=options))
    if kind == "json_object":
        return from_schema(json.dumps({"type": "object"}), defaults=options)
    if kind == "regex":
        check_regex(_sized("regex", value))
        return _sized("regex", llguidance.LLMatcher.grammar_from_regex(value))
    if kind == "choice":
        check_choices(value)
        return llguidance.grammar_from("choice", list(value))
    try:
        lark = any_to_lark(_sized("grammar", value))  # GBNF -> Lark; Lark passes through
    except (ValueError, RecursionError, IndexError, KeyError) as exc:
        raise ValueError(f"grammar: the grammar does not parse: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the converter's own errors are plain Exception
        raise ValueError(f"grammar: the grammar does not parse: {exc}") from None
    check_lark(lark)
    return llguidance.LLMatcher.grammar_from_lark(_sized("grammar", lark))


def _sized(name: str, text: str) -> str:
    if len(text) > MAX_GRAMMAR_CHARS:
        raise ValueError(f"{name}: {len(text)} characters is over the {MAX_GRAMMAR_CHARS} limit")
    return text


def _check_grammar(kind: str, text: str) -> None:
    """llguidance's own check (schema keywords, regex syntax, grammar rules), by field.

    With ``verbose_errors`` off the library leaves out its parser state; what is left is
    put on one line and capped (:func:`short_message`).
    """
    import llguidance

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        text, limits=library_limits())
    if is_error:
        raise ValueError(f"{kind}: {short_message(messages[0] if messages else 'invalid')}")


def short_message(message: str, limit: int = 300) -> str:
    """A library message as a client sees it: one line, at most ``limit`` characters."""
    line = " ".join(message.split()) or "invalid"
    return line if len(line) <= limit else line[:limit] + "..."


__all__ = ["MAX_CHOICES", "MAX_GRAMMAR_CHARS", "StructuredOutputsParams", "short_message"]
