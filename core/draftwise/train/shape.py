"""The DSpark drafter's shape from costs measured on this machine, not copied from a paper.

Why: on a CPU the draft step decides everything. At SmolLM2-135M's size the frozen
49,152-token LM head is ~84% of a draft step, and the default model's DFlash drafter
(block 4, full vocabulary) ran slower than speculation off at acceptance 1.53. So the
trainer measures, at start, what a step of each candidate costs, and picks the shape
whose predicted speedup is highest (the break-even acceptance of each is printed):

1. the target: the engine's own cost model (``spec.cost_model.measure_costs``, the grid
   adaptive depth and ``doctor`` use: one row of ``1 .. B + 1`` tokens, on this thread's
   CPU clock), so a step of ``n`` drafts costs ``T(1 + n)`` and a plain step ``T(1)``;
2. a candidate drafter (``layers``, draft vocabulary ``Vd``, block ``B``): its step timed
   here with torch's bf16 GEMMs at the drafter's shapes: the context K/V of the tokens a
   step adds (``fc`` and each layer's ``k_proj``/``v_proj`` over two tokens), the block's
   ``B`` rows through each layer (projections, attention over a context of
   ``CONTEXT`` keys, the MLP), the reduced head ``[B, H] x [Vd, H]``, and the Markov
   pass (``B`` sequential ``W2 u`` products and argmaxes). These are the engine's
   drafter's GEMM shapes, not its kernels (a proxy: it ranks shapes; the engine
   measures the real cost online);
3. break-even acceptance ``tau* = (T(1 + B) + D) / T(1)`` (the tokens a step must commit
   to match speculation off); the predicted acceptance ``tau = 1 + sum_j (alpha c)^j``
   over the block's ``B`` slots, ``c`` the share of the data's labels inside the draft
   vocabulary (a token outside it is never drafted) and ``alpha`` a prior per-slot
   acceptance (:data:`PRIOR_ALPHA`); the speedup ``tau T(1) / (T(1 + B) + D)``;
4. the pick: the highest predicted speedup, ties to the cheaper draft step. The depth
   does not enter ``tau`` (no number here says what a second layer buys on this data),
   so a second layer is picked only where it costs nothing measurable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

#: a prior per-slot acceptance at full coverage: the smallest published DSpark run
#: (1,600 samples, block 4, ``shared/reference/training.md`` §0.3) reached tau 1.81,
#: which ``1 + a + a^2 + a^3 + a^4`` gives at a = 0.42
PRIOR_ALPHA = 0.42
#: the context keys the timed block attends to (a ~128-token prompt plus response)
CONTEXT = 192
#: draft vocabulary sizes tried when none is given
VOCABS = (4096, 8192, 16384)
#: depths tried when none is given
LAYERS = (1, 2)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One drafter shape and what it would cost and give (rule 3)."""

    layers: int
    draft_vocab: int
    block_size: int
    draft_seconds: float  # D
    coverage: float  # c

    def break_even(self, target: list[float]) -> float:
        """``tau*``: ``target[n]`` is ``T(n + 1)``."""
        return (target[self.block_size] + self.draft_seconds) / target[0]

    def predicted_tau(self, alpha: float = PRIOR_ALPHA) -> float:
        """Rule 3's acceptance."""
        p = alpha * self.coverage
        return 1.0 + sum(p ** j for j in range(1, self.block_size + 1))

    def speedup(self, target: list[float], alpha: float = PRIOR_ALPHA) -> float:
        """Rule 3's predicted speedup over speculation off."""
        return self.predicted_tau(alpha) / self.break_even(target)

    def describe(self, target: list[float]) -> str:
        """One line of the printed table."""
        return (f"layers {self.layers}, draft vocab {self.draft_vocab} ({self.coverage:.1%} "
                f"of labels), block {self.block_size}: draft step {self.draft_seconds * 1e3:.2f}"
                f" ms, verify {target[self.block_size] * 1e3:.2f} ms, plain step "
                f"{target[0] * 1e3:.2f} ms; break-even acceptance "
                f"{self.break_even(target):.2f}, predicted {self.predicted_tau():.2f} "
                f"(speedup {self.speedup(target):.2f}x)")


