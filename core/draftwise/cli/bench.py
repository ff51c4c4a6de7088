"""``draftwise bench``: speed and acceptance over a workload, peers in the same run."""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import click

from draftwise.cli.common import RegularFile


def _identical(a: list[Any], b: list[Any]) -> int:
    """How many prompts produced the same tokens in both runs."""
    return sum(x.token_ids == y.token_ids for x, y in zip(a, b))


@click.command("bench")
@click.option("--workload", required=True, type=RegularFile())
@click.option("--model", default=None, help="Checkpoint path (default: the embedded model).")
@click.option("--speculative-config", "-sc", default=None, help="vLLM-style JSON.")
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(1, 1024))
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]),
              help="cpu: the C kernels; cuda: the same engine on the Triton kernels, "
              "where torch sees a CUDA device and triton is installed (docs/gpu.md).")
@click.option("--dtype", default="auto", show_default=True)
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1), help="Runs; best per prompt.")
@click.option("--compare-hf", is_flag=True, help="Also run HF transformers in this process.")
@click.option("--compare-off", is_flag=True, help="Also run our engine with speculation off.")
@click.option("--compare-k", "compare_k", default=None, metavar="K1,K2,...",
              help="Also run the same config at fixed depth k for each listed k (adaptive "
                   "settings dropped), side by side in this run; implies --compare-off.")
@click.option("--hf-threads", "hf_threads_opt", default=None, type=click.IntRange(1),
              help="torch threads for the HF peer (default: the same as our engine's).")
@click.option("--threads", "num_threads", default=None, type=click.IntRange(1),
              help="compute threads (default: every core with the native "
              "GEMMs, else cores - 1).")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True,
              help="What a second is: wall time, or this process's CPU time (for a loaded "
                   "shared machine; meaningful with --threads 1).")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False))
