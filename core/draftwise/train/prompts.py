"""Prompts for self-distillation: a built-in mix, or the user's own file.

Why built in: a drafter is trained on the target's answers to prompts like the ones it
will serve, and no machine here reaches a hub. Every Python installation carries a large
body of real code with docstrings: its standard library. The mix is

- **code** (~3,800 prompts on CPython 3.11, 96%): for a documented public function or
  method of the standard library (tests, demos and vendored folders left out), "write a
  function with this signature that does <its docstring's first paragraph>", or "explain
  what this function does" over its source (at most 60 lines), half each;
- **general** (168, 4%): six instruction templates crossed with 28 software topics,
  spread evenly through the code prompts.

It leans to code on purpose (the benchmark target is a coder model); a chat-first target
is better served by the user's own prompts (``--prompts``).

The order is a seeded shuffle, so a run and its resumption see the same sequence. A
user file is JSONL: ``{"prompt": "text"}`` (completion) or ``{"messages": [...]}`` (chat),
one per line; anything else is refused with its line number.
"""

from __future__ import annotations

import ast
import json
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftwise.errors import DraftwiseError

#: source lines an "explain" prompt may quote
MAX_SOURCE_LINES = 60

_GENERAL_TEMPLATES = (
    "Explain {topic} to a new programmer in a short paragraph.",
    "List five practical tips about {topic}.",
    "Compare two common approaches to {topic} and say when each is better.",
    "Summarise the key ideas of {topic} in three sentences.",
    "Write a short, friendly email asking a colleague for help with {topic}.",
    "What are common mistakes people make with {topic}, and how can they be avoided?",
)
_TOPICS = (
    "unit testing", "version control", "caching", "error handling", "recursion",
    "binary search", "hash tables", "regular expressions", "concurrency", "logging",
    "code review", "database indexes", "REST APIs", "memory management", "sorting",
    "time zones", "floating-point numbers", "text encodings", "command-line tools",
    "performance profiling", "dependency management", "data validation", "refactoring",
    "documentation", "security basics", "networking", "file formats", "scheduling tasks",
)


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt: chat ``messages`` or a completion ``text`` (exactly one is set)."""

    messages: tuple[dict[str, str], ...] | None = None
    text: str | None = None


class PromptFileError(DraftwiseError, ValueError):
    """A prompt file line that is neither ``{"prompt": ...}`` nor ``{"messages": [...]}``."""


def builtin_prompts(seed: int = 0, limit: int | None = None) -> list[Prompt]:
    """The built-in mix (module doc), shuffled with ``seed``; ``limit`` keeps the first."""
    rng = random.Random(seed)
    code = list(_code_prompts(rng))
    general = [Prompt(messages=({"role": "user", "content": t.format(topic=topic)},))
               for t in _GENERAL_TEMPLATES for topic in _TOPICS]
    rng.shuffle(code)
    rng.shuffle(general)
    # the general prompts spread evenly through the code ones, so any prefix keeps the mix
    out: list[Prompt] = []
    every = max(1, len(code) // max(1, len(general)))
    gi = 0
    for i, p in enumerate(code):
        out.append(p)
        if (i + 1) % every == 0 and gi < len(general):
            out.append(general[gi])
            gi += 1
    out += general[gi:]
    return out[:limit] if limit is not None else out


def _code_prompts(rng: random.Random) -> Iterator[Prompt]:
    """Prompts over the standard library's documented top-level functions."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts[:-1])
        if parts & _SKIPPED_DIRS or path.name.startswith("test_"):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        for node in _functions(tree):
            if node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 40:
                continue
            summary = doc.strip().split("\n\n")[0].replace("\n", " ")
            signature = f"{node.name}({ast.unparse(node.args)})"
            end = node.end_lineno or node.lineno
            if rng.random() < 0.5 and end - node.lineno < MAX_SOURCE_LINES:
                body = "\n".join(lines[node.lineno - 1:end])
                content = f"Explain what this Python function does:\n\n```python\n{body}\n```"
            else:
                content = (f"Write a Python function `{signature}` that does the following: "
                           f"{summary}")
            yield Prompt(messages=({"role": "user", "content": content},))


#: standard-library folders that are tests, demos, vendored or installed packages
_SKIPPED_DIRS = {"test", "tests", "idlelib", "turtledemo", "site-packages", "dist-packages",
                 "lib2to3", "ensurepip", "__pycache__", "config-3.10", "config-3.11"}


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef]:
    """Top-level functions, then the methods of top-level classes."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (n for n in node.body if isinstance(n, ast.FunctionDef))


def read_prompts(path: str | Path) -> list[Prompt]:
    """A JSONL prompt file (module doc); a bad line is refused with its number."""
    out: list[Prompt] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item: Any = json.loads(line)
            except ValueError as exc:
                raise PromptFileError(f"{path}:{n}: not JSON: {exc}") from None
            out.append(_prompt(item, f"{path}:{n}"))
    if not out:
        raise PromptFileError(f"{path}: no prompts")
    return out


def _prompt(item: Any, where: str) -> Prompt:
    if isinstance(item, dict) and set(item) == {"prompt"} and isinstance(item["prompt"], str):
        return Prompt(text=item["prompt"])
    if isinstance(item, dict) and set(item) == {"messages"} and isinstance(item["messages"], list):
        msgs = item["messages"]
        if msgs and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                        and isinstance(m.get("content"), str) for m in msgs):
            return Prompt(messages=tuple({"role": m["role"], "content": m["content"]}
                                         for m in msgs))
    raise PromptFileError(f'{where}: expected {{"prompt": "..."}} or '
                          '{"messages": [{"role": ..., "content": ...}, ...]}')


__all__ = ["Prompt", "PromptFileError", "builtin_prompts", "read_prompts"]
