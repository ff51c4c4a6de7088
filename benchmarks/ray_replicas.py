"""Replicas on Ray against one process (docs/scaling.md, issue 45), on one machine.

    python benchmarks/ray_replicas.py --out ray.json                      # default model
    python benchmarks/ray_replicas.py --workload many-prefixes --kv-blocks 768 --out mp.json
    python benchmarks/ray_replicas.py --model /work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --concurrency 8,32 --requests 32 --max-tokens 16 --routing prefix --out ray-1.5b.json

For each concurrency: completion tokens per second and p50/p99 request latency for one
``draftwise serve`` process with 2 threads, and for 2 replicas x 1 thread behind the Ray
Serve ingress under each routing policy (prefix, round-robin, power-of-two), with the
prefix-cache hit rate summed over the replicas and where each request went.

Workloads (``--workload``):

* ``sessions``: 4 shared system prompts and multi-turn sessions (each turn repeats the
  session's earlier turns, as a chat client does), sent in turn order;
* ``many-prefixes``: ``--prefixes`` distinct long prefixes (``--prefix-words`` words each:
  long system prompts / conversations), each used ``--uses`` times with a new question,
  in rounds of a seeded shuffle (interleaved: no prefix twice in a row, no fixed order a
  round-robin could align with). With ``--kv-blocks`` sized so one replica's pool holds
  about two thirds of the prefixes and the two pools all of them, round-robin and
  power-of-two send every prefix to both replicas and thrash, while prefix routing keeps
  each on one. The single process gets both pools' blocks (the same memory).

Placement: each reply names its replica (``x-draftwise-replica``); per run the report
gives how many replicas each prefix (system prompt / session) was served by and the
share of requests that went to a replica that had not served their prefix before (the
first request of a prefix is always such a request).

The routing overhead is the mean latency of a 1-token request through the ingress minus
the same request on one process with 1 thread (a replica's own size), sequential, after
a warm-up (``--no-overhead`` skips it).

Servers listen on loopback and are stopped by their own PID / by ``serve.shutdown``.
Greedy, ``ignore_eos``: every configuration makes the same tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import httpx

SYSTEMS = [f"You are assistant number {i}. " + "Answer briefly and politely. " * 12
           for i in range(4)]
TOPICS = ["sorting", "hash maps", "recursion", "closures", "generators", "decorators",
          "threads", "sockets", "regular expressions", "unit tests", "dataclasses", "typing"]
TEXT = ("the project team should review each change before release and write down why "
         "a test failed when the build ran on a slow machine with little memory while "
         "users asked for faster answers about their data files network requests error "
         "messages and the history of every decision made in earlier meetings")
WORDS = TEXT.split()

#: a request: the prefix it shares (a session or a long prompt's id) and its text
Item = tuple[str, str]


def prompts(n: int, run: int = 0) -> list[Item]:
    """``n`` prompts: sessions of 4 turns over the 4 system prompts, sent turn by turn;
    ``run`` makes the system prompts new, so one run's prefixes are not cached by another."""
    sessions = max(1, n // 4)
    out: list[Item] = []
    for turn in range(4):
        for s in range(sessions):
            history = "".join(f"User: tell me about {TOPICS[(s + t) % len(TOPICS)]}.\n"
                              f"Assistant: here is a short answer about it.\n"
                              for t in range(turn))
            out.append((f"system {s % 4}", f"[{run}] " + SYSTEMS[s % 4] + history
                        + f"User: tell me about {TOPICS[(s + turn) % len(TOPICS)]}.\n"))
    return out[:n]


def many_prefixes(run: int, prefixes: int, uses: int, words: int) -> list[Item]:
    """``prefixes`` long prefixes used ``uses`` times each, in rounds of a seeded shuffle
    (module docstring); ``run`` makes every prefix new."""
    rng = random.Random(run)
    texts = []
    for p in range(prefixes):
        wr = random.Random(1000 * run + p)
        texts.append(f"[{run}] Conversation {p}. " + " ".join(wr.choice(WORDS) for _ in range(words)))
    out: list[Item] = []
    for use in range(uses):
        order = list(range(prefixes))
        rng.shuffle(order)
        out += [(f"prefix {p}", texts[p] + f"\nUser: question {use}: what about "
                 f"{TOPICS[(p + use) % len(TOPICS)]}?\n") for p in order]
    return out


def placement(sent: list[tuple[str, str]]) -> dict[str, Any]:
    """Where a run's requests went: replicas per prefix, and the share sent to a replica
    that had not served their prefix before (in the order the replies were sent back)."""
    seen: dict[str, set[str]] = {}
    fresh = 0
    for tag, replica in sent:
        where = seen.setdefault(tag, set())
        fresh += replica not in where
        where.add(replica)
    spread = Counter(len(v) for v in seen.values())
    return {"prefixes": len(seen), "replicas_per_prefix": dict(sorted(spread.items())),
            "to_a_new_replica": fresh / max(1, len(sent)),
            "requests_per_replica": dict(Counter(r for _, r in sent))}


async def load(url: str, items: list[Item], conc: int, max_tokens: int) -> dict[str, Any]:
    """Every prompt, at most ``conc`` in flight; throughput, latency percentiles and where
    each request went."""
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []
    sent: list[tuple[str, str]] = []
    toks = prompt_toks = 0

    async def one(item: Item, client: httpx.AsyncClient) -> None:
        nonlocal toks, prompt_toks
        tag, prompt = item
        async with sem:
            t = time.perf_counter()
            r = await client.post(f"{url}/v1/completions", json={
                "model": "default", "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}, timeout=900)
            r.raise_for_status()
            lat.append(time.perf_counter() - t)
            usage = r.json()["usage"]
            toks += usage["completion_tokens"]
            prompt_toks += usage["prompt_tokens"]
            sent.append((tag, r.headers.get("x-draftwise-replica", "single")))

    async with httpx.AsyncClient() as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(p, client) for p in items))
        wall = time.perf_counter() - t0
    lat.sort()
    return {"tok_s": toks / wall, "p50_s": statistics.median(lat),
            "p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))], "requests": len(lat),
            "tokens": toks, "mean_prompt_tokens": prompt_toks / len(lat), "wall_s": wall,
            "placement": placement(sent)}


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


def counters(url: str, replicas: int) -> dict[str, tuple[float, float]]:
    """Prefix-cache queries and hits so far, per replica (a /metrics call lands on one
    replica; the ``x-draftwise-replica`` header says which)."""
    seen: dict[str, tuple[float, float]] = {}
    for _ in range(40):
        r = httpx.get(f"{url}/metrics", timeout=30)
        seen[r.headers.get("x-draftwise-replica", "single")] = _counters(r.text)
        if len(seen) >= replicas:
            break
    return seen


def measured(url: str, replicas: int, items: list[Item], conc: int, max_tokens: int
             ) -> dict[str, Any]:
    """One load run, with the prefix-cache hit rate of its own lookups (all replicas',
    and each replica's)."""
    before = counters(url, replicas)
    got = asyncio.run(load(url, items, conc, max_tokens))
    after = counters(url, replicas)
    per: dict[str, float | None] = {}
    q = h = 0.0
    for name, (q1, h1) in after.items():
        q0, h0 = before.get(name, (0.0, 0.0))
        per[name] = (h1 - h0) / (q1 - q0) if q1 > q0 else None
        q, h = q + q1 - q0, h + h1 - h0
    got["hit_rate"] = h / q if q > 0 else None
    got["hit_rate_per_replica"] = per
    return got


def rss_mib(pid: int) -> dict[str, float]:
    """A process's resident memory now and at its peak (``/proc/PID/status``)."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def replica_rss() -> dict[str, dict[str, float]]:
    """Every local Ray Serve replica process of the engine, by PID (its proctitle)."""
    out: dict[str, dict[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            if cmd.startswith("ray::ServeReplica") and "EngineReplica" in cmd:
                out[entry] = rss_mib(int(entry))
        except OSError:
            continue
    return out


def _counters(text: str) -> tuple[float, float]:
    vals: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("prefix_cache_queries", "prefix_cache_hits"):
            if line.startswith((f"draftwise:{name}{{", f"draftwise:{name} ")):
                vals[name] = vals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return vals.get("prefix_cache_queries", 0.0), vals.get("prefix_cache_hits", 0.0)


def single(model: str | None, threads: int, port: int, run: Any,
           extra: tuple[str, ...] = ()) -> Any:
    """Run ``run(url, pid)`` against one ``draftwise serve`` process, stopped by its PID."""
    cmd = [sys.executable, "-c", "from draftwise.cli import main; main()", "serve",
           "--threads", str(threads), "--port", str(port), "--host", "127.0.0.1",
           "--served-model-name", "default", "--log-level", "warning", *extra]
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
        return run(url, proc.pid)
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--workload", default="sessions", choices=["sessions", "many-prefixes"])
    parser.add_argument("--concurrency", default="8,32")
    parser.add_argument("--requests", type=int, default=64, help="sessions workload")
    parser.add_argument("--prefixes", type=int, default=36, help="many-prefixes workload")
    parser.add_argument("--uses", type=int, default=4, help="many-prefixes: uses a prefix")
    parser.add_argument("--prefix-words", type=int, default=500,
                        help="many-prefixes: words a prefix (about 520 tokens with the question, at 500)")
    parser.add_argument("--kv-blocks", type=int, default=None,
                        help="KV blocks per replica (the single process gets twice as "
                        "many); default: the engine's own size")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--routing", default="prefix,round-robin,power-of-two")
    parser.add_argument("--no-single", action="store_true", help="replicas only")
    parser.add_argument("--no-overhead", action="store_true",
                        help="skip the 1-token routing-overhead measurement")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    concs = [int(c) for c in args.concurrency.split(",")]

    def work(run: int) -> list[Item]:
        if args.workload == "sessions":
            return prompts(args.requests, run)
        return many_prefixes(run, args.prefixes, args.uses, args.prefix_words)

    items = prompts(2, -1)  # the warm-up's
    report: dict[str, Any] = {"model": args.model or "default", "workload": args.workload,
                              "requests": len(work(0)), "max_tokens": args.max_tokens,
                              "kv_blocks_per_replica": args.kv_blocks, "runs": {}, "rss_mib": {}}
    if args.workload == "many-prefixes":
        report.update(prefixes=args.prefixes, uses=args.uses, prefix_words=args.prefix_words)

    def show(label: str, conc: int, got: dict[str, Any]) -> None:
        report["runs"].setdefault(label, {})[str(conc)] = got
        rate = got.get("hit_rate")
        where = got["placement"]
        print(f"{label:>36} c={conc:<3} {got['tok_s']:7.1f} tok/s  p50 {got['p50_s']:6.2f} s  "
              f"p99 {got['p99_s']:6.2f} s" + (f"  prefix hits {rate:.0%}" if rate is not None
                                                else "")
              + f"  replicas/prefix {where['replicas_per_prefix']}"
              f"  to a new replica {where['to_a_new_replica']:.0%}"
              f"  prompt {got['mean_prompt_tokens']:.0f} tok", flush=True)

    def bench_single(url: str, pid: int) -> None:
        asyncio.run(load(url, items, 2, 4))
        for run, conc in enumerate(concs):
            got = measured(url, 1, work(run), conc, args.max_tokens)
            show("1 process x 2 threads", conc, got)
        report["rss_mib"]["1 process x 2 threads"] = rss_mib(pid)
        print(f"1 process x 2 threads: RSS {rss_mib(pid)} MiB", flush=True)

    if not args.no_single:
        kv = ("--num-kv-blocks", str(2 * args.kv_blocks)) if args.kv_blocks else ()
        single(args.model, 2, 18950, bench_single, kv)
    base = None
    if not args.no_overhead:
        base = single(args.model, 1, 18953, lambda url, pid: one_token_latency(url))
        report["one_token_single_1thread_s"] = base
        print(f"1-token request, 1 process x 1 thread: {base * 1e3:.1f} ms", flush=True)

    import ray
    from draftwise.scale import ReplicaSpec, Scaling
    from draftwise.scale.app import deploy
    from draftwise.server import ServerConfig
    from ray import serve

    engine_kwargs: dict[str, Any] = {"num_threads": 1}
    if args.kv_blocks:
        engine_kwargs["num_kv_blocks"] = args.kv_blocks
    temp = tempfile.mkdtemp(prefix="dw-bench-ray-")
    report["ray_temp_dir"] = temp
    print(f"Ray's session logs: {temp}/session_latest/logs", flush=True)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", _temp_dir=temp, logging_level="WARNING")
    try:
        for routing in args.routing.split(","):
            # one Serve HTTP proxy per cluster (its port is set once), and the ingress
            # relays the raw path: each policy's app in turn, at "/", the last one deleted
            port = 18960
            spec = ReplicaSpec(model=args.model, speculative_config=None, dtype="auto",
                               engine_kwargs=engine_kwargs,
                               config=ServerConfig(served_model_names=("default",)))
            deploy(spec, Scaling(replicas=2, routing=routing), "127.0.0.1", port,
                   name=f"bench-{routing}", route_prefix="/")
            url = f"http://127.0.0.1:{port}"
            print(f"deployed ({routing}): replicas' RSS {replica_rss()} MiB", flush=True)
            asyncio.run(load(url, items, 2, 4))
            for run, conc in enumerate(concs):
                got = measured(url, 2, work(run), conc, args.max_tokens)
                show(f"2 replicas x 1 thread, {routing}", conc, got)
            report["rss_mib"][routing] = rss = replica_rss()
            print(f"2 replicas x 1 thread, {routing}: RSS {rss} MiB", flush=True)
            if base is not None:
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
