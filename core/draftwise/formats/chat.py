"""Chat templates: the model's own Jinja template, rendered as transformers renders it.

Templates come from the Hub and are untrusted code, so they run in jinja2's immutable
sandbox with the helpers templates expect (``raise_exception``, ``strftime_now``, a
``tojson`` that does not HTML-escape, ``{% generation %}`` blocks, loop controls).
The rendered text is tokenized without adding special tokens: the template writes them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from draftwise.formats.errors import ChatTemplateError, ModelFormatError
from draftwise.formats.jsonfile import read_json, read_text
from draftwise.jsontext import show

if TYPE_CHECKING:
    from draftwise.formats.tokenizer import Tokenizer

Message = Mapping[str, Any]


class _GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (training masks unused)."""

    tags = {"generation"}  # noqa: RUF012 - the jinja Extension API declares it a set

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore attributes (no reaching into internals)."""

    def __setitem__(self, name: str, value: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")
        super().__setitem__(name, value)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_template(source: str) -> jinja2.Template:
    """Compile once per model; each render then costs only the template's own work."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, "jinja2.ext.loopcontrols"],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from None


class ChatTemplate:
    """A model's chat template with its special-token strings bound in."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self._template = compile_template(source)

    def render(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for ``messages`` (list of ``{"role", "content"}`` dicts)."""
        context = {**self.special_tokens, **kwargs}
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                tools=list(tools) if tools is not None else None,
                documents=list(documents) if documents is not None else None,
                add_generation_prompt=add_generation_prompt,
                **context,
            )
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from None

    def encode(
        self,
        tokenizer: Tokenizer,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> list[int]:
        """Render and tokenize; the template already wrote BOS and friends."""
        text = self.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        return tokenizer.encode(text, add_special_tokens=False)


def render_chat(
    source: str,
    messages: Sequence[Message],
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str:
    """One-off render (compiles every call; keep a :class:`ChatTemplate` on hot paths)."""
    return ChatTemplate(source).render(
        messages, add_generation_prompt=add_generation_prompt, **kwargs
    )


def chat_template_from_dir(directory: str) -> str | None:
    """The template of an HF directory: ``chat_template.jinja`` or tokenizer_config's."""
    jinja_file = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(jinja_file):
        return read_text(jinja_file)
    for name in ("chat_template.json", "tokenizer_config.json"):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        template = read_json(path).get("chat_template")
        if template is None:
            continue
        if isinstance(template, list):  # named templates: take "default"
            named = {
                t["name"]: t["template"]
                for t in template
                if isinstance(t, dict)
                and isinstance(t.get("name"), str)
                and isinstance(t.get("template"), str)
            }
            if len(named) != len(template):
                raise ModelFormatError(
                    path, "'chat_template' is a list whose entries are not all "
                    '{"name": <string>, "template": <string>}', key="chat_template",
                )
            template = named.get("default") or next(iter(named.values()), None)
        if not isinstance(template, str):
            raise ModelFormatError(
                path, f"'chat_template' is {show(template)}, expected a string or a list "
                "of named templates", key="chat_template",
            )
        return template
    return None
