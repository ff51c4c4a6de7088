"""Bounds on a grammar document, measured here before the grammar library sees it.

Why this exists: llguidance walks rule references (Lark rules, JSON-schema ``$ref`` chains)
recursively in native code. A ~100 KB schema whose ``$defs`` chain 3,000 deep (or a
37 KB Lark grammar ``r0: r1``, ``r1: r2`` ...) overflows the C stack and kills the whole
process: no exception, every other request's stream cut. Its size limits do not bound
nesting, and its own "too deeply nested" checks cover inline nesting only. So every
document is measured first, without recursion (an explicit stack), and refused with a
:class:`GrammarBoundError` naming the limit.

What is measured:

- **Reference depth** (:data:`MAX_REFERENCE_DEPTH`): the longest path through the
  document, counting one level per nested JSON container or Lark parenthesis and one per
  reference followed (``$ref`` into the same document; a Lark rule naming another rule).
  A reference back into the path being measured (a recursive schema or grammar, which is
  legitimate and which the library handles lazily) ends that path instead of looping.
  2,000 levels of pure references still compile on an 8 MiB stack; 3,000 do not. The
  limit leaves that margin eight times over, while real schemas and grammars stay well
  under 100.
- **Choices** (:data:`MAX_CHOICES`): llguidance's parser refuses a grammar row of more
  than 2,000 items, but only once generation reaches that row; a choice list becomes one
  such row, so it stays well below.
- **Regex repetition counts** (:data:`MAX_REPEAT`): ``a{1000000}`` passes validation and
  fails in the lexer at the first token ("too many expressions"); counts past the limit
  are refused by name instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from draftwise.errors import DraftwiseError

#: nested containers plus references followed, along any one path through a grammar
MAX_REFERENCE_DEPTH = 256
#: strings a ``choice`` constraint may list (one grammar row; the library's row limit is 2,000)
MAX_CHOICES = 1024
#: largest ``{n}`` / ``{n,m}`` count in a regex (the lexer expands each repetition)
MAX_REPEAT = 10_000


def library_limits() -> Any:
    """llguidance's resource limits as the engine runs them: the library's defaults, with
    ``verbose_errors`` off so no error message carries the parser's state or the grammar
    back to a client (or into a log line)."""
    import llguidance

    return llguidance.LLParserLimits(verbose_errors=False)


class GrammarBoundError(DraftwiseError, ValueError):
    """A grammar document over one of this module's limits (the client's input)."""


def check_json_schema(schema: Any, kind: str = "json") -> None:
    """Refuse a schema whose nesting plus ``$ref`` chains exceed :data:`MAX_REFERENCE_DEPTH`."""
    depth = _longest_path(schema, _schema_children(schema))
    if depth > MAX_REFERENCE_DEPTH:
        raise GrammarBoundError(
            f"{kind}: the schema nests more than {MAX_REFERENCE_DEPTH} levels deep, counting "
            f"the $ref chains it follows (flatten the $ref chain or the nesting)")


def check_choices(choices: tuple[str, ...] | list[str]) -> None:
    """Refuse an empty choice list or one longer than :data:`MAX_CHOICES`."""
    if not choices or len(choices) > MAX_CHOICES:
        raise GrammarBoundError(
            f"choice: give between 1 and {MAX_CHOICES} strings, got {len(choices)}")


#: a counted repetition: ``{n}``, ``{n,}`` or ``{n,m}`` (``\{`` is a literal brace)
_REPEAT = re.compile(r"(?<!\\)\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def check_regex(pattern: str, kind: str = "regex") -> None:
    """Refuse a counted repetition above :data:`MAX_REPEAT` (the lexer would expand it)."""
    for match in _REPEAT.finditer(pattern):
        for count in match.groups():
            if count and (len(count) > 9 or int(count) > MAX_REPEAT):
                raise GrammarBoundError(
                    f"{kind}: the repetition {match.group(0)!r} is over the limit of "
                    f"{MAX_REPEAT} repeats")


def check_lark(lark: str, kind: str = "grammar") -> None:
    """Refuse a Lark grammar whose rule chains and parentheses nest past the limit.

    ``%json {...}`` blocks embed a schema; each is measured as a schema too. Regexes
    (``/.../``) are checked for repetition counts.
    """
    rules, schemas, regexes = _lark_rules(lark)
    for schema in schemas:
        check_json_schema(schema, kind)
    for pattern in regexes:
        check_regex(pattern, kind)
    children = _lark_children(rules)
    memo: dict[Any, int] = {}  # shared: each rule is walked once, from whichever root
    depth = 0
    for name in ("start", *rules):  # rules start does not reach are compiled all the same
        depth = max(depth, _longest_path(("rule", name), children, memo))
        if depth > MAX_REFERENCE_DEPTH:
            break
    if depth > MAX_REFERENCE_DEPTH:
        raise GrammarBoundError(
            f"{kind}: rules reference each other (parentheses counted) more than "
            f"{MAX_REFERENCE_DEPTH} levels deep (flatten the rule chain)")


# -- longest path without recursion ----------------------------------------------------


def _longest_path(root: Any, children: Any, memo: dict[Any, int] | None = None) -> int:
    """Nodes on the longest path from ``root``; an edge back into the path ends it.

    ``children(node)`` yields child nodes; nodes are compared by :func:`_key`. Memoised
    (``memo`` may be shared between roots), so a shared subschema or rule is walked once.
    Stops early once past the limit: the caller only needs to know that.
    """
    memo = {} if memo is None else memo
    if _key(root) in memo:
        return memo[_key(root)]
    on_path: set[Any] = set()
    stack: list[tuple[Any, Iterator[Any], int]] = []

    def enter(node: Any) -> None:
        key = _key(node)
        on_path.add(key)
        stack.append((node, iter(children(node)), 1))

    enter(root)
    while stack:
        node, it, best = stack[-1]
        child = next(it, _DONE)
        if child is _DONE:
            stack.pop()
            key = _key(node)
            on_path.discard(key)
            memo[key] = best
            if stack:
                parent, pit, pbest = stack[-1]
                stack[-1] = (parent, pit, max(pbest, best + 1))
            continue
        ckey = _key(child)
        if ckey in on_path:
            continue  # recursion: the library expands it lazily, one level at a time
        if ckey in memo:
            stack[-1] = (node, it, max(best, memo[ckey] + 1))
            continue
        if len(stack) > MAX_REFERENCE_DEPTH:
            return len(stack) + 1
        enter(child)
    return memo.get(_key(root), 1)


_DONE = object()


def _key(node: Any) -> Any:
    return ("id", id(node)) if isinstance(node, dict | list) else node


def _schema_children(root: Any) -> Any:
    """Children of a JSON-schema node: its containers' values, and a local ``$ref``'s target."""

    def children(node: Any) -> Iterator[Any]:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                target = _resolve(root, ref)
                if target is not None:
                    yield target
            for value in node.values():
                if isinstance(value, dict | list):
                    yield value
        elif isinstance(node, list):
            for value in node:
                if isinstance(value, dict | list):
                    yield value

    return children


def _resolve(root: Any, ref: str) -> Any:
    """The node a same-document ``$ref`` (``#`` or ``#/json/pointer``) points at, or None."""
    if not ref.startswith("#"):
        return None  # another document: the library refuses it by name
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


# -- Lark -------------------------------------------------------------------------------

#: a rule or terminal definition at the start of a line: ``name:``, ``?name:``, ``NAME.2:``
_RULE = re.compile(r"^[ \t]*[?!]?([A-Za-z_][A-Za-z0-9_]*)(?:\.-?\d+)?[ \t]*:(?!:)", re.M)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _lark_rules(text: str) -> tuple[dict[str, str], list[Any], list[str]]:
    """Rule bodies by name (literals removed), embedded ``%json`` schemas, and regexes."""
    body, schemas, regexes = _strip_literals(text)
    starts = list(_RULE.finditer(body))
    rules: dict[str, str] = {}
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(body)
        rules[m.group(1)] = rules.get(m.group(1), "") + " " + body[m.end():end]
    return rules, schemas, regexes


def _strip_literals(text: str) -> tuple[str, list[Any], list[str]]:
    """The grammar with strings, regexes, comments and ``%json`` blocks blanked out.

    A scanner, not a parser: what it blanks can hold rule names and brackets that are
    not references or nesting.
    """
    out: list[str] = []
    schemas: list[Any] = []
    regexes: list[str] = []
    decoder = json.JSONDecoder()
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or (c == "/" and i + 1 < n and text[i + 1] not in "/*"):
            j = _literal_end(text, i)
            if c == "/":
                regexes.append(text[i + 1:j - 1])
            out.append(" ")
            i = j
        elif text.startswith("//", i) or c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("%json", i):
            j = text.find("{", i)
            try:
                schema, end = decoder.raw_decode(text, j) if j >= 0 else (None, i + 5)
            except ValueError:
                schema, end = None, i + 5  # malformed: the library names it
            if schema is not None:
                schemas.append(schema)
            out.append(" ")
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out), schemas, regexes


