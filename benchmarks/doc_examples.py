"""Every command in README.md and docs/*.md, found, classified by its marker, and run.

A fenced ``bash``, ``console`` or ``python`` block is preceded by one HTML comment that
says what the test suite does with it (the comment does not render, and the fence keeps
its plain info string, so the page reads and highlights as before)::

    <!-- doc-test: run max-tokens=16 -->             run as written (options below)
    <!-- doc-test: server -->                         run against a `draftwise serve`
                                                      the test started on a free port
    <!-- doc-test: file acme_repeat/options.py -->    written to that path; later blocks
                                                      of the page run beside it
    <!-- doc-test: skip real-model: why -->           not run by the suite; listed here

``run`` options: ``max-tokens=N`` (every ``--max-tokens``/``max_tokens`` becomes N, and a
``draftwise generate`` without one gets it), ``timeout=S`` (default 120), ``expect=TEXT``
(a substring the output must hold; quote it). A ``console`` block's ``$`` lines are the
commands and the lines after each are its output, matched with ``...`` as a wildcard.
Paths under ``/tmp/`` are moved into a scratch folder.

``skip`` takes a category, then a reason: ``real-model`` (needs the fetched real-size
GGUFs or a checkpoint from a hub), ``long`` (minutes on two cores), ``install`` (changes
the environment) or ``fragment`` (a piece of code, not a program). The tests
(``tests/docs/test_doc_examples.py``) fail on a block with no marker.

This script is the other half: it lists the skipped blocks, and runs the ``real-model``
and ``long`` shell blocks (those are benchmarks, not tests), with ``MODELS`` naming where
``scripts/fetch_models.py`` put the GGUFs::

    python benchmarks/doc_examples.py --list
    MODELS=/work/models python benchmarks/doc_examples.py --run real-model,long
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the languages whose blocks must carry a marker
LANGUAGES = ("bash", "console", "python")
MODES = ("run", "server", "file", "skip")
SKIP_CATEGORIES = ("real-model", "long", "install", "fragment")
_MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<body>.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>[^`]*)$")


class MarkerError(ValueError):
    """A marker the runner cannot follow; names the file and line."""


@dataclass(frozen=True, slots=True)
class Marker:
    """What to do with one block (module doc)."""

    mode: str
    #: ``skip``: the category (``real-model``, ``long`` ...); ``file``: the path
    arg: str = ""
    #: ``skip``: why, in words
    reason: str = ""
    options: dict[str, str] = field(default_factory=dict)

    @property
    def max_tokens(self) -> int | None:
        """The ``max-tokens=N`` option, if any."""
        value = self.options.get("max-tokens")
        return None if value is None else int(value)

    @property
    def timeout(self) -> float:
        """Seconds one block may take."""
        return float(self.options.get("timeout", 120))


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block of a page, with its marker (None: unmarked)."""

    path: Path
    #: 1-based line of the opening fence
    line: int
    lang: str
    source: str
    marker: Marker | None

    @property
    def where(self) -> str:
        """``docs/server.md:57``, for messages and test ids."""
        try:
            return f"{self.path.relative_to(ROOT)}:{self.line}"
        except ValueError:
            return f"{self.path}:{self.line}"


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def parse_marker(body: str, where: str) -> Marker:
    """``mode [arg] [key=value ...]``, or ``skip category: reason``."""
    if body.startswith("skip"):
        rest = body[len("skip"):].strip()
        category, _, reason = rest.partition(":")
        category, reason = category.strip(), reason.strip()
        if category not in SKIP_CATEGORIES or not reason:
            raise MarkerError(
                f"{where}: 'doc-test: skip' needs a category ({', '.join(SKIP_CATEGORIES)}) "
                f"and a reason, e.g. 'skip long: minutes on two cores'; got {body!r}"
            )
        return Marker("skip", category, reason)
    words = shlex.split(body)
    if not words or words[0] not in MODES:
        raise MarkerError(f"{where}: unknown doc-test mode in {body!r}; use one of {MODES}")
    mode, args = words[0], words[1:]
    arg = ""
    if mode == "file":
        if not args:
            raise MarkerError(f"{where}: 'doc-test: file' needs the path to write")
        arg, args = args[0], args[1:]
    options: dict[str, str] = {}
    for word in args:
        key, eq, value = word.partition("=")
        if not eq or key not in ("max-tokens", "timeout", "expect"):
            raise MarkerError(
                f"{where}: unknown doc-test option {word!r}; use max-tokens=N, timeout=S "
                "or expect='TEXT'"
            )
        options[key] = value
    return Marker(mode, arg, "", options)


