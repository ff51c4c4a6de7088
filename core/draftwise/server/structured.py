"""A request body's output constraint: OpenAI's ``response_format`` and vLLM's extras.

Accepted, one per request (two are refused by name, never merged):

- ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``,
  or ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}``
  (the schema is always enforced exactly, so ``strict`` changes nothing);
- vLLM's ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``;
- vLLM's ``structured_outputs`` object (``json``, ``regex``, ``choice``, ``grammar``,
  ``json_object``).

Each becomes a :class:`StructuredOutputsParams`; a schema, regex or grammar that does not
compile is a 400 naming the body field it came from.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from draftwise.server.errors import APIError
from draftwise.structured import StructuredOutputsParams

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def structured_outputs(body: Any) -> StructuredOutputsParams | None:
    """The body's constraint, or None; every refusal names its field."""
    given: list[tuple[str, dict[str, Any]]] = []
    fmt = getattr(body, "response_format", None)
    if fmt is not None:
        spec = _response_format(fmt)
        if spec is not None:
            given.append(("response_format", spec))
    for name, key in _GUIDED.items():
        value = getattr(body, name, None)
        if value is not None:
            given.append((name, {key: value}))
    so = getattr(body, "structured_outputs", None)
    if so is not None:
        given.append(("structured_outputs", dict(so)))
    if not given:
        return None
    if len(given) > 1:
        names = ", ".join(name for name, _ in given)
        raise APIError(f"{given[1][0]}: give one output constraint per request, got {names}",
                       param=given[1][0], code="invalid_value")
    field, spec = given[0]
    try:
        return StructuredOutputsParams(**spec)
    except (ValidationError, TypeError) as exc:
        raise _named(field, spec, exc) from None


def _response_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    """OpenAI's shapes -> StructuredOutputsParams keywords (None for plain text)."""
    kind = fmt.get("type")
    if kind == "text" and set(fmt) == {"type"}:
        return None
    if kind == "json_object" and set(fmt) == {"type"}:
        return {"json_object": True}
    if kind == "json_schema":
        extra = set(fmt) - {"type", "json_schema"}
        if extra:
            raise _bad("response_format", f"unrecognized key {min(extra)!r}")
        js = fmt.get("json_schema")
        if not isinstance(js, dict):
            raise _bad("response_format.json_schema",
                       "an object with 'name' and 'schema' is required")
        extra = set(js) - {"name", "description", "schema", "strict"}
        if extra:
            raise _bad("response_format.json_schema", f"unrecognized key {min(extra)!r}")
        if "schema" not in js:
            raise _bad("response_format.json_schema.schema", "this field is required")
        if not isinstance(js["schema"], dict):
            raise _bad("response_format.json_schema.schema", "a JSON schema object is required")
        if js.get("strict") not in (None, True, False):
            raise _bad("response_format.json_schema.strict", "a boolean is required")
        return {"json": js["schema"]}
    if kind in ("text", "json_object"):
        raise _bad("response_format", f"type {kind!r} takes no other keys")
    raise _bad("response_format.type", f"{kind!r} is not one of 'text', 'json_object', "
               "'json_schema'")


def _named(field: str, spec: dict[str, Any], exc: Exception) -> APIError:
    """A StructuredOutputsParams refusal, under the body field the value came from."""
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        loc = [str(p) for p in err.get("loc", ())]
    else:
        msg, loc = str(exc), []
    for kind in ("json", "regex", "choice", "grammar", "json_object"):
        msg = msg.removeprefix(f"{kind}: ")
    if field == "response_format" and "json" in spec:
        param = "response_format.json_schema.schema"
    elif field == "structured_outputs":
        param = f"structured_outputs.{loc[0]}" if loc else "structured_outputs"
    else:
        param = field
    return _bad(param, msg)


def _bad(param: str, message: str) -> APIError:
    return APIError(f"{param}: {message}", param=param, code="invalid_value")


__all__ = ["structured_outputs"]
