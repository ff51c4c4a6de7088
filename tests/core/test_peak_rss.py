"""The peak resident memory every report quotes is the process's own (``draftwise.peak_rss``).

``ru_maxrss`` of a process started by exec carries the replaced address space's peak on
Linux: a start-up probe spawned by a benchmark holding several engines once reported
8668 MiB for a 1.4 GB run. Here a parent touches 256 MiB and execs the reader in its
own process, which is what fork+exec from a big parent amounts to.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftwise.bench import peak_rss_mib as bench_peak_rss_mib
from draftwise.cli.common import peak_rss_bytes as cli_peak_rss_bytes
from draftwise.peak_rss import peak_rss_bytes, peak_rss_mib

CORE = Path(__file__).resolve().parents[2] / "core"
BIG = 256 << 20

#: touches BIG bytes, then replaces itself with a reader of its own peak
EXEC_AFTER_BIG = f"""
import os, sys
ballast = b"x" * {BIG}
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
"""
READER = """
import resource
from draftwise.peak_rss import peak_rss_bytes
print(peak_rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc (Linux)")
def test_a_process_exec_d_from_a_big_one_reports_its_own_peak() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CORE), env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", EXEC_AFTER_BIG, READER], env=env,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    own, inherited = map(int, out.split())
    assert inherited >= BIG  # the trap this module avoids is real here
    assert 0 < own < BIG // 2  # an interpreter and one small module, not the parent's peak


def test_every_report_reads_the_one_helper() -> None:
    """generate --json, bench and the benchmark scripts quote the helper, and nothing
    outside it reads ``.ru_maxrss``."""
    assert cli_peak_rss_bytes is peak_rss_bytes and bench_peak_rss_mib is peak_rss_mib
    assert 0 < peak_rss_bytes() == round(peak_rss_mib() * 2**20)
    root = CORE.parent
    readers = [str(p.relative_to(root)) for d in ("core", "benchmarks", "plugins")
               for p in (root / d).rglob("*.py")
               if ".ru_maxrss" in p.read_text(encoding="utf-8") and p.name != "peak_rss.py"]
    assert readers == []