def _literal_end(text: str, i: int) -> int:
    """Index past the string or regex literal opening at ``i`` (its flags included)."""
    quote, j, n = text[i], i + 1, len(text)
    while j < n and text[j] != quote and text[j] != "\n":
        j += 2 if text[j] == "\\" else 1
    j += 1
    while j < n and text[j].isalpha():  # /re/i, "lit"i
        j += 1
    return min(j, n)


def _lark_children(rules: dict[str, str]) -> Any:
    """Children of a rule: the rules its body names, each inside its parentheses' nesting.

    A rule body's opening brackets become a chain of ``("paren", rule, k)`` nodes, so a
    reference inside ``k`` brackets sits ``k`` levels below its rule.
    """
    refs: dict[str, list[tuple[int, str]]] = {}
    for name, body in rules.items():
        found: list[tuple[int, str]] = []
        level = 0
        for m in re.finditer(r"[()\[\]]|[A-Za-z_][A-Za-z0-9_]*", body):
            tok = m.group(0)
            if tok in "([":
                level += 1
                found.append((level, ""))
            elif tok in ")]":
                level = max(0, level - 1)
            elif tok in rules and tok != name:
                found.append((level, tok))
        refs[name] = found

    def children(node: Any) -> Iterator[Any]:
        _, name, *rest = node
        level = rest[0] if rest else 0
        for lvl, target in refs.get(name, ()):
            if lvl == level + 1 and not target:
                yield ("paren", name, lvl)
            elif lvl == level and target:
                yield ("rule", target)

    return children


__all__ = ["MAX_CHOICES", "MAX_REFERENCE_DEPTH", "MAX_REPEAT", "GrammarBoundError",
           "check_choices", "check_json_schema", "check_lark", "check_regex", "library_limits"]
