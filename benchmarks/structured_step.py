"""Grammar-on vs grammar-off engine step time, with and without speculation (issue 17).

    python3 benchmarks/structured_step.py [--max-tokens 96] [--reps 3] [--k 4]

The default model, one request at a time (concurrency 1), greedy chat. Grammar on is a
JSON schema (``response_format`` json_schema's path); grammar off is the same prompt
unconstrained. Each configuration runs ``--reps`` times on a warm engine; the step time is
wall time over engine steps, and ``verify_ms`` is the verify phase per step, which holds
the mask computation (``structured/masks.py``) and its application. Prints one JSON line
per configuration, then the overheads. The machine's load average is printed too: the
numbers are only comparable on an otherwise idle machine. Last, the grammar's own cost
per step is timed alone (masks through the drafts + applying them), which a loaded
machine disturbs far less than whole steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "fruits": {"type": "array", "items": {"type": "string"}, "maxItems": 6}},
    "required": ["name", "age", "fruits"],
    "additionalProperties": False,
}
PROMPT = [{"role": "user", "content": "Describe Ann, 31, who likes apple, banana, cherry, apple, "
           "banana, cherry, as JSON."}]


def run(spec: dict | None, grammar: bool, max_tokens: int, reps: int) -> dict:
    from draftwise import LLM, SamplingParams
    from draftwise.structured import StructuredOutputsParams

    llm = LLM(max_num_seqs=1, speculative_config=spec)
    so = StructuredOutputsParams(json=SCHEMA) if grammar else None
    params = SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=so)
    llm.chat(PROMPT, params)  # warm: kernels, the grammar library's tokenizer view
    samples = []
    for _ in range(reps):
        st = llm.engine.stats
        steps0, verify0, gen0 = st.num_steps, st.timings.verify, st.num_generated_tokens
        t0 = time.perf_counter()
        out = llm.chat(PROMPT, params)[0].outputs[0]
        wall = time.perf_counter() - t0
        steps = st.num_steps - steps0
        samples.append({"step_ms": 1e3 * wall / steps,
                        "verify_ms": 1e3 * (st.timings.verify - verify0) / steps,
                        "tok_per_s": (st.num_generated_tokens - gen0) / wall,
                        "tokens": len(out.token_ids), "steps": steps})
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def mask_cost(k: int, reps: int = 5) -> dict:
    """The grammar's own cost per step, alone: masks for 1 + k positions through k valid
    drafts, applied to [1 + k, V] logits, along a real JSON answer (load-insensitive-ish)."""
    import torch
    from draftwise import LLM, SamplingParams
    from draftwise.structured import StructuredOutputsParams
    from draftwise.structured.masks import apply_token_bitmask, step_bitmask

    llm = LLM(max_num_seqs=1)
    so = StructuredOutputsParams(json=SCHEMA)
    answer = llm.chat(PROMPT, SamplingParams(temperature=0, max_tokens=96,
                                             structured_outputs=so))[0].outputs[0].token_ids
    g = llm.engine.grammars
    vocab = g.vocab_size
    logits = torch.randn(1 + k, vocab)
    per_step = []
    for _ in range(reps):
        m = g.matcher(so)
        for i in range(len(answer) - 1):
            drafts = answer[i + 1 : i + 1 + k] if k else []
            t0 = time.perf_counter()
            bm = step_bitmask(g.executor, [m], [drafts], vocab)
            apply_token_bitmask(logits[: 1 + len(drafts)], bm)
            per_step.append(time.perf_counter() - t0)
            m.consume([answer[i]])
    ms = sorted(1e3 * t for t in per_step)
    return {"k": k, "mask_ms_median": round(ms[len(ms) // 2], 4),
            "mask_ms_p90": round(ms[int(len(ms) * 0.9)], 4), "steps": len(ms)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    a = ap.parse_args()
    ngram = {"method": "ngram", "num_speculative_tokens": a.k, "prompt_lookup_min": 1,
             "prompt_lookup_max": 4}
    print(json.dumps({"loadavg_before": os.getloadavg()}))
    res = {}
    for name, spec in (("spec_off", None), (f"ngram_k{a.k}", ngram)):
        for grammar in (False, True):
            r = run(spec, grammar, a.max_tokens, a.reps)
            res[(name, grammar)] = r
            print(json.dumps({"spec": name, "grammar": grammar,
                              **{k: round(v, 3) for k, v in r.items()}}))
    for name in ("spec_off", f"ngram_k{a.k}"):
        off, on = res[(name, False)], res[(name, True)]
        print(json.dumps({"spec": name,
                          "step_overhead_pct": round(100 * (on["step_ms"] / off["step_ms"] - 1), 1),
                          "verify_extra_ms": round(on["verify_ms"] - off["verify_ms"], 3)}))
    for k in (0, a.k):
        print(json.dumps({"grammar_cost_alone": mask_cost(k)}))
    print(json.dumps({"loadavg_after": os.getloadavg()}))


if __name__ == "__main__":
    main()
