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
    serve(app, "127.0.0.1", 0, log_level="warning", shutdown_timeout=10,
          on_ready=lambda url: print(url, flush=True))
    print("clean exit", flush=True)
""")


def _start() -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get(
        "PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.stderr else url
    return proc, url


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
