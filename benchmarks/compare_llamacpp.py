"""Side-by-side benchmark: draftwise vs llama.cpp's own ``llama-server``, plain and speculative.

At each thread count (``--threads 1,2``) one run measures, on the same prompt token ids (the
chat template applied once, by draftwise's tokenizer), greedy, one request at a time:

* draftwise plain and with each ``--speculative-config`` JSON, in this process;
* ``llama-server`` plain and with each ``--llama-spec`` flag set, one server per mode started
  here on 127.0.0.1 (``-t T -tb T -c 4096 -np 1 --no-webui``), fed ids on ``/completion``
  with ``cache_prompt: false`` and stopped at the end;
* ``llama-bench -p 256 -n 64`` and draftwise's equivalent (``decode_bench.py``): pure
  prefill and decode of the forward alone;
* start-up to first token and peak RSS of both, each as a fresh process;
* optionally (``--concurrency N``) served throughput at N concurrent streaming requests:
  ``llama-server -np N`` and draftwise's own server, through ``load_gen.py``.

Every end-to-end figure is wall time per request including prefill, after a warm-up request,
the fastest of ``--repeat`` runs per prompt (as ``compare_vllm.py``, ``draftwise bench`` and
the peers table). Every mode is started and warmed up first (each ``llama-server`` stays up,
idle between its turns), then ``--repeat`` rounds run each mode's workload once, in reversed
order every other round, so each mode meets each minute of a shared machine alike; beside the
best-per-prompt ratios the report gives paired ones, round i of a mode over round i of the
reference (median [min, max]). The report leads with ratios taken in the same run, and per-prompt greedy
token identity of each draftwise speculative mode against draftwise plain (the lossless
check; llama.cpp comparisons are informative). Build the peer first with
``benchmarks/setup_llamacpp.sh``; fetch real models with ``scripts/fetch_models.py``.

Example (the target/draft pair of the peers table)::

    python benchmarks/compare_llamacpp.py --model /work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --draft-model /work/models/qwen2.5-coder-0.5b-instruct.gguf --threads 1,2 \\
        --out results/compare_llamacpp.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the shared helpers beside this script

from llamacpp import DEFAULT_BUILD, LlamaServer, binary_version, run_llama_bench
from llamacpp_report import add_comparisons, print_markdown
from side_by_side import build_ours, loadavg, log, peer_results, record_ours

DEFAULT_WORKLOAD = HERE / "workloads" / "llamacpp-6.jsonl"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
         "prompt_lookup_max": 4}  # fmt: skip


# -- modes -------------------------------------------------------------------------------


def ours_mode(text: str) -> tuple[str, dict[str, Any]]:
    """``[LABEL=]JSON`` -> (label, config); the label defaults to the method and its k."""
    label, sep, rest = text.partition("=")
    if not sep or text.lstrip().startswith("{"):
        label, rest = "", text
    cfg = json.loads(rest)
    if not isinstance(cfg, dict):
        raise SystemExit(f"--speculative-config must be a JSON object, got {rest!r}")
    if not label:
        k = cfg.get("num_speculative_tokens")
        label = f"{cfg.get('method', '?')}" + (f" k={k}" if k is not None else "")
    return label, cfg


def llama_mode(text: str) -> tuple[str, list[str]]:
    """``[LABEL=]FLAGS`` -> (label, argv); the label defaults to ``--spec-type`` (+ n-max)."""
    label, sep, rest = text.partition("=")
    if not sep or text.lstrip().startswith("-"):
        label, rest = "", text
    flags = shlex.split(rest)
    if not label:
        kind = flags[flags.index("--spec-type") + 1] if "--spec-type" in flags else "spec"
        nmax = flags.index("--spec-draft-n-max") if "--spec-draft-n-max" in flags else None
        label = kind + (f" n-max={flags[nmax + 1]}" if nmax is not None else "")
    return label, flags


# -- the modes of the end-to-end rounds --------------------------------------------------


class OursMode:
    """One draftwise engine (plain or one speculative config), built and warmed up once;
    each :meth:`round` runs the workload once on it."""

    def __init__(self, args: argparse.Namespace, spec: dict[str, Any] | None, items: list[Any],
                 prompts: list[dict[str, Any]], threads: int, forward_bench: bool = False) -> None:
        from draftwise.bench import prompt_ids
        from draftwise.bench.run import warm_up

        self.args, self.spec, self.items, self.forward_bench = args, spec, items, forward_bench
        self.engine = build_ours(args.model, json.dumps(spec) if spec else None, args.dtype,
                                 threads)  # fmt: skip
        ids = [{"id": i.id, "kind": i.kind, "ids": prompt_ids(self.engine, i)} for i in items]
        if prompts and ids != prompts:
            raise RuntimeError("prompt ids changed between two draftwise engines")
        prompts[:] = ids
        warm_up(self.engine, items)
        self.runs: list[tuple[list[Any], float]] = []

    def round(self) -> tuple[int, float]:
        """Run the workload once: (tokens, seconds summed over its prompts)."""
        from draftwise.bench.run import run_engine

        results, wall = run_engine(self.engine, self.items, self.args.max_tokens, 1)
        self.runs.append((results, wall))
        return sum(r.num_output_tokens for r in results), sum(r.seconds for r in results)

    def record(self) -> dict[str, Any]:
        """The mode's record (and, with ``forward_bench``, the pure forward bench on its
        model: the plain engine's)."""
        from decode_bench import measure as decode_measure
        from draftwise.models.kernels import kernel_threads

        rec = record_ours(self.engine, self.runs)
        rec.pop("_results")
        rec["speculative_config"] = self.spec
        rec["threads"] = kernel_threads()
        if self.forward_bench:
            a = self.args
            rec["forward_bench"] = decode_measure(self.engine.loaded, a.bench_prompt, a.bench_gen,
                                                  a.bench_reps)  # fmt: skip
        return rec

    def close(self) -> None:
        del self.engine
        gc.collect()


