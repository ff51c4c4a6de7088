"""What every ``draftwise train <method>`` shares: the frozen target pieces, the data
cursor, checkpoints with exact resume, and the budgeted loop with progress.

Why one module: ``train dflash`` and ``train dspark`` differ in their net, objective,
layout and estimate, and in nothing else; a method supplies those through a
:class:`TrainRun` subclass (``train_step``, ``evaluate``, ``save_drafter``,
``report_dict``) and :func:`run_loop` drives it. Rule by rule:

1. the target is loaded once (float32) for what every drafter shares with it and never
   trains: the embedding (block inputs, the mask slots included) and the LM head
   (:func:`load_target`);
2. a step reads the next ``batch`` training sequences from the cursor (``epoch``,
   ``position`` in ``TrainSet.order(seed, epoch)``) and draws its randomness from a
   generator seeded by ``(seed, step)`` (:meth:`TrainRun.step_generator`);
3. every ``checkpoint_minutes`` (and at the end, a budget, or Ctrl-C between steps; a
   Ctrl-C inside a step drops that step and keeps the last checkpoint) the drafter is
   written in the method's layout and ``train_state.pt`` beside it: weights, AdamW's
   state, the cursor, the step, the losses. Running the same command again resumes from
   it, and the loss curve and weights are those of an uninterrupted run (same thread
   count: torch's CPU kernels are deterministic for a fixed one); a run with other
   ``fixed`` settings is refused by name;
4. a held-out acceptance estimate before the first step, every ``eval_minutes`` and at
   the end; ``draftwise_train.json`` in the drafter folder keeps what ``report_dict``
   says (what ``doctor`` reads).
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from draftwise.errors import DraftwiseError, EngineConfigError
from draftwise.train.trainset import TargetFacts, TrainSet

STATE = "train_state.pt"
REPORT = "draftwise_train.json"
#: every 20th usable sequence of the data folder is held out (``trainset`` rule 2)
HELD_OUT_SHARE = 0.05


class TrainResumeError(DraftwiseError, ValueError):
    """``--out`` holds a run this one cannot resume (another shape, data or seed)."""


@dataclass(frozen=True, slots=True)
class RunPlan:
    """What every trainer's run takes, with the defaults they share (one place for them);
    a method's plan adds its shape options. ``steps`` counts every run into ``out``,
    ``minutes`` this one."""

    data: Path
    out: Path
    model: str | None = None
    intermediate_size: int | None = None  # None: the target's
    mask_token_id: int | None = None  # None: the target's last vocabulary id
    steps: int | None = None
    minutes: float | None = None
    lr: float = 1e-3
    warmup: int = 50
    seed: int = 0
    threads: int | None = None
    batch: int = 4  # sequences per step
    anchors: int = 32  # blocks per sequence
    grad_clip: float = 1.0
    held_out_share: float = HELD_OUT_SHARE
    checkpoint_minutes: float = 5.0
    eval_minutes: float = 5.0
    eval_anchors: int = 4096  # blocks the held-out walk may draft (acceptance.py)
    progress_seconds: float = 10.0


class LoopPlan(Protocol):
    """The plan fields the loop reads (every method's frozen plan has them)."""

    @property
    def out(self) -> Path: ...

    @property
    def steps(self) -> int | None: ...

    @property
    def minutes(self) -> float | None: ...

    @property
    def seed(self) -> int: ...

    @property
    def batch(self) -> int: ...

    @property
    def anchors(self) -> int: ...

    @property
    def lr(self) -> float: ...

    @property
    def warmup(self) -> int: ...

    @property
    def checkpoint_minutes(self) -> float: ...

    @property
    def eval_minutes(self) -> float: ...

    @property
    def progress_seconds(self) -> float: ...


@dataclass(slots=True)
class TrainReport:
    """How the run ended: steps (all runs), why it stopped, the curve and the estimates."""

    out: Path
    step: int
    stopped: str
    losses: list[float]
    acceptance: dict[str, Any]  # the last estimate (acceptance.Acceptance.as_dict + step)
    history: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(slots=True)
class Target:
    """The frozen pieces the drafter shares with the target (rule 1)."""

    facts: TargetFacts
    config: Any
    embed: torch.Tensor  # [V, H] float32
    head: torch.Tensor  # [V, H] float32
    #: the head the loss runs through: bf16 GEMMs ran 3.4x faster than float32 here (2-core
    #: EPYC, avx512_bf16: 86 vs 26 GFLOP/s), the head is >80% of a step's FLOPs, and the
    #: engine runs the drafter's head in bf16 by default anyway
    head_bf16: torch.Tensor  # [V, H]


def load_target(model: str | None) -> Target:
    """The target's embedding and LM head as float32 tensors (a quantized head is
    recovered as ``lm_head(I)``: the same function, whatever its storage)."""
    from draftwise.models.loader import load_model

    loaded = load_model(model, dtype="float32")
    m, cfg = loaded.model, loaded.config
    with torch.no_grad():
        embed = m.embed(torch.arange(cfg.vocab_size)).float().contiguous()
        w = m.lm_head_weight
        head = (w.detach().float().contiguous() if isinstance(w, torch.Tensor)
                else m.lm_head(torch.eye(cfg.hidden_size)).T.contiguous())
    facts = TargetFacts(str(loaded.path), int(cfg.hidden_size), int(cfg.num_hidden_layers))
    return Target(facts, cfg, embed, head, head.to(torch.bfloat16))


def check_budget(method: str, steps: int | None, minutes: float | None) -> None:
    """A run needs a budget (rule 3's resume counts steps over every run)."""
    if steps is None and minutes is None:
        raise EngineConfigError(f"train {method} needs a budget: --steps N (all runs into "
                                "--out together) or --minutes M (this run)")


class TrainRun(ABC):
    """The loop's state between steps (rules 2-3); a method subclasses it."""

    method = "?"

    def __init__(self, plan: LoopPlan, target: Target, data: TrainSet, net: torch.nn.Module,
                 opt: torch.optim.Optimizer, fixed: dict[str, Any], config_name: str) -> None:
        self.plan, self.target, self.data = plan, target, data
        self.net, self.opt, self.fixed = net, opt, fixed
        self.config_name = config_name  # the layout's config file: a drafter without state
        self.step, self.epoch, self.position = 0, 0, 0
        self.order = data.order(plan.seed, 0)
        self.losses: list[float] = []
        self.history: list[dict[str, Any]] = []
        self.seconds = 0.0  # training seconds, every run
        self.mid_step = False
        self.last = target.facts.num_layers - 1

    # -- what a method supplies ----------------------------------------------------------
    @abstractmethod
    def train_step(self) -> tuple[float, int]:
        """One optimizer step: the loss and the supervised positions."""

    @abstractmethod
    def evaluate(self) -> Any:
        """Rule 4's estimate (an ``Acceptance``), appended to ``history``."""

    @abstractmethod
    def save_drafter(self) -> None:
        """The drafter in the method's layout, into ``plan.out``."""

    @abstractmethod
    def report_dict(self) -> dict[str, Any]:
        """``draftwise_train.json``."""

    # -- shared --------------------------------------------------------------------------
    def step_generator(self) -> torch.Generator:
        """Rule 2: the step's randomness, a function of (seed, step) alone."""
        return torch.Generator().manual_seed(
            int(np.random.SeedSequence([self.plan.seed, self.step]).generate_state(1)[0]))

    def next_sequences(self) -> list[int]:
        """The cursor's next ``batch`` training sequence indices (new epochs reshuffle)."""
        picks = []
        for _ in range(self.plan.batch):
            if self.position >= len(self.order):
                self.epoch, self.position = self.epoch + 1, 0
                self.order = self.data.order(self.plan.seed, self.epoch)
            picks.append(int(self.order[self.position]))
            self.position += 1
        return picks

    def next_batch(self, gen: torch.Generator) -> list[tuple[Any, torch.Tensor, torch.Tensor]]:
        """The step's training sequences as (recorded sequence, its ids, its ``anchors``
        positions over the response, drawn from ``gen``), in the cursor's order (every
        method's step starts here, so the draws of a resumed run are the uninterrupted
        one's)."""
        from draftwise.train.dflash_objective import sample_anchors

        out = []
        for i in self.next_sequences():
            seq = self.data.train[i]
            ids = torch.from_numpy(np.asarray(seq.token_ids, dtype=np.int64))
            out.append((seq, ids, sample_anchors(len(ids), seq.response_start,
                                                 self.plan.anchors, gen)))
        return out

    def finish_step(self, grad_clip: float, loss: float, total_weight: float,
                    labelled: int) -> tuple[float, int]:
        """The end of every method's ``train_step``: clip, step the optimizer, count the
        step and record its loss (the summed weighted loss over the step's weight)."""
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), grad_clip)
        self.opt.step()
        self.step += 1
        value = loss / total_weight
        self.losses.append(value)
        self.mid_step = False
        return value, labelled

    def set_lr(self) -> None:
        """Linear warmup, then constant: a step's rate never depends on the budget.
        A group's ``lr_scale`` (default 1) multiplies it."""
        lr = self.plan.lr * min(1.0, (self.step + 1) / max(1, self.plan.warmup))
        for group in self.opt.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)

    def resume(self) -> bool:
        """Load ``train_state.pt`` when there is one; refuse another run's."""
        path = self.plan.out / STATE
        if not path.is_file():
            if (self.plan.out / self.config_name).is_file():
                raise TrainResumeError(
                    f"--out {self.plan.out} holds a drafter without {STATE}: not a run this "
                    "command can resume. Instead: another --out.")
            return False
        state = torch.load(path, weights_only=False)
        if state.get("method", "dflash") != self.method:
            raise TrainResumeError(
                f"--out {self.plan.out} holds a {state.get('method', 'dflash')} run, not a "
                f"{self.method} one. Instead: another --out.")
        diff = {k: (state["fixed"].get(k), v) for k, v in self.fixed.items()
                if state["fixed"].get(k) != v}
        if diff:
            said = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
            raise TrainResumeError(
                f"--out {self.plan.out} holds a run with other settings ({said}). Instead: "
                "the same settings to resume it, or another --out.")
        self.net.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.step, self.epoch, self.position = state["step"], state["epoch"], state["position"]
        self.order = self.data.order(self.plan.seed, self.epoch)
        self.losses, self.history = list(state["losses"]), list(state["history"])
        self.seconds = float(state["seconds"])
        return True

    def save(self) -> None:
        """The drafter, then the state, then the report (each written atomically)."""
        from draftwise.train.dflash_layout import write_json

        out = self.plan.out
        out.mkdir(parents=True, exist_ok=True)
        self.save_drafter()
        state = {"format": 1, "method": self.method, "fixed": self.fixed,
                 "model": self.net.state_dict(), "optimizer": self.opt.state_dict(),
                 "step": self.step, "epoch": self.epoch, "position": self.position,
                 "losses": self.losses, "history": self.history, "seconds": self.seconds,
                 "rng": {"step": "torch.Generator seeded by (seed, step)",
                         "order": "numpy default_rng([seed, epoch])"}}
        tmp = out / f"{STATE}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, out / STATE)
        write_json(out / REPORT, self.report_dict())

    def data_dict(self) -> dict[str, Any]:
        """The report's data section."""
        return {"path": self.fixed["data"], "model": self.data.model,
                "taps": list(self.data.taps), "tokens": self.data.tokens,
                "train_sequences": len(self.data.train),
                "held_out_sequences": len(self.data.held_out)}

    def epochs(self) -> float:
        """Epochs done, fractional."""
        return round(self.epoch + self.position / max(1, len(self.data.train)), 3)


