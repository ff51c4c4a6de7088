"""SIGTERM / SIGINT on a served process: in-flight requests finish, exit status 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).parent

SCRIPT = textwrap.dedent("""
    import sys
    from server_fakes import FakeEngine
    from draftwise.server import ServerConfig, create_app
    from draftwise.server.runner import serve

    app = create_app(FakeEngine(step_delay=0.01), ServerConfig(served_model_names=("m",)))
    serve(app, "127.0.0.1", 0, log_level="info", shutdown_timeout=float(sys.argv[1]),
          on_ready=lambda url: print(url, flush=True))
    print("clean exit", flush=True)
""")


def _start(shutdown_timeout: float = 10.0) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get(
        "PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(shutdown_timeout)],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.stderr else url
    return proc, url


def _wait_up(url: str) -> None:
    for _ in range(200):  # the socket is bound before uvicorn starts: wait for startup
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError(f"{url} never came up")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_drains_in_flight_stream_and_exits_0(sig):
    proc, url = _start()
    try:
        for _ in range(200):  # the socket is bound before uvicorn starts: wait for startup
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        body = {"prompt": "drain", "max_tokens": 50, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=20) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            proc.send_signal(sig)
            rest = [line for line in lines if line.startswith("data: ")]
        events = [first, *rest]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert "clean exit" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_shutdown_timeout_sends_error_event_and_done_and_503s_late_requests():
    """Past --shutdown-timeout: the stream ends with an error event and [DONE]; a request
    during the drain gets the documented 503 body; the log has no traceback."""
    proc, url = _start(shutdown_timeout=1.5)
    try:
        _wait_up(url)
        body = {"prompt": "endless", "max_tokens": 240, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=20) as r:
            lines = (line for line in r.iter_lines() if line.startswith("data: "))
            next(lines)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            late = httpx.post(f"{url}/v1/completions", json={"prompt": "late"}, timeout=5)
            rest = list(lines)
        assert late.status_code == 503
        assert late.json()["error"]["code"] == "shutting_down"
        assert rest[-1] == "data: [DONE]"
        error = json.loads(rest[-2][6:])["error"]
        assert "shutdown timeout expired" in error["message"]
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert "clean exit" in out
        assert "Traceback" not in err and "CancelledError" not in err, err
        assert "shutdown timeout: ending 1 request(s)" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
