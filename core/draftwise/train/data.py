"""``draftwise train data``: the target's own answers to a prompt mix, with its taps.

The loop: a batch of prompts through the engine (continuous batching, greedy and sampled
by a seeded share), each prompt + response teacher-forced once more for its hidden states
(``record.py``), written to shards (``shards.py``). The manifest advances only with a
written shard, so stopping at any point and running the same command again resumes where
the last shard ended and produces the same data: greedy rows are deterministic, a sampled
row's seed is the run's seed plus the prompt's index, and the engine's kernels are
batch-invariant, so a row's tokens do not depend on which batch it ran in.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftwise.train.prompts import Prompt
from draftwise.train.record import TapRecorder, default_taps
from draftwise.train.shards import ShardWriter


@dataclass(frozen=True, slots=True)
class DataPlan:
    """What one ``train data`` run makes; every budget is optional (the prompts end it)."""

    model: str | None
    out: Path
    taps: tuple[int, ...] | None = None  # None: default_taps of the target
    max_tokens: int = 256  # per response
    batch: int = 16  # prompts per engine call
    tokens: int | None = None  # stop after this many recorded tokens (this run and before)
    minutes: float | None = None  # stop after this long (this run)
    max_bytes: int | None = None  # stop before the data passes this size on disk
    sampled_share: float = 0.5  # the share of prompts answered by sampling
    temperature: float = 0.7
    seed: int = 0
    shard_tokens: int = 1 << 18
    shard_seconds: float = 600.0  # a shard at least this often (a resume starts there)
    threads: int | None = None


@dataclass(slots=True)
class Progress:
    """What a progress line reports, after each batch."""

    prompts_done: int
    prompts_total: int
    tokens: int  # recorded tokens on disk
    run_tokens: int  # generated (response) tokens this run
    seconds: float  # this run
    bytes: int
    skipped: int  # prompts too long for the context
    eta_seconds: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.run_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(slots=True)
class DataReport:
    """What the run ended with, and why it stopped."""

    out: Path
    taps: tuple[int, ...]
    stopped: str
    progress: Progress
    notes: list[str] = field(default_factory=list)


def generate_data(plan: DataPlan, prompts: list[Prompt],
                  progress: Callable[[Progress], None] | None = None) -> DataReport:
    """Run the plan over ``prompts`` (in their order), resuming from ``plan.out``."""
    import numpy as np

    from draftwise.llm import LLM
    from draftwise.sampling_params import SamplingParams

    llm = LLM(model=plan.model, num_threads=plan.threads)
    engine = llm.engine
    loaded = engine.loaded
    taps = plan.taps or default_taps(int(loaded.config.num_hidden_layers))
    recorder = TapRecorder(loaded, taps, engine.max_model_len)
    names = (*(f"tap{t}" for t in recorder.taps), "final")
    writer = ShardWriter(plan.out, names, int(loaded.config.hidden_size),
                         shard_tokens=plan.shard_tokens, shard_seconds=plan.shard_seconds,
                         meta={"model": str(loaded.path), "taps": list(recorder.taps),
                               "seed": plan.seed, "max_tokens": plan.max_tokens})
    t0 = time.monotonic()
    state = Progress(writer.prompts_done, len(prompts), int(writer.manifest["tokens"]), 0,
                     0.0, writer.bytes_written, 0)
    stopped = "prompts"
    i = writer.prompts_done
    room = engine.max_model_len - plan.max_tokens
    while i < len(prompts):
        reason = _budget_reached(plan, state)
        if reason is not None:
            stopped = reason
            break
        chunk = prompts[i:i + plan.batch]
        ids_list, params, kept = [], [], []
        for j, prompt in enumerate(chunk):
            ids = _prompt_ids(engine, prompt)
            if not 0 < len(ids) <= room:
                state.skipped += 1
                continue
            index = i + j
            sampled = random.Random(plan.seed * 1_000_003 + index).random() < plan.sampled_share
            params.append(SamplingParams(
                temperature=plan.temperature if sampled else 0.0, max_tokens=plan.max_tokens,
                seed=plan.seed + index if sampled else None))
            ids_list.append(ids)
            kept.append(index)
        outs = llm.generate([{"prompt_token_ids": ids} for ids in ids_list], params) \
            if ids_list else []
        for ids, out in zip(ids_list, outs):
            response = list(out.outputs[0].token_ids)
            seq = ids + response
            if len(seq) > engine.max_model_len:
                seq = seq[:engine.max_model_len]
            states = recorder.record(seq)
            writer.add(seq, len(ids), {k: v.numpy().astype(np.float16) for k, v in states.items()})
            state.run_tokens += len(response)
            state.tokens += len(seq)
        i += len(chunk)
        writer.prompts_finished(len(chunk))
        state.prompts_done, state.bytes = i, writer.bytes_written
        state.seconds = time.monotonic() - t0
        state.eta_seconds = _eta(plan, state, len(prompts))
        if progress is not None:
            progress(state)
    writer.prompts_finished(0, force=True)
    state.prompts_done = writer.prompts_done
    state.tokens = int(writer.manifest["tokens"])
    state.bytes = writer.bytes_written
    state.seconds = time.monotonic() - t0
    return DataReport(plan.out, recorder.taps, stopped, state)


def _prompt_ids(engine: Any, prompt: Prompt) -> list[int]:
    if prompt.messages is not None:
        return list(engine.apply_chat_template([dict(m) for m in prompt.messages], True))
    return list(engine.tokenize_prompt(prompt.text)[1])


def _budget_reached(plan: DataPlan, state: Progress) -> str | None:
    if plan.tokens is not None and state.tokens >= plan.tokens:
        return "tokens"
    if plan.minutes is not None and state.seconds >= plan.minutes * 60:
        return "minutes"
    if plan.max_bytes is not None and state.bytes >= plan.max_bytes:
        return "size"
    return None


def _eta(plan: DataPlan, state: Progress, total: int) -> float | None:
    """Seconds left by the tightest budget, at this run's pace so far."""
    if state.seconds <= 0 or state.run_tokens == 0:
        return None
    rate = state.tokens / state.seconds if state.tokens else 0.0
    left = [(total - state.prompts_done) * state.seconds / max(1, state.prompts_done)]
    if plan.tokens is not None and rate > 0:
        left.append(max(0.0, (plan.tokens - state.tokens) / rate))
    if plan.minutes is not None:
        left.append(max(0.0, plan.minutes * 60 - state.seconds))
    return min(x for x in left if math.isfinite(x))


__all__ = ["DataPlan", "DataReport", "Progress", "generate_data"]
