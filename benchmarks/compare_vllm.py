"""Side-by-side benchmark: draftwise vs vLLM-CPU, plain and with the same speculative config.

One run measures four things on the same prompt token ids, greedy, one request at a time:

* vLLM plain and vLLM with ``--speculative-config``, each in its own subprocess of the vLLM
  venv's python (``benchmarks/setup_vllm_venv.sh``), on an HF-format copy of the default model
  (``benchmarks/export_hf_copy.py``; made on the fly when missing);
* draftwise plain and draftwise with the same config, in this process
  (``draftwise.bench.run``).

Every figure is wall time per prompt including prefill, after a warm-up request, the minimum of
``--repeat`` runs per prompt (as ``draftwise bench`` and the peers table do). Absolute tok/s on
a shared 2-core machine is noisy, so the report leads with ratios taken in the same run:
each engine's spec-on/off ratio and draftwise/vLLM for the same config and dtype, plus greedy
token identity counts. vLLM is never a draftwise dependency: it only runs in its own venv.

Example::

    benchmarks/setup_vllm_venv.sh /tmp/vllm-venv
    python benchmarks/compare_vllm.py --workload benchmarks/workloads/cpu-smoke-8.jsonl \\
        --max-tokens 128 --dtype bfloat16 --vllm-python /tmp/vllm-venv/bin/python \\
        --speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":4}' \\
        --out results/compare_vllm.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the shared helpers beside this script

from side_by_side import (  # noqa: E402
    build_ours,
    identity,
    loadavg,
    log,
    measure_ours,
    peer_results,
    ratio,
    with_retries,
)

# The script the vLLM venv runs. It must not import draftwise (not installed there) and its
# body must sit under ``if __name__ == "__main__":`` because vLLM spawns worker processes.
VLLM_WORKER = r"""
import json
import sys
import time


