"""The comparisons and the markdown table of ``compare_llamacpp.py``'s report.

Kept apart from the runner so the arithmetic can be read (and re-run on a saved report:
``python benchmarks/llamacpp_report.py REPORT.json``) without starting anything. Every ratio
is taken between figures of the same thread count in the same run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from side_by_side import identity, paired, ratio

OURS, PEER = "draftwise plain", "llama.cpp plain"


def _ok(runs: dict[str, Any], label: str) -> bool:
    return label in runs and "error" not in runs[label]


def _tps(runs: dict[str, Any], label: str) -> float:
    return float(runs[label]["summary"]["all"]["tok_per_s"])


def _pair(peer: float | None, ours: float | None) -> dict[str, float | None]:
    """One figure for both engines and draftwise over llama.cpp."""
    return {"llama.cpp": peer, "draftwise": ours,
            "draftwise/llama.cpp": ours / peer if ours is not None and peer else None}  # fmt: skip


def _get(d: Any, *keys: str) -> Any:
    """A nested value, or None where any level is missing or an error record."""
    for k in keys:
        if not isinstance(d, dict) or "error" in d or k not in d:
            return None
        d = d[k]
    return d


def _with_paired(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """:func:`ratio` (best run per prompt), plus ``paired``: the same rounds' ratios, where
    both records hold ``rounds`` (compare_llamacpp.py's interleaved rounds)."""
    out: dict[str, Any] = ratio(a, b)
    both = a.get("rounds"), b.get("rounds")
    if all(both):
        out["paired"] = paired(*both)
    return out


def add_comparisons(rec: dict[str, Any], ours: list[str], peers: list[str]) -> None:
    """Add ``ratios``, ``identity`` and ``figures`` to one thread count's record."""
    runs = rec["runs"]
    ratios: dict[str, Any] = {}
    for label in [OURS, *ours, *peers]:
        if _ok(runs, label) and _ok(runs, PEER):
            ratios[f"{label} / {PEER}"] = _with_paired(runs[label], runs[PEER])
    for label in ours:
        if _ok(runs, label) and _ok(runs, OURS):
            ratios[f"{label} / {OURS}"] = _with_paired(runs[label], runs[OURS])
    best_ours = max((x for x in [OURS, *ours] if _ok(runs, x)), key=lambda x: _tps(runs, x),
                    default=None)  # fmt: skip
    best_peer = max((x for x in [PEER, *peers] if _ok(runs, x)), key=lambda x: _tps(runs, x),
                    default=None)  # fmt: skip
    if best_ours and best_peer:
        ratios["best draftwise / best llama.cpp"] = {
            "all": _tps(runs, best_ours) / _tps(runs, best_peer),
            "draftwise": best_ours,
            "llama.cpp": best_peer,
        }
    rec["ratios"] = ratios

    pp = {k: v["per_prompt"] for k, v in runs.items() if "error" not in v}
    ident: dict[str, Any] = {}
    for label in ours:  # the lossless check: speculation on vs off, same engine
        if label in pp and OURS in pp:
            ident[f"{label} vs {OURS}"] = identity(pp[label], pp[OURS])
    for label in peers:  # informative
        if label in pp and PEER in pp:
            ident[f"{label} vs {PEER}"] = identity(pp[label], pp[PEER])
    for label in [OURS, *ours]:  # informative: two engines' numerics differ
        if label in pp and PEER in pp:
            ident[f"{label} vs {PEER}"] = identity(pp[label], pp[PEER])
    rec["identity"] = ident

    fb, lb = _get(runs, OURS, "forward_bench"), rec.get("llama_bench")
    figures = {
        "prefill_tok_per_s": _pair(_get(lb, "prefill", "tok_per_s"), _get(fb, "prefill", "tok_per_s")),
        "decode_tok_per_s": _pair(_get(lb, "decode", "tok_per_s"), _get(fb, "decode", "tok_per_s")),
        "startup_to_first_token_s": _pair(
            _get(runs, PEER, "startup", "startup_to_first_token_s"),
            _get(rec, "draftwise_startup", "startup_to_first_token_s"),
        ),
        "peak_rss_mib": _pair(
            _get(runs, PEER, "startup", "peak_rss_mib"),
            _get(rec, "draftwise_startup", "peak_rss_mib"),
        ),
    }
    conc = rec.get("concurrency")
    if conc:
        peer_c = _get(conc, PEER, "output_tok_per_s")
        for label in [OURS, f"{OURS} in-process", *ours]:
            if label in conc:
                figures[f"served c={conc['concurrency']} tok/s, {label}"] = _pair(
                    peer_c, _get(conc, label, "output_tok_per_s")
                )
    rec["figures"] = figures


def _f(x: Any, fmt: str = ".1f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{fmt}}{suffix}"


def _paired_cell(ratios: dict[str, Any], label: str, ref: str) -> str:
    """``median [min, max]`` of the paired rounds of ``label`` over ``ref``, or ``-``."""
    p = _get(ratios, f"{label} / {ref}", "paired")
    return "-" if p is None else f"{p['median']:.2f}x [{p['min']:.2f}, {p['max']:.2f}]"


def _bench_label(report: dict[str, Any], key: str) -> str:
    """Row names that carry the sizes actually run (pp256 / tg64 by default)."""
    t = next(iter(report["by_threads"].values()))
    lb = t.get("llama_bench") or {}
    n = _get(lb, "prefill" if key.startswith("prefill") else "decode", "n_tokens")
    if key.startswith("prefill"):
        return f"pure prefill pp{n or ''} tok/s"
    if key.startswith("decode"):
        return f"pure decode tg{n or ''} tok/s"
    if key.startswith("served"):
        return key
    return {"startup_to_first_token_s": "start-up to first token s",
            "peak_rss_mib": "peak RSS MiB (plain)"}[key]  # fmt: skip


def print_markdown(report: dict[str, Any]) -> None:
    """The report as markdown tables, one section per thread count."""
    print(f"\nmodel `{report['model']}`, {report['num_prompts']} prompts, greedy, "
          f"{report['max_tokens']} new tokens, best of {report['repeat']}, one request at a time; "
          f"llama.cpp {report['llama_cpp']['version']}")  # fmt: skip
    for threads, rec in report["by_threads"].items():
        runs = rec["runs"]
        load = rec.get("loadavg", {})
        marks = [v[0] for v in load.values() if v]
        print(f"\n### {threads} thread{'s' if threads != '1' else ''}"
              + (f" (load {min(marks):.2f}..{max(marks):.2f})" if marks else ""))  # fmt: skip
        kinds = sorted({k for v in runs.values() if "summary" in v for k in v["summary"]} - {"all"})
        if not runs:  # --only-concurrency: the figures below are the whole report
            _print_figures(report, rec)
            continue
        head = ["run", "tok/s", *kinds, f"x {PEER}", "paired rounds", "x own plain",
                "paired rounds", "identical to own plain", "draft acceptance"]  # fmt: skip
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
        for label, run in runs.items():
            if "error" in run:
                print(f"| {label} | error: {run['error'][:120]} |" + " |" * (len(head) - 2))
                continue
            s = run["summary"]
            own = OURS if label.startswith("draftwise") else PEER
            vs_peer = 1.0 if label == PEER else _get(rec["ratios"], f"{label} / {PEER}", "all")
            vs_own = 1.0 if label == own else _get(rec["ratios"], f"{label} / {own}", "all")
            pair_peer = _paired_cell(rec["ratios"], label, PEER)
            pair_own = _paired_cell(rec["ratios"], label, own)
            ident = _get(rec["identity"], f"{label} vs {own}")
            sd = run.get("spec_decode") or {}
            drafted = sd.get("draft_n", sd.get("num_draft_tokens"))
            accept = "none drafted" if sd and not drafted else _f(sd.get("draft_acceptance_rate"), ".2f")
            cells = [label, _f(s["all"]["tok_per_s"]),
                     *(_f(_get(s, k, "tok_per_s")) for k in kinds),
                     _f(vs_peer, ".2f", "x"), pair_peer, _f(vs_own, ".2f", "x"), pair_own,
                     f"{ident['identical']}/{ident['of']}" if ident else "-",
                     accept]  # fmt: skip
            print("| " + " | ".join(cells) + " |")
        _print_figures(report, rec)
        best = rec["ratios"].get("best draftwise / best llama.cpp")
        if best:
            print(f"\nbest draftwise ({best['draftwise']}) / best llama.cpp ({best['llama.cpp']}): "
                  f"{best['all']:.2f}x")  # fmt: skip
        for name, r in rec["identity"].items():
            if name.endswith(f"vs {PEER}"):
                div = f" (first divergence: {r['first_divergence']})" if r["first_divergence"] else ""
                print(f"identical {name}: {r['identical']}/{r['of']}{div}")


def _print_figures(report: dict[str, Any], rec: dict[str, Any]) -> None:
    """The side-by-side figures measured (rows neither engine has are left out), and each
    concurrency run's load average when it ended: other work on the machine moves them."""
    print()
    print("| figure | llama.cpp | draftwise | draftwise/llama.cpp |")
    print("|---|---:|---:|---:|")
    for key, fig in rec["figures"].items():
        if fig["llama.cpp"] is None and fig["draftwise"] is None:
            continue
        fmt = ".2f" if "startup" in key else ".1f"
        print(f"| {_bench_label(report, key)} | {_f(fig['llama.cpp'], fmt)} | "
              f"{_f(fig['draftwise'], fmt)} | {_f(fig['draftwise/llama.cpp'], '.2f', 'x')} |")
    conc = rec.get("concurrency") or {}
    loads = {k: v["loadavg"] for k, v in conc.items() if isinstance(v, dict) and v.get("loadavg")}
    if loads:
        print("\nload average (1, 5, 15 min) at the end of each concurrency run: "
              + "; ".join(f"{k} {', '.join(f'{x:.1f}' for x in v)}" for k, v in loads.items()))


if __name__ == "__main__":
    print_markdown(json.loads(Path(sys.argv[1]).read_text()))
