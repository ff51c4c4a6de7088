"""The same trained DFlash drafter in draftwise and in llama.cpp's ``draft-dflash``.

Exports ``--drafter`` with ``draftwise train export --format llamacpp-gguf`` (module
``draftwise.train.llamacpp_export``), then runs ``compare_llamacpp.py`` on the held-out
prompts with five modes, greedy, one request at a time: draftwise plain and with
``{"method": "dflash", "model": DRAFTER}``, adaptive depth (the default) and fixed at
k = B-1 (``"draftwise": {"adaptive": false}``, llama.cpp's policy, for a like-for-like
acceptance); ``llama-server`` plain and with ``-md FILE.gguf
--spec-type draft-dflash --spec-draft-n-max B-1`` (non-causal block, ``p-min`` 0, llama.cpp's
defaults for DFlash). It prints tok/s of each, draftwise's acceptance and llama.cpp's
``draft_n``/``draft_n_accepted``, and whether each speculative mode's greedy tokens equal its
own engine's plain ones.

A drafter that taps the target's last layer (the trainer's default taps do) needs a llama.cpp
built with ``benchmarks/llamacpp_final_tap.patch`` (``PATCHES=benchmarks/llamacpp_final_tap.patch
benchmarks/setup_llamacpp.sh DIR``) and ``--allow-final-tap`` here: stock llama.cpp aborts at
the first draft (``draftwise.train.llamacpp_export``, fact 3).

Example (the shipped-model drafter, 1 thread, the first 8 held-out prompts)::

    PATCHES=benchmarks/llamacpp_final_tap.patch benchmarks/setup_llamacpp.sh /work/peers
    python benchmarks/llamacpp_dflash.py --drafter /work/drafters/dflash-smollm2 \\
        --allow-final-tap --workload /work/train-logs/held-mix.jsonl --limit 8 --threads 1 \\
        --llama-bin /work/peers/llama.cpp-build/bin --out results/llamacpp_dflash.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare_llamacpp
from llamacpp import DEFAULT_BUILD


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", required=True, help="a `train dflash` folder")
    ap.add_argument("--model", default=None, help="the target GGUF (default: the embedded model)")
    ap.add_argument("--gguf", default=None, help="where the export goes (default: OUT.dflash.gguf)")
    ap.add_argument("--type", default="f32", choices=["f32", "f16", "bf16", "q8_0"])
    ap.add_argument("--allow-final-tap", action="store_true")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--llama-bin", default=str(DEFAULT_BUILD))
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def summarize(rec: dict[str, Any], k: int) -> list[str]:
    """One thread count's lines: tok/s, acceptance, identity."""
    runs, lines = rec["runs"], []
    for label, run in runs.items():
        if "error" in run:
            lines.append(f"  {label}: FAILED {run['error']}")
            continue
        line = f"  {label}: {run['summary']['all']['tok_per_s']:.1f} tok/s"
        spec = run.get("spec_decode") or {}
        if "mean_acceptance_length" in spec:  # draftwise
            line += (f", {spec['num_accepted_tokens']}/{spec['num_draft_tokens']} drafted "
                     f"tokens accepted ({(spec['draft_acceptance_rate'] or 0):.3f}), mean "
                     f"acceptance length {(spec['mean_acceptance_length'] or 0):.3f}")
        elif spec:  # llama.cpp: draft_n counts tokens; each DFlash draft is n-max of them
            drafts = spec["draft_n"] / k if spec["draft_n"] else 0
            line += (f", draft_n_accepted/draft_n {spec['draft_n_accepted']}/{spec['draft_n']}"
                     f" ({(spec['draft_acceptance_rate'] or 0):.3f}), mean acceptance length "
                     f"~{1 + spec['draft_n_accepted'] / drafts if drafts else 0:.3f} (draft_n / "
                     f"{k} drafts)")
        lines.append(line)
    for pair, ident in rec.get("identity", {}).items():
        lines.append(f"  identity {pair}: {json.dumps(ident)[:160]}")
    for pair, ratio in rec.get("ratios", {}).items():
        lines.append(f"  ratio {pair}: {json.dumps(ratio)[:160]}")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from draftwise.train.llamacpp_export import export_llamacpp

    out = Path(args.out)
    gguf = Path(args.gguf) if args.gguf else out.with_suffix(".dflash.gguf")
    report = export_llamacpp(Path(args.drafter), gguf, args.model, args.type,
                             args.allow_final_tap, show=print)
    k = report.block_size - 1
    spec = {"method": "dflash", "model": str(Path(args.drafter).resolve()),
            "num_speculative_tokens": k}
    fixed = {**spec, "draftwise": {"adaptive": False}}  # llama.cpp's policy: always k
    theirs = f"-md {shlex.quote(str(gguf))} --spec-type draft-dflash --spec-draft-n-max {k}"
    cmd = ["--workload", args.workload, "--limit", str(args.limit), "--max-tokens",
           str(args.max_tokens), "--repeat", str(args.repeat), "--threads", args.threads,
           "--speculative-config", f"dflash k{k} adaptive={json.dumps(spec)}",
           "--speculative-config", f"dflash k{k} fixed={json.dumps(fixed)}",
           "--llama-spec", f"draft-dflash n-max {k}={theirs}",
           "--llama-bin", args.llama_bin, "--no-bench", "--no-startup", "--out", str(out)]
    if args.model:
        cmd += ["--model", args.model]
    compare_llamacpp.main(cmd)
    result = json.loads(out.read_text())
    for threads, rec in result["by_threads"].items():
        print(f"threads {threads}:")
        print("\n".join(summarize(rec, k)))


if __name__ == "__main__":
    main()
