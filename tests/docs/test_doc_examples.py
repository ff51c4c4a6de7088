"""Every command in README.md and docs/*.md runs, or says why not.

The marker grammar and the parser are ``benchmarks/doc_examples.py``'s (one place): a
block with no ``<!-- doc-test: ... -->`` marker fails here, a ``run`` block runs on the
default model, a ``server`` block against one ``draftwise serve`` started on a free
loopback port, and a ``skip`` block is listed for the benchmark script instead.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import doc_examples as dx  # noqa: E402

BLOCKS = dx.all_blocks()
RUNNABLE = [b for b in BLOCKS if b.marker is not None and b.marker.mode != "skip"]
#: the server every ``server`` block talks to: the command README.md and docs/server.md show
SERVE_CONFIG = ('{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,'
                '"prompt_lookup_max":4}')

pytestmark = pytest.mark.default_model


def test_every_block_is_run_or_marked_skipped() -> None:
    unmarked = [b.where for b in BLOCKS if b.marker is None]
    assert not unmarked, (
        "fenced bash/console/python blocks without a '<!-- doc-test: ... -->' marker on the "
        f"line before the fence (run, server, file PATH or 'skip CATEGORY: reason'; see "
        f"benchmarks/doc_examples.py): {unmarked}"
    )


def test_markers_are_parsed_strictly() -> None:
    assert dx.parse_marker("skip long: minutes", "x").arg == "long"
    with pytest.raises(dx.MarkerError, match="needs a category"):
        dx.parse_marker("skip because", "x")
    with pytest.raises(dx.MarkerError, match="unknown doc-test option"):
        dx.parse_marker("run max_tokens=3", "x")
    assert dx.parse_marker("run max-tokens=8 expect='a b'", "x").options == {
        "max-tokens": "8", "expect": "a b"}


def test_console_output_matching() -> None:
    steps = dx.console_steps("$ a \\\n  b\nout ...\n$ c\n")
    assert [(s.command, s.expected) for s in steps] == [("a b", "out ..."), ("c", "")]
    assert dx.output_matches("error: x ...", "error: x and more\n")
    assert not dx.output_matches("error: x", "error: y")


def test_max_tokens_substitution() -> None:
    src = ('draftwise generate --prompt "p"\n'
           "draftwise generate --max-tokens 128 \\\n  --prompt q\n"
           'x = dict(max_tokens=24)\n{"max_tokens": 24}\n')
    out = dx.with_max_tokens(src, 8)
    assert "draftwise generate --max-tokens 8 --prompt \"p\"" in out
    assert "--max-tokens 8    --prompt q" in out
    assert "max_tokens=8" in out and '"max_tokens": 8' in out


# -- running them ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The blocks' environment: ``draftwise`` and ``python3`` are this interpreter's."""
    bin_dir = tmp_path_factory.mktemp("doc-bin")
    (bin_dir / "draftwise").write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c '
        '"import sys; from draftwise.cli import main; sys.argv[0] = \'draftwise\'; main()" "$@"\n'
    )
    (bin_dir / "draftwise").chmod(0o755)
    for name in ("python3", "python"):
        (bin_dir / name).symlink_to(sys.executable)
    out = dict(os.environ)
    out["PATH"] = f"{bin_dir}{os.pathsep}{out.get('PATH', '')}"
    out["PYTHONUNBUFFERED"] = "1"
    return out


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where a block's ``/tmp/...`` paths go."""
    return tmp_path_factory.mktemp("doc-tmp")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(env: dict[str, str]) -> Iterator[tuple[int, list[str]]]:
    """``draftwise serve`` as the pages start it, on a free loopback port; stopped by pid."""
    port = free_port()
    argv = ["draftwise", "serve", "--port", str(port), "--speculative-config", SERVE_CONFIG]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"draftwise serve exited {proc.returncode}: {proc.stderr.read()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("draftwise serve did not answer within 120 s")
                time.sleep(0.25)
        yield port, argv
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def page_files(block: dx.Block, root: Path) -> Path:
    """The page's ``file`` blocks written under ``root`` (a package its run blocks import)."""
    folder = root / block.path.stem
    for b in BLOCKS:
        if b.path == block.path and b.marker is not None and b.marker.mode == "file":
            target = folder / b.marker.arg
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(b.source)
    return folder


def prepared(block: dx.Block, scratch: Path, port: int | None) -> str:
    """The block's source with the test's paths, port and token limit."""
    assert block.marker is not None
    source = block.source.replace("/tmp/", f"{scratch}/")
    if port is not None:
        source = source.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        source = source.replace("--port 8000", f"--port {port}")
    if block.marker.max_tokens is not None:
        source = dx.with_max_tokens(source, block.marker.max_tokens)
    return source


def drop_serve(commands: list[str], argv: list[str], where: str) -> list[str]:
    """A page's own ``draftwise serve`` must be the one the test started; the rest runs."""
    rest = []
    for command in commands:
        if command.startswith("draftwise serve"):
            assert shlex.split(command) == argv, (
                f"{where}: the page starts {command!r}, the test {shlex.join(argv)!r}; "
                "change SERVE_CONFIG or the page"
            )
        else:
            rest.append(command)
    return rest


def run(args: list[str], block: dx.Block, env: dict[str, str]) -> subprocess.CompletedProcess:
    assert block.marker is not None
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=block.marker.timeout)


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.where)
def test_block_runs(block: dx.Block, env: dict[str, str], scratch: Path,
                    request: pytest.FixtureRequest) -> None:
    marker = block.marker
    assert marker is not None
    if marker.mode == "file":  # run by the blocks that import it; here: it compiles
        compile(block.source, f"{block.where} ({marker.arg})", "exec")
        return
    if "curl " in block.source and shutil.which("curl") is None:
        pytest.skip("curl is not installed here")
    port, argv = None, None
    if marker.mode == "server":
        port, argv = request.getfixturevalue("server")
    source = prepared(block, scratch, port)
    block_env = dict(env)
    files = page_files(block, scratch / "pages")
    block_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(files), env.get("PYTHONPATH", "")) if p)
    if block.lang == "python":
        out = run([sys.executable, "-c", source], block, block_env)
        assert out.returncode == 0, f"{block.where}:\n{out.stdout}\n{out.stderr}"
        output = out.stdout
    elif block.lang == "console":
        output = ""
        for step in dx.console_steps(source):
            if argv is not None and not drop_serve([step.command], argv, block.where):
                continue
            out = run(["bash", "-c", step.command], block, block_env)
            shown = out.stdout + out.stderr
            assert dx.output_matches(step.expected, shown), (
                f"{block.where}: `{step.command}` printed\n{shown}\nthe page shows\n"
                f"{step.expected}")
            output += out.stdout
    else:
        commands = dx.split_commands(source)
        if argv is not None:
            commands = drop_serve(commands, argv, block.where)
        out = run(["bash", "-e", "-c", "\n".join(commands)], block, block_env)
        assert out.returncode == 0, f"{block.where}:\n{out.stdout}\n{out.stderr}"
        output = out.stdout
    expect = marker.options.get("expect")
    if expect is not None:
        assert expect in output, f"{block.where}: {expect!r} not in\n{output}"
