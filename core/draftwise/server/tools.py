"""Tool calling in chat: OpenAI's ``tools`` / ``tool_choice``, in the Hermes format.

Accepted only when the checkpoint's chat template renders tools. That is decided by
rendering (:func:`renders_tools`): a one-message conversation is rendered with and
without a probe tool, and the template renders tools when the probe's name reaches the
prompt only in the second. Grepping the template source for ``tools`` would also accept a
template that mentions tools only to ``raise_exception`` on them, or in a comment; the
render tests exactly what the model will see.

The output format is the Hermes one that Qwen2.5 (and Hermes, and most templates that
render tools) ask for::

    <tool_call>
    {"name": "<function name>", "arguments": <the arguments object>}
    </tool_call>

``tool_choice`` (OpenAI's semantics; vLLM's for ``none``):

- ``"required"`` or ``{"type": "function", "function": {"name": ...}}``: the output is
  constrained to exactly one such block, by an llguidance Lark grammar whose arguments
  rule is the function's ``parameters`` JSON schema. The constraint goes through the
  structured-output machinery, so its token mask applies at every verified position and
  speculation stays lossless.
- ``"auto"`` (the default when tools are given): no constraint; ``<tool_call>`` blocks
  that parse are returned as ``tool_calls``, the rest of the text as ``content``.
- ``"none"``: tools are still rendered into the prompt (vLLM's default; its
  ``--exclude-tools-when-tool-choice-none`` is not offered) and the output is plain text.

``parallel_tool_calls`` (OpenAI's, default true; vLLM's semantics): with ``"required"``
the grammar takes one or more blocks, separated by a newline as Qwen2.5's template
renders several calls (the model decides how many); ``false`` makes it exactly one. A
named function is always exactly one call. An ``auto`` output may hold several blocks:
every one that parses is returned, only the first with ``parallel_tool_calls: false``
(as vLLM filters).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from draftwise.formats.chat import ChatTemplate
from draftwise.formats.errors import ChatTemplateError
from draftwise.server.errors import APIError
from draftwise.structured import StructuredOutputsParams

#: OpenAI's rule for a function's name
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: one Hermes block; the JSON inside is parsed separately (it may itself hold "}")
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_PROBE_NAME = "draftwise_probe_tool"
_PROBE = {"type": "function", "function": {
    "name": _PROBE_NAME, "description": "probe",
    "parameters": {"type": "object", "properties": {}}}}
_PROBE_CHAT = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request's tools change: the prompt, the constraint, the response parsing."""

    #: the function tools, as the chat template receives them
    tools: tuple[dict[str, Any], ...]
    #: "none", "auto", "required" or "function" (one named function)
    choice: str
    #: the output constraint of a forced call, else None
    constraint: StructuredOutputsParams | None = None
    #: ``parallel_tool_calls`` is not false: several calls may be made and returned
    parallel: bool = True

    @property
    def parses(self) -> bool:
        """Whether the output is read for ``<tool_call>`` blocks."""
        return self.choice != "none"

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, tool_calls) of an output; only the first call unless parallel."""
        content, calls = parse_calls(text, tool_names(self))
        return content, calls if self.parallel else calls[:1]


#: tools one request may give (OpenAI's documented limit); each schema is checked, and a
#: forced call compiles all of them into one grammar row
MAX_TOOLS = 128

def renders_tools(template: ChatTemplate | None) -> bool:
    """Whether the template shows the model a tool (the probe's name reaches the prompt)."""
    if template is None:
        return False
    try:
        without = template.render(_PROBE_CHAT, add_generation_prompt=True)
        with_tool = template.render(_PROBE_CHAT, add_generation_prompt=True, tools=[_PROBE])
    except ChatTemplateError:
        return False
    return _PROBE_NAME in with_tool and _PROBE_NAME not in without


def chat_template_of(engine: Any) -> ChatTemplate | None:
    """The engine's checkpoint chat template (None when it has none)."""
    return getattr(getattr(engine, "loaded", None), "chat_template", None)


def tool_plan(body: Any, template: ChatTemplate | None) -> ToolPlan | None:
    """The request's tool plan, or None without tools; each refusal names its field."""
    tools, choice = body.tools, body.tool_choice
    if not tools:
        if choice not in (None, "none"):
            raise _bad("tool_choice", "tool_choice needs tools; give the functions in tools")
        return None
    if len(tools) > MAX_TOOLS:  # before any schema is compiled
        raise _bad("tools", f"at most {MAX_TOOLS} tools may be given (OpenAI's limit), "
                   f"got {len(tools)}")
    if not renders_tools(template):
        raise APIError(
            "tools: this checkpoint's chat template does not render tools, so the model "
            "would never see them; serve a model whose template does (e.g. Qwen2.5 "
            "Instruct GGUFs), or send response_format {'type': 'json_schema'} with the "
            "function's parameters schema", param="tools", code="unsupported_value")
    functions = tuple(_function(i, t) for i, t in enumerate(tools))
    names = [f["function"]["name"] for f in functions]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise _bad("tools", f"the function name {dup!r} is given twice")
    kind, name = _choice(choice, names)
    parallel = body.parallel_tool_calls is not False
    if kind in ("none", "auto"):
        return ToolPlan(functions, kind, parallel=parallel)
    chosen = [f["function"] for f in functions
              if kind == "required" or f["function"]["name"] == name]
    try:
        grammar = call_grammar(chosen, many=kind == "required" and parallel)
        constraint = StructuredOutputsParams(grammar=grammar)
    except ValidationError as exc:  # a schema llguidance takes alone but not in the call
        raise _bad("tools", _message(exc)) from None
    return ToolPlan(functions, kind, constraint, parallel)


def _function(i: int, tool: Any) -> dict[str, Any]:
    """One ``tools`` entry checked; its parameters schema must compile."""
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise _bad(f"{where}.type", "only {'type': 'function', 'function': {...}} tools exist")
    extra = set(tool) - {"type", "function"}
    if extra:
        raise _bad(where, f"unrecognized key {min(extra)!r}")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise _bad(f"{where}.function", "an object with 'name' and 'parameters' is required")
    extra = set(fn) - {"name", "description", "parameters", "strict"}
    if extra:
        raise _bad(f"{where}.function", f"unrecognized key {min(extra)!r}")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _bad(f"{where}.function.name", "1 to 64 letters, digits, '_' or '-' are required")
    if not isinstance(fn.get("description", ""), str):
        raise _bad(f"{where}.function.description", "a string is required")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise _bad(f"{where}.function.parameters", "a JSON schema object is required")
    try:
        StructuredOutputsParams(json=params)
    except ValidationError as exc:
        raise _bad(f"{where}.function.parameters", _message(exc)) from None
    return {"type": "function", "function": {**fn, "parameters": params}}


def _choice(choice: Any, names: list[str]) -> tuple[str, str | None]:
    """``tool_choice`` -> (kind, forced name)."""
    if choice is None:
        return "auto", None
    if choice in ("none", "auto", "required"):
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function" and set(choice) == {
            "type", "function"} and isinstance(choice["function"], dict) and set(
            choice["function"]) == {"name"}:
        name = choice["function"]["name"]
        if name not in names:
            raise _bad("tool_choice.function.name",
                       f"{name!r} is not one of the tools ({', '.join(names)})")
        return "function", name
    raise _bad("tool_choice", "give 'none', 'auto', 'required' or "
               "{'type': 'function', 'function': {'name': ...}}")


