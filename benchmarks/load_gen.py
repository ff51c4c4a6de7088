"""Load generator for ``draftwise serve``: throughput, TTFT and inter-token latency.

    python benchmarks/load_gen.py --workload benchmarks/workloads/cpu-smoke-8.jsonl \\
        --concurrency 1,4,16 --num-requests 16 --max-tokens 32 --out server-load.json

By default it builds the engine in this process for each mode (speculation off, n-gram
on), measures it first with the ``draftwise bench`` harness at concurrency 1 (the
in-process figure), then serves the SAME engine with uvicorn on a loopback port and
drives it over HTTP with async httpx streaming clients. The ratio server / in-process
tok/s at concurrency 1 is the cost of the HTTP layer. With ``--url`` it only loads an
external server (no in-process peer). Requests are greedy and bounded in number.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
         "prompt_lookup_max": 4}


@dataclass(slots=True)
class Sample:
    """One request as the client saw it (seconds, from just before it was sent)."""

    id: str
    ok: bool
    seconds: float
    ttft: float | None
    itl: float | None
    completion_tokens: int
    error: str | None = None


def request_body(item: Any, model: str | None, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The endpoint and body for a workload item.

    Prompt token ids go to ``/v1/completions`` as they are (every server then sees the same
    ids, whatever its chat template); else chat when the item has messages.
    """
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if getattr(item, "prompt_token_ids", None) is not None:
        return "/v1/completions", {**body, "prompt": list(item.prompt_token_ids)}
    if item.messages is not None:
        return "/v1/chat/completions", {**body, "messages": item.messages}
    return "/v1/completions", {**body, "prompt": item.prompt}


async def one_request(client: httpx.AsyncClient, item: Any, model: str | None,
                      max_tokens: int) -> Sample:
    """Stream one request; TTFT is the first event carrying text."""
    path, body = request_body(item, model, max_tokens)
    t0 = time.perf_counter()
    first: float | None = None
    tokens = 0
    try:
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                body_text = (await resp.aread()).decode(errors="replace")
                return Sample(item.id, False, time.perf_counter() - t0, None, None, 0,
                              body_text)
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return Sample(item.id, False, time.perf_counter() - t0, None, None, 0,
                                  chunk["error"]["message"])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    piece = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if piece and first is None:
                        first = time.perf_counter()
    except httpx.HTTPError as exc:
        return Sample(item.id, False, time.perf_counter() - t0, None, None, 0, repr(exc))
    end = time.perf_counter()
    itl = (end - first) / (tokens - 1) if first is not None and tokens > 1 else None
    return Sample(item.id, True, end - t0, first - t0 if first else None, itl, tokens)


async def run_load(url: str, items: list[Any], model: str | None, max_tokens: int,
                   concurrency: int, num_requests: int, api_key: str | None,
                   timeout: float) -> tuple[list[Sample], float]:
    """``num_requests`` requests (cycling the workload), at most ``concurrency`` in flight."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    queue = [items[i % len(items)] for i in range(num_requests)]
    samples: list[Sample] = []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout,
                                 limits=limits) as client:

        async def worker() -> None:
            while queue:
                item = queue.pop(0)
                samples.append(await one_request(client, item, model, max_tokens))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return samples, wall


def _pct(values: list[float], q: float) -> float | None:
    """Percentile by nearest rank (None for no data)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summarize_load(samples: list[Sample], wall: float) -> dict[str, Any]:
    """Request and token throughput, TTFT and ITL distributions, errors."""
    ok = [s for s in samples if s.ok]
    ttft = [s.ttft for s in ok if s.ttft is not None]
    itl = [s.itl for s in ok if s.itl is not None]
    tokens = sum(s.completion_tokens for s in ok)
    busy = sum(s.seconds for s in ok)
    return {
        "num_requests": len(samples),
        "num_ok": len(ok),
        "errors": sorted({s.error or "" for s in samples if not s.ok})[:5],
        "wall_seconds": wall,
        "requests_per_s": len(ok) / wall if wall else 0.0,
        "output_tokens": tokens,
        "output_tok_per_s": tokens / wall if wall else 0.0,
        # bench's definition: tokens / seconds spent on them (per-request speed at c=1)
        "tok_per_s": tokens / busy if busy else 0.0,
        "ttft_s": {"mean": statistics.fmean(ttft) if ttft else None,
                   "p50": _pct(ttft, 50), "p90": _pct(ttft, 90), "p99": _pct(ttft, 99)},
        "itl_s": {"mean": statistics.fmean(itl) if itl else None,
                  "p50": _pct(itl, 50), "p90": _pct(itl, 90), "p99": _pct(itl, 99)},
    }