def probe_ours(args: argparse.Namespace, threads: int, ids: list[int]) -> dict[str, Any]:
    """Start-up to first token and peak RSS of a fresh draftwise process (plain)."""
    cmd = [sys.executable, str(HERE / "startup_probe.py"), "--threads", str(threads),
           "--dtype", args.dtype, "--prompt-ids", json.dumps(ids)]  # fmt: skip
    if args.model:
        cmd += ["--model", args.model]
    with tempfile.TemporaryFile("w+") as err:  # a file, not a pipe: a chatty child never blocks
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        line = proc.stdout.readline() if proc.stdout else ""
        first_at = time.perf_counter()
        proc.communicate(timeout=args.startup_timeout)
        if proc.returncode != 0 or not line.strip():
            err.seek(0)
            raise RuntimeError(f"startup probe failed ({proc.returncode}): {err.read()[-2000:]}")
    out: dict[str, Any] = json.loads(line)
    out["startup_to_first_token_s"] = first_at - t0
    return out


class LlamaMode:
    """One ``llama-server`` (plain or one flag set), started, timed to its first token and
    warmed up once, then left running (idle between its rounds) until ``stack`` closes."""

    def __init__(self, args: argparse.Namespace, flags: list[str], threads: int,
                 items: list[Any], prompts: list[dict[str, Any]], log_path: Path,
                 stack: contextlib.ExitStack) -> None:
        self.flags, self.items, self.prompts, self.max_tokens = flags, items, prompts, args.max_tokens
        self.server = LlamaServer(args.llama_bin / "llama-server", args.model_path, threads, flags,
                                  log_path, startup_timeout=args.startup_timeout)  # fmt: skip
        stack.enter_context(self.server)
        first = self.server.complete(prompts[0]["ids"], 1)
        self.startup = {"startup_to_first_token_s": first["_done_at"] - self.server.started_at,
                        "ready_s": self.server.ready_at - self.server.started_at}  # fmt: skip
        self.server.complete(prompts[0]["ids"], 16)  # warm-up, as draftwise's warm_up
        self.runs: list[list[dict[str, Any]]] = []

    def round(self) -> tuple[int, float]:
        """Run the workload once: (tokens, seconds summed over its prompts)."""
        run = []
        for p in self.prompts:
            r = self.server.complete(p["ids"], self.max_tokens)
            run.append({"id": p["id"], "token_ids": r.get("tokens", []),
                        "seconds": r["_seconds"], "timings": r.get("timings", {}),
                        "stop_type": r.get("stop_type")})  # fmt: skip
        self.runs.append(run)
        return sum(len(r["token_ids"]) for r in run), sum(r["seconds"] for r in run)

    def record(self) -> dict[str, Any]:
        """The mode's record; called while the server runs (its peak RSS is read here)."""
        from draftwise.bench import summarize, to_json

        results = peer_results(self.runs, self.items, self.prompts)
        timings = [r["timings"] for run in self.runs for r in run]
        drafted = sum(t.get("draft_n", 0) for t in timings)
        accepted = sum(t.get("draft_n_accepted", 0) for t in timings)
        return {
            "flags": self.flags,
            "command": shlex.join(self.server.cmd),
            "summary": summarize(results),
            "per_prompt": to_json(results),
            "rounds": [{"seconds": sum(r["seconds"] for r in run),
                        "tokens": sum(len(r["token_ids"]) for r in run)} for run in self.runs],
            "startup": self.startup | {"peak_rss_mib": self.server.peak_rss_mib()},
            "spec_decode": {"draft_n": drafted, "draft_n_accepted": accepted,
                            "draft_acceptance_rate": accepted / drafted if drafted else None}
            if self.flags else None,  # fmt: skip
            "raw_runs": self.runs,
        }

    def close(self) -> None:
        """Nothing: the server stops when the rounds' ``ExitStack`` closes."""


