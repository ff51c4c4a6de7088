"""Grammar-on vs grammar-off engine step time, with and without speculation (issue 17).

    python3 benchmarks/structured_step.py [--max-tokens 96] [--reps 3] [--k 4]

The default model, one request at a time (concurrency 1), greedy chat. Grammar on is a
JSON schema (``response_format`` json_schema's path); grammar off is the same prompt
unconstrained. Each configuration runs ``--reps`` times on a warm engine; the step time is
wall time over engine steps, and ``verify_ms`` is the verify phase per step, which holds
the mask computation (``structured/masks.py``) and its application. Prints one JSON line
per configuration, then the overheads. The machine's load average is printed too: the
numbers are only comparable on an otherwise idle machine.
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
    print(json.dumps({"loadavg_after": os.getloadavg()}))


if __name__ == "__main__":
    main()