def bench(
    workload: str,
    model: str | None,
    speculative_config: str | None,
    concurrency: int,
    max_tokens: int,
    dtype: str,
    device: str,
    repeat: int,
    compare_hf: bool,
    compare_off: bool,
    compare_k: str | None,
    hf_threads_opt: int | None,
    num_threads: int | None,
    clock: str,
    out_path: str,
) -> None:
    """Benchmark the engine on a JSONL workload and write a JSON report."""
    import torch

    from draftwise.bench import load_workload, now, peak_rss_mib, prompt_ids, summarize, to_json
    from draftwise.bench.run import best_of, engine_profile, run_engine, warm_up
    from draftwise.cli.common import announce_backend, build_engine, fail, peak_rss_bytes
    from draftwise.models.kernels import kernel_threads
    from draftwise.models.quant import quant_simd

    items = load_workload(workload)
    report: dict[str, Any] = {
        "workload": str(workload),
        "max_tokens": max_tokens,
        "concurrency": concurrency,
        "repeat": repeat,
        "clock": clock,
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
    }

    def build(spec: str | None) -> Any:
        engine = build_engine(
            model, spec, dtype, max_num_seqs=max(concurrency, 1), num_threads=num_threads,
            device=device,
        )
        announce_backend(engine)
        warm_up(engine, items)
        return engine

    def describe(label: str, spec: str | None, engine: Any, runs: list[Any]) -> list[Any]:
        results, wall = best_of(runs)
        report[label] = {
            "speculative_config": json.loads(spec) if spec else None,
            "dtype": str(next(engine.loaded.model.parameters()).dtype),
            "threads": kernel_threads(),  # the engine's compute threads (bootstrap.apply_threads)
            # every kernel that ran, decided once (models.backend): numbers depend on them
            "backend": engine.loaded.model.backend.as_dict(),
            "attention_backend": engine.loaded.model.backend.attention,
            "packed_weights": bool(getattr(engine.loaded.model, "packed", False)),
            "weight_backend": getattr(engine.loaded.model, "weight_backend", "dense"),
            "quant_kernel": quant_simd(),  # avx512vnni, avx2 or scalar: the GGUF GEMM
            # bytes one decode step streams, start-up and memory (GGUF stays quantized)
            "weight_bytes": getattr(engine.loaded.model, "weight_bytes", None),
            "load_seconds": engine.load_seconds,
            "peak_rss_bytes": peak_rss_bytes(),
            "summary": summarize(results, wall),
            "per_prompt": to_json(results),
            "profile": engine_profile(engine),
        }
        if engine.spec is not None:
            report[label]["spec_decode"] = engine.spec.metrics.summary()
            if engine.spec.policy is not None:  # adaptive depth: its measured cost model
                report[label]["adaptive"] = engine.spec.policy.summary()
        total = report[label]["summary"]["all"]
        click.echo(
            f"{label}: {total['tok_per_s']:.1f} tok/s per request, "
            f"{total['wall_tok_per_s']:.1f} tok/s throughput (concurrency {concurrency})",
            err=True,
        )
        return results

    # every engine is built first and the repeats are interleaved (A B C, A B C, ...), so
    # a load change on a shared machine lands on every configuration alike
    configs: list[tuple[str, str | None]] = [("draftwise", speculative_config)]
    fixed_ks = _parse_ks(compare_k, speculative_config)  # a bad list: usage error, exit 2
    if (compare_off or fixed_ks) and speculative_config:
        configs.append(("draftwise_spec_off", None))
        fixed_spec = _without_adaptive(speculative_config)
        if fixed_ks:  # fixed depth at every listed k, side by side in the same run
            configs += [(f"draftwise_k{k}", _fixed_depth(speculative_config, k))
                        for k in fixed_ks]
        elif fixed_spec is not None:  # adaptive: fixed depth side by side in the same run
            configs.append(("draftwise_fixed_k", fixed_spec))
    try:
        engines = {label: build(spec) for label, spec in configs}
        runs: dict[str, list[Any]] = {label: [] for label, _ in configs}
        timer = time.process_time if clock == "cpu" else now
        for round_ in range(repeat):
            if concurrency == 1:
                # one request at a time: interleave prompt by prompt (A B C on prompt 1, then
                # on prompt 2, ...), so the per-prompt ratios compare runs seconds apart, not
                # a whole workload apart; each engine still sees the prompts in order. Every
                # other round runs them C B A: which engine ran just before moves a prompt's
                # ratio (up to 10%, docs/speculative-decoding.md), so a fixed order would
                # bias every per-prompt ratio the same way
                order = configs if round_ % 2 == 0 else configs[::-1]
                per: dict[str, list[Any]] = {label: [] for label, _ in configs}
                for item in items:
                    for label, _spec in order:
                        res, _ = run_engine(engines[label], [item], max_tokens, 1, timer)
                        per[label] += res
                for label, _spec in configs:
                    runs[label].append((per[label], sum(r.seconds for r in per[label])))
            else:
                for label, _spec in configs:
                    runs[label].append(run_engine(engines[label], items, max_tokens,
                                                  concurrency, timer))
        results = {label: describe(label, spec, engines[label], runs[label])
                   for label, spec in configs}
        ours, engine = results["draftwise"], engines["draftwise"]
        if "draftwise_spec_off" in results:
            off = results["draftwise_spec_off"]
            report["ratios"] = report.get("ratios", {})
            report["ratios"]["spec_on_vs_off"] = _ratio(report, "draftwise", "draftwise_spec_off")
            if concurrency > 1:  # what a server delivers: tokens over the whole run's time
                report["ratios"]["throughput_spec_on_vs_off"] = _throughput_ratio(
                    report, "draftwise", "draftwise_spec_off")
            report["identical_to_spec_off"] = _identical(ours, off)
            if "draftwise_fixed_k" in results:
                report["ratios"]["fixed_k_vs_off"] = _ratio(
                    report, "draftwise_fixed_k", "draftwise_spec_off")
                report["ratios"]["adaptive_vs_fixed_k"] = _ratio(
                    report, "draftwise", "draftwise_fixed_k")
                report["identical_fixed_k_to_spec_off"] = _identical(
                    results["draftwise_fixed_k"], off)
            fixed_labels = [label for label, _ in configs if label.startswith("draftwise_k")]
            for label in fixed_labels:
                report["ratios"][f"{label}_vs_off"] = _ratio(report, label, "draftwise_spec_off")
                report.setdefault("identical_to_spec_off_by_k", {})[label] = _identical(
                    results[label], off)
            if fixed_labels:  # whole workload: adaptive (or the config) against the best k
                best = max(fixed_labels,
                           key=lambda lb: report[lb]["summary"]["all"]["tok_per_s"])
                report["best_fixed_k"] = best
                report["ratios"]["vs_best_fixed_k"] = _ratio(report, "draftwise", best)
            spec_labels = [label for label, _ in configs if label != "draftwise_spec_off"]
            _per_prompt_ratios(report, spec_labels)
            _paired_ratios(report, runs, spec_labels)
            for name, value in report["ratios"].items():
                click.echo(f"ratio {name}: {value['all']:.2f}x", err=True)
            _echo_per_prompt(report)
    except Exception as exc:  # noqa: BLE001 - config/load errors become a clean exit
        fail(exc)
        return

    if compare_hf:
        from draftwise.bench.hf import load_hf_model, run_hf

        # like for like: HF gets as many threads as our engine had, unless told otherwise
        hf_threads = hf_threads_opt or kernel_threads()
        torch.set_num_threads(hf_threads)
        hf_model = load_hf_model(str(engine.loaded.path))
        hf_items = [(i.id, i.kind, prompt_ids(engine, i)) for i in items]
        eos = sorted(engine.eos_token_ids)
        run_hf(hf_model, hf_items[:1], 8, eos)  # warm-up
        hf_runs = [(run_hf(hf_model, hf_items, max_tokens, eos), 0.0) for _ in range(repeat)]
        hf_res, _ = best_of(hf_runs)
        report["hf_transformers"] = {
            "dtype": "float32",
            "threads": hf_threads,
            "summary": summarize(hf_res),
            "per_prompt": to_json(hf_res),
        }
        report.setdefault("ratios", {})["draftwise_vs_hf"] = _ratio(
            report, "draftwise", "hf_transformers"
        )
        report["identical_to_hf"] = _identical(ours, hf_res)
        k = engine.spec.k if engine.spec is not None else None
        if engine.spec is not None and engine.spec.config.method == "ngram":
            pl_runs = [
                (run_hf(hf_model, hf_items, max_tokens, eos, prompt_lookup_num_tokens=k), 0.0)
                for _ in range(repeat)
            ]
            pl_res, _ = best_of(pl_runs)
            report["hf_prompt_lookup"] = {
                "prompt_lookup_num_tokens": k,
                "summary": summarize(pl_res),
                "per_prompt": to_json(pl_res),
            }
            report["ratios"]["draftwise_vs_hf_prompt_lookup"] = _ratio(
                report, "draftwise", "hf_prompt_lookup"
            )
        for label in ("hf_transformers", "hf_prompt_lookup"):
            if label in report:
                tps = report[label]["summary"]["all"]["tok_per_s"]
                click.echo(f"{label}: {tps:.1f} tok/s", err=True)
        for name, value in report["ratios"].items():
            click.echo(f"ratio {name}: {value['all']:.2f}x", err=True)

    report["peak_rss_mib"] = peak_rss_mib()
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(report, indent=2, default=str))
    click.echo(f"wrote {out_path}", err=True)
    sys.stdout.flush()


