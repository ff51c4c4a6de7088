"""``draftwise train mtp``: an MTP head for a target that ships none, on the shared loop.

The loop, checkpoints, exact resume and the held-out walk are ``loop.py``'s and
``acceptance.py``'s; the net is ``mtp_net.py`` (what the mtp plugin runs, rules there), the
layout ``mtp_layout.py`` (DeepSeek ``nextn`` names the plugin loads by ``"model"``). What
is MTP's here:

1. the head reads the target's last layer BEFORE its final norm (the plugin's
   ``hidden_layer``), so the data folder must record tap ``num_hidden_layers - 1`` (the
   default taps do); its ``final`` (post-norm) state cannot stand in: the norm drops each
   row's scale, and the head would be trained on an input the engine never gives it. A
   folder without that tap is refused by name;
2. a step draws ``anchors`` positions ``a`` per sequence over the response (``response_start
   <= a <= T - 2``: the engine's anchor is the last committed token, its hidden state not
   yet computed), runs step 1 over every pair position of the sequence (causal, one
   forward) and the recursion ``s = 2 .. depth`` at the anchors only, teacher-forced on
   the recorded tokens with the head's own outputs fed back (the plugin's loop); the loss
   is CE on the recorded token ``a + s`` (the target's next-next token for ``s = 1``: the
   published MTP recipe), every step weighted alike (DeepSeek-V3's mean over depths),
   normalised by the step's labelled count. CE and not a distillation to the target's
   distribution: the data keeps the post-norm state from which ``train dspark`` recomputes
   it, but that doubles the LM-head GEMMs that dominate a step here;
3. the held-out estimate is ``acceptance.walk_estimate`` with the head's own recursive
   greedy drafts (fed its own argmax, as online): ``acceptance`` at ``eval_k`` (what
   ``doctor`` reads) and ``acceptance_per_k`` for k = 1 .. ``eval_k`` (the same drafts:
   the recursion is causal, so k's drafts are a prefix of ``eval_k``'s).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from draftwise.errors import EngineConfigError
from draftwise.train.acceptance import Acceptance, walk_estimate
from draftwise.train.dflash_layout import CONFIG
from draftwise.train.loop import (
    RunPlan,
    Target,
    TrainReport,
    TrainRun,
    check_budget,
    load_target,
    run_loop,
)
from draftwise.train.mtp_layout import save_head
from draftwise.train.mtp_net import MtpNet, MtpShape, chain_logits
from draftwise.train.shards import DataFolderError, Sequence
from draftwise.train.trainset import TrainSet, open_trainset

#: the plan fields a resumed run must share with the run it resumes
FIXED = ("layers", "depth", "intermediate_size", "lr", "warmup", "seed", "batch", "anchors",
         "grad_clip", "held_out_share")


@dataclass(frozen=True, slots=True)
class MtpPlan(RunPlan):
    """One ``train mtp`` run; ``steps`` counts every run into ``out``, ``minutes`` this one."""

    layers: int = 1  # MTP layers (the plugin writes real pairs into layer 0's KV only)
    depth: int = 2  # recursive steps the loss covers (rule 2)
    eval_k: int = 3  # drafts per step the held-out walk runs (rule 3)


def check_plan(plan: MtpPlan) -> None:
    """Refusals that need no target or data: each names the flag and what works."""
    check_budget("mtp", plan.steps, plan.minutes)
    if plan.layers != 1:
        raise EngineConfigError(
            f"--layers {plan.layers}: the mtp plugin fills only its first MTP layer's KV "
            "with the target's pairs (a second layer would attend to scratch alone), so a "
            "trained head has one layer. Instead: --layers 1, and --depth for k > 1.")
    if plan.depth < 1:
        raise EngineConfigError(f"--depth {plan.depth}: the loss covers at least the first "
                                "step. Instead: --depth 1 or more (2-3).")
    if plan.eval_k < 1:
        raise EngineConfigError(f"--eval-k {plan.eval_k}: the walk drafts at least one "
                                "token a step. Instead: --eval-k 1 or more.")
    if plan.mask_token_id is not None:
        raise EngineConfigError(f"--mask-token-id {plan.mask_token_id}: an MTP head has no "
                                "mask slots. Instead: leave it out.")


def make_shape(plan: MtpPlan, target: Target) -> MtpShape:
    """The head's shape from the target's config; what the plugin cannot run is refused."""
    c = target.config
    if getattr(c, "hybrid", None) is not None or not hasattr(c, "window_of"):
        raise EngineConfigError("train mtp: the target is not llama-family; a GDN hybrid "
                                "ships its own MTP head. Instead: that head (mtp without "
                                "'model').")
    odd = [name for name, on in (("o_proj bias", c.o_proj_bias), ("MLP bias", c.mlp_bias),
                                 ("sliding-window first layer", c.window_of(0) is not None))
           if on]
    if odd:
        raise EngineConfigError(f"train mtp: the target has {', '.join(odd)}, which the "
                                "mtp plugin's nextn layer does not load. Instead: ngram "
                                "or draft_model for this target.")
    if plan.intermediate_size not in (None, c.intermediate_size):
        raise EngineConfigError(
            f"intermediate_size {plan.intermediate_size}: the mtp plugin builds the head's "
            f"layer at the target's MLP size ({c.intermediate_size}). Instead: leave it out.")
    return MtpShape(
        hidden_size=c.hidden_size, num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
        intermediate_size=c.intermediate_size,
        vocab_size=c.vocab_size, num_target_layers=c.num_hidden_layers,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
        max_position_embeddings=c.max_position_embeddings,
        attention_bias=bool(c.attention_bias), qk_norm=bool(c.qk_norm),
        rope_scaling=c.rope_scaling)


class Run(TrainRun):
    """MTP's net, objective, layout and estimate on the shared loop (module doc)."""

    method = "mtp"

    def __init__(self, plan: MtpPlan, target: Target, data: TrainSet, shape: MtpShape) -> None:
        net = MtpNet(shape)
        net.init_weights(plan.seed)
        opt = torch.optim.AdamW(net.parameters(), lr=plan.lr, weight_decay=0.0)
        fixed = {k: getattr(plan, k) for k in FIXED}
        fixed.update(intermediate_size=shape.intermediate_size,
                     data=str(Path(plan.data).resolve()), train_sequences=len(data.train))
        super().__init__(plan, target, data, net, opt, fixed, CONFIG)
        self.mplan, self.shape, self.mnet = plan, shape, net

    def save_drafter(self) -> None:
        """The plugin's ``deepseek_nextn`` layout (``mtp_layout.py``)."""
        save_head(self.mnet, self.plan.out)

    def report_dict(self) -> dict[str, Any]:
        """``draftwise_train.json``."""
        last = self.history[-1] if self.history else None
        return {
            "method": "mtp", "format": 1,
            "shape": self.shape.as_dict() | {"layers": self.mplan.layers,
                                             "layout": "deepseek_nextn",
                                             "hidden_layer": self.last,
                                             "hidden": "pre-final-norm"},
            "data": self.data_dict(),
            "training": {k: self.fixed[k] for k in ("lr", "warmup", "seed", "batch",
                                                     "anchors", "depth", "grad_clip")}
            | {"steps": self.step, "epochs": self.epochs(), "seconds": round(self.seconds, 1),
               "objective": "CE on the recorded token a + s, steps s = 1 .. depth alike"},
            "losses": [round(x, 5) for x in self.losses],
            "eval_k": self.mplan.eval_k,
            "acceptance": last,
            "acceptance_per_k": last.get("per_k") if last else None,
            "acceptance_history": self.history,
        }

    def chain(self, seq: Sequence, ids: torch.Tensor, anchors: torch.Tensor, depth: int,
              teacher: bool) -> list[torch.Tensor]:  # per step s: [N, V] logits
        """``mtp_net.chain_logits`` over one recorded sequence (rule 1's tap)."""
        return chain_logits(self.mnet, self.target.embed, self.target.head_bf16, ids,
                            head_input(seq.states, self.last), anchors, depth, teacher)

    def train_step(self) -> tuple[float, int]:
        """One optimizer step; ``mid_step`` is True while cursor, weights or step may
        disagree."""
        self.mid_step = True
        plan = self.mplan
        items = self.next_batch(self.step_generator())
        total = sum(int((a[:, None] + torch.arange(1, plan.depth + 1) < len(ids)).sum())
                    for _, ids, a in items)
        self.set_lr()
        self.opt.zero_grad(set_to_none=True)
        loss = 0.0
        for seq, ids, anchors in items:
            part = torch.zeros(())
            for s, logits in enumerate(self.chain(seq, ids, anchors, plan.depth, True), 1):
                at = anchors + s
                valid = at < len(ids)
                ce = F.cross_entropy(logits, ids[at.clamp(max=len(ids) - 1)],
                                     reduction="none")
                part = part + (ce * valid).sum()
            (part / max(1, total)).backward()
            loss += float(part.detach())
        return self.finish_step(plan.grad_clip, loss, max(1, total), total)

    @torch.no_grad()
    def hits(self, seq: Sequence, ids: torch.Tensor, start: int) -> list[list[bool]]:
        """Rule 3: for every anchor ``a`` in ``start .. T-3``, which of its
        ``min(eval_k, T-a-2)`` own greedy drafts equal the recorded tokens."""
        t, k = ids.shape[0], self.mplan.eval_k
        anchors = torch.arange(start, t - 2, dtype=torch.int64)
        if anchors.numel() == 0:
            return []
        drafts = torch.stack([x.argmax(-1) for x in self.chain(seq, ids, anchors, k, False)],
                             dim=1)  # [N, k]
        at = (anchors[:, None] + torch.arange(1, k + 1)).clamp(max=t - 1)
        match = (drafts == ids[at]).tolist()
        return [row[:min(k, t - a - 2)] for a, row in zip(anchors.tolist(), match)]

    def evaluate(self) -> Acceptance:
        """The held-out walk at ``eval_k`` and at every smaller k, recorded in the history."""
        self.net.eval()
        cache: dict[int, list[list[bool]]] = {}

        def hits_of(seq: Sequence, ids: torch.Tensor, start: int) -> list[list[bool]]:
            if id(seq) not in cache:
                cache[id(seq)] = self.hits(seq, ids, start)
            return cache[id(seq)]

        def cut(j: int) -> Callable[[Sequence, torch.Tensor, int], list[list[bool]]]:
            return lambda seq, ids, start: [h[:j] for h in hits_of(seq, ids, start)]

        k = self.mplan.eval_k
        per_k = {}
        for j in range(1, k + 1):
            acc = walk_estimate(self.data.held_out, j, cut(j), self.target.head_bf16,
                                self.mplan.eval_anchors)
            per_k[str(j)] = acc.as_dict()
        self.net.train()
        self.history.append({"step": self.step, **acc.as_dict(), "per_k": {
            j: d["mean_acceptance_length"] for j, d in per_k.items()}})
        return acc


