"""``draftwise train dspark``: a DSpark drafter with a reduced draft vocabulary, resumable.

The loop, checkpoints, exact resume and progress are the shared ones (``loop.py``); the
objective is ``dspark_objective.py``, the net ``dspark_net.py``, the saved layout
``dspark_layout.py`` (speculators', ``d2t``/``t2d`` included). What is DSpark's here:

1. the draft vocabulary is chosen once, from the training sequences' label counts
   (``dspark_objective`` rule 1), and is part of the run's fixed settings: a resumed run
   recomputes it and must find the same ids. The LM head is the target's rows at those
   ids, frozen (bf16, as the head the loss runs through in ``train dflash``);
2. a step draws anchors as DFlash's, builds next-token blocks, runs the backbone over
   every block of a sequence at once, the base logits through the reduced head, the
   teacher-forced Markov bias and the confidence logit, and steps AdamW on rule 5's
   loss (the Markov factors at ``markov_lr_scale`` times the rate: speculators found
   them barely training at the body's);
3. the held-out estimate is ``acceptance.walk_estimate`` with DSpark's drafts: per
   anchor, the whole block's greedy Markov pass (teacher-forced previous tokens give the
   same accepted prefix as the draft's own picks: up to the first miss they are equal),
   mapped through the draft vocabulary, so a token outside it is never accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftwise.errors import EngineConfigError
from draftwise.train.acceptance import Acceptance, walk_estimate
from draftwise.train.dflash_layout import CONFIG
from draftwise.train.dflash_net import DFlashShape
from draftwise.train.dspark_layout import save_drafter
from draftwise.train.dspark_net import DSparkNet
from draftwise.train.dspark_objective import (
    DEFAULT_GAMMA,
    choose_draft_vocab,
    coverage,
    next_token_blocks,
    slot_losses,
    slot_weights,
    target_probs,
    token_counts,
)
from draftwise.train.loop import (
    STATE,
    RunPlan,
    Target,
    TrainReport,
    TrainRun,
    check_budget,
    load_target,
    run_loop,
)
from draftwise.train.shards import Sequence
from draftwise.train.trainset import TrainSet, open_trainset

#: the plan fields a resumed run must share with the run it resumes
FIXED = ("block_size", "draft_vocab", "markov_rank", "intermediate_size",
         "mask_token_id", "lr", "markov_lr_scale", "warmup", "seed", "batch", "anchors",
         "gamma", "grad_clip", "held_out_share")


@dataclass(frozen=True, slots=True)
class DSparkPlan(RunPlan):
    """One ``train dspark`` run; ``steps`` counts every run into ``out``, ``minutes`` this one."""

    layers: int | None = None  # None: chosen by the measured cost model (shape.py)
    block_size: int = 4
    draft_vocab: int | None = None  # None: chosen by the measured cost model (shape.py)
    markov_rank: int = 64
    markov_lr_scale: float = 10.0
    gamma: float = DEFAULT_GAMMA


def check_plan(plan: DSparkPlan, vocab: int | None = None) -> None:
    """Refusals that need no data: each names the flag and what works."""
    check_budget("dspark", plan.steps, plan.minutes)
    if plan.block_size < 1:
        raise EngineConfigError(f"--block-size {plan.block_size}: a DSpark block drafts at "
                                "least one token. Instead: --block-size 1 or more (4-8).")
    if plan.layers is not None and plan.layers < 1:
        raise EngineConfigError(f"--layers {plan.layers}: a drafter needs at least 1 layer")
    if plan.markov_rank < 1:
        raise EngineConfigError(f"--markov-rank {plan.markov_rank}: the Markov head needs a "
                                "rank of at least 1. Instead: --markov-rank 64.")
    if plan.draft_vocab is not None and (
            plan.draft_vocab < 1 or (vocab is not None and plan.draft_vocab > vocab)):
        raise EngineConfigError(
            f"--draft-vocab {plan.draft_vocab}: a draft vocabulary is 1 to the target's "
            f"{vocab or 'vocabulary size'} tokens. Instead: e.g. --draft-vocab 8192.")


def make_shape(plan: DSparkPlan, target: Target, taps: tuple[int, ...], layers: int
               ) -> DFlashShape:
    """The backbone's shape: the target's width, heads and MLP, the plan's depth and
    block, the data's taps."""
    c = target.config
    mask = c.vocab_size - 1 if plan.mask_token_id is None else plan.mask_token_id
    if not 0 <= mask < c.vocab_size:
        raise EngineConfigError(f"--mask-token-id {mask} is outside the target's vocabulary "
                                f"[0, {c.vocab_size})")
    return DFlashShape(
        hidden_size=c.hidden_size, num_layers=layers, num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
        intermediate_size=plan.intermediate_size or c.intermediate_size,
        vocab_size=c.vocab_size, block_size=plan.block_size, target_layer_ids=taps,
        num_target_layers=c.num_hidden_layers, mask_token_id=mask,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
        max_position_embeddings=c.max_position_embeddings)


