"""``draftwise doctor``: is this target + speculative config worth serving, and with what k?

Three parts, each usable on its own:

1. :func:`pairing_checks`: per chain member, what its draft checkpoint says against the
   target (format, vocabulary size, tokenizer overlap and special tokens, context length,
   tapped layers, chat template). Refusals already happened when the engine was built;
   these are the findings that load but cost acceptance.
2. :func:`simulate_walk`: teacher-forced acceptance. The target's own greedy continuation
   of each prompt is generated once (speculation off for those requests); the proposers
   then draft at exactly the positions an online run with depth k would visit (prefill
   samples one token, each step moves by accepted + 1, drafts are cut to the tokens left),
   and are scored against the continuation. No target forward is needed per k, and for a
   greedy run the result is the acceptance online speculation measures.
3. :func:`report`: acceptance per position, predicted speedup per k from the measured cost
   model (:mod:`draftwise.spec.cost_model`), measured speedup per k when asked (the same engine,
   per-request depth), and a recommended config.

Only proposers without their own KV or hidden-state inputs can be walked offline (they
draft from tokens alone). A drafter that reads the target's hidden states is predicted
instead from the held-out estimate its trainer saved beside it
(:func:`training_estimate`: ``draftwise train`` walks held-out greedy rows exactly as the
engine decodes them, within 0.003 of online acceptance) and this machine's measured
costs (:func:`estimate_speedup`); without such an estimate it is refused by name, with
the online measurement (``draftwise bench``) as what works instead.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.metrics import SpecDecodingStats
from draftwise.sampling_params import SamplingParams
from draftwise.spec.params import SpeculativeParams
from draftwise.speculator import DraftInput, DraftRow, VerifyOutcome

if TYPE_CHECKING:
    from draftwise.spec.cost_model import CostModel
    from draftwise.engine import LLMEngine
    from draftwise.spec.speculation import Speculation


class DoctorError(DraftwiseError, ValueError):
    """What the doctor cannot do for this config, and what would work instead."""


@dataclass(slots=True)
class Finding:
    """One pairing check: ``ok``, ``warn`` or ``info``, with what was compared."""

    member: str
    check: str
    status: str
    detail: str


@dataclass(slots=True)
class Walk:
    """One depth's offline walk over every prompt."""

    k: int
    stats: SpecDecodingStats
    #: tokens emitted in all, decode steps taken (the prefill sample not counted)
    num_tokens: int = 0
    num_steps: int = 0
    #: draft tokens verified per decode step, in order (what the forward would carry)
    drafts_per_step: list[int] = field(default_factory=list)
    #: seconds the proposers took in the walk, and the draft tokens they were asked for
    propose_seconds: float = 0.0
    num_asked: int = 0


# -- 1. pairing ---------------------------------------------------------------------------


def pairing_checks(engine: LLMEngine) -> list[Finding]:
    """What each chain member's checkpoint says against the target (no weights read)."""
    from draftwise.spec.draft_stage import detect_drafts
    from draftwise.formats.default_model import resolve_model_path
    from draftwise.plugins.manager import load_speculators

    spec, config = engine.spec, engine.spec_config
    if spec is None or config is None:
        raise DoctorError("doctor needs a speculative config: give --speculative-config")
    target = engine.loaded
    _, detected = detect_drafts(config, load_speculators(), resolve_model_path(engine.args.model))
    out: list[Finding] = []
    layers = int(target.config.num_hidden_layers)
    for d, drafter in zip(detected, spec.drafters):
        name = drafter.method
        if d.checkpoint is None:
            out.append(Finding(name, "checkpoint", "ok",
                               "reads no checkpoint: drafts from the tokens alone"))
            continue
        ck = d.checkpoint
        out.append(Finding(name, "format", "info",
                           f"{ck.format} {ck.architecture} at {ck.path}"))
        vocab = ck.config.get("vocab_size")
        tv = int(target.config.vocab_size)
        out.append(Finding(name, "vocab_size", "ok" if vocab in (None, tv) else "warn",
                           f"draft {vocab}, target {tv}"))
        ctx = ck.config.get("max_position_embeddings")
        if isinstance(ctx, int):
            short = ctx < engine.max_model_len
            out.append(Finding(
                name, "context", "warn" if short else "ok",
                f"draft {ctx}, engine max_model_len {engine.max_model_len}"
                + (": rows past it are not drafted" if short else ""),
            ))
        if drafter.hidden_layers:
            bad = [h for h in drafter.hidden_layers if not 0 <= h < layers]
            out.append(Finding(name, "hidden_layers", "warn" if bad else "ok",
                               f"taps {list(drafter.hidden_layers)} of {layers} target layers"))
        out += _tokenizer_findings(name, ck.path, engine)
    return out


