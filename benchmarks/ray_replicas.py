"""Short benchmark for docs/scaling.md (issue 45): replicas on Ray against one process.

  python benchmarks/ray_replicas.py            # default model, concurrency 8

Prints throughput (completion tokens/s) and p50/p99 latency for 2 replicas x 1 thread
(prefix routing) and 1 process x 2 threads; the prefix-cache hit rate with prefix
routing against round-robin on a shared-system-prompt workload; and the routing
overhead per request (ingress + router vs. a replica's own time).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

SYSTEMS = [f"You are assistant number {i}. " + "Answer briefly and politely. " * 12
           for i in range(4)]
QUESTIONS = [f"Question {j}: what is {j} plus {j}?" for j in range(32)]


async def run(url: str, n: int, conc: int, max_tokens: int) -> tuple[float, list[float], int]:
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []
    toks = 0

    async def one(i: int, client: httpx.AsyncClient) -> None:
        nonlocal toks
        async with sem:
            t = time.perf_counter()
            r = await client.post(f"{url}/v1/completions", json={
                "prompt": SYSTEMS[i % 4] + QUESTIONS[i % 32], "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}, timeout=600)
            lat.append(time.perf_counter() - t)
            toks += r.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient() as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i, client) for i in range(n)))
        return time.perf_counter() - t0, lat, toks


def report(label: str, wall: float, lat: list[float], toks: int) -> None:
    lat = sorted(lat)
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    print(f"{label}: {toks / wall:.1f} tok/s, p50 {statistics.median(lat):.2f} s, "
          f"p99 {p99:.2f} s, {len(lat)} requests", flush=True)


def single(n: int, conc: int, max_tokens: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "from draftwise.cli import main; main()", "serve", "--threads", "2",
                             "--port", "18950", "--log-level", "warning"])
    url = "http://127.0.0.1:18950"
    try:
        for _ in range(240):
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        asyncio.run(run(url, 2, 2, 4))  # warm-up
        report("1 process x 2 threads", *asyncio.run(run(url, n, conc, max_tokens)))
    finally:
        proc.terminate()
        proc.wait(30)


def replicas(n: int, conc: int, max_tokens: int) -> None:
    import ray
    from ray import serve

    from draftwise.scale import ReplicaSpec, Scaling
    from draftwise.scale.app import deploy
    from draftwise.server import ServerConfig

    temp = tempfile.mkdtemp(prefix="dw-bench-ray-")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", _temp_dir=temp)
    try:
        for port, routing in ((18951, "prefix"), (18952, "round-robin")):
            spec = ReplicaSpec(model=None, speculative_config=None, dtype="auto",
                               engine_kwargs={"num_threads": 1},
                               config=ServerConfig(served_model_names=("default",)))
            deploy(spec, Scaling(replicas=2, routing=routing), "127.0.0.1", port,
                   name=f"bench-{routing}", route_prefix=f"/{routing}")
            url = f"http://127.0.0.1:{port}/{routing}"
            asyncio.run(run(url, 2, 2, 4))
            report(f"2 replicas x 1 thread ({routing})", *asyncio.run(run(url, n, conc, max_tokens)))
            # hit rate: both replicas' counters (a /metrics call goes to one replica)
            q = h = 0.0
            seen = set()
            for _ in range(20):
                r = httpx.get(f"{url}/metrics")
                rep = r.headers.get("x-draftwise-replica")
                if rep not in seen:
                    seen.add(rep)
                    qq, hh = _parse(r.text)
                    q, h = q + qq, h + hh
            print(f"  prefix-cache hit rate ({routing}, {len(seen)} replicas): "
                  f"{h / q if q else 0:.2%}", flush=True)
            # routing overhead: 1-token requests, ingress vs replica time
            t = time.perf_counter()
            for i in range(20):
                httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1})
            per = (time.perf_counter() - t) / 20
            print(f"  mean 1-token request through the ingress: {per * 1000:.1f} ms", flush=True)
            serve.delete(f"bench-{routing}")
    finally:
        serve.shutdown()
        ray.shutdown()


def _parse(text: str) -> tuple[float, float]:
    vals = {}
    for line in text.splitlines():
        for name in ("prefix_cache_queries", "prefix_cache_hits"):
            if line.startswith(f"draftwise:{name}{{"):
                vals[name] = float(line.rsplit(" ", 1)[1])
    return vals.get("prefix_cache_queries", 0.0), vals.get("prefix_cache_hits", 0.0)


if __name__ == "__main__":
    N, CONC, MAX = 32, 8, 32
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which in ("all", "single"):
        single(N, CONC, MAX)
    if which in ("all", "replicas"):
        replicas(N, CONC, MAX)