def sweep(url: str, items: list[Any], args: argparse.Namespace, model: str | None,
          ) -> dict[str, Any]:
    """Every concurrency level against one server."""
    out: dict[str, Any] = {}
    for c in args.concurrency:
        n = max(args.num_requests, c) if c > 1 else min(args.num_requests, len(items))
        samples, wall = asyncio.run(run_load(url, items, model, args.max_tokens, c, n,
                                             args.api_key, args.timeout))
        out[str(c)] = {"summary": summarize_load(samples, wall),
                       "per_request": [asdict(s) for s in samples]}
        s = out[str(c)]["summary"]
        print(f"  c={c:<3} {s['requests_per_s']:.2f} req/s  {s['output_tok_per_s']:.1f} tok/s  "
              f"ttft p50 {s['ttft_s']['p50']}  itl p50 {s['itl_s']['p50']}  "
              f"ok {s['num_ok']}/{s['num_requests']}", file=sys.stderr)
    return out


def on_thread(where: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on the main thread or on a fresh worker thread (as the server does).

    The server steps its engine on a dedicated thread; on some machines torch runs much
    slower on the main thread than on a worker (seen on a loaded 2-core box: ~20 ms per
    op), so the fair in-process peer runs where the server runs, unless told otherwise.
    """
    if where == "main":
        return fn()
    box: list[T] = []
    worker = threading.Thread(target=lambda: box.append(fn()), name="bench-engine")
    worker.start()
    worker.join()
    if not box:
        raise RuntimeError("the in-process run failed on its thread (see the traceback)")
    return box[0]


def in_process_mode(label: str, spec: dict[str, Any] | None, items: list[Any],
                    args: argparse.Namespace) -> dict[str, Any]:
    """In-process bench at concurrency 1, then the same engine behind the server."""
    from draftwise.bench import summarize
    from draftwise.bench.run import run_engine, warm_up
    from draftwise.cli.common import build_engine
    from draftwise.server import ServerConfig, create_app
    from draftwise.server.runner import ServerThread

    print(f"{label}: loading", file=sys.stderr)
    engine = build_engine(None, json.dumps(spec) if spec else None, "auto",
                          max_num_seqs=max(args.concurrency), max_model_len=args.max_model_len,
                          enable_prefix_caching=args.prefix_caching)
    on_thread(args.in_process_thread, lambda: warm_up(engine, items))
    first = items[: min(args.num_requests, len(items))]

    def in_process() -> dict[str, Any]:
        results, wall = on_thread(args.in_process_thread,
                                  lambda: run_engine(engine, first, args.max_tokens, 1))
        return summarize(results, wall)["all"]  # type: ignore[no-any-return]

    # in-process before AND after the server sweep: a shared machine drifts, and the
    # ratio uses the better of the two (the same way the bench takes the best run)
    before = in_process()
    print(f"  in-process c=1: {before['tok_per_s']:.1f} tok/s", file=sys.stderr)
    app = create_app(engine, ServerConfig(served_model_names=("bench",)))
    with ServerThread(app, shutdown_timeout=5) as url:
        levels = sweep(url, items, args, "bench")
    after = in_process()
    print(f"  in-process c=1 (again): {after['tok_per_s']:.1f} tok/s", file=sys.stderr)
    local = max(before, after, key=lambda s: s["tok_per_s"])
    server_c1 = levels.get("1", {}).get("summary", {}).get("tok_per_s")
    return {
        "speculative_config": spec,
        "in_process_c1": local,
        "in_process_c1_runs": [before, after],
        "server": levels,
        "server_vs_in_process_c1": (server_c1 / local["tok_per_s"]
                                    if server_c1 and local["tok_per_s"] else None),
        "spec_decode": engine.spec.metrics.summary() if engine.spec is not None else None,
    }


def main(argv: list[str] | None = None) -> None:
    """Parse flags, run every mode, write the JSON report."""
    from draftwise.bench import load_workload

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", default="benchmarks/workloads/cpu-smoke-8.jsonl")
    p.add_argument("--concurrency", default="1,4,16",
                   type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--num-requests", type=int, default=16,
                   help="requests per level (c=1 runs each workload item once, at most)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--modes", default="off,ngram", help="in-process modes: off, ngram")
    p.add_argument("--prefix-caching", action="store_true",
                   help="keep the prefix cache on (off by default: repeated prompts would "
                        "make later runs look faster than earlier ones)")
    p.add_argument("--in-process-thread", choices=["worker", "main"], default="worker",
                   help="where the in-process peer steps the engine (the server uses a worker)")
    p.add_argument("--url", default=None, help="load this server instead (no in-process peer)")
    p.add_argument("--model", default=None, help="`model` field sent with --url")
    p.add_argument("--api-key", default=None)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    items = load_workload(args.workload)
    report: dict[str, Any] = {
        "in_process_thread": args.in_process_thread,
        "workload": args.workload, "max_tokens": args.max_tokens,
        "concurrency": args.concurrency, "num_requests": args.num_requests,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
    }
    if args.url:
        report["external"] = sweep(args.url, items, args, args.model)
    else:
        specs = {"off": None, "ngram": NGRAM}
        for mode in args.modes.split(","):
            try:
                report[mode] = in_process_mode(mode, specs[mode], items, args)
            except Exception as exc:  # noqa: BLE001 - report it and go on with the next mode
                print(f"{mode}: failed: {exc!r}", file=sys.stderr)
                report[mode] = {"error": repr(exc)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
