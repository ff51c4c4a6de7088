"""Where a server's RSS levels off under load: the KV pool's share and everything else's.

    python benchmarks/rss_soak.py --seconds 180 --concurrency 16 --prompt-tokens 1000 \\
        --out rss-soak.json -- --max-num-seqs 32

Starts ``draftwise serve --port 0`` (arguments after ``--`` go to it), drives it on
loopback with ``--concurrency`` threads sending distinct random-token prompts (so the
prefix cache never shares a block and the pool's pages fault in as fast as the load
allows) for ``--seconds``, and samples the process's ``VmRSS`` every ``--every`` seconds
from ``/proc/PID/status``, and from ``/proc/PID/smaps`` the resident bytes of the KV
pool's own mapping (the anonymous mapping of the size the start-up log states). RSS
minus the pool's resident bytes is everything else: flat once warm, or a leak. The
server is stopped by its own pid; every request and wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

KV_LINE = re.compile(r"KV cache: (\d+) blocks x (\d+) tokens = ([\d.]+) MiB")
READY = re.compile(r"draftwise serving .* on (http://\S+) .*pid (\d+)")
MIB = 2**20


def status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/PID/status."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def mapping_rss_kib(pid: int, size_kib: int) -> int | None:
    """Rss of the anonymous mapping of ``size_kib`` (the KV pool, to the 0.1 MiB the log
    states it in), or None if none is."""
    best: tuple[int, int] | None = None
    size = rss = 0
    anon = False
    with open(f"/proc/{pid}/smaps", encoding="ascii", errors="replace") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                anon = len(line.split()) < 6  # no path: anonymous
                size = rss = 0
            elif line.startswith("Size:"):
                size = int(line.split()[1])
            elif line.startswith("Rss:") and anon and abs(size - size_kib) <= 128:
                rss = int(line.split()[1])
                best = (size, rss)
    return best[1] if best else None


def main(argv: list[str] | None = None) -> None:
    """Run the soak; print and write the samples."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=180.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--every", type=float, default=10.0)
    p.add_argument("--out", default=None)
    p.add_argument("serve_args", nargs="*")
    args = p.parse_args(argv)

    cmd = [sys.executable, "-c", "import sys; sys.argv[0] = 'draftwise'; "
           "from draftwise.cli import main; main()", "serve", "--port", "0", *args.serve_args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    url, pid, kv_kib = None, proc.pid, None
    started = time.monotonic()
    while url is None and time.monotonic() - started < 300:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit(f"the server exited ({proc.wait()}) before it was ready")
        if (m := KV_LINE.search(line)) is not None:
            kv_kib = round(float(m.group(3)) * 1024)
        if (m := READY.search(line)) is not None:
            url, pid = m.group(1), int(m.group(2))
    if url is None or kv_kib is None:
        proc.kill()
        raise SystemExit("no ready line or KV cache line (run with --log-level info)")
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained

    stop = threading.Event()
    done = [0]
    errors: list[str] = []

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=300) as http:
            while not stop.is_set():
                ids = [rng.randrange(200, 40000) for _ in range(args.prompt_tokens)]
                r = http.post(f"{url}/v1/completions", json={
                    "prompt": ids, "max_tokens": args.max_tokens, "temperature": 0,
                    "ignore_eos": True})
                if r.status_code != 200:
                    errors.append(r.text[:200])
                done[0] += 1

    samples: list[dict[str, Any]] = []
    threads = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(args.concurrency)]

    def sample(label: str) -> None:
        rss = status_kib(pid, "VmRSS")
        kv = mapping_rss_kib(pid, kv_kib) or 0
        row = {"t": round(time.monotonic() - t0, 1), "label": label, "requests": done[0],
               "rss_mib": round(rss / 1024, 1), "kv_resident_mib": round(kv / 1024, 1),
               "rest_mib": round((rss - kv) / 1024, 1),
               "hwm_mib": round(status_kib(pid, "VmHWM") / 1024, 1)}
        samples.append(row)
        print(json.dumps(row), flush=True)

    t0 = time.monotonic()
    try:
        sample("idle")
        for t in threads:
            t.start()
        while time.monotonic() - t0 < args.seconds:
            time.sleep(args.every)
            sample("load")
        stop.set()
        for t in threads:
            t.join(timeout=300)
        sample("after")
    finally:
        os.kill(pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
    report = {"kv_pool_mib": round(kv_kib / 1024, 1), "serve_args": args.serve_args,
              "concurrency": args.concurrency, "prompt_tokens": args.prompt_tokens,
              "max_tokens": args.max_tokens, "requests": done[0], "errors": errors[:5],
              "samples": samples}
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}))


if __name__ == "__main__":
    main()