def _without_adaptive(spec: str) -> str | None:
    """The same config at fixed depth (``"adaptive": false``), or None when it runs fixed
    depth already (adaptive is the default: a config without the key is adaptive unless
    its drafter's own confidence stop keeps it fixed, which the resolved config knows)."""
    from draftwise.config import parse_speculative_config

    if parse_speculative_config(spec).adaptive is None:
        return None
    data = json.loads(spec)
    ns = data.get("draftwise")
    data["draftwise"] = {**(ns if isinstance(ns, dict) else {}), "adaptive": False}
    return json.dumps(data)


def _parse_ks(value: str | None, spec: str | None) -> list[int]:
    """``--compare-k 1,2,3`` -> [1, 2, 3]; refused without a speculative config."""
    if not value:
        return []
    if not spec:
        raise click.BadParameter("needs --speculative-config (the config to fix)",
                                 param_hint="--compare-k")
    try:
        ks = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: give draft lengths like 1,2,3",
                                 param_hint="--compare-k") from None
    if not ks or any(k < 1 for k in ks):
        raise click.BadParameter(f"{value!r}: every k must be at least 1",
                                 param_hint="--compare-k")
    return sorted(set(ks))


def _fixed_depth(spec: str, k: int) -> str:
    """The config at fixed depth ``k``: adaptive settings dropped, top-level k set."""
    data = json.loads(_without_adaptive(spec) or spec)
    data["num_speculative_tokens"] = k
    return json.dumps(data)


