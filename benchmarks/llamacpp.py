"""Drive llama.cpp's own binaries (``llama-server``, ``llama-bench``) for ``compare_llamacpp.py``.

llama.cpp is never a draftwise dependency: the binaries are built by
``benchmarks/setup_llamacpp.sh`` and only ever run as child processes. The server is started
on 127.0.0.1 with a free port, fed prompt token ids on ``/completion`` (so its tokenizer and
chat template never enter the comparison), and stopped by the context manager whatever
happens. Its peak RSS is read from ``/proc/<pid>/status`` (VmHWM) before it stops.
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

DEFAULT_BUILD = Path("/work/peers/llama.cpp-build/bin")


class LlamaCppError(RuntimeError):
    """A llama.cpp binary failed to start, died, or answered with an error."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peak_rss_mib_of(pid: int) -> float | None:
    """A live process's peak resident memory (VmHWM), MiB; None when /proc cannot say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def binary_version(binary: Path) -> str:
    """``llama-server --version``'s build line (llama.cpp prints it on stderr)."""
    proc = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("version")]
    return lines[0] if lines else (proc.stdout + proc.stderr).strip()[-200:]


class LlamaServer:
    """One ``llama-server`` child process for one mode (speculation flags are server-wide).

    ``started_at`` is the ``perf_counter`` just before the process was spawned, so a caller
    can time start-up to first token the way a user meets it.
    """

    def __init__(
        self,
        binary: Path,
        model: str,
        threads: int,
        flags: list[str],
        log_path: Path,
        parallel: int = 1,
        ctx_per_slot: int = 4096,
        startup_timeout: float = 600.0,
        request_timeout: float = 1800.0,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [
            str(binary),
            "-m", model,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "-t", str(threads),
            "-tb", str(threads),
            "-c", str(ctx_per_slot * parallel),  # -c is shared by the -np slots
            "-np", str(parallel),
            "--no-webui",
            *flags,
        ]  # fmt: skip
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: httpx.Client | None = None
        self.started_at = 0.0
        self.ready_at = 0.0

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def start(self) -> None:
        """Spawn the server and wait until ``/health`` says the model is loaded."""
        log = self.log_path.open("wb")
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()  # the child holds its own descriptor
        self.client = httpx.Client(base_url=self.url, timeout=self.request_timeout)
        deadline = self.started_at + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise LlamaCppError(
                    f"llama-server exited with {self.proc.returncode} while starting: "
                    f"{shlex.join(self.cmd)}\n{self._log_tail()}"
                )
            try:
                if self.client.get("/health", timeout=5.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass  # not listening yet
            if time.perf_counter() > deadline:
                self.stop()
                raise LlamaCppError(f"llama-server not ready after {self.startup_timeout:.0f} s")
            time.sleep(0.05)
        self.ready_at = time.perf_counter()

    def complete(self, ids: list[int], n_predict: int) -> dict[str, Any]:
        """One greedy ``/completion`` on prompt ids, prompt cache off; the reply plus wall time."""
        if self.client is None:
            raise LlamaCppError("llama-server is not running")
        body = {
            "prompt": ids,
            "n_predict": n_predict,
            "temperature": 0,
            "cache_prompt": False,
            "return_tokens": True,
            "stream": False,
        }
        t0 = time.perf_counter()
        resp = self.client.post("/completion", json=body)
        seconds = time.perf_counter() - t0
        if resp.status_code != 200:
            raise LlamaCppError(f"/completion answered {resp.status_code}: {resp.text[:500]}")
        reply = resp.json()
        reply["_seconds"] = seconds
        reply["_done_at"] = t0 + seconds
        return reply  # type: ignore[no-any-return]

    def peak_rss_mib(self) -> float | None:
        """The server's peak RSS so far (MiB)."""
        return peak_rss_mib_of(self.proc.pid) if self.proc is not None else None

    def stop(self) -> None:
        """Terminate the child (kill after 10 s) and close the client; safe to call twice."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def run_llama_bench(
    binary: Path,
    model: str,
    threads: int,
    n_prompt: int,
    n_gen: int,
    reps: int,
    timeout: float = 1800.0,
) -> dict[str, Any]:
    """``llama-bench -p N -n M`` at one thread count: pure prefill and decode tok/s.

    llama-bench times ``pp`` as one batch of ``n_prompt`` tokens from an empty context and
    ``tg`` as ``n_gen`` single-token decodes from an empty context, ``reps`` times each.
    """
    cmd = [
        str(binary), "-m", model, "-p", str(n_prompt), "-n", str(n_gen),
        "-t", str(threads), "-r", str(reps), "-o", "json",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise LlamaCppError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    rows = json.loads(proc.stdout)
    out: dict[str, Any] = {"command": shlex.join(cmd)}
    for row in rows:
        key = "prefill" if row.get("n_gen", 0) == 0 else "decode"
        out[key] = {
            "n_tokens": row["n_prompt"] if key == "prefill" else row["n_gen"],
            "tok_per_s": row["avg_ts"],
            "stddev_tok_per_s": row.get("stddev_ts"),
            "samples_tok_per_s": row.get("samples_ts"),
            "n_threads": row.get("n_threads"),
        }
        out["model_size_bytes"] = row.get("model_size")
        out["model_type"] = row.get("model_type")
        out["build_commit"] = row.get("build_commit")
        out["cpu_info"] = row.get("cpu_info")
    return out