class Run(TrainRun):
    """DSpark's net, objective, layout and estimate on the shared loop (module doc)."""

    method = "dspark"

    def __init__(self, plan: DSparkPlan, target: Target, data: TrainSet, shape: DFlashShape,
                 draft_ids: torch.Tensor, cover: float) -> None:
        net = DSparkNet(shape, int(draft_ids.shape[0]), plan.markov_rank)
        net.init_weights(plan.seed)
        markov = list(net.markov_head.parameters())
        rest = [p for n, p in net.named_parameters() if not n.startswith("markov_head.")]
        groups: list[dict[str, Any]] = [
            {"params": rest}, {"params": markov, "lr_scale": plan.markov_lr_scale}]
        opt = torch.optim.AdamW(groups, lr=plan.lr, weight_decay=0.0)
        fixed = {k: getattr(plan, k) for k in FIXED}
        fixed.update(layers_chosen=shape.num_layers, draft_vocab=int(draft_ids.shape[0]),
                     mask_token_id=shape.mask_token_id,
                     intermediate_size=shape.intermediate_size,
                     data=str(Path(plan.data).resolve()), taps=list(data.taps),
                     train_sequences=len(data.train),
                     draft_ids_sum=int(draft_ids.sum()))
        super().__init__(plan, target, data, net, opt, fixed, CONFIG)
        self.dplan, self.shape, self.dnet = plan, shape, net
        self.draft_ids, self.cover = draft_ids, cover
        #: target id -> draft index (-1 outside: only read through ``in_vocab``)
        self.index = torch.full((shape.vocab_size,), -1, dtype=torch.int64)
        self.index[draft_ids] = torch.arange(draft_ids.shape[0])
        self.head_d = target.head_bf16.index_select(0, draft_ids).contiguous()  # [Vd, H]
        self.weights = slot_weights(shape.block_size, plan.gamma)

    def save_drafter(self) -> None:
        """speculators' layout (``dspark_layout.py``)."""
        save_drafter(self.dnet, self.target.head, self.draft_ids, self.plan.out,
                     self.target.facts.path)

    def report_dict(self) -> dict[str, Any]:
        """``draftwise_train.json``."""
        last = self.history[-1] if self.history else None
        return {
            "method": "dspark", "format": 1,
            "shape": self.shape.as_dict() | {
                "draft_vocab_size": int(self.draft_ids.shape[0]),
                "draft_vocab_coverage": round(self.cover, 4),
                "markov_rank": self.dplan.markov_rank, "gamma": self.dplan.gamma},
            "data": self.data_dict(),
            "training": {k: self.fixed[k] for k in ("lr", "markov_lr_scale", "warmup", "seed",
                                                     "batch", "anchors", "grad_clip")}
            | {"steps": self.step, "epochs": self.epochs(), "seconds": round(self.seconds, 1)},
            "losses": [round(x, 5) for x in self.losses],
            "acceptance": last,
            "acceptance_history": self.history,
        }

    def forward_blocks(self, seq: Sequence, ids: torch.Tensor, anchors: torch.Tensor
                       ) -> tuple[torch.Tensor, ...]:
        """Corrected logits ``[N, B, Vd]``, confidence logits, labels, valid, hidden."""
        s = self.shape
        blocks, labels, valid, prev = next_token_blocks(ids, anchors, s.block_size,
                                                        s.mask_token_id)
        hidden = self.dnet(self.data.taps_of(seq, self.last), self.target.embed[blocks],
                           anchors)
        n, b, h = hidden.shape
        base = torch.nn.functional.linear(hidden.reshape(-1, h).to(torch.bfloat16),
                                          self.head_d).float().view(n, b, -1)
        bias, conf = self.dnet.heads(hidden, prev)
        return base + bias, conf, labels, valid, hidden

    def train_step(self) -> tuple[float, int]:
        """One optimizer step; returns the step's loss and its supervised positions.
        ``mid_step`` is True while the cursor, weights or step may disagree."""
        self.mid_step = True
        plan = self.dplan
        items = self.next_batch(self.step_generator())
        b = self.shape.block_size
        total_w = sum(float(((a[:, None] + torch.arange(b) + 1 < len(ids)) * self.weights)
                            .sum()) for _, ids, a in items)
        self.set_lr()
        self.opt.zero_grad(set_to_none=True)
        loss, labelled = 0.0, 0
        for seq, ids, anchors in items:
            logits, conf, labels, valid, _ = self.forward_blocks(seq, ids, anchors)
            at = (anchors[:, None] + torch.arange(b)).clamp(max=len(ids) - 1)
            final = torch.from_numpy(np.asarray(seq.states["final"], dtype=np.float32))[at]
            with torch.no_grad():
                p_in, p_out = target_probs(final, self.target.head_bf16, self.draft_ids)
            label_d = self.index[labels]
            terms = slot_losses(logits, conf, label_d.clamp(min=0), label_d >= 0, p_in, p_out)
            part = (terms.total() * valid * self.weights).sum()
            (part / total_w).backward()
            loss += float(part.detach())
            labelled += int(valid.sum())
        return self.finish_step(plan.grad_clip, loss, total_w, labelled)

    @torch.no_grad()
    def hits(self, seq: Sequence, ids: torch.Tensor, start: int) -> list[list[bool]]:
        """Rule 3: for every anchor ``a`` in ``start .. T-3``, which of its
        ``min(B, T-a-2)`` greedy drafts equal the recorded tokens."""
        t, b = ids.shape[0], self.shape.block_size
        anchors = torch.arange(start, t - 2, dtype=torch.int64)
        if anchors.numel() == 0:
            return []
        out: list[list[bool]] = []
        for chunk in anchors.split(256):
            logits, _, labels, valid, _ = self.forward_blocks(seq, ids, chunk)
            match = (self.draft_ids[logits.argmax(-1)] == labels) & valid
            for a, row in zip(chunk.tolist(), match.tolist()):
                out.append(row[:min(b, t - a - 2)])
        return out

    def evaluate(self) -> Acceptance:
        """The held-out estimate (rule 3), recorded in the history."""
        self.net.eval()
        acc = walk_estimate(self.data.held_out, self.shape.block_size, self.hits,
                            self.target.head_bf16, self.dplan.eval_anchors)
        self.net.train()
        self.history.append({"step": self.step, **acc.as_dict()})
        return acc