def interleaved_rounds(modes: dict[str, Any], repeat: int, errors: dict[str, str],
                       loads: dict[str, Any]) -> None:
    """``repeat`` rounds, each running every mode's workload once, in reversed order every
    other round: each mode meets each minute of a shared machine alike, so a ratio of two
    modes' same round compares like with like (``rounds`` in the records; a mode measured
    minutes after another read 1.02-1.17x of it from one run to the next here). A mode
    that fails leaves the rounds, its error recorded by name."""
    order = list(modes)
    for r in range(repeat):
        for label in order if r % 2 == 0 else order[::-1]:
            if label in errors:
                continue
            try:
                tokens, seconds = modes[label].round()
            except Exception as exc:  # noqa: BLE001 - a failed mode is a finding, not a crash
                errors[label] = f"{type(exc).__name__}: {exc}"
                log(f"  round {r + 1}: {label} failed: {errors[label]}")
                continue
            log(f"  round {r + 1}: {label} {tokens / seconds if seconds else 0.0:.1f} tok/s")
        loads[f"round {r + 1}"] = loadavg()


# -- served throughput at N concurrent requests ------------------------------------------


def concurrency_runs(
    args: argparse.Namespace, threads: int, items: list[Any], prompts: list[dict[str, Any]],
    ours_specs: list[tuple[str, dict[str, Any]]], out_base: Path,
) -> dict[str, Any]:
    """N requests in flight at once, every figure total output tok/s over the run's wall time.

    * ``llama.cpp plain``: ``llama-server -np N -c N x --ctx-per-slot`` (each slot gets the
      per-request context), N streaming clients through ``load_gen.py``;
    * ``draftwise plain``: draftwise's own server (``max_num_seqs=N``, ``max_model_len``
      the same per-request context), the same clients, the same prompt ids;
    * ``draftwise plain in-process``: the same engine driven by the ``draftwise bench``
      loop at concurrency N (no HTTP), so the server's share of any gap is visible;
    * ``draftwise <mode>``: each speculative mode, served, once.

    Both plain servers stay up side by side and are loaded in turn ``--concurrency-rounds``
    times (llama.cpp, draftwise served, draftwise in-process, again), so load from other
    work on the machine falls on both alike; each keeps its best round and every round is
    in ``rounds``. ``prompts`` may be empty (``--only-concurrency``): the first draftwise
    engine then makes the ids, so both engines still see the same tokens.
    """
    import load_gen
    from draftwise.bench import WorkloadItem, prompt_ids, summarize
    from draftwise.bench.run import run_engine, warm_up
    from draftwise.server import ServerConfig, create_app
    from draftwise.server.runner import ServerThread

    n = args.concurrency
    num = args.concurrency_requests or max(2 * n, len(items))
    ctx = args.ctx_per_slot

    def load(url: str, model: str | None, work: list[Any]) -> dict[str, Any]:
        samples, wall = asyncio.run(load_gen.run_load(url, work, model, args.max_tokens, n, num,
                                                      None, args.request_timeout))  # fmt: skip
        rec = load_gen.summarize_load(samples, wall)
        rec["loadavg"] = loadavg()
        return rec

    def in_process(engine: Any, work: list[Any]) -> dict[str, Any]:
        batch = [dataclasses.replace(work[i % len(work)], id=f"{work[i % len(work)].id}#{i}")
                 for i in range(num)]  # fmt: skip
        results, wall = run_engine(engine, batch, args.max_tokens, n)
        tokens = sum(r.num_output_tokens for r in results)
        return {"output_tok_per_s": tokens / wall, "wall_seconds": wall, "output_tokens": tokens,
                "summary": summarize(results, wall)["all"], "loadavg": loadavg()}  # fmt: skip

    def ours(spec: dict[str, Any] | None) -> Any:
        engine = build_ours(args.model, json.dumps(spec) if spec else None, args.dtype,
                            threads, max_num_seqs=n, max_model_len=ctx)  # fmt: skip
        if not prompts:
            prompts[:] = [{"id": i.id, "kind": i.kind, "ids": prompt_ids(engine, i)} for i in items]
        return engine

    out: dict[str, Any] = {"concurrency": n, "num_requests": num, "ctx_per_slot": ctx,
                           "max_tokens": args.max_tokens, "rounds": []}  # fmt: skip
    plain = ours(None)
    work = [WorkloadItem(id=p["id"], kind=p["kind"], prompt_token_ids=p["ids"]) for p in prompts]
    warm_up(plain, work)
    # the in-process run gets its own engine: the served one belongs to the server's engine
    # loop, which wakes every 0.5 s and steps it (LLMEngine refuses a second driver)
    local = ours(None)
    warm_up(local, work)
    app = create_app(plain, ServerConfig(served_model_names=("bench",)))
    with LlamaServer(args.llama_bin / "llama-server", args.model_path, threads,
                     ["--no-cache-prompt"], out_base.with_suffix(f".t{threads}.c{n}.llama.log"),
                     parallel=n, ctx_per_slot=ctx,
                     startup_timeout=args.startup_timeout) as server, \
            ServerThread(app, shutdown_timeout=5) as url:  # fmt: skip
        server.complete(prompts[0]["ids"], 16)
        for r in range(args.concurrency_rounds):
            rnd: dict[str, Any] = {}
            for label, fn in (("llama.cpp plain", lambda: load(server.url, None, work)),
                              ("draftwise plain", lambda: load(url, "bench", work)),
                              ("draftwise plain in-process",
                               lambda: in_process(local, work))):  # noqa: F821 (before del)
                rnd[label] = fn()
                log(f"  c={n} round {r + 1}: {label} {rnd[label]['output_tok_per_s']:.1f} tok/s "
                    f"(load {rnd[label]['loadavg'][0]:.1f})")  # fmt: skip
            out["rounds"].append(rnd)
        peak = server.peak_rss_mib()
        command = shlex.join(server.cmd)
    del plain, local, app
    gc.collect()
    for label in ("llama.cpp plain", "draftwise plain", "draftwise plain in-process"):
        out[label] = max((rnd[label] for rnd in out["rounds"]), key=lambda x: x["output_tok_per_s"])
    out["llama.cpp plain"].update(peak_rss_mib=peak, command=command)
    out["ratio_per_round"] = [rnd["draftwise plain"]["output_tok_per_s"]
                              / rnd["llama.cpp plain"]["output_tok_per_s"]
                              for rnd in out["rounds"]]  # fmt: skip
    for label, spec in ours_specs:
        log(f"  c={n}: draftwise {label}")
        try:
            engine = ours(spec)
            warm_up(engine, work)
            app = create_app(engine, ServerConfig(served_model_names=("bench",)))
            with ServerThread(app, shutdown_timeout=5) as url:
                out[f"draftwise {label}"] = load(url, "bench", work)
            del engine, app
            gc.collect()
        except Exception as exc:  # noqa: BLE001 - record it by name, go on with the others
            out[f"draftwise {label}"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


# -- one thread count --------------------------------------------------------------------


def one_thread_count(
    args: argparse.Namespace, threads: int, items: list[Any], prompts: list[dict[str, Any]],
    out_path: Path,
) -> dict[str, Any]:
    """Every mode at one thread count; failures are recorded by name and the rest goes on."""
    rec: dict[str, Any] = {"runs": {}, "loadavg": {"start": loadavg()}}
    runs = rec["runs"]
    if args.only_concurrency:
        rec["concurrency"] = concurrency_runs(args, threads, items, prompts, args.ours_specs,
                                              out_path)  # fmt: skip
        rec["loadavg"]["concurrency"] = loadavg()
        return rec

    bench = not args.no_bench
    modes: dict[str, Any] = {}
    errors: dict[str, str] = {}
    labels: list[str] = []  # the report's order, failed modes included

    def open_mode(label: str, fn: Any) -> None:
        log(f"t={threads}: {label}: start and warm up")
        labels.append(label)
        try:
            modes[label] = fn()
        except Exception as exc:  # noqa: BLE001 - a refused mode is a finding, not a crash
            errors[label] = f"{type(exc).__name__}: {exc}"
            log(f"  failed: {errors[label]}")

    with contextlib.ExitStack() as stack:  # every llama-server stops when the rounds end
        try:
            open_mode("draftwise plain", lambda: OursMode(args, None, items, prompts, threads, bench))
            if not prompts:
                raise SystemExit("draftwise plain failed, so there are no prompt ids to compare on")
            for label, spec in args.ours_specs:
                open_mode(f"draftwise {label}",
                          lambda s=spec: OursMode(args, s, items, prompts, threads))  # fmt: skip
            for label, flags in [("plain", []), *args.llama_specs]:
                slug = label.replace(" ", "_").replace("=", "")
                log_path = out_path.with_suffix(f".t{threads}.{slug}.llama.log")
                open_mode(f"llama.cpp {label}",
                          lambda f=flags, lp=log_path: LlamaMode(args, f, threads, items, prompts, lp,
                                                                 stack))  # fmt: skip
            rec["loadavg"]["started"] = loadavg()
            interleaved_rounds(modes, args.repeat, errors, rec["loadavg"])
            for label in labels:
                if label not in errors:
                    try:
                        runs[label] = modes[label].record()
                        log(f"{label}: {runs[label]['summary']['all']['tok_per_s']:.1f} tok/s "
                            "(best run per prompt)")
                        continue
                    except Exception as exc:  # noqa: BLE001
                        errors[label] = f"{type(exc).__name__}: {exc}"
                runs[label] = {"error": errors[label]}
        finally:
            for mode in modes.values():
                mode.close()

    if bench:
        log(f"t={threads}: llama-bench -p {args.bench_prompt} -n {args.bench_gen}")
        try:
            rec["llama_bench"] = run_llama_bench(args.llama_bin / "llama-bench", args.model_path,
                                                 threads, args.bench_prompt, args.bench_gen,
                                                 args.bench_reps)  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            rec["llama_bench"] = {"error": f"{type(exc).__name__}: {exc}"}
        rec["loadavg"]["llama_bench"] = loadavg()
    if not args.no_startup:
        log(f"t={threads}: draftwise start-up probe")
        try:
            rec["draftwise_startup"] = probe_ours(args, threads, prompts[0]["ids"])
        except Exception as exc:  # noqa: BLE001
            rec["draftwise_startup"] = {"error": f"{type(exc).__name__}: {exc}"}
    if args.concurrency:
        rec["concurrency"] = concurrency_runs(args, threads, items, prompts, args.ours_specs,
                                              out_path)  # fmt: skip
        rec["loadavg"]["concurrency"] = loadavg()
    return rec


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF for both engines (default: the embedded model)")
    ap.add_argument("--workload", default=str(DEFAULT_WORKLOAD))
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=2, help="runs per mode; best per prompt")
    ap.add_argument("--threads", default="1,2", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--dtype", default="auto", help="draftwise weights dtype (llama.cpp reads the file as is)")
    ap.add_argument("--speculative-config", action="append", default=None, metavar="[LABEL=]JSON",
                    help="a draftwise mode (repeatable; default: n-gram k=4, lookup 1..4)")
    ap.add_argument("--llama-spec", action="append", default=None, metavar="[LABEL=]FLAGS",
                    help="llama-server flags of a speculative mode (repeatable; default: "
                         "'--spec-type ngram-mod')")
    ap.add_argument("--draft-model", default=None,
                    help="adds llama.cpp '-md M --spec-type draft-simple --spec-draft-n-max K' "
                         "and draftwise's draft_model with the same K")
    ap.add_argument("--draft-k", type=int, default=4)
    ap.add_argument("--draft-head-tokens", type=int, default=None, metavar="N",
                    help="also draftwise's draft_model with lm_head_tokens=N (the draft's LM "
                         "head over the first N token ids, the specials and the context's)")
    ap.add_argument("--draft-confidence", type=float, default=None, metavar="T",
                    help="also draftwise's draft_model with min_draft_confidence=T (and "
                         "--draft-head-tokens when given) and llama.cpp's draft mode with "
                         "--spec-draft-p-min T (which drops the unsure token; ours keeps it)")
    ap.add_argument("--llama-bin", type=Path, default=DEFAULT_BUILD,
                    help=f"directory with llama-server and llama-bench (default {DEFAULT_BUILD})")
    ap.add_argument("--bench-prompt", type=int, default=256, help="llama-bench -p")
    ap.add_argument("--bench-gen", type=int, default=64, help="llama-bench -n")
    ap.add_argument("--bench-reps", type=int, default=3, help="llama-bench -r (and ours)")
    ap.add_argument("--no-bench", action="store_true", help="skip the pure prefill/decode bench")
    ap.add_argument("--no-startup", action="store_true", help="skip draftwise's start-up probe")
    ap.add_argument("--concurrency", type=int, default=0,
                    help="also serve N concurrent streaming requests (llama-server -np N)")
    ap.add_argument("--only-concurrency", action="store_true",
                    help="run only the --concurrency comparison (no one-at-a-time modes, "
                         "no llama-bench, no start-up probe)")
    ap.add_argument("--concurrency-rounds", type=int, default=2,
                    help="alternating rounds of the plain concurrency runs (best kept)")
    ap.add_argument("--concurrency-requests", type=int, default=None,
                    help="requests per concurrency run (default: max(2N, prompts))")
    ap.add_argument("--ctx-per-slot", type=int, default=4096,
                    help="per-request context: llama-server -c is N times it, draftwise "
                         "max_model_len is it")
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument("--request-timeout", type=float, default=1800.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from draftwise.formats.default_model import default_model_path

    args.model_path = args.model or default_model_path()  # llama.cpp needs a file
    ours = args.speculative_config or [json.dumps(NGRAM)]
    llama = args.llama_spec or ["--spec-type ngram-mod"]
    if args.draft_model:
        ours = [*ours, json.dumps({"method": "draft_model", "model": args.draft_model,
                                   "num_speculative_tokens": args.draft_k})]  # fmt: skip
        if args.draft_head_tokens:
            cut = {"method": "draft_model", "model": args.draft_model,
                   "num_speculative_tokens": args.draft_k, "lm_head_tokens": args.draft_head_tokens}
            label = f"draft_model k{args.draft_k} head{args.draft_head_tokens}"
            ours.append(f"{label}={json.dumps(cut)}")
        llama = [*llama, f"-md {shlex.quote(args.draft_model)} --spec-type draft-simple "
                         f"--spec-draft-n-max {args.draft_k}"]  # fmt: skip
        if args.draft_confidence is not None:
            t = args.draft_confidence
            conf = {"method": "draft_model", "model": args.draft_model,
                    "num_speculative_tokens": args.draft_k, "min_draft_confidence": t}
            label = f"draft_model k{args.draft_k} conf{t}"
            if args.draft_head_tokens:
                conf["lm_head_tokens"] = args.draft_head_tokens
                label += f" head{args.draft_head_tokens}"
            ours.append(f"{label}={json.dumps(conf)}")
            llama.append(f"draft-simple n-max {args.draft_k} p-min {t}=-md "
                         f"{shlex.quote(args.draft_model)} --spec-type draft-simple "
                         f"--spec-draft-n-max {args.draft_k} --spec-draft-p-min {t}")
    if args.only_concurrency and not args.concurrency:
        raise SystemExit("--only-concurrency needs --concurrency N")
    if args.only_concurrency and not args.speculative_config:
        ours = []  # plain only unless modes are named
    args.ours_specs = [ours_mode(s) for s in ours]
    args.llama_specs = [llama_mode(s) for s in llama]
    for what, modes in (("draftwise", args.ours_specs), ("llama.cpp", args.llama_specs)):
        labels = [m[0] for m in modes]
        if len(set(labels)) != len(labels) or "plain" in labels:
            raise SystemExit(f"{what} mode labels must be unique and not 'plain': {labels}")
    for binary in ("llama-server", "llama-bench"):
        if not (args.llama_bin / binary).is_file():
            raise SystemExit(f"no {binary} in {args.llama_bin}: build it with "
                             "benchmarks/setup_llamacpp.sh DIR, then pass --llama-bin DIR/llama.cpp-build/bin")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    import torch
    from draftwise.bench import load_workload, peak_rss_mib

    items = load_workload(args.workload)[: args.limit]
    report: dict[str, Any] = {
        "model": args.model_path,
        "workload": args.workload,
        "num_prompts": len(items),
        "max_tokens": args.max_tokens,
        "repeat": args.repeat,
        "dtype": args.dtype,
        "threads": args.threads,
        "draftwise_modes": {label: cfg for label, cfg in args.ours_specs},
        "llama_modes": {label: flags for label, flags in args.llama_specs},
        "llama_cpp": {"bin": str(args.llama_bin),
                      "version": binary_version(args.llama_bin / "llama-server")},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "torch": torch.__version__},
        "by_threads": {},
    }  # fmt: skip
    prompts: list[dict[str, Any]] = []
    for t in args.threads:
        report["by_threads"][str(t)] = one_thread_count(args, t, items, prompts, out_path)
    report["prompts"] = prompts
    for rec in report["by_threads"].values():
        add_comparisons(rec, [f"draftwise {m}" for m, _ in args.ours_specs],
                        [f"llama.cpp {m}" for m, _ in args.llama_specs])  # fmt: skip
    report["peak_rss_mib_this_process"] = peak_rss_mib()
    out_path.write_text(json.dumps(report, indent=2, default=str))
    log(f"wrote {out_path}")
    print_markdown(report)


if __name__ == "__main__":
    main()
