"""Where a draft_model step's time goes, against a plain decode step, on a real pair.

    python benchmarks/draft_model_step.py --model /work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --draft /work/models/qwen2.5-coder-0.5b-instruct.gguf --k 2 --threads 2 --max-tokens 96

Builds two engines (plain, and ``draft_model`` at fixed depth ``--k``, or adaptive with
``--adaptive``), warms both, then runs the workload's prompts interleaved prompt by prompt
(plain, then draft_model), timing every engine step in wall and process-CPU seconds with
the engine's own split (schedule / propose / forward / verify / commit). Inside propose it
times each draft forward by depth, split into ``build_forward_batch``, the model's layers,
the final norm + LM head and the pick; the rest of the plugin's ``propose`` and the core's
glue around it (``Speculation.propose``) are what remains. With ``--kernels`` every C
kernel wrapper is timed too, draft and target apart (adds ~1-2 us per call: read the
split, not the totals).

Steps are grouped: ``prefill`` (the target's prompt), ``first`` (a request's first decode
step: the draft catches up on the prompt), ``decode`` (the rest). The report gives the
steady decode cost per emitted token of each engine and their ratio, and how much of a
request's time prefill and the catch-up take, so the end-to-end tok/s ratio is explained.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

PHASES = ("schedule", "propose", "forward", "verify", "commit")


class Spans:
    """Named wall/CPU seconds accumulated within the current step, plus a 'where' flag."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.record_conf = False
        self.where = "target"
        self.depth = 0
        #: per drafting step: each row's draft probabilities (greedy: max of the softmax)
        self.conf: list[list[float]] = []
        self.trace: list[tuple[list[float], int, int]] = []

    def reset(self) -> None:
        self.wall.clear()
        self.cpu.clear()
        self.calls.clear()

    def wrap(self, name: str | Callable[[], str], fn: Callable[..., Any],
             cpu: bool = True) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            key = name() if callable(name) else name
            t0 = time.perf_counter()
            c0 = time.process_time() if cpu else 0.0
            try:
                return fn(*a, **kw)
            finally:
                self.wall[key] += time.perf_counter() - t0
                if cpu:
                    self.cpu[key] += time.process_time() - c0
                self.calls[key] += 1
        return timed


def instrument_globals(spans: Spans, kernels_too: bool) -> None:
    """Wrap what every engine shares: the proposer module's helpers, attention metadata,
    and (``kernels_too``) every C kernel wrapper, once."""
    import draftwise_draft_model.proposer as prop_mod

    from draftwise.models import attention, kernels

    prop_mod.build_forward_batch = spans.wrap("draft_build_batch", prop_mod.build_forward_batch)
    real_pick = prop_mod.pick_draft_tokens

    def pick(logits: Any, *a: Any, **kw: Any) -> Any:
        if spans.record_conf:  # the draft's max probability, outside the timed pick
            spans.conf.append(logits.float().softmax(-1).amax(-1).tolist())
        return real_pick(logits, *a, **kw)

    prop_mod.pick_draft_tokens = spans.wrap("draft_pick", pick)
    real_meta = attention.AttentionMetadata.build
    attention.AttentionMetadata.build = staticmethod(  # type: ignore[method-assign]
        spans.wrap(lambda: f"{spans.where}_attn_meta", real_meta, cpu=False))
    if kernels_too:
        from timing import KERNEL_WRAPPERS

        for name in (*KERNEL_WRAPPERS, "attention_index"):
            if hasattr(kernels, name):
                setattr(kernels, name, spans.wrap(
                    lambda _n=name: f"{spans.where}_k_{_n}", getattr(kernels, name), cpu=False))


