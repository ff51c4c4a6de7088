"""How long a long prompt stalls a stream already running (issue 40, item 5).

Starts ``draftwise serve`` on 127.0.0.1 (a free port), opens a greedy victim stream, and
once it is decoding sends a long prompt (``--prompt-tokens`` random token ids,
``max_tokens`` 1), then the same prompt again with ``prompt_logprobs``. For each long
prompt it reports the victim's largest gaps between streamed tokens while the prompt ran,
and the prompt's own latency and prefill rate. Last, a long prompt alone and a short
request sent ``--newcomer-after`` seconds later: the short one's latency. Wall time is what it measures, so it is a
benchmark, not a test; run it on a quiet machine, before and after a change, in one
sitting.

    python3 benchmarks/long_prompt_victim.py --prompt-tokens 6500 \
        [--serve-arg=--long-prefill-token-threshold=256] [--out report.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

READY = re.compile(r"on (http://127\.0\.0\.1:\d+)")


def start_server(extra: list[str]) -> tuple[subprocess.Popen[str], str]:
    """``draftwise serve --port 0``; returns the process and its URL once it is ready."""
    cmd = [sys.executable, "-c", "from draftwise.cli import main; main()", "serve",
           "--host", "127.0.0.1",
           "--port", "0", "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        m = READY.search(line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining
            return proc, m.group(1)
    raise RuntimeError(f"server exited before it was ready (rc {proc.wait()})")


def stream_victim(url: str, times: list[float], stop: threading.Event, max_tokens: int) -> None:
    """A greedy stream; each token's arrival time is appended until ``stop`` is set."""
    body = {"prompt": "The history of the printing press begins", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    with (httpx.Client(timeout=None) as client,
          client.stream("POST", f"{url}/v1/completions", json=body) as resp):
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                times.append(time.monotonic())
            if stop.is_set():
                return  # closing the stream aborts the request


def one_long_prompt(url: str, ids: list[int], prompt_logprobs: int | None,
                    victim_tokens: int) -> dict[str, Any]:
    """Run the victim, then the long prompt beside it; the victim's gaps while it ran."""
    times: list[float] = []
    stop = threading.Event()
    victim = threading.Thread(target=stream_victim, args=(url, times, stop, victim_tokens))
    victim.start()
    while len(times) < 8:  # the victim is decoding
        if not victim.is_alive():
            raise RuntimeError("the victim stream ended before it decoded 8 tokens")
        time.sleep(0.01)
    body: dict[str, Any] = {"prompt": ids, "max_tokens": 1, "temperature": 0}
    if prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs
    t0 = time.monotonic()
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=None)
    t1 = time.monotonic()
    resp.raise_for_status()
    settle = len(times) + 4  # a few tokens after, so the last gap is closed
    while len(times) < settle and victim.is_alive():
        time.sleep(0.01)
    stop.set()
    victim.join()
    during = [b - a for a, b in itertools.pairwise(times) if b > t0 and a < t1]
    before = [b - a for a, b in itertools.pairwise(times) if b <= t0]
    gaps = sorted(during, reverse=True)
    return {
        "prompt_tokens": len(ids),
        "prompt_logprobs": prompt_logprobs,
        "latency_s": round(t1 - t0, 3),
        "prefill_tokens_per_s": round(len(ids) / (t1 - t0), 1),
        "victim_largest_gaps_s": [round(g, 3) for g in gaps[:5]],
        "victim_tokens_during": len(during),
        "victim_median_gap_before_s": round(sorted(before)[len(before) // 2], 4) if before
        else None,
    }


def newcomer_latency(url: str, ids: list[int], delay: float) -> dict[str, Any]:
    """The long prompt alone, then ``delay`` s later a short request: how long the short
    one took (its one token) while the long one was being prefilled."""
    result: dict[str, float] = {}

    def long_prompt() -> None:
        t0 = time.monotonic()
        body = {"prompt": ids, "max_tokens": 1, "temperature": 0}
        httpx.post(f"{url}/v1/completions", json=body, timeout=None).raise_for_status()
        result["long"] = time.monotonic() - t0

    thread = threading.Thread(target=long_prompt)
    thread.start()
    time.sleep(delay)
    t0 = time.monotonic()
    body = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
    httpx.post(f"{url}/v1/completions", json=body, timeout=None).raise_for_status()
    short = time.monotonic() - t0
    thread.join()
    return {"prompt_tokens": len(ids), "newcomer_after_s": delay,
            "newcomer_latency_s": round(short, 3), "latency_s": round(result["long"], 3)}


def main(argv: list[str] | None = None) -> None:
    """Parse flags, serve, measure, print (and write) the report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=6500)
    ap.add_argument("--prompt-logprobs", type=int, default=20,
                    help="the second long prompt's prompt_logprobs (0: skip that run)")
    ap.add_argument("--victim-tokens", type=int, default=4000)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="passed to draftwise serve (repeatable), e.g. --serve-arg=--model=X")
    ap.add_argument("--newcomer-after", type=float, default=2.0,
                    help="last, the long prompt alone and a short request this many seconds "
                    "later: the short one's latency (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    rng = random.Random(args.seed)
    proc, url = start_server(args.serve_arg)
    try:
        vocab = 49152  # the default model's; ids below it are valid for SmolLM2
        runs = []
        for plp in [None] + ([args.prompt_logprobs] if args.prompt_logprobs else []):
            ids = [rng.randrange(100, vocab) for _ in range(args.prompt_tokens)]
            runs.append(one_long_prompt(url, ids, plp, args.victim_tokens))
            print(json.dumps(runs[-1]), flush=True)
        if args.newcomer_after > 0:
            ids = [rng.randrange(100, vocab) for _ in range(args.prompt_tokens)]
            runs.append(newcomer_latency(url, ids, args.newcomer_after))
            print(json.dumps(runs[-1]), flush=True)
        report = {"serve_args": args.serve_arg, "cpus": os.cpu_count(),
                  "load_avg": os.getloadavg(), "runs": runs}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
