"""Import circles in core and the plugins, measured on the AST: there are none, and a
new one fails here.

Every ``import`` counts: module level, inside functions, under ``TYPE_CHECKING`` (a
circle through annotations is still two modules that cannot be understood apart). An
edge into the root package ``draftwise`` (its lazy ``__init__``) is left out, as is the
C extension. ``KNOWN_CIRCLES`` is empty: it was the debt recorded in
``docs/architecture.md`` (six circles, 49 modules, when the test was written) and shrank
to nothing; a circle added back fails ``test_no_new_circle...``. Run this file directly
to print the circles.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: circles (strongly connected components) tolerated as known debt: none are left
KNOWN_CIRCLES: list[frozenset[str]] = []


def modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package) for core and every plugin package."""
    found: dict[str, tuple[Path, bool]] = {}
    packages = [root / "core" / "draftwise", *sorted(root.glob("plugins/*/draftwise_*"))]
    for package in packages:
        for path in sorted(package.rglob("*.py")):
            parts = list(path.relative_to(package.parent).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = (path, is_package)
    return found


def import_graph(mods: dict[str, tuple[Path, bool]]) -> dict[str, set[str]]:
    """module -> the modules it imports (any import statement anywhere in the file)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, (path, is_package) in mods.items():
        package = mod if is_package else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [base])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            for name in targets:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name not in (mod, "draftwise"):
                    graph[mod].add(name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


def test_no_new_circle_and_no_known_one_grows() -> None:
    found = circles(import_graph(modules()))
    new = [sorted(c) for c in found if not any(c <= known for known in KNOWN_CIRCLES)]
    assert not new, ("import circles that are not known debt (break them; see "
                     f"docs/architecture.md): {new}")


def test_known_circles_list_shrinks_with_the_code() -> None:
    """A known circle that no longer exists (or shrank) is taken off the list."""
    found = circles(import_graph(modules()))
    stale = [sorted(known) for known in KNOWN_CIRCLES if known not in found]
    assert not stale, f"update KNOWN_CIRCLES: these circles are gone or smaller: {stale}"


#: modules below speculation: the step hands them to ``spec/``, so they name nothing in it
#: (not even under ``TYPE_CHECKING``: a protocol of their own says what they read)
BELOW_SPEC = ("draftwise.request", "draftwise.scheduler")


def test_request_and_scheduler_do_not_reach_up_into_spec() -> None:
    graph = import_graph(modules())
    up = {m: sorted(t for t in graph[m] if t == "draftwise.spec" or t.startswith("draftwise.spec."))
          for m in BELOW_SPEC}
    assert not any(up.values()), f"imports of spec/ from below it: {up}"


def test_the_measure_sees_type_checking_and_function_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "core" / "draftwise"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from draftwise.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from draftwise import c\n")
    (pkg / "c.py").write_text("from . import a\n")
    assert circles(import_graph(modules(tmp_path))) == [
        frozenset({"draftwise.a", "draftwise.b", "draftwise.c"})]


if __name__ == "__main__":
    for circle in sorted(circles(import_graph(modules())), key=len, reverse=True):
        print(len(circle), " ".join(sorted(circle)))
    sys.exit(0)
