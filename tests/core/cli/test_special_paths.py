"""A FIFO, a character device or a unix socket given where a file is read: a named
refusal (exit 2, the path and what it is), never a hang.

Opening a FIFO waits for a writer forever, so every case runs the console script in a
subprocess with a timeout: a regression fails its test instead of stalling the suite.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from draftwise.formats.default_model import check_checkpoint_path, special_kind
from draftwise.formats.errors import ModelFormatError

SCRIPT = "import sys; sys.argv[0] = 'draftwise'; from draftwise.cli import main; main()"
#: a refusal comes before torch's import finishes; a hang is what this bound catches
TIMEOUT_S = 60

KINDS = {"fifo": "a FIFO (named pipe)", "chardev": "a character device", "socket": "a socket"}


@pytest.fixture(scope="module")
def specials() -> Iterator[dict[str, str]]:
    """One path of each kind (a short directory: a socket's path is limited to ~107 bytes)."""
    folder = tempfile.mkdtemp(prefix="dw-special-")
    fifo = os.path.join(folder, "model.gguf")
    os.mkfifo(fifo)
    sock_path = os.path.join(folder, "model.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(sock_path)
    try:
        yield {"fifo": fifo, "chardev": os.devnull, "socket": sock_path}
    finally:
        sock.close()
        shutil.rmtree(folder, ignore_errors=True)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True,
                          text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)


def assert_refused(out: subprocess.CompletedProcess[str], path: str, kind: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr
    assert path in out.stderr and kind in out.stderr, out.stderr
    assert "regular file" in out.stderr, out.stderr


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_generate_refuses_a_special_model_path(specials: dict[str, str], kind: str) -> None:
    out = run("generate", "--model", specials[kind], "--prompt", "hi", "--max-tokens", "1")
    assert_refused(out, specials[kind], KINDS[kind])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_serve_refuses_at_start_up(specials: dict[str, str], kind: str) -> None:
    out = run("serve", "--model", specials[kind], "--port", "0")
    assert_refused(out, specials[kind], KINDS[kind])
    assert "serving" not in out.stderr  # refused before binding


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_drafter_model_path_is_refused(specials: dict[str, str], kind: str) -> None:
    config = ('{"method": "draft_model", "model": "%s", "num_speculative_tokens": 3}'
              % specials[kind])
    out = run("generate", "--speculative-config", config, "--prompt", "hi", "--max-tokens", "1")
    assert_refused(out, specials[kind], KINDS[kind])


def test_bench_refuses_a_fifo_workload(specials: dict[str, str]) -> None:
    out = run("bench", "--workload", specials["fifo"], "--out", os.devnull)
    assert out.returncode == 2, out.stderr
    assert specials["fifo"] in out.stderr and "FIFO" in out.stderr, out.stderr


def test_a_fifo_inside_a_checkpoint_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    os.mkfifo(tmp_path / "model.safetensors")
    with pytest.raises(ModelFormatError, match="FIFO") as info:
        check_checkpoint_path(tmp_path)
    assert str(tmp_path / "model.safetensors") in str(info.value)


def test_special_kind_leaves_files_directories_and_missing_paths_alone(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    assert special_kind(tmp_path / "a.gguf") is None
    assert special_kind(tmp_path) is None
    assert special_kind(tmp_path / "missing") is None  # its own refusal: no such file
    link = tmp_path / "link.gguf"
    link.symlink_to(tmp_path / "a.gguf")  # HF caches link to blobs: followed
    assert special_kind(link) is None