def instrument(engine: Any, spans: Spans) -> None:
    """Wrap the draft_model proposer's pieces of ``engine`` and its target's head."""
    spec = engine.spec
    if spec is not None:
        proposer = spec.drafters[0].proposer
        real_propose = proposer.propose

        def propose(batch: Any) -> Any:
            spans.where, spans.depth = "draft", 0
            try:
                return real_propose(batch)
            finally:
                spans.where = "target"

        proposer.propose = spans.wrap("plugin_propose", propose)
        model = proposer.model
        real_fwd = model.forward

        def fwd(*a: Any, **kw: Any) -> Any:
            try:
                return real_fwd(*a, **kw)
            finally:
                spans.depth += 1

        model.forward = spans.wrap(lambda: f"draft_forward_d{spans.depth}", fwd)
        model.lm_head = spans.wrap("draft_lm_head", model.lm_head)
        model.final_norm = spans.wrap("draft_final_norm", model.final_norm)
        model.embed = spans.wrap("draft_embed", model.embed, cpu=False)
        spec.propose = spans.wrap("core_propose", spec.propose)
        real_feedback = spec.feedback

        def feedback(rows: Any, drafts: Any, outcome: Any) -> Any:
            if spans.record_conf and len(rows) == 1 and drafts.num_draft_tokens[0]:
                conf = [c[0] for c in spans.conf]
                spans.trace.append((conf, drafts.num_draft_tokens[0], outcome.num_accepted[0]))
            spans.conf = []
            return real_feedback(rows, drafts, outcome)

        spec.feedback = spans.wrap("core_feedback", feedback)
        spec.commit_row = spans.wrap("core_commit_row", spec.commit_row, cpu=False)
    tgt = engine.loaded.model
    tgt.lm_head = spans.wrap("target_lm_head", tgt.lm_head)
    engine.runner.build = spans.wrap("target_build_batch", engine.runner.build)