def _tokenizer_findings(member: str, path: str, engine: LLMEngine) -> list[Finding]:
    """Token-to-id overlap, special tokens and chat template of a draft directory."""
    from draftwise.formats.chat import chat_template_from_dir
    from draftwise.formats.tokenizer import Tokenizer, find_tokenizer_file, read_tokenizer_config

    directory = path if os.path.isdir(path) else os.path.dirname(path)
    file = find_tokenizer_file(directory) if directory else None
    target = engine.tokenizer
    if file is None or target is None:
        return [Finding(member, "tokenizer", "info",
                        "the draft ships no tokenizer.json: it is assumed to share the "
                        "target's ids")]
    draft = Tokenizer.from_file(file, read_tokenizer_config(directory))
    dv = draft.backend.get_vocab(with_added_tokens=True)
    tv = target.backend.get_vocab(with_added_tokens=True)
    same = sum(1 for tok, i in tv.items() if dv.get(tok) == i)
    share = same / max(1, len(tv))
    out = [Finding(member, "tokenizer", "ok" if share == 1.0 else "warn",
                   f"{100 * share:.1f}% of the target's tokens have the same id in the draft")]
    specials = (draft.bos_token_id == target.bos_token_id
                and set(draft.eos_token_ids) == set(target.eos_token_ids))
    out.append(Finding(member, "special_tokens", "ok" if specials else "warn",
                       f"bos {draft.bos_token_id}/{target.bos_token_id}, eos "
                       f"{list(draft.eos_token_ids)}/{list(target.eos_token_ids)} (draft/target)"))
    dt = chat_template_from_dir(directory)
    tt = engine.loaded.chat_template.source if engine.loaded.chat_template else None
    status = "ok" if dt == tt else ("info" if dt is None or tt is None else "warn")
    out.append(Finding(member, "chat_template", status,
                       "same" if dt == tt else "differs (or one is absent)"))
    return out


# -- 2. the offline walk ------------------------------------------------------------------


def greedy_continuations(
    engine: LLMEngine, prompts: list[list[int]], max_tokens: int, ignore_eos: bool = False
) -> list[list[int]]:
    """The target's own greedy output per prompt (speculation off for these requests)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    off = SpeculativeParams(enabled=False) if engine.spec is not None else None
    ids = [engine.add_request({"prompt_token_ids": p}, params, speculative=off) for p in prompts]
    done: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    return [done[i] for i in ids]


def walkable(spec: Speculation) -> bool:
    """Whether every member drafts from tokens alone (the offline walk can run it)."""
    return not any(d.own_kv or d.hidden_layers for d in spec.drafters)


def check_walkable(spec: Speculation) -> None:
    """Refuse members that need the target's state to draft, naming them."""
    for d in spec.drafters:
        if d.own_kv or d.hidden_layers:
            raise DoctorError(
                f"method '{d.method}' drafts from its own KV or the target's hidden states, "
                "which the offline walk does not provide. Instead: measure it online with "
                "`draftwise bench --compare-off`, or keep the draftwise_train.json "
                "`draftwise train` saved beside the drafter (doctor predicts from it)."
            )


def simulate_walk(
    spec: Speculation,
    prompts: list[list[int]],
    continuations: list[list[int]],
    max_tokens: int,
    k: int,
    max_model_len: int,
) -> Walk:
    """Draft where an online greedy run at depth ``k`` would, score against the target.

    Mirrors the engine step for step: the prefill samples token 0 with no drafts; at each
    decode step the row may draft ``min(k, tokens left - 1, context left - 1)``; the chain
    is asked in order (first member with a draft wins); accepted = the draft's longest
    prefix equal to the continuation; the row moves by accepted + 1.
    """
    check_walkable(spec)
    walk = Walk(k, SpecDecodingStats(spec.k))
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    for n, (prompt, cont) in enumerate(zip(prompts, continuations)):
        req_id = f"doctor-{k}-{n}"
        tokens = np.asarray(list(prompt) + list(cont), dtype=np.int64)
        t = 1 if cont else 0  # the prefill's sample
        while t < len(cont):
            cap = max(0, min(k, max_tokens - t - 1, max_model_len - (len(prompt) + t) - 1))
            draft, owner = _propose(spec, walk, req_id, tokens[: len(prompt) + t], cap, greedy)
            acc = 0
            while acc < len(draft) and t + acc < len(cont) and draft[acc] == cont[t + acc]:
                acc += 1
            if len(draft):
                walk.stats.observe_draft(len(draft), acc)
                fb = VerifyOutcome([req_id], [len(draft)], [acc], [list(cont[t : t + acc + 1])])
                spec.drafters[owner].proposer.on_verified(fb)
            walk.drafts_per_step.append(len(draft))
            walk.num_steps += 1
            t += acc + 1
        walk.num_tokens += len(cont)
        for d in spec.drafters:
            d.proposer.release(req_id)
    return walk