def _per_prompt_ratios(report: dict[str, Any], labels: list[str] | None = None) -> None:
    """tok/s of each speculating run over spec off, prompt by prompt (min and each)."""
    off = {p["id"]: p["tok_per_s"] for p in report["draftwise_spec_off"]["per_prompt"]}
    out: dict[str, Any] = {}
    for label in labels or ("draftwise", "draftwise_fixed_k"):
        if label not in report:
            continue
        each = {p["id"]: (p["tok_per_s"] / off[p["id"]] if off.get(p["id"]) else 0.0)
                for p in report[label]["per_prompt"]}
        out[label] = {"min": min(each.values(), default=0.0), "per_prompt": each}
    report["per_prompt_vs_off"] = out


def _paired_ratios(report: dict[str, Any], runs: dict[str, list[Any]],
                   labels: list[str]) -> None:
    """Per prompt, the ratio over spec off within each round, summarised over the rounds.

    Why beside the best-of ratio: a prompt's best run of each config may come from
    different rounds, minutes apart on a shared machine, while a round's runs of one
    prompt are seconds apart (at concurrency 1 the rounds interleave prompt by prompt).
    The spread of the paired ratios says whether a prompt below 1.0x is the machine or
    the config: a median at or above 1.0 with a low minimum is noise, a maximum below it
    is not."""
    if len(runs["draftwise_spec_off"]) < 2:
        return
    for label in labels:
        paired: dict[str, list[float]] = {}
        for (ours, _), (off, _) in zip(runs[label], runs["draftwise_spec_off"]):
            base = {r.id: r.tok_per_s for r in off}
            for a in ours:
                if base.get(a.id, 0.0) > 0:
                    paired.setdefault(a.id, []).append(a.tok_per_s / base[a.id])
        out = {pid: {"median": statistics.median(v), "min": min(v), "max": max(v)}
               for pid, v in paired.items()}
        entry = report["per_prompt_vs_off"][label]
        entry["paired"] = out
        entry["paired_min_median"] = min((v["median"] for v in out.values()), default=0.0)


def _echo_per_prompt(report: dict[str, Any]) -> None:
    """The per-prompt ratios over spec off as a table on stderr (one column per run)."""
    table = report.get("per_prompt_vs_off", {})
    if not table:
        return
    labels = list(table)
    ids = list(next(iter(table.values()))["per_prompt"])
    names = [lb.removeprefix("draftwise_") if lb != "draftwise" else "config" for lb in labels]
    click.echo("per prompt, tok/s over spec off: " + "  ".join(f"{n:>8s}" for n in names),
               err=True)
    for pid in ids:
        cells = "  ".join(f"{table[lb]['per_prompt'].get(pid, 0.0):8.2f}" for lb in labels)
        click.echo(f"  {pid:30s} {cells}", err=True)
    click.echo(f"  {'min':30s} " + "  ".join(f"{table[lb]['min']:8.2f}" for lb in labels),
               err=True)
    paired = table[labels[0]].get("paired")
    if paired:  # the config's ratio within each round: median [min, max] over rounds
        click.echo(f"per prompt, {names[0]} over spec off within each round: median [min, max]",
                   err=True)
        for pid in ids:
            if (v := paired.get(pid)) is None:  # spec off gave it no tokens: no ratio
                continue
            click.echo(f"  {pid:30s} {v['median']:8.2f} [{v['min']:.2f}, {v['max']:.2f}]",
                       err=True)


def _throughput_ratio(report: dict[str, Any], a: str, b: str) -> dict[str, float]:
    """Throughput of ``a`` over ``b``: the whole workload's tokens over the run's time (on
    ``--clock``; ``wall_tok_per_s`` in the summary).

    Why beside :func:`_ratio`: that one divides tokens by the requests' own seconds, the
    rate a request sees; at concurrency above 1 the run's time is set by its slowest
    request too, so a config that speeds most requests while slowing the last one can
    raise the one and lower the other."""
    wa = report[a]["summary"]["all"]["wall_tok_per_s"]
    wb = report[b]["summary"]["all"]["wall_tok_per_s"]
    return {"all": wa / wb if wb else 0.0}


def _ratio(report: dict[str, Any], a: str, b: str) -> dict[str, float]:
    """tok/s of ``a`` over tok/s of ``b``, overall and per kind."""
    sa, sb = report[a]["summary"], report[b]["summary"]
    return {
        kind: (sa[kind]["tok_per_s"] / sb[kind]["tok_per_s"]) if sb[kind]["tok_per_s"] else 0.0
        for kind in sa
        if kind in sb
    }