def blocks(path: Path) -> Iterator[Block]:
    """Every fenced block of a page, with the marker on the line before its fence."""
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent = m.group("indent")
        info = m.group("info").strip()
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[i + 1:end]]
        prev = lines[i - 1] if i > 0 else ""
        mm = _MARKER.match(prev)
        where = f"{path}:{i + 1}"
        marker = parse_marker(mm.group("body"), where) if mm else None
        yield Block(path, i + 1, info.split()[0] if info else "", "\n".join(body) + "\n",
                    marker)
        i = end + 1


def all_blocks(root: Path = ROOT) -> list[Block]:
    """The blocks of every page that must carry a marker."""
    return [b for page in pages(root) for b in blocks(page) if b.lang in LANGUAGES]


# -- turning a block into what runs ---------------------------------------------------------


def with_max_tokens(source: str, n: int) -> str:
    """Every token limit in the block set to ``n``; a bare ``draftwise generate`` gets one."""
    source = re.sub(r"--max-tokens[ =]\d+", f"--max-tokens {n}", source)
    source = re.sub(r"(max_tokens\s*=\s*)\d+", rf"\g<1>{n}", source)
    source = re.sub(r'("max_tokens"\s*:\s*)\d+', rf"\g<1>{n}", source)
    out = []
    for command in split_commands(source):
        if "draftwise generate" in command and "--max-tokens" not in command:
            command = command.replace("draftwise generate", f"draftwise generate --max-tokens {n}", 1)
        out.append(command)
    return "\n".join(out) + "\n"


def split_commands(script: str) -> list[str]:
    """A shell script's commands: backslash-continued lines joined, blank lines dropped."""
    commands: list[str] = []
    current = ""
    for line in script.split("\n"):
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip():
            commands.append(current.strip())
        current = ""
    return commands


@dataclass(frozen=True, slots=True)
class ConsoleStep:
    """One ``$`` command of a console block and the output the page shows for it."""

    command: str
    expected: str


def console_steps(source: str) -> list[ConsoleStep]:
    """The ``$`` commands (continuation lines joined) and the lines shown after each."""
    steps: list[ConsoleStep] = []
    command: str | None = None
    expected: list[str] = []
    continuing = False
    for line in source.rstrip("\n").split("\n"):
        if continuing:
            command = f"{command} {line.strip().removesuffix(chr(92)).strip()}"
            continuing = line.rstrip().endswith("\\")
            continue
        if line.startswith("$ "):
            if command is not None:
                steps.append(ConsoleStep(command, "\n".join(expected)))
            command, expected = line[2:].strip().removesuffix("\\").strip(), []
            continuing = line.rstrip().endswith("\\")
        else:
            expected.append(line)
    if command is not None:
        steps.append(ConsoleStep(command, "\n".join(expected)))
    return steps


def output_matches(expected: str, actual: str) -> bool:
    """The page's output against the real one: ``...`` stands for anything, line ends and
    trailing blank lines are not compared."""
    want = "\n".join(ln.rstrip() for ln in expected.strip("\n").split("\n"))
    got = "\n".join(ln.rstrip() for ln in actual.strip("\n").split("\n"))
    pattern = ".*?".join(re.escape(part) for part in want.split("..."))
    return re.fullmatch(pattern, got, flags=re.DOTALL) is not None


# -- the benchmark half ---------------------------------------------------------------------


def run_shell_block(block: Block, env: dict[str, str] | None = None) -> int:
    """Run a bash block, or a console block's commands, from the repository root."""
    script = block.source
    if block.lang == "console":
        script = "\n".join(step.command for step in console_steps(block.source)) + "\n"
    print(f"== {block.where}", flush=True)
    start = time.perf_counter()
    rc = subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, env=env).returncode
    print(f"== {block.where}: exit {rc} in {time.perf_counter() - start:.1f} s", flush=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    """``--list`` the skipped blocks, or ``--run`` the shell blocks of some categories."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="print every skipped block")
    parser.add_argument("--run", default="", metavar="CATEGORIES",
                        help="comma-separated skip categories whose shell blocks to run "
                             "(real-model, long)")
    args = parser.parse_args(argv)
    skipped = [b for b in all_blocks() if b.marker is not None and b.marker.mode == "skip"]
    if args.list or not args.run:
        for b in skipped:
            category, reason = (b.marker.arg, b.marker.reason) if b.marker else ("", "")
            print(f"{b.where}\t{b.lang}\t{category}\t{reason}")
        return 0
    wanted = set(args.run.split(","))
    failed = []
    for b in skipped:
        if b.marker is not None and b.marker.arg in wanted and b.lang in ("bash", "console"):
            if run_shell_block(b) != 0:
                failed.append(b.where)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
