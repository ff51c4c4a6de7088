"""Replicas on Ray against one process (docs/scaling.md, issue 45), on one machine.

    python benchmarks/ray_replicas.py --out ray.json                      # default model
    python benchmarks/ray_replicas.py --model /work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --concurrency 8,32 --out ray-1.5b.json

For each concurrency: completion tokens per second and p50/p99 request latency for one
``draftwise serve`` process with 2 threads, and for 2 replicas x 1 thread behind the Ray
Serve ingress under each routing policy (prefix, round-robin, power-of-two), with the
prefix-cache hit rate summed over the replicas. The workload is 4 shared system prompts
and multi-turn sessions (each turn repeats the session's earlier turns, as a chat client
does), sent in turn order, so prefix routing has something to find. The routing overhead
is the mean latency of a 1-token request through the ingress minus the same request on
one process with 1 thread (a replica's own size), sequential, after a warm-up.

Servers listen on loopback and are stopped by their own PID / by ``serve.shutdown``.
Greedy, ``ignore_eos``: every configuration makes the same tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

SYSTEMS = [f"You are assistant number {i}. " + "Answer briefly and politely. " * 12
           for i in range(4)]
TOPICS = ["sorting", "hash maps", "recursion", "closures", "generators", "decorators",
          "threads", "sockets", "regular expressions", "unit tests", "dataclasses", "typing"]


def prompts(n: int, run: int = 0) -> list[str]:
    """``n`` prompts: sessions of 4 turns over the 4 system prompts, sent turn by turn;
    ``run`` makes the system prompts new, so one run's prefixes are not cached by another."""
    sessions = max(1, n // 4)
    out: list[str] = []
    for turn in range(4):
        for s in range(sessions):
            history = "".join(f"User: tell me about {TOPICS[(s + t) % len(TOPICS)]}.\n"
                              f"Assistant: here is a short answer about it.\n"
                              for t in range(turn))
            out.append(f"[{run}] " + SYSTEMS[s % 4] + history
                       + f"User: tell me about {TOPICS[(s + turn) % len(TOPICS)]}.\n")
    return out[:n]


async def load(url: str, items: list[str], conc: int, max_tokens: int) -> dict[str, Any]:
    """Every prompt, at most ``conc`` in flight; throughput and latency percentiles."""
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []
    toks = 0

    async def one(prompt: str, client: httpx.AsyncClient) -> None:
        nonlocal toks
        async with sem:
            t = time.perf_counter()
            r = await client.post(f"{url}/v1/completions", json={
                "model": "default", "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}, timeout=900)
            r.raise_for_status()
            lat.append(time.perf_counter() - t)
            toks += r.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient() as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(p, client) for p in items))
        wall = time.perf_counter() - t0
    lat.sort()
    return {"tok_s": toks / wall, "p50_s": statistics.median(lat),
            "p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))], "requests": len(lat),
            "tokens": toks, "wall_s": wall}


def one_token_latency(url: str, n: int = 30) -> float:
    """Mean seconds of a sequential 1-token request (after 5 unmeasured)."""
    body = {"model": "default", "prompt": "Hello there", "max_tokens": 1, "temperature": 0}
    with httpx.Client(timeout=120) as client:
        for _ in range(5):
            client.post(f"{url}/v1/completions", json=body).raise_for_status()
        t = time.perf_counter()
        for _ in range(n):
            client.post(f"{url}/v1/completions", json=body).raise_for_status()
    return (time.perf_counter() - t) / n


def counters(url: str, replicas: int) -> tuple[float, float]:
    """Prefix-cache queries and hits so far, summed over the replicas (a /metrics call
    lands on one replica; the ``x-draftwise-replica`` header says which)."""
    seen: dict[str, tuple[float, float]] = {}
    for _ in range(40):
        r = httpx.get(f"{url}/metrics", timeout=30)
        seen[r.headers.get("x-draftwise-replica", "single")] = _counters(r.text)
        if len(seen) >= replicas:
            break
    return sum(v[0] for v in seen.values()), sum(v[1] for v in seen.values())


def measured(url: str, replicas: int, items: list[str], conc: int, max_tokens: int
             ) -> dict[str, Any]:
    """One load run, with the prefix-cache hit rate of its own lookups."""
    q0, h0 = counters(url, replicas)
    got = asyncio.run(load(url, items, conc, max_tokens))
    q1, h1 = counters(url, replicas)
    got["hit_rate"] = (h1 - h0) / (q1 - q0) if q1 > q0 else None
    return got


def _counters(text: str) -> tuple[float, float]:
    vals: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("prefix_cache_queries", "prefix_cache_hits"):
            if line.startswith(f"draftwise:{name}{{") or line.startswith(f"draftwise:{name} "):
                vals[name] = vals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return vals.get("prefix_cache_queries", 0.0), vals.get("prefix_cache_hits", 0.0)


def single(model: str | None, threads: int, port: int, run: Any) -> Any:
    """Run ``run(url)`` against one ``draftwise serve`` process, stopped by its PID."""
    cmd = [sys.executable, "-c", "from draftwise.cli import main; main()", "serve",
           "--threads", str(threads), "--port", str(port), "--host", "127.0.0.1",
           "--served-model-name", "default", "--log-level", "warning"]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise SystemExit(f"the server exited with {proc.returncode}")
            time.sleep(0.5)
        return run(url)
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--concurrency", default="8,32")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--routing", default="prefix,round-robin,power-of-two")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    concs = [int(c) for c in args.concurrency.split(",")]
    items = prompts(2, -1)  # the warm-up's
    report: dict[str, Any] = {"model": args.model or "default", "requests": args.requests,
                              "max_tokens": args.max_tokens, "runs": {}}

    def show(label: str, conc: int, got: dict[str, Any]) -> None:
        report["runs"].setdefault(label, {})[str(conc)] = got
        rate = got.get("hit_rate")
        print(f"{label:>32} c={conc:<3} {got['tok_s']:7.1f} tok/s  p50 {got['p50_s']:6.2f} s  "
              f"p99 {got['p99_s']:6.2f} s" + (f"  prefix hits {rate:.0%}" if rate is not None
                                                else ""), flush=True)

    def bench_single(url: str) -> None:
        asyncio.run(load(url, items, 2, 4))
        for run, conc in enumerate(concs):
            got = measured(url, 1, prompts(args.requests, run), conc, args.max_tokens)
            show("1 process x 2 threads", conc, got)

    single(args.model, 2, 18950, bench_single)
    base = single(args.model, 1, 18953, one_token_latency)
    report["one_token_single_1thread_s"] = base
    print(f"1-token request, 1 process x 1 thread: {base * 1e3:.1f} ms", flush=True)

    import ray
    from ray import serve

    from draftwise.scale import ReplicaSpec, Scaling
    from draftwise.scale.app import deploy
    from draftwise.server import ServerConfig

    temp = tempfile.mkdtemp(prefix="dw-bench-ray-")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", _temp_dir=temp, logging_level="WARNING")
    try:
        for routing in args.routing.split(","):
            # one Serve HTTP proxy per cluster (its port is set once), and the ingress
            # relays the raw path: each policy's app in turn, at "/", the last one deleted
            port = 18960
            spec = ReplicaSpec(model=args.model, speculative_config=None, dtype="auto",
                               engine_kwargs={"num_threads": 1},
                               config=ServerConfig(served_model_names=("default",)))
            deploy(spec, Scaling(replicas=2, routing=routing), "127.0.0.1", port,
                   name=f"bench-{routing}", route_prefix="/")
            url = f"http://127.0.0.1:{port}"
            asyncio.run(load(url, items, 2, 4))
            for run, conc in enumerate(concs):
                got = measured(url, 2, prompts(args.requests, run), conc, args.max_tokens)
                show(f"2 replicas x 1 thread, {routing}", conc, got)
            per = one_token_latency(url)
            report.setdefault("one_token_ingress_s", {})[routing] = per
            print(f"1-token request through the ingress ({routing}): {per * 1e3:.1f} ms, "
                  f"overhead {(per - base) * 1e3:+.1f} ms", flush=True)
            serve.delete(f"bench-{routing}")
    finally:
        serve.shutdown()
        ray.shutdown()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