def run_request(engine: Any, ids: list[int], max_tokens: int, spans: Spans | None
                ) -> dict[str, Any]:
    """One greedy request, every step timed; returns the steps and the output tokens."""
    from draftwise.bench.run import greedy_params

    rid = engine.add_request({"prompt_token_ids": ids}, greedy_params(max_tokens))
    req = engine.scheduler.requests[rid]
    tm = engine.stats.timings
    steps: list[dict[str, Any]] = []
    out_ids: list[int] = []
    t_start = time.perf_counter()
    while engine.has_unfinished_requests():
        before = {p: getattr(tm, p) for p in PHASES}
        n0 = req.num_output_tokens
        if spans is not None:
            spans.reset()
        c0, w0 = time.process_time(), time.perf_counter()
        outs = engine.step()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        rec: dict[str, Any] = {
            "wall": wall, "cpu": cpu, "tokens": req.num_output_tokens - n0,
            "split": {p: getattr(tm, p) - before[p] for p in PHASES},
        }
        if spans is not None:
            rec["spans"] = {k: (spans.wall[k], spans.cpu.get(k, 0.0), spans.calls[k])
                            for k in spans.wall}
        steps.append(rec)
        for o in outs:
            if o.finished:
                out_ids = list(o.outputs[0].token_ids)
    seconds = time.perf_counter() - t_start
    for i, s in enumerate(steps):
        s["kind"] = "prefill" if i == 0 else "first" if i == 1 else "decode"
    return {"steps": steps, "token_ids": out_ids, "seconds": seconds}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per step kind: steps, tokens, wall/cpu ms per step and per token, the split, spans."""
    out: dict[str, Any] = {}
    for kind in ("prefill", "first", "decode"):
        steps = [s for r in runs for s in r["steps"] if s["kind"] == kind]
        if not steps:
            continue
        n, toks = len(steps), sum(s["tokens"] for s in steps)
        wall, cpu = sum(s["wall"] for s in steps), sum(s["cpu"] for s in steps)
        rec: dict[str, Any] = {
            "steps": n, "tokens": toks, "seconds": round(wall, 4),
            "wall_ms_per_step": round(1e3 * wall / n, 3),
            "cpu_ms_per_step": round(1e3 * cpu / n, 3),
            "median_wall_ms": round(1e3 * statistics.median(s["wall"] for s in steps), 3),
            "wall_ms_per_token": round(1e3 * wall / max(toks, 1), 3),
            "cpu_ms_per_token": round(1e3 * cpu / max(toks, 1), 3),
            "split_ms_per_step": {p: round(1e3 * sum(s["split"][p] for s in steps) / n, 3)
                                  for p in PHASES},
        }
        agg: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for s in steps:
            for k, (w, c, m) in s.get("spans", {}).items():
                a = agg[k]
                a[0] += w
                a[1] += c
                a[2] += m
        if agg:
            rec["spans_ms_per_step"] = {
                k: {"wall": round(1e3 * v[0] / n, 3), "cpu": round(1e3 * v[1] / n, 3),
                    "calls": round(v[2] / n, 2)}
                for k, v in sorted(agg.items(), key=lambda kv: -kv[1][0])}
        out[kind] = rec
    total = sum(r["seconds"] for r in runs)
    toks = sum(len(r["token_ids"]) for r in runs)
    out["end_to_end"] = {"seconds": round(total, 3), "tokens": toks,
                         "tok_per_s": round(toks / total, 2)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="/work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--draft", default="/work/models/qwen2.5-coder-0.5b-instruct.gguf")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--adaptive", action="store_true")
    ap.add_argument("--extra", default="{}", help="more draft_model keys (JSON)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--workload", default=str(Path(__file__).resolve().parent
                                              / "workloads" / "llamacpp-6.jsonl"))
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--kernels", action="store_true", help="also time every C kernel call")
    ap.add_argument("--no-plain", action="store_true")
    ap.add_argument("--trace", default=None, help="write each drafting step's draft "
                    "probabilities, drafts and accepted count here (JSON; adds a softmax)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import os

    from draftwise.bench import load_workload, prompt_ids
    from draftwise.bench.run import warm_up
    from side_by_side import build_ours
    from timing import write_report

    cfg: dict[str, Any] = {"method": "draft_model", "model": args.draft,
                           "num_speculative_tokens": args.k, **json.loads(args.extra)}
    if args.adaptive:
        cfg["draftwise"] = {"adaptive": True}
    items = load_workload(args.workload)[: args.prompts]
    load0 = os.getloadavg()
    spec = build_ours(args.model, json.dumps(cfg), "auto", args.threads)
    plain = None if args.no_plain else build_ours(args.model, None, "auto", args.threads)
    spans = Spans()
    spans.record_conf = args.trace is not None
    instrument_globals(spans, args.kernels)
    instrument(spec, spans)
    if plain is not None:
        instrument(plain, spans)
    for eng in (spec, plain):
        if eng is not None:
            warm_up(eng, items)
    spans.trace.clear()
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "spec": []}
    for _ in range(args.repeat):
        for item in items:
            ids = prompt_ids(spec, item)
            if plain is not None:
                runs["plain"].append(run_request(plain, ids, args.max_tokens, spans))
            runs["spec"].append(run_request(spec, ids, args.max_tokens, spans))
    report: dict[str, Any] = {"config": cfg, "threads": args.threads, "loadavg_before": load0}
    for label, rs in runs.items():
        if rs:
            report[label] = summarise(rs)
    if runs["plain"]:
        same = sum(a["token_ids"] == b["token_ids"] for a, b in zip(runs["plain"], runs["spec"]))
        report["identical"] = f"{same}/{len(runs['spec'])}"
        p, s = report["plain"], report["spec"]
        report["ratio_end_to_end"] = round(s["end_to_end"]["tok_per_s"]
                                           / p["end_to_end"]["tok_per_s"], 3)
        report["ratio_decode_per_token"] = round(p["decode"]["wall_ms_per_token"]
                                                 / s["decode"]["wall_ms_per_token"], 3)
        report["ratio_decode_per_token_cpu"] = round(p["decode"]["cpu_ms_per_token"]
                                                     / s["decode"]["cpu_ms_per_token"], 3)
    report["spec_decode"] = spec.spec.metrics.summary()
    if args.trace:
        Path(args.trace).write_text(json.dumps(spans.trace))
    write_report(report, args.out)


if __name__ == "__main__":
    main()
