"""Agentic workload: speculation off vs ngram vs suffix, by workload part, interleaved.

    python benchmarks/agentic.py --threads 2 --concurrency 1 8 --out agentic.json

Four parts, written before any run and not tuned to one (greedy, chat template):

- ``edit``: multi-turn; turn 1 asks for a small file, turn 2 (with turn 1's answer in
  the conversation) for the whole file again with a small edit, turn 3 for another edit;
- ``tool``: a tool-calling agent; every request asks for one JSON call of the same
  tool with different arguments (the calls share their shape, not their text);
- ``shape``: many requests asking for one fixed record format filled for different
  items (outputs share a shape across requests);
- ``chat``: open questions, nothing repeated (the control).

``--llama 'LABEL=FLAGS'`` adds llama.cpp's ``llama-server`` (``benchmarks/llamacpp.py``,
the default model's GGUF as is) at concurrency 1, e.g. its n-gram modes:

    python benchmarks/agentic.py --concurrency 1 --llama 'llama=' \
        --llama 'llama ngram-cache=--spec-type ngram-cache' \
        --llama 'llama ngram-mod=--spec-type ngram-mod'

Modes (``--mode LABEL=JSON``, repeatable; default off, ngram as the project runs it,
suffix with vLLM's defaults) each get their own engine, built and warmed first. At
concurrency 1 every conversation runs on every mode in turn (the order rotating), so the
machine's load moves all modes alike; a later request of a mode sees that mode's earlier
outputs, as a server would. At concurrency > 1 each part runs on every mode in turn, its
requests ``--concurrency`` at a time (multi-turn conversations: all first turns, then all
second turns). Suffix requests all carry one isolation key (one user). Reported per mode
and part: output tokens, seconds, tok/s, ratio to off, acceptance, greedy identity with
off, and the suffix proposer's drafts by source; then the global index's memory per
1,000 cached requests (measured: this run's outputs replayed into an index of 1,000).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SYSTEM_TOOL = (
    "You are an agent that answers only with a tool call. The tool is "
    "get_weather(city: string, unit: \"celsius\" | \"fahrenheit\", days: integer). Reply with "
    "exactly one JSON object like {\"tool\": \"get_weather\", \"arguments\": {...}} and "
    "nothing else."
)
TOOL_ASKS = [
    ("Lisbon", "celsius", 3), ("Denver", "fahrenheit", 1), ("Osaka", "celsius", 5),
    ("Nairobi", "celsius", 2), ("Toronto", "fahrenheit", 7), ("Lima", "celsius", 4),
    ("Oslo", "celsius", 1), ("Austin", "fahrenheit", 2),
]
SHAPE_ITEMS = [
    "a stainless steel water bottle", "a wireless keyboard", "a hiking backpack",
    "a cast iron skillet", "a desk lamp", "a yoga mat", "a travel mug", "a bike helmet",
]
SHAPE_FORMAT = (
    "Write a catalog entry for {item}. Use exactly this format, one field per line:\n"
    "Name: <name>\nPrice: <price in USD>\nCategory: <category>\nWeight: <weight>\n"
    "Summary: <one sentence>"
)
EDIT_TASKS = [
    ("inventory.py", "a class Inventory with methods add(item, qty), remove(item, qty) and "
     "total()", "Rename the method remove to discard", "Add a method clear() that empties it"),
    ("stack.py", "a class Stack with methods push(x), pop(), peek() and is_empty()",
     "Make pop() return None when the stack is empty", "Add a __len__ method"),
    ("timer.py", "a class Timer with methods start(), stop() and elapsed()",
     "Rename elapsed to seconds", "Add a reset() method"),
]
CHAT = [
    "Why is the sky blue? Answer in a short paragraph.",
    "Give three tips for learning a new language.",
    "What is the difference between a virus and a bacterium?",
    "Write a haiku about autumn rain.",
    "Explain what a hash table is to a beginner.",
    "What should I pack for a weekend camping trip?",
]


@dataclass(slots=True)
class Conversation:
    """One conversation: its part, its turns (user messages), its system prompt."""

    part: str
    cid: str
    turns: list[str]
    system: str | None = None


def workload() -> list[Conversation]:
    """The parts, interleaved in a fixed order (a session mixes them)."""
    edit = [Conversation("edit", f"edit{i}", [
        f"Write the Python file {name} with {what}. Print only the complete file in one "
        "code block.",
        f"{first}. Print the complete updated file {name} again in one code block.",
        f"{second}. Print the complete updated file {name} again in one code block.",
    ]) for i, (name, what, first, second) in enumerate(EDIT_TASKS)]
    tool = [Conversation("tool", f"tool{i}", [
        f"What will the weather be in {city} for the next {days} days, in {unit}?"],
        SYSTEM_TOOL) for i, (city, unit, days) in enumerate(TOOL_ASKS)]
    shape = [Conversation("shape", f"shape{i}", [SHAPE_FORMAT.format(item=item)])
             for i, item in enumerate(SHAPE_ITEMS)]
    chat = [Conversation("chat", f"chat{i}", [q]) for i, q in enumerate(CHAT)]
    out: list[Conversation] = []
    for i in range(max(len(edit), len(tool), len(shape), len(chat))):
        for part in (edit, tool, shape, chat):
            if i < len(part):
                out.append(part[i])
    return out


@dataclass(slots=True)
class Result:
    """One request on one mode."""

    mode: str
    part: str
    rid: str
    tokens: list[int]
    seconds: float


class Mode:
    """One engine and what it ran."""

    def __init__(self, label: str, spec: str | None, threads: int, max_num_seqs: int,
                 model: str | None = None) -> None:
        from side_by_side import build_ours

        self.label = label
        self.engine = build_ours(model, spec, "auto", threads, max_num_seqs=max_num_seqs)
        #: cid -> the conversation's messages so far (this mode's own answers)
        self.history: dict[str, list[dict[str, str]]] = {}

    def messages(self, conv: Conversation, turn: int) -> list[dict[str, str]]:
        msgs = self.history.setdefault(conv.cid, [] if conv.system is None else
                                       [{"role": "system", "content": conv.system}])
        msgs.append({"role": "user", "content": conv.turns[turn]})
        return msgs

    def run(self, batch: list[tuple[Conversation, int]], max_tokens: int) -> list[Result]:
        """Run one turn of each conversation in ``batch`` together; each request's time is
        from the batch's start to its finish (at concurrency 1: the request's own time)."""
        from draftwise import SamplingParams

        engine = self.engine
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        rids: dict[str, tuple[Conversation, int]] = {}
        t0 = time.perf_counter()
        for conv, turn in batch:
            ids = engine.apply_chat_template(self.messages(conv, turn), True)
            rid = engine.add_request({"prompt_token_ids": ids}, params,
                                     request_id=f"{conv.cid}.t{turn}.{len(rids)}",
                                     isolation_key="bench-user")
            rids[rid] = (conv, turn)
        out: list[Result] = []
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished and o.request_id in rids:
                    conv, turn = rids[o.request_id]
                    c = o.outputs[0]
                    self.history[conv.cid].append({"role": "assistant", "content": c.text})
                    out.append(Result(self.label, conv.part, f"{conv.cid}.t{turn}",
                                      list(c.token_ids), time.perf_counter() - t0))
        return out

    def proposer_stats(self) -> dict[str, Any]:
        spec = self.engine.spec
        if spec is None:
            return {}
        return {"acceptance": {"num_drafts": spec.metrics.num_drafts,
                               "num_draft_tokens": spec.metrics.num_draft_tokens,
                               "num_accepted_tokens": spec.metrics.num_accepted_tokens},
                "proposers": spec.proposer_stats()}


class LlamaMode:
    """llama.cpp's own server as one more mode (concurrency 1 only): the same prompt token
    ids (draftwise's chat template), greedy ``/completion`` with its prompt cache off; the
    next turn's prompt carries llama.cpp's own answer. Speculation flags are server-wide,
    so ``ngram-mod``'s table and ``ngram-cache``'s dynamic cache persist across requests,
    as suffix's global index does."""

    def __init__(self, label: str, flags: list[str], threads: int, templater: Mode,
                 log_dir: Path, model: str | None = None) -> None:
        from draftwise.formats.default_model import resolve_model_path
        from llamacpp import DEFAULT_BUILD, LlamaServer

        self.label = label
        self.templater = templater
        self.flags = flags
        self.server = LlamaServer(DEFAULT_BUILD / "llama-server", resolve_model_path(model),
                                  threads, flags, log_dir / f"{label.replace(' ', '_')}.log")
        self.server.start()
        self.history: dict[str, list[dict[str, str]]] = {}
        self.draft_n = 0
        self.draft_n_accepted = 0

    messages = Mode.messages

    def run(self, batch: list[tuple[Conversation, int]], max_tokens: int) -> list[Result]:
        out: list[Result] = []
        for conv, turn in batch:
            ids = self.templater.engine.apply_chat_template(self.messages(conv, turn), True)
            reply = self.server.complete(list(ids), max_tokens)
            self.history[conv.cid].append({"role": "assistant", "content": reply["content"]})
            timings = reply.get("timings", {})
            self.draft_n += int(timings.get("draft_n", 0) or 0)
            self.draft_n_accepted += int(timings.get("draft_n_accepted", 0) or 0)
            out.append(Result(self.label, conv.part, f"{conv.cid}.t{turn}",
                              list(reply.get("tokens", [])), reply["_seconds"]))
        return out

    def proposer_stats(self) -> dict[str, Any]:
        return {"flags": self.flags, "draft_n": self.draft_n,
                "draft_n_accepted": self.draft_n_accepted}

    def close(self) -> None:
        self.server.stop()


def run_c1(modes: list[Any], convs: list[Conversation], max_tokens: int) -> list[Result]:
    results: list[Result] = []
    i = 0
    for conv in convs:
        for turn in range(len(conv.turns)):
            order = modes[i % len(modes):] + modes[: i % len(modes)]
            i += 1
            for mode in order:
                results += mode.run([(conv, turn)], max_tokens)
    return results


def run_batched(modes: list[Mode], convs: list[Conversation], max_tokens: int,
                concurrency: int) -> list[Result]:
    results: list[Result] = []
    parts: dict[str, list[Conversation]] = {}
    for conv in convs:
        parts.setdefault(conv.part, []).append(conv)
    i = 0
    for part, members in parts.items():
        for turn in range(max(len(c.turns) for c in members)):
            todo = [(c, turn) for c in members if turn < len(c.turns)]
            for start in range(0, len(todo), concurrency):
                chunk = todo[start : start + concurrency]
                order = modes[i % len(modes):] + modes[: i % len(modes)]
                i += 1
                for mode in order:
                    # a batch's time is the batch's: count it once, on its last request
                    got = mode.run(chunk, max_tokens)
                    span = max(r.seconds for r in got)
                    for r in got:
                        r.seconds = 0.0
                    got[-1].seconds = span
                    results += got
    return results


def summarize(results: list[Result], labels: list[str]) -> dict[str, Any]:
    """tok/s per mode and part, ratios to the first mode, identity with it."""
    base = labels[0]
    by: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        by.setdefault((r.mode, r.part), []).append(r)
        by.setdefault((r.mode, "all"), []).append(r)
    parts = sorted({p for _, p in by}, key=lambda p: (p == "all", p))
    ref = {(r.part, r.rid): r.tokens for r in results if r.mode == base}
    table: dict[str, Any] = {}
    for part in parts:
        row: dict[str, Any] = {}
        for label in labels:
            rs = by.get((label, part), [])
            toks = sum(len(r.tokens) for r in rs)
            secs = sum(r.seconds for r in rs)
            row[label] = {"tokens": toks, "seconds": round(secs, 3),
                          "tok_s": round(toks / secs, 2) if secs else None,
                          "identical_to_" + base: all(ref.get((r.part, r.rid)) == r.tokens
                                                      for r in rs)}
        b = row[base]["tok_s"]
        for label in labels:
            t = row[label]["tok_s"]
            row[label]["ratio"] = round(t / b, 3) if t and b else None
        table[part] = row
    return table


def index_memory(results: list[Result]) -> dict[str, Any]:
    """The global index's bytes per 1,000 cached requests, this run's outputs replayed."""
    from draftwise_ngram.suffix_index import GlobalIndex

    outputs = [r.tokens for r in results if r.tokens] or [[0]]
    g = GlobalIndex(max_cached_requests=1000)
    for i in range(1000):
        g.start(f"r{i}", "k")
        g.extend(f"r{i}", outputs[i % len(outputs)])
        g.stop(f"r{i}")
    return {"requests": 1000, "tokens": g.num_tokens,
            "mean_output_tokens": round(g.num_tokens / 1000, 1),
            "bytes_measured": g.nbytes(), "bytes_estimated": g.estimated_bytes(),
            "bytes_per_token": round(g.nbytes() / max(1, g.num_tokens), 1)}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", action="append", default=None, metavar="LABEL=JSON",
                    help="a mode (repeatable; 'null' JSON: speculation off); default: off, "
                         "ngram, suffix")
    ap.add_argument("--model", default=None,
                    help="a GGUF target (default: the embedded SmolLM2), both engines")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--llama", action="append", default=None, metavar="LABEL=FLAGS",
                    help="a llama-server mode at concurrency 1 (repeatable), e.g. "
                         "'llama ngram-mod=--spec-type ngram-mod'; 'LABEL=' runs it plain")
    ap.add_argument("--llama-threads", type=int, default=None,
                    help="llama-server's -t (default --threads); on a shared machine its "
                         "spinning threads collapse when oversubscribed (measured: 3 tok/s "
                         "at -t 2 beside one busy core, 58 at -t 1)")
    ap.add_argument("--parts", default="edit,tool,shape,chat")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    specs = args.mode or [
        "off=null",
        'ngram={"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,'
        '"prompt_lookup_max":4}',
        'suffix={"method":"suffix"}',
    ]
    wanted = set(args.parts.split(","))
    convs = [c for c in workload() if c.part in wanted]
    report: dict[str, Any] = {"model": args.model, "threads": args.threads, "llama_threads": args.llama_threads,
                              "llama": args.llama, "max_tokens": args.max_tokens,
                              "modes": specs, "loadavg_before": loadavg(), "runs": {}}
    for conc in args.concurrency:
        modes: list[Any] = []
        for text in specs:
            label, _, cfg = text.partition("=")
            spec = None if cfg.strip() in ("", "null") else cfg
            modes.append(Mode(label, spec, args.threads, max(1, conc), args.model))
        if conc == 1:
            import shlex
            import tempfile

            log_dir = Path(tempfile.mkdtemp(prefix="agentic-llama-"))
            for text in args.llama or []:
                label, _, flags = text.partition("=")
                modes.append(LlamaMode(label, shlex.split(flags),
                                       args.llama_threads or args.threads, modes[0], log_dir,
                                       args.model))
        for m in modes:  # warm-up: first-call costs stay out of the numbers
            m.run([(Conversation("warm", "warm", ["Say hello."]), 0)], 8)
            m.history.clear()
        t0 = time.perf_counter()
        results = (run_c1(modes, convs, args.max_tokens) if conc == 1
                   else run_batched(modes, convs, args.max_tokens, conc))
        labels = [m.label for m in modes]
        report["runs"][f"c{conc}"] = {
            "wall_s": round(time.perf_counter() - t0, 1),
            "by_part": summarize(results, labels),
            "speculation": {m.label: m.proposer_stats() for m in modes},
        }
        for m in modes:
            if isinstance(m, LlamaMode):
                m.close()
        if conc == args.concurrency[0]:
            report["global_index_memory_per_1000_requests"] = index_memory(
                [r for r in results if not r.mode.startswith("llama")])
        print(json.dumps({f"c{conc}": report["runs"][f"c{conc}"]["by_part"]["all"]}),
              file=sys.stderr, flush=True)
        del modes
    report["loadavg_after"] = loadavg()
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