def choose(candidates: list[Candidate], target: list[float],
           alpha: float = PRIOR_ALPHA) -> Candidate:
    """Rule 4: the highest predicted speedup, ties to the cheaper draft step."""
    return max(candidates, key=lambda c: (round(c.speedup(target, alpha), 6),
                                          -c.draft_seconds))


def measure_target(model: str | None, block_size: int) -> list[float]:
    """Rule 1: ``[T(1), .., T(B + 1)]`` seconds, from the engine's cost model."""
    from draftwise import LLM
    from draftwise.spec.cost_model import measure_costs

    torch_threads = torch.get_num_threads()
    llm = LLM(model=model, num_threads=1)
    engine = llm.engine
    cost = measure_costs(engine.runner, engine.kv, block_size, 1, threads=1)
    torch.set_num_threads(torch_threads)
    return [cost.step_seconds(1, n) for n in range(1, block_size + 2)]


def _best(fn: Callable[[], object], repeats: int) -> float:
    """The least CPU time of ``repeats`` calls (one thread: the quiet machine's cost)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


@torch.no_grad()
def time_draft_step(hidden: int, heads: int, kv_heads: int, head_dim: int,
                    intermediate: int, taps: int, layers: int, draft_vocab: int,
                    block_size: int, markov_rank: int, repeats: int = 20) -> float:
    """Rule 2: one draft step of this shape, seconds (random bf16 weights)."""
    g = torch.Generator().manual_seed(0)
    bf = torch.bfloat16

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(bf)

    fc, kvw = w(hidden, taps * hidden), w(2 * kv_heads * head_dim, hidden)
    qw, ow = w(heads * head_dim, hidden), w(hidden, heads * head_dim)
    up, down = w(2 * intermediate, hidden), w(hidden, intermediate)
    head, w2 = w(draft_vocab, hidden), w(draft_vocab, markov_rank)
    keys = w(kv_heads, CONTEXT + block_size, head_dim)
    x_ctx, x = w(2, taps * hidden), w(block_size, hidden)
    u = w(1, markov_rank)
    group = heads // kv_heads

    def step() -> None:
        c = F.linear(x_ctx, fc)
        h = x
        for _ in range(layers):
            F.linear(c, kvw)
            q = F.linear(h, qw).view(block_size, kv_heads, group * head_dim)
            kvb = F.linear(h, kvw)
            s = torch.einsum("bkd,ktd->kbt", q[..., :head_dim], keys)
            a = torch.einsum("kbt,ktd->bkd", torch.softmax(s.float(), -1).to(bf), keys)
            h = h + F.linear(a.repeat(1, 1, group).reshape(block_size, -1), ow) + kvb[:, :1]
            gu = F.linear(h, up)
            h = h + F.linear(F.silu(gu[:, :intermediate]) * gu[:, intermediate:], down)
        base = F.linear(h, head).float()
        for j in range(block_size):
            (base[j] + F.linear(u, w2).float()[0]).argmax()

    return _best(step, repeats)


def candidates(counts: np.ndarray, config: object, taps: int, block_size: int,
               markov_rank: int, layers: tuple[int, ...], vocabs: tuple[int, ...]
               ) -> list[Candidate]:
    """Rule 2 for every (layers, vocabulary) pair, with each vocabulary's coverage."""
    from draftwise.train.dspark_objective import choose_draft_vocab, coverage

    c = config
    out = []
    vocab = int(c.vocab_size)  # type: ignore[attr-defined]
    for v in sorted({min(v, vocab) for v in vocabs}):
        cover = coverage(counts, choose_draft_vocab(counts, v))
        for n in layers:
            seconds = time_draft_step(
                int(c.hidden_size), int(c.num_attention_heads),  # type: ignore[attr-defined]
                int(c.num_key_value_heads), int(c.head_dim),  # type: ignore[attr-defined]
                int(c.intermediate_size), taps, n, v, block_size,  # type: ignore[attr-defined]
                markov_rank)
            out.append(Candidate(n, v, block_size, seconds, cover))
    return out


__all__ = ["CONTEXT", "LAYERS", "PRIOR_ALPHA", "VOCABS", "Candidate", "candidates", "choose",
           "measure_target", "time_draft_step"]
