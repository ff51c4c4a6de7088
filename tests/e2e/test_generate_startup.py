"""What ``draftwise generate`` loads on its way to the first token, as the console script
runs it (issue 13's start-up and memory targets).

The command imports nothing a plain generation does not use (the server, transformers,
metrics export, the grammar library), and its peak resident set, the process's own
``VmHWM``, stays within the file size + 0.5 GB (the KV cache's pages are touched only
as far as the prompt reaches).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftwise.formats.default_model import default_model_path

pytestmark = pytest.mark.default_model

ROOT = Path(__file__).resolve().parents[2]
#: top-level packages generate must not import unless asked for what they serve
NOT_FOR_GENERATE = ("fastapi", "uvicorn", "starlette", "transformers", "prometheus_client",
                    "llguidance", "xgrammar", "rich")
SCRIPT = """
import atexit, json, sys
sys.argv = ["draftwise", *sys.argv[1:]]
atexit.register(lambda: print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})),
                              file=sys.stderr))
from draftwise.cli import main
main()
"""


def test_generate_imports_only_what_it_uses_and_stays_within_its_memory_bound() -> None:
    env = dict(os.environ)
    paths = [str(ROOT / "core"), *map(str, sorted((ROOT / "plugins").glob("*"))),
             env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, "generate", "--prompt", "hi", "--max-tokens", "1",
         "--json"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    modules = set(json.loads(proc.stderr.strip().splitlines()[-1]))
    assert "draftwise" in modules and "torch" in modules
    assert modules.isdisjoint(NOT_FOR_GENERATE), modules.intersection(NOT_FOR_GENERATE)
    metrics = json.loads(proc.stdout)["metrics"]
    assert metrics["peak_rss_bytes"] <= os.path.getsize(default_model_path()) + 500_000_000
    assert metrics["first_token_after_start_seconds"] > metrics["load_seconds"] > 0