def main(in_path, out_path):
    spec = json.loads(open(in_path).read())
    from vllm import LLM, SamplingParams
    try:
        from vllm.inputs import TokensPrompt
    except ImportError:  # older layouts
        TokensPrompt = dict
    import vllm

    t_load = time.perf_counter()
    kwargs = dict(
        model=spec["model"],
        dtype=spec["dtype"],
        enable_prefix_caching=False,
        max_model_len=spec["max_model_len"],
        max_num_seqs=1,
        seed=0,
        disable_log_stats=False,
    )
    if spec["speculative_config"] is not None:
        kwargs["speculative_config"] = spec["speculative_config"]
    llm = LLM(**kwargs)
    load_s = time.perf_counter() - t_load

    prompts = spec["prompts"]
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])

    def one(ids, p):
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=list(ids))], p, use_tqdm=False)
        dt = time.perf_counter() - t0
        comp = out[0].outputs[0]
        return list(comp.token_ids), dt, comp.finish_reason

    # warm-up: one short request, like draftwise.bench.run.warm_up
    one(prompts[0]["ids"], SamplingParams(temperature=0.0, max_tokens=16))

    runs = []
    for _ in range(spec["repeat"]):
        run = []
        for p in prompts:
            ids, dt, why = one(p["ids"], params)
            run.append({"id": p["id"], "token_ids": ids, "seconds": dt, "finish_reason": why})
        runs.append(run)

    metrics = {}
    try:
        for m in llm.get_metrics():
            if "spec_decode" in m.name:
                val = getattr(m, "value", None)
                if val is None:
                    val = getattr(m, "values", None)
                metrics[m.name] = val
    except Exception as exc:  # metrics are a nicety, never fatal
        metrics["error"] = repr(exc)

    import torch

    info = {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "frontend_torch_threads": torch.get_num_threads(),  # not the model worker's
        "load_seconds": load_s,
    }
    with open(out_path, "w") as f:
        json.dump({"runs": runs, "spec_decode_metrics": metrics, "info": info}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
"""


# -- vLLM side ---------------------------------------------------------------------------


def ensure_hf_copy(path: str) -> str:
    """The HF-format copy vLLM loads; exported from the default GGUF when missing."""
    if (Path(path) / "config.json").is_file() and any(Path(path).glob("*.safetensors")):
        return path
    log(f"no HF copy at {path}; exporting the default GGUF there")
    from export_hf_copy import export

    export(path)
    return path


def run_vllm(
    python: str,
    model_dir: str,
    dtype: str,
    spec_config: dict[str, Any] | None,
    prompts: list[dict[str, Any]],
    max_tokens: int,
    repeat: int,
    max_model_len: int,
    timeout: float,
    log_path: Path,
) -> dict[str, Any]:
    """One vLLM configuration in a subprocess of the vLLM venv; its raw per-prompt results."""
    with tempfile.TemporaryDirectory(prefix="compare_vllm_") as tmp:
        script = Path(tmp) / "vllm_worker.py"
        script.write_text(VLLM_WORKER)
        inp, outp = Path(tmp) / "in.json", Path(tmp) / "out.json"
        inp.write_text(
            json.dumps(
                {
                    "model": model_dir,
                    "dtype": dtype,
                    "speculative_config": spec_config,
                    "prompts": prompts,
                    "max_tokens": max_tokens,
                    "repeat": repeat,
                    "max_model_len": max_model_len,
                }
            )
        )
        env = dict(os.environ)
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # else it reserves ~92% of RAM and may not start
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.pop("PYTHONPATH", None)  # keep draftwise's environment out of the venv
        preload = vllm_preload(python)
        if preload:  # vLLM's CPU guide: Intel OpenMP preloaded, else spec decode is slow
            env["LD_PRELOAD"] = ":".join([*preload, env.get("LD_PRELOAD", "")]).rstrip(":")
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.run(
                [python, str(script), str(inp), str(outp)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                cwd=tmp,
                check=False,
            )
        if proc.returncode != 0 or not outp.is_file():
            tail = log_path.read_text()[-3000:]
            raise RuntimeError(
                f"vLLM worker failed (rc={proc.returncode}); log {log_path}:\n{tail}"
            )
        raw = json.loads(outp.read_text())
        raw["info"]["subprocess_seconds"] = time.perf_counter() - t0
        raw["info"]["ld_preload"] = env.get("LD_PRELOAD", "")
        return raw


def vllm_results(raw: dict[str, Any], items: list[Any], prompts: list[dict[str, Any]]) -> list[Any]:
    """Raw vLLM runs as draftwise PromptResults, best (fastest) run per prompt."""
    return peer_results(raw["runs"], items, prompts)


def vllm_preload(python: str) -> list[str]:
    """The libraries vLLM's CPU install guide says to LD_PRELOAD, where the venv has them.

    vllm-cpu pulls in ``intel-openmp`` (``<venv>/lib/libiomp5.so``); without it preloaded
    vLLM warns that CPU speculative decoding loses "significant performance". tcmalloc is
    also recommended; it is used when ``libtcmalloc_minimal.so.4`` is on the system.
    """
    venv = Path(python).absolute().parent.parent  # not resolve(): bin/python is a symlink
    found = [str(p) for p in (venv / "lib" / "libiomp5.so",) if p.is_file()]
    for lib_dir in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"):
        tc = Path(lib_dir) / "libtcmalloc_minimal.so.4"
        if tc.is_file():
            found.append(str(tc))
            break
    return found


# -- report ------------------------------------------------------------------------------


def print_table(report: dict[str, Any]) -> None:
    runs = report["runs"]
    kinds = [k for k in runs["draftwise_plain"]["summary"] if k != "all"]
    head = f"{'engine / mode':<22}{'dtype':<10}{'all':>8}" + "".join(f"{k:>10}" for k in kinds)
    print()
    print(f"tok/s (greedy, {report['max_tokens']} max tokens, best of {report['repeat']})")
    print(head)
    print("-" * len(head))
    for label, rec in runs.items():
        s = rec["summary"]
        row = f"{label:<22}{rec['dtype']:<10}{s['all']['tok_per_s']:>8.1f}"
        row += "".join(f"{s[k]['tok_per_s']:>10.1f}" if k in s else f"{'-':>10}" for k in kinds)
        print(row)
    print()
    print(f"{'ratio':<34}{'all':>8}" + "".join(f"{k:>10}" for k in kinds))
    for name, r in report["ratios"].items():
        print(
            f"{name:<34}{r.get('all', 0):>7.2f}x" + "".join(f"{r.get(k, 0):>9.2f}x" for k in kinds)
        )
    print()
    for name, r in report["identity"].items():
        extra = (
            f"  (first divergence at token {r['first_divergence']})"
            if r["first_divergence"]
            else ""
        )
        print(f"identical {name:<34}{r['identical']}/{r['of']}{extra}")
    sd = report["runs"]["draftwise_spec"].get("spec_decode")
    if isinstance(sd, dict):
        keys = [
            k
            for k in ("acceptance_rate", "mean_acceptance_length", "draft_acceptance_rate")
            if k in sd
        ]
        if keys:
            print("draftwise spec: " + ", ".join(f"{k}={sd[k]}" for k in keys))
    vm = report["runs"]["vllm_spec"].get("spec_decode_metrics") or {}
    acc = vm.get("vllm:spec_decode_num_accepted_tokens")
    dr = vm.get("vllm:spec_decode_num_draft_tokens")
    if isinstance(acc, (int, float)) and isinstance(dr, (int, float)) and dr:
        print(
            f"vllm spec: draft acceptance {acc / dr:.3f} ({int(acc)}/{int(dr)}, warm-up included)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description="draftwise vs vLLM-CPU, plain and speculative, one run."
    )
    ap.add_argument("--workload", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument(
        "--speculative-config", required=True, help="vLLM-style JSON, used by both engines"
    )
    ap.add_argument("--dtype", default="bfloat16", help="bfloat16 or float32 (both engines)")
    ap.add_argument("--vllm-python", default="/tmp/vllm-venv/bin/python")
    ap.add_argument(
        "--hf-model", default="/tmp/smollm2-hf", help="HF copy for vLLM (exported if missing)"
    )
    ap.add_argument("--model", default=None, help="our checkpoint (default: the embedded GGUF)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per engine; best per prompt")
    ap.add_argument(
        "--threads", type=int, default=None, help="our torch threads (default: torch's)"
    )
    ap.add_argument("--max-model-len", type=int, default=2048, help="vLLM context length")
    ap.add_argument(
        "--vllm-timeout", type=float, default=1800.0, help="seconds per vLLM subprocess"
    )
    ap.add_argument(
        "--reuse-vllm",
        default=None,
        help="take the vLLM runs from an earlier report of this script (same prompts) instead of rerunning",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    spec_cfg = json.loads(args.speculative_config)
    spec_str = json.dumps(spec_cfg)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    import torch
    from draftwise.bench import load_workload, peak_rss_mib, prompt_ids, to_json
    from draftwise.models.kernels import kernel_threads

    items = load_workload(args.workload)
    report: dict[str, Any] = {
        "workload": args.workload,
        "max_tokens": args.max_tokens,
        "repeat": args.repeat,
        "dtype": args.dtype,
        "speculative_config": spec_cfg,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
        },
        "runs": {},
        "loadavg": {"start": loadavg()},
    }
    runs = report["runs"]

    # -- draftwise, in this process (its tokenizer also fixes the prompt ids for vLLM) --
    log(f"draftwise plain ({args.dtype})")
    prompts: list[dict[str, Any]] = []

    def ours(spec: str | None) -> dict[str, Any]:
        eng = build_ours(args.model, spec, args.dtype, args.threads)
        report["machine"]["draftwise_threads"] = kernel_threads()  # torch may hold just 1
        ids = [{"id": i.id, "kind": i.kind, "ids": prompt_ids(eng, i)} for i in items]
        if prompts and ids != prompts:
            raise RuntimeError("prompt ids changed between our two engines")
        prompts[:] = ids
        rec = measure_ours(eng, items, args.max_tokens, args.repeat)
        del eng
        gc.collect()
        return rec

    rec = with_retries(lambda: ours(None), "draftwise plain")
    ours_plain = rec.pop("_results")
    runs["draftwise_plain"] = rec
    report["loadavg"]["draftwise_plain"] = loadavg()
    log(f"  {rec['summary']['all']['tok_per_s']:.1f} tok/s")

    log(f"draftwise spec {spec_str}")
    rec = with_retries(lambda: ours(spec_str), "draftwise spec")
    ours_spec = rec.pop("_results")
    runs["draftwise_spec"] = rec
    report["loadavg"]["draftwise_spec"] = loadavg()
    log(f"  {rec['summary']['all']['tok_per_s']:.1f} tok/s")

    # -- vLLM, in its own venv --
    from draftwise.bench import summarize

    if args.reuse_vllm:
        old = json.loads(Path(args.reuse_vllm).read_text())
        if [p["ids"] for p in old["prompts"]] != [p["ids"] for p in prompts]:
            raise SystemExit("--reuse-vllm: that report used different prompt ids")
        if old["max_tokens"] != args.max_tokens or old["dtype"] != args.dtype:
            raise SystemExit("--reuse-vllm: that report used another max_tokens or dtype")
        if old["speculative_config"] != spec_cfg:
            raise SystemExit("--reuse-vllm: that report used another speculative config")
        raws = {k: old["vllm_raw"][k] for k in ("vllm_plain", "vllm_spec")}
        report["vllm_reused_from"] = args.reuse_vllm
    else:
        model_dir = ensure_hf_copy(args.hf_model)
        raws = {}
        for label, cfg in (("vllm_plain", None), ("vllm_spec", spec_cfg)):
            log(f"{label} ({args.dtype}) in {args.vllm_python} (startup takes 1-2 minutes)")
            log_path = out_path.with_suffix(f".{label}.log")
            raws[label] = run_vllm(
                args.vllm_python,
                model_dir,
                args.dtype,
                cfg,
                prompts,
                args.max_tokens,
                args.repeat,
                args.max_model_len,
                args.vllm_timeout,
                log_path,
            )
            report["loadavg"][label] = loadavg()
    vllm_res: dict[str, list[Any]] = {}
    for label, raw in raws.items():
        res = vllm_results(raw, items, prompts)
        vllm_res[label] = res
        runs[label] = {
            "dtype": args.dtype,
            "speculative_config": spec_cfg if label == "vllm_spec" else None,
            "summary": summarize(res),
            "per_prompt": to_json(res),
            "spec_decode_metrics": raw.get("spec_decode_metrics"),
            "info": raw.get("info"),
        }
        log(f"{label}: {runs[label]['summary']['all']['tok_per_s']:.1f} tok/s")
    report["vllm_raw"] = raws
    report["prompts"] = prompts

    # -- ratios and identity --
    report["ratios"] = {
        "draftwise spec/plain": ratio(runs["draftwise_spec"], runs["draftwise_plain"]),
        "vllm spec/plain": ratio(runs["vllm_spec"], runs["vllm_plain"]),
        "draftwise/vllm plain": ratio(runs["draftwise_plain"], runs["vllm_plain"]),
        "draftwise/vllm spec": ratio(runs["draftwise_spec"], runs["vllm_spec"]),
    }
    pp = {k: v["per_prompt"] for k, v in runs.items()}
    report["identity"] = {
        "draftwise spec vs draftwise plain": identity(pp["draftwise_spec"], pp["draftwise_plain"]),
        "vllm spec vs vllm plain": identity(pp["vllm_spec"], pp["vllm_plain"]),
        "draftwise plain vs vllm plain": identity(pp["draftwise_plain"], pp["vllm_plain"]),
        "draftwise spec vs vllm spec": identity(pp["draftwise_spec"], pp["vllm_spec"]),
    }
    report["peak_rss_mib"] = peak_rss_mib()
    out_path.write_text(json.dumps(report, indent=2, default=str))
    log(f"wrote {out_path}")
    print_table(report)
    del ours_plain, ours_spec, vllm_res


if __name__ == "__main__":
    main()