def call_grammar(functions: list[dict[str, Any]], many: bool = False) -> str:
    """A Lark grammar (llguidance's dialect) of one Hermes block calling one of ``functions``,
    or with ``many`` one or more such blocks, a newline between two (Qwen2.5's rendering).

    Each function's arguments are its parameters schema through llguidance's ``%json``,
    with flexible whitespace as the plain JSON-schema constraint has.
    """
    rules = []
    alts = []
    tail = json.dumps("}\n</tool_call>")
    for i, fn in enumerate(functions):
        head = json.dumps(f'<tool_call>\n{{"name": "{fn["name"]}", "arguments": ')
        schema = {**fn["parameters"], "x-guidance": {"whitespace_flexible": True}}
        alts.append(f"call_{i}")
        rules.append(f"call_{i}: {head} args_{i} {tail}")
        rules.append(f"args_{i}: %json {json.dumps(schema)}")
    start = f"start: {' | '.join(alts)}"
    if many:
        start = f'start: call ("\\n" call)*\ncall: {" | ".join(alts)}'
    return "\n".join([start, *rules]) + "\n"


def parse_calls(text: str, names: set[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """(content outside the calls or None, OpenAI tool_calls) of one output text.

    A block whose JSON does not parse, lacks a known ``name`` or has non-object
    ``arguments`` stays in the content as the model wrote it (vLLM's Hermes parser does
    the same), so nothing the model produced is lost.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for match in _BLOCK.finditer(text):
        call = _call(match.group(1), names)
        if call is None:
            continue
        kept.append(text[pos:match.start()])
        pos = match.end()
        calls.append(call)
    if not calls:
        return text, []
    kept.append(text[pos:])
    return "".join(kept).strip() or None, calls


def _call(inner: str, names: set[str]) -> dict[str, Any] | None:
    try:
        data = json.loads(inner)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("name") not in names:
        return None
    args = data.get("arguments", {})
    if not isinstance(args, dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": data["name"],
                         "arguments": json.dumps(args, ensure_ascii=False)}}


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for the template: an assistant's ``tool_calls[].function.arguments`` is a
    JSON string in OpenAI's API but an object to templates (``| tojson``), as vLLM does."""
    out = []
    for msg in messages:
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            msg = {**msg, "tool_calls": [_args_object(c) for c in calls]}
        out.append(msg)
    return out


def _args_object(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        args = json.loads(fn["arguments"])
    except ValueError:
        raise _bad("messages", "an assistant tool_calls[].function.arguments is not valid "
                   "JSON") from None
    return {**call, "function": {**fn, "arguments": args}}


def tool_names(plan: ToolPlan) -> set[str]:
    """The names a parsed call may carry."""
    return {f["function"]["name"] for f in plan.tools}


def finish_reason(reason: str | None, calls: list[dict[str, Any]]) -> str | None:
    """``tool_calls`` when the model stopped after calling; ``length`` etc. stay."""
    return "tool_calls" if calls and reason == "stop" else reason


def _message(exc: ValidationError) -> str:
    """A StructuredOutputsParams refusal's text, without pydantic's and the kind's prefix."""
    msg = str(exc.errors()[0].get("msg", "invalid")).removeprefix("Value error, ")
    for kind in ("json: ", "grammar: "):
        msg = msg.removeprefix(kind)
    return msg


def _bad(param: str, message: str) -> APIError:
    return APIError(f"{param}: {message}", param=param, code="invalid_value")


__all__ = ["MAX_TOOLS", "ToolPlan", "call_grammar", "chat_template_of", "finish_reason", "parse_calls",
           "renders_tools", "template_messages", "tool_names", "tool_plan"]
