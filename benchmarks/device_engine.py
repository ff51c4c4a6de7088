"""The engine on ``--device cuda`` against ``--device cpu``: greedy tokens compared, tok/s.

Run by ``benchmarks/device_check.sh`` on a lent GPU machine (``docs/gpu.md``). For each of
speculation off, n-gram and draft_model (the default model drafting for itself: a timing
of the draft loop, not of acceptance), the same greedy requests run on the CPU engine
(the C kernels) and on the CUDA engine (the Triton kernels), both in float32 so the only
difference is the kernels; the report says whether every token matched and each
engine's decode rate. A float16 CUDA run of speculation off (``--dtype auto`` there) is
timed too.

    python benchmarks/device_engine.py [--model PATH] [--prompts 4] [--max-tokens 32] --out FILE
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

WORKLOAD = Path(__file__).resolve().parent / "workloads" / "cpu-smoke-8.jsonl"


def configs(model: str) -> dict[str, dict[str, Any] | None]:
    """The speculation settings compared (fixed depth: the drafts are the point)."""
    fixed = {"draftwise": {"adaptive": False}}
    return {
        "off": None,
        "ngram": {"method": "ngram", "num_speculative_tokens": 4, **fixed},
        "draft_model": {"method": "draft_model", "model": model, "num_speculative_tokens": 3,
                        **fixed},
    }


def run(model: str | None, device: str, dtype: str, spec: dict[str, Any] | None,
        messages: list[list[dict[str, str]]], max_tokens: int) -> dict[str, Any]:
    """One engine's greedy tokens for every prompt, with its load time and decode rate."""
    import torch
    from draftwise import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(model, speculative_config=spec, dtype=dtype, device=device,
              max_num_seqs=len(messages))
    loaded = time.perf_counter() - start
    prompts = [llm.engine.loaded.encode_chat(m) for m in messages]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    llm.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    report = {
        "device": device, "dtype": dtype, "load_s": round(loaded, 2),
        "seconds": round(seconds, 3), "tokens": sum(map(len, tokens)),
        "tok_per_s": round(sum(map(len, tokens)) / seconds, 1),
        "backend": llm.engine.runner.model.backend.as_dict(),
        "token_ids": tokens,
    }
    del llm
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return report


def first_mismatch(a: list[list[int]], b: list[list[int]]) -> tuple[int, int]:
    """(prompt, token position) of the first difference between two runs' tokens."""
    for i, (r, s) in enumerate(zip(a, b)):
        if r != s:
            return i, next((j for j, (x, y) in enumerate(zip(r, s)) if x != y),
                           min(len(r), len(s)))
    return len(a), 0


def main() -> None:
    """Every configuration on both devices; one JSON report."""
    from draftwise.formats.default_model import default_model_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="default: the embedded default model")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    model = a.model or default_model_path()
    lines = WORKLOAD.read_text().splitlines()[: a.prompts]
    messages = [json.loads(line)["messages"] for line in lines]
    report: dict[str, Any] = {"model": model, "prompts": len(messages),
                              "max_tokens": a.max_tokens}
    for name, spec in configs(model).items():
        entry: dict[str, Any] = {}
        for device in ("cpu", "cuda"):
            try:
                entry[device] = run(model, device, "float32", spec, messages, a.max_tokens)
            except Exception as exc:  # noqa: BLE001 - the report says which failed; the others run
                entry[device] = {"error": f"{type(exc).__name__}: {exc}"}
        cpu, cuda = entry["cpu"].get("token_ids"), entry["cuda"].get("token_ids")
        entry["tokens_equal"] = cpu is not None and cpu == cuda
        if cpu is not None and cuda is not None and cpu != cuda:
            entry["first_mismatch"] = first_mismatch(cpu, cuda)
        report[name] = entry
        print(name, {d: entry[d].get("tok_per_s", entry[d].get("error")) for d in ("cpu", "cuda")},
              "tokens_equal", entry["tokens_equal"], flush=True)
    try:
        report["off_cuda_fp16"] = run(model, "cuda", "float16", None, messages, a.max_tokens)
    except Exception as exc:  # noqa: BLE001 - reported, as above
        report["off_cuda_fp16"] = {"error": f"{type(exc).__name__}: {exc}"}
    Path(a.out).write_text(json.dumps(report, indent=1))
    print(f"device_engine: wrote {a.out}")


if __name__ == "__main__":
    main()