def merge_walks(walks: list[Walk]) -> Walk:
    """Per-prompt walks of one depth as one."""
    out = Walk(walks[0].k, SpecDecodingStats(walks[0].stats.num_spec_tokens))
    for w in walks:
        out.stats.merge(w.stats)
        out.num_tokens += w.num_tokens
        out.num_steps += w.num_steps
        out.drafts_per_step += w.drafts_per_step
        out.propose_seconds += w.propose_seconds
        out.num_asked += w.num_asked
    return out


def _propose(
    spec: Speculation, walk: Walk, req_id: str, tokens: np.ndarray, cap: int,
    params: SamplingParams,
) -> tuple[np.ndarray, int]:
    """The chain's draft for one row (first member with a draft wins), timed."""
    if cap <= 0:
        return np.zeros(0, dtype=np.int64), 0
    walk.num_asked += cap
    for pid, drafter in enumerate(spec.drafters):
        room = cap if drafter.max_model_len is None else min(cap, drafter.max_model_len
                                                             - len(tokens))
        if room <= 0:
            continue
        t0 = time.perf_counter()
        out = drafter.proposer.propose(DraftInput([DraftRow(req_id, tokens, room, params)]))
        walk.propose_seconds += time.perf_counter() - t0
        if out.num_draft_tokens[0]:
            return np.asarray(out.token_ids[: out.num_draft_tokens[0]]), pid
    return np.zeros(0, dtype=np.int64), 0


# -- 2b. a trained drafter's own estimate ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class TrainingEstimate:
    """The held-out acceptance ``draftwise train`` saved beside a drafter: the share of
    draft steps whose first j + 1 drafts all held, j = 0 .. block - 2."""

    path: str
    method: str
    through_slot: tuple[float, ...]
    steps: int
    sequences: int

    def expected_tokens(self, k: int) -> float:
        """Tokens a step commits verifying ``k`` of the block's drafts."""
        return 1.0 + sum(self.through_slot[:k])

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {"path": self.path, "method": self.method, "steps": self.steps,
                "sequences": self.sequences,
                "accepted_through_slot": list(self.through_slot)}