def head_input(states: Mapping[str, Any], last: int) -> torch.Tensor:  # [T, H] float32
    """Rule 1: what the plugin hands the head, from a sequence's recorded states: the
    last layer's tap (before the final norm), never ``final``."""
    return torch.from_numpy(np.asarray(states[f"tap{last}"], dtype=np.float32))


def prepare(plan: MtpPlan, say: Callable[[str], None]) -> tuple[Target, TrainSet, MtpShape]:
    """Refusals, the target, the data (with rule 1's tap), the shape."""
    check_plan(plan)
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    target = load_target(plan.model)
    shape = make_shape(plan, target)
    data = open_trainset(plan.data, target.facts, min_response=2,
                         held_out_share=plan.held_out_share)
    last = target.facts.num_layers - 1
    if last not in data.taps:
        raise DataFolderError(
            f"--data {plan.data} records taps {list(data.taps)}, not the target's last layer "
            f"{last}: an MTP head reads that layer's output before the final norm, which the "
            "recorded post-norm state cannot give back. Instead: `draftwise train data "
            f"--taps ...,{last}` (the default taps include it).")
    say(f"mtp: 1 layer (deepseek nextn layout), depth {plan.depth}, reads layer {last} "
        f"before the final norm, walk at k = 1 .. {plan.eval_k}")
    return target, data, shape


def train_mtp(plan: MtpPlan, progress: Callable[[str], None] | None = None) -> TrainReport:
    """Run (or resume) ``plan`` until its budget; module doc for the steps."""
    say = progress or (lambda _line: None)
    target, data, shape = prepare(plan, say)
    return run_loop(lambda: Run(plan, target, data, shape), plan, say)


__all__ = ["MtpPlan", "Run", "check_plan", "head_input", "train_mtp"]
