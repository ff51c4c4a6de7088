"""How many draftwise modules one speculative decode step runs (issue 42's measure: 27).

    python benchmarks/step_modules.py                 # default model, n-gram, both depth rules
    python benchmarks/step_modules.py --list          # and the modules, by package

Builds the engine on the default model with n-gram speculation (k 4), runs one greedy
request past its prefill and a few decode steps (warm-up: lazy imports, first-call
caches), then profiles ``LLMEngine.step()`` with ``sys.setprofile`` until a step that
verified at least one draft, and counts the distinct modules whose Python functions ran
in it: ``draftwise.*`` (core) and ``draftwise_*`` (plugins). The C extension is listed
apart (its entry points are C calls, not modules read). Run for the default depth rule
(adaptive) and for fixed depth; a step that drafts nothing is not counted (adaptive depth
may park a row for some steps: the script steps on until one drafts).

Why a profile and not an import list: the question is what a newcomer must read to follow
one step, and a module imported but not run in the step is not on that path.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

PROMPT = ("Repeat this list exactly three times: apple, banana, cherry, date, elderberry, "
          "fig, grape. apple, banana, cherry, date, elderberry, fig, grape. apple, banana,")


def _ours(name: str) -> bool:
    return name == "draftwise" or name.startswith(("draftwise.", "draftwise_"))


def profile_step(step: Callable[[], Any]) -> tuple[set[str], set[str]]:
    """(Python modules whose functions ran, C functions of ours called) during ``step()``."""
    modules: set[str] = set()
    c_calls: set[str] = set()

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if _ours(name):
                modules.add(name)
        elif event == "c_call":
            owner = getattr(arg, "__module__", None) or ""
            if _ours(owner):
                c_calls.add(f"{owner}.{arg.__name__}")

    sys.setprofile(hook)
    try:
        step()
    finally:
        sys.setprofile(None)
    return modules, c_calls


def measure(adaptive: bool, warmup: int, max_steps: int) -> dict[str, Any]:
    """One engine, one request; the first profiled step after warm-up that verified drafts."""
    from draftwise import LLM, SamplingParams

    config: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": 4,
                              "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    if not adaptive:
        config["draftwise"] = {"adaptive": False}
    engine = LLM(speculative_config=config, max_num_seqs=1).engine
    engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=warmup + max_steps * 5))
    for _ in range(warmup):
        engine.step()
    metrics = engine.spec.metrics
    for step in range(max_steps):
        before = metrics.num_draft_tokens
        modules, c_calls = profile_step(engine.step)
        if metrics.num_draft_tokens > before:
            core = sorted(m for m in modules if m == "draftwise" or m.startswith("draftwise."))
            plugins = sorted(m for m in modules if m.startswith("draftwise_"))
            return {"adaptive": adaptive, "profiled_steps": step + 1,
                    "drafts_verified": metrics.num_draft_tokens - before,
                    "modules": len(core) + len(plugins), "core": len(core),
                    "plugins": len(plugins), "core_modules": core, "plugin_modules": plugins,
                    "c_entry_points": sorted(c_calls)}
        if not engine.has_unfinished_requests():
            break
    return {"adaptive": adaptive, "error": f"no step verified a draft in {max_steps} steps"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--list", action="store_true", help="print the modules too")
    args = ap.parse_args()
    for adaptive in (True, False):
        got = measure(adaptive, args.warmup, args.max_steps)
        if not args.list:
            got = {k: v for k, v in got.items() if not k.endswith(("_modules", "_points"))}
        print(json.dumps(got, indent=None if not args.list else 1))


if __name__ == "__main__":
    main()