def prepare(plan: DSparkPlan, say: Callable[[str], None]
            ) -> tuple[Target, TrainSet, DFlashShape, torch.Tensor, float]:
    """Refusals, the target, the data, the shape (measured, ``shape.py``, where the plan
    leaves it open) and the draft vocabulary (rule 1)."""
    check_plan(plan)
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    target = load_target(plan.model)
    vocab = int(target.config.vocab_size)
    check_plan(plan, vocab)
    data = open_trainset(plan.data, target.facts, min_response=2,
                         held_out_share=plan.held_out_share)
    counts = token_counts(data.train, vocab)
    layers, size = pick_shape(plan, target, data, counts, say)
    shape = make_shape(plan, target, data.taps, layers)
    ids = choose_draft_vocab(counts, size)
    cover = coverage(counts, ids)
    say(f"dspark: {shape.num_layers} layer(s), block {shape.block_size}, draft vocabulary "
        f"{ids.shape[0]} of {vocab} ({cover:.1%} of the training labels), markov rank "
        f"{plan.markov_rank}, taps {list(shape.target_layer_ids)}, mask "
        f"{shape.mask_token_id}")
    return target, data, shape, ids, cover


def pick_shape(plan: DSparkPlan, target: Target, data: TrainSet, counts: np.ndarray,
               say: Callable[[str], None]) -> tuple[int, int]:
    """Depth and draft vocabulary: the plan's, or the measured cost model's pick; the
    costs and break-even acceptance are printed either way. A resumed run keeps the
    shape it was started with (the measurement may differ run to run)."""
    from draftwise.train.shape import LAYERS, VOCABS, candidates, choose, measure_target

    vocab = int(target.config.vocab_size)
    saved = plan.out / STATE
    if (plan.layers is None or plan.draft_vocab is None) and saved.is_file():
        fixed = torch.load(saved, weights_only=False)["fixed"]
        layers = plan.layers or int(fixed["layers_chosen"])
        size = plan.draft_vocab or int(fixed["draft_vocab"])
        say(f"dspark: shape of the run in {plan.out}: {layers} layer(s), draft vocabulary "
            f"{size}")
        return layers, size
    t_target = measure_target(plan.model, plan.block_size)
    layers_tried = (plan.layers,) if plan.layers is not None else LAYERS
    vocabs = (plan.draft_vocab,) if plan.draft_vocab is not None else (*VOCABS, vocab)
    cands = candidates(counts, target.config, len(data.taps), plan.block_size,
                       plan.markov_rank, layers_tried, vocabs)
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    for c in cands:
        say(f"dspark: cost model: {c.describe(t_target)}")
    best = choose(cands, t_target)
    say(f"dspark: chosen: {best.layers} layer(s), draft vocabulary {best.draft_vocab}: "
        f"break-even acceptance {best.break_even(t_target):.2f}")
    return best.layers, best.draft_vocab


def train_dspark(plan: DSparkPlan, progress: Callable[[str], None] | None = None
                 ) -> TrainReport:
    """Run (or resume) ``plan`` until its budget; module doc for the steps."""
    say = progress or (lambda _line: None)
    target, data, shape, ids, cover = prepare(plan, say)
    return run_loop(lambda: Run(plan, target, data, shape, ids, cover), plan, say)


__all__ = ["DSparkPlan", "Run", "check_plan", "train_dspark"]