def run_loop(make_run: Callable[[], TrainRun], plan: LoopPlan,
             say: Callable[[str], None]) -> TrainReport:
    """Rules 2-4: resume or start, then step until the budget, checkpointing and
    estimating on the clock; ``make_run`` builds a fresh run (a Ctrl-C inside a step
    rebuilds it from the last checkpoint)."""
    run = make_run()
    name = run.method
    resumed = run.resume()
    say(f"{name}: {'resuming at step ' + str(run.step) if resumed else 'new run'}: data "
        f"{len(run.data.train)} train / {len(run.data.held_out)} held-out sequences")
    if not run.history:
        acc = run.evaluate()
        say(f"{name}: held-out acceptance before training {acc.describe()}")
    plan.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    mark_ckpt = mark_eval = mark_say = t0
    start_step, labelled_total = run.step, 0
    stopped = "steps"
    try:
        while True:
            now = time.monotonic()
            if plan.steps is not None and run.step >= plan.steps:
                stopped = "steps"
                break
            if plan.minutes is not None and now - t0 >= plan.minutes * 60:
                stopped = "minutes"
                break
            s0 = time.monotonic()
            _, labelled = run.train_step()
            run.seconds += time.monotonic() - s0
            labelled_total += labelled
            now = time.monotonic()
            if now - mark_say >= plan.progress_seconds or run.step == start_step + 1:
                mark_say = now
                say(progress_line(run, plan, now - t0, run.step - start_step, labelled_total))
            if now - mark_eval >= plan.eval_minutes * 60:
                mark_eval = now
                acc = run.evaluate()
                say(f"{name}: step {run.step}: held-out acceptance {acc.describe()}")
            if now - mark_ckpt >= plan.checkpoint_minutes * 60:
                mark_ckpt = now
                run.save()
    except KeyboardInterrupt:
        stopped = "interrupted"
        if run.mid_step:  # a half-done step is dropped: back to the last checkpoint
            run = make_run()
            run.resume()
            say(f"{name}: interrupted inside a step; keeping the checkpoint at step {run.step}")
    if not run.history or run.history[-1]["step"] != run.step:
        run.evaluate()
    run.save()
    last = run.history[-1]
    say(f"{name}: stopped by {stopped} at step {run.step}; held-out acceptance "
        f"{mean_text(last)}; drafter in {plan.out}")
    return TrainReport(plan.out, run.step, stopped, run.losses, last, run.history,
                       time.monotonic() - t0)


