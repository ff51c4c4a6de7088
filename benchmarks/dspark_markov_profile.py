"""Where DSpark's Markov pass spends its time, per head type, outside the engine.

A random Markov head of ``benchmarks/dspark_step.py``'s drafter (weights std 0.02, rank
256) at the ``tiny`` shape (H = 576, V = 49152) or the ``published`` one (H = 2560,
V = 151936), one row, base logits drawn with the spread of that drafter's LM head
(std 0.02 sqrt(H)), hidden states of unit RMS. Timed, as medians over ``--repeats``
runs (wall and the calling thread's CPU time, ms; torch at one thread, as in the engine):

- the torch pass's pieces per block position: the latent (``MarkovHead.latent``), the
  ``W2 u`` product (``MarkovHead.bias``), the pick (``argmax_rows`` of base + bias), the
  certified pick (``certified_argmax``) and a look-ahead guess (top-64 and gathered rows);
- the native pass (``markov_kernel.markov_pass``) over a block of ``--block`` positions: full
  products one position at a time, with the screen, and with windows;
- one ``W2`` product at 1..16 rows, after other memory was streamed (``cold``: the pass's
  situation after the draft's LM head) and straight after another (``warm``: ``W2`` in
  the last-level cache if it fits).

    python benchmarks/dspark_markov_profile.py --shape tiny --block 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

SHAPES = {"tiny": (576, 49152), "published": (2560, 151936)}


def timed(fn: Callable[[], Any], repeats: int, before: Callable[[], Any] | None = None
          ) -> dict[str, float]:
    """Median wall and thread-CPU ms of ``fn`` (``before`` runs untimed ahead of each)."""
    wall, cpu = [], []
    for _ in range(repeats):
        if before is not None:
            before()
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(1e3 * (time.thread_time() - c0))
        wall.append(1e3 * (time.perf_counter() - t0))
    return {"wall_ms": round(statistics.median(wall), 4), "cpu_ms": round(statistics.median(cpu), 4),
            "cpu_min_ms": round(min(cpu), 4)}


def make_head(kind: str, h: int, v: int, r: int) -> Any:
    from draftwise.models.linear import pack_weights
    from draftwise_dspark.markov import MarkovHead, MarkovWeights

    g = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return (0.02 * torch.randn(shape, generator=g)).bfloat16()

    mats = [rnd(v, r)] + ([rnd(r, h + r)] if kind == "gated" else [])
    mats += [rnd(3 * r, 2 * r + h)] if kind == "rnn" else []
    packed = pack_weights(mats)
    latent = None if kind == "vanilla" else (packed[1], rnd(packed[1].out_features))
    return MarkovHead(MarkovWeights(kind, rnd(v, r), packed[0],
                                    gate=latent if kind == "gated" else None,
                                    joint=latent if kind == "rnn" else None))


def main() -> None:
    from draftwise.models import kernels, markov_kernel
    from draftwise.sampling import argmax_rows
    from draftwise_dspark.lookahead import guess
    from draftwise_dspark.native import LANES, native_pass

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=tuple(SHAPES), default="tiny")
    ap.add_argument("--kinds", nargs="+", default=["vanilla", "gated", "rnn"])
    ap.add_argument("--block", type=int, default=7)
    ap.add_argument("--rank", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2, help="the native kernels' threads")
    args = ap.parse_args()
    h, v = SHAPES[args.shape]
    r, b = args.rank, args.block
    torch.set_num_threads(1)  # as the engine runs torch beside the native GEMM (bootstrap)
    kernels.set_kernel_threads(args.threads)
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(b, h, generator=g).bfloat16()
    base = (0.02 * h**0.5 * torch.randn(b, v, generator=g)).bfloat16().float()
    flush = torch.empty(64 << 20, dtype=torch.uint8)

    def evict() -> None:  # stream 64 MB: what the draft's LM head does before the pass
        flush.add_(1)

    report: dict[str, Any] = {"shape": args.shape, "hidden_size": h, "vocab_size": v,
                              "rank": r, "block": b, "kernel_threads": kernels.kernel_threads(),
                              "load_before": os.getloadavg(),
                              "w2_mb": round(v * r * 2 / 2**20, 1), "kinds": {}}
    for kind in args.kinds:
        head = make_head(kind, h, v, r)
        nat = native_pass(head, h)
        prev = torch.tensor([7])
        state = head.init_state(1, torch.bfloat16, torch.device("cpu"))
        u, _ = head.latent(prev, hidden[:1], state)
        bias = head.bias(u)
        rows = head.w2_rows()
        top = base[:1].topk(64, dim=1).indices
        out: dict[str, Any] = {"torch_per_position": {
            "latent": timed(lambda: head.latent(prev, hidden[:1], state), args.repeats),
            "w2_product_cold": timed(lambda: head.bias(u), args.repeats, evict),
            "w2_product_warm": timed(lambda: head.bias(u), args.repeats, lambda: head.bias(u)),
            "pick": timed(lambda: argmax_rows((base[:1] + bias).contiguous()), args.repeats),
            "certified_pick": timed(lambda: head.certified_argmax(base[:1], u), args.repeats),
            "guess": timed(lambda: guess(base[:1], u, base[:1].topk(64, dim=1).indices, rows),
                           args.repeats),
            "guess_gather_only": timed(lambda: guess(base[:1], u, top, rows), args.repeats),
        }}
        if nat is not None:
            def run(depth: int, screen: bool, cold: bool, lanes: int = LANES) -> dict[str, float]:
                def call() -> Any:
                    return markov_kernel.markov_pass(
                        nat.kernel, hidden, base, [b], [7], depth=depth, lanes=lanes,
                        screen=screen, give_up=10**6, max_blocks=max(4, v // 64 // 8),
                        guess_tokens=64, w2_rows=rows if depth else None)
                res = timed(call, args.repeats, evict if cold else None)
                phases: dict[str, list[float]] = {}
                for _ in range(args.repeats):  # the kernel's own per-phase wall clock
                    if cold:
                        evict()
                    stats = call()[2]
                    for key in ("ns_latent", "ns_screen", "ns_guess", "ns_product"):
                        phases.setdefault(key, []).append(stats[key] / 1e6)
                res.update({k: stats[k] for k in ("products", "certified", "guesses_held")})
                res.update({k.replace("ns_", "") + "_min_ms": round(min(x), 4)
                            for k, x in phases.items()})
                return res

            out["native_pass"] = {
                "full_products_cold": run(0, False, True),
                "full_products_warm": run(0, False, False),
                "screen_cold": run(0, True, True),
                "windows_cold": run(b - 1, False, True),
                "windows_and_screen_cold": run(b - 1, True, True),
            }
            us = torch.randn(16, r, generator=g).bfloat16()
            out["w2_product_rows"] = {
                str(m): {"cold": timed(lambda m=m: head.bias(us[:m]), args.repeats, evict),
                         "warm": timed(lambda m=m: head.bias(us[:m]), args.repeats,
                                       lambda m=m: head.bias(us[:m]))}
                for m in (1, 2, 4, 7, 8, 15, 16)}
        report["kinds"][kind] = out
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