def training_estimate(engine: LLMEngine) -> TrainingEstimate | None:
    """The trainer's held-out estimate of the config's (first) drafter that has one, or
    None. An estimate from before the walk (no ``steps``: the per-anchor figure, which read
    2.11 where the drafter accepted 1.60 online) is refused by name with how to refresh it."""
    from pathlib import Path

    from draftwise.train.loop import REPORT

    config = engine.spec_config
    for member in config.drafters if config is not None else ():
        report = Path(member.model, REPORT) if member.model else None
        if report is None or not report.is_file():
            continue
        try:
            doc = json.loads(report.read_text())
            acc = doc["acceptance"]
            through = tuple(float(x) for x in acc["accepted_through_slot"])
            steps, rows = int(acc["steps"]), int(acc["sequences"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DoctorError(
                f"{report}: no held-out estimate of the current form ({exc!r}). Instead: "
                f"`draftwise train estimate --drafter {member.model} --data DATA --save` "
                "with the data folder it was trained on") from exc
        if acc.get("mean_acceptance_length") is None or not steps:
            raise DoctorError(f"{report}: its held-out rows had no greedy row to walk, so "
                              "there is no estimate. Instead: measure it online with "
                              "`draftwise bench --compare-off`")
        return TrainingEstimate(str(member.model), str(doc.get("method", member.method)),
                                through, steps, rows)
    return None


def draft_step_seconds(engine: LLMEngine, prompt: list[int], max_tokens: int) -> float:
    """Seconds the drafters take per drafting step, timed on one request at the config's
    full depth (a block drafter's forward costs the same whatever k it is cut to)."""
    spec = engine.spec
    assert spec is not None
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ask = SpeculativeParams(enabled=True, num_speculative_tokens=spec.k,
                            adaptive=False if spec.policy is not None else None)
    p0, d0 = engine.stats.timings.propose, spec.metrics.num_drafts
    engine.add_request({"prompt_token_ids": prompt}, params, speculative=ask)
    while engine.has_unfinished_requests():
        engine.step()
    steps = spec.metrics.num_drafts - d0
    if not steps:
        raise DoctorError("the drafter made no draft on the workload's first prompt, so its "
                          "price could not be timed. Instead: a longer --max-tokens")
    return (engine.stats.timings.propose - p0) / steps


def estimate_speedup(est: TrainingEstimate, k: int, cost: CostModel,
                     draft_seconds: float) -> float:
    """Plain time over speculative time per token at fixed depth ``k``: a step commits
    ``est.expected_tokens(k)`` tokens for a forward of 1 + k tokens and one drafting step."""
    plain = cost.step_seconds(1, 1)
    spec = cost.step_seconds(1, 1 + k) + draft_seconds
    return est.expected_tokens(k) * plain / spec if spec else 1.0


# -- 3. the report ------------------------------------------------------------------------


def predicted_speedup(walk: Walk, cost: CostModel) -> float:
    """Plain time over speculative time for the walk, from the measured single-row costs."""
    plain = walk.num_tokens * cost.step_seconds(1, 1)
    draft_per_token = walk.propose_seconds / walk.num_asked if walk.num_asked else 0.0
    spec = cost.step_seconds(1, 1)  # the prefill's sampling step stands for itself
    spec *= min(1, walk.num_tokens)
    spec += sum(cost.step_seconds(1, 1 + nd) for nd in walk.drafts_per_step)
    spec += walk.num_asked * draft_per_token
    return plain / spec if spec else 1.0


def measured_speedup(
    engine: LLMEngine, prompts: list[list[int]], max_tokens: int, ks: list[int],
    ignore_eos: bool = False,
) -> dict[int, float]:
    """Wall-clock speed at each fixed depth over depth 0, same engine, one request at a time.

    Depths are interleaved per prompt (each prompt runs at every k before the next), so a
    load change on a shared machine lands on every k alike.
    """
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    fixed = False if engine.spec is not None and engine.spec.policy is not None else None
    seconds = dict.fromkeys([0, *ks], 0.0)
    for p in prompts:
        for k in seconds:
            ask = SpeculativeParams(enabled=k > 0, num_speculative_tokens=k or None,
                                    adaptive=fixed)
            t0 = time.perf_counter()
            engine.add_request({"prompt_token_ids": p}, params, speculative=ask)
            while engine.has_unfinished_requests():
                engine.step()
            seconds[k] += time.perf_counter() - t0
    return {k: seconds[0] / seconds[k] for k in ks if seconds[k]}


def recommend(config: dict[str, Any], speedups: dict[int, float], per_prompt_best: set[int],
              ) -> dict[str, Any]:
    """The config to serve: the best k, adaptive when prompts disagree, or none at all."""
    best_k = max(speedups, key=lambda k: speedups[k])
    if speedups[best_k] < 1.0:
        return {"speculative_config": None,
                "why": f"no depth beats plain decoding (best {speedups[best_k]:.2f}x at "
                       f"k={best_k}); serve without speculation, or with adaptive depth, "
                       "which turns itself off"}
    out = dict(config)
    ns = dict(out.get("draftwise") or {})
    if "drafter_chain" not in ns:
        out["num_speculative_tokens"] = best_k
    why = f"k={best_k} is fastest ({speedups[best_k]:.2f}x)"
    if len(per_prompt_best) > 1:
        ns["adaptive"] = True
        why += (f"; prompts disagree on their best k ({sorted(per_prompt_best)}), so adaptive "
                "depth picks per request")
    if ns:
        out["draftwise"] = ns
    return {"speculative_config": out, "why": why}


def table(walks: list[Walk], predicted: dict[int, float], measured: dict[int, float]) -> str:
    """The printed table: acceptance per position (deepest walk), then one line per k."""
    deepest = walks[-1].stats
    rates = ", ".join(f"{r:.3f}" if r is not None else "-"
                      for r in deepest.summary()["acceptance_rate_per_pos"])
    lines = [f"acceptance per position (k={walks[-1].k}): {rates}"]
    lines.append(f"{'k':>3} {'drafts':>7} {'accepted':>9} {'mean_acc_len':>13} "
                 f"{'predicted':>10} {'measured':>9}")
    for w in walks:
        s = w.stats.summary()
        mal = s["mean_acceptance_length"]
        meas = measured.get(w.k)
        lines.append(
            f"{w.k:>3} {s['num_draft_tokens']:>7} {s['num_accepted_tokens']:>9} "
            f"{(f'{mal:.2f}' if mal else '-'):>13} {predicted[w.k]:>9.2f}x "
            f"{(f'{meas:.2f}x' if meas else '-'):>9}"
        )
    return "\n".join(lines)


def as_json(obj: Any) -> str:
    """Indented JSON for ``--json``."""
    return json.dumps(obj, indent=2, default=str)


__all__ = [
    "DoctorError",
    "Finding",
    "TrainingEstimate",
    "Walk",
    "check_walkable",
    "draft_step_seconds",
    "estimate_speedup",
    "greedy_continuations",
    "measured_speedup",
    "merge_walks",
    "pairing_checks",
    "predicted_speedup",
    "recommend",
    "simulate_walk",
    "table",
    "training_estimate",
    "walkable",
]