def mean_text(acceptance: dict[str, Any]) -> str:
    """An estimate's mean acceptance length as printed (``none`` without greedy rows)."""
    value = acceptance.get("mean_acceptance_length")
    return "none" if value is None else f"{value:.3f}"


def progress_line(run: TrainRun, plan: LoopPlan, elapsed: float, steps: int,
                  labelled: int) -> str:
    """A progress line: step, smoothed loss, supervised tokens/s, ETA."""
    recent = run.losses[-10:]
    rate = labelled / elapsed if elapsed > 0 else 0.0
    left = []
    if plan.steps is not None and steps:
        left.append((plan.steps - run.step) * elapsed / steps)
    if plan.minutes is not None:
        left.append(max(0.0, plan.minutes * 60 - elapsed))
    eta = f", ETA {min(left) / 60:.1f} min" if left else ""
    total = f"/{plan.steps}" if plan.steps is not None else ""
    return (f"{run.method}: step {run.step}{total}, loss {sum(recent) / len(recent):.4f}, "
            f"{rate:.0f} tok/s{eta}")


__all__ = ["HELD_OUT_SHARE", "REPORT", "STATE", "LoopPlan", "RunPlan", "Target", "TrainReport",
           "TrainResumeError", "TrainRun", "check_budget", "load_target", "mean_text",
           "progress_line", "run_loop"]
