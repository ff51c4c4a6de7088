"""A trained DFlash drafter online against its training forward, step by step.

Why: the trainer's held-out estimate and the engine's online acceptance must measure the
same thing; when they disagree, this finds where. For the greedy held-out rows of a
``train data`` folder (``draftwise.train.acceptance`` rule 1) it

1. runs the engine greedily on each row's prompt, at fixed depth, and logs every step's
   context hidden states (what the drafter was handed) and drafts;
2. compares the handed states with the data folder's recording of the same positions
   (the tap convention, the context after an accepted run, the bonus token, rollback);
3. recomputes each step's drafts with the training forward (float32, the trainer's
   head) over the recorded taps, and counts the steps whose drafts agree;
4. prints the engine's acceptance beside the estimate's walk over the same rows.

Usage (1 thread, a few minutes for 45 rows of 128 tokens on the default model)::

    python benchmarks/dflash_online_vs_offline.py --drafter DIR --data DIR [--rows 8]

Measured on the default model's first drafter (45 rows): states equal to the recording
at every handed position (max abs difference 0.0), the float32 forward's drafts at 91% of
the bfloat16 engine's steps, online 1.602 tokens a step against the walk's 1.603.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True, type=Path)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--model", default=None)
    ap.add_argument("--rows", type=int, default=8, help="greedy held-out rows to run")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from draftwise import LLM, SamplingParams
    from draftwise.train.acceptance import estimate_acceptance, greedy_path
    from draftwise.train.dflash import HELD_OUT_SHARE, load_target
    from draftwise.train.dflash_layout import CONFIG, load_weights, shape_of
    from draftwise.train.dflash_net import DFlashNet
    from draftwise.train.trainset import open_trainset

    shape = shape_of(json.loads((args.drafter / CONFIG).read_text()))
    t = load_target(args.model)
    data = open_trainset(args.data, t.facts, 2, HELD_OUT_SHARE)
    net = DFlashNet(shape)
    load_weights(net, args.drafter)
    net.eval()
    last, k = t.facts.num_layers - 1, shape.block_size - 1
    rows = [s for s in data.held_out if greedy_path(
        torch.from_numpy(np.asarray(s.token_ids, dtype=np.int64)), s.states["final"],
        s.response_start, t.head_bf16)][: args.rows]

    llm = LLM(model=args.model, num_threads=1, speculative_config={
        "method": "dflash", "model": str(args.drafter), "num_speculative_tokens": k,
        "draftwise": {"adaptive": False}})
    proposer = llm.engine.spec.proposers[0]
    target = llm.engine.loaded.model
    seen: list[dict[str, Any]] = []
    original = proposer.propose

    def propose(batch: Any) -> Any:
        out = original(batch)
        for i, row in enumerate(batch.rows):
            seen.append({"n": len(row.token_ids), "s": row.num_kv_computed,
                         "hidden": {a: b.clone() for a, b in (row.hidden or {}).items()},
                         "drafts": out.row(i).tolist()})
        return out

    proposer.propose = propose  # type: ignore[method-assign]
    same_out = agree = steps = handed = 0
    max_diff = 0.0
    for seq in rows:
        ids = np.asarray(seq.token_ids, dtype=np.int64)
        rs = seq.response_start
        seen.clear()
        out = llm.generate([{"prompt_token_ids": ids[:rs].tolist()}],
                           SamplingParams(temperature=0.0, max_tokens=len(ids) - rs))
        same_out += list(out[0].outputs[0].token_ids) == ids[rs:].tolist()
        taps = data.taps_of(seq, last)  # [T, taps * H]
        for st in seen:
            n, s = st["n"], st["s"]
            if st["hidden"]:
                got = torch.cat([target.final_norm(st["hidden"][layer]).float() if layer == last
                                 else st["hidden"][layer].float()
                                 for layer in shape.target_layer_ids], 1)
                max_diff = max(max_diff, float((got - taps[s:n - 1]).abs().max()))
                handed += n - 1 - s
            if not st["drafts"]:
                continue
            steps += 1
            block = torch.tensor([[int(ids[n - 1])] + [shape.mask_token_id] * len(st["drafts"])])
            with torch.no_grad():
                hid = net(taps[:n - 1], t.embed[block], torch.tensor([n - 1]))
            mine = F.linear(hid[0, 1:].to(t.head_bf16.dtype), t.head_bf16).argmax(-1).tolist()
            agree += mine == st["drafts"]
    online = llm.engine.spec.metrics.summary()
    est = estimate_acceptance(net, rows, lambda s: data.taps_of(s, last), t.embed,
                              t.head_bf16, 10**9)
    print(json.dumps({
        "rows": len(rows), "outputs_as_recorded": same_out, "positions_handed": handed,
        "handed_states_max_abs_diff": max_diff, "draft_steps": steps,
        "steps_drafting_the_training_forward_argmax": agree,
        "online": {key: online[key] for key in ("num_drafts", "mean_acceptance_length",
                                                "acceptance_rate_per_pos")},
        "offline_walk": est.as_dict()}, indent=2))


if __name__ == "__main__":
    main()
