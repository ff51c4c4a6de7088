"""The one place logits become token choices.

The request's settings are ``draftwise.sampling_params.SamplingParams`` (importable from
here too, as before the split). Everything that turns target logits into a
distribution lives here (:func:`process_logits`, :func:`probs_from_logits`), so
verification (``draftwise.spec.verify``) and probabilistic drafters use exactly the same
temperature / min-p / top-k / top-p processing as plain sampling.

Randomness: a request with a seed owns a ``torch.Generator``; each row draws its
uniforms from its own generator only (:func:`draw_uniforms`), so a seeded request
samples the same tokens whatever else is in the batch. A token is drawn from a
distribution by inverse CDF with ONE uniform (:func:`categorical`): one draw per token,
no per-vocabulary noise (49152 exponentials per row would cost ~0.7 ms on CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from draftwise.models import kernels
from draftwise.models.backend import ARGMAX
from draftwise.sampling_params import SamplingParams

#: top-p first looks for its nucleus among this many most likely tokens (exact; falls
#: back to a full sort only when they hold less than ``top_p`` of the mass)
TOP_P_CANDIDATES = 1024
#: the "keep every token" top-k of rows without a top-k limit (clamped to the vocab size)
_TOP_K_ALL = 2**62


def make_generator(seed: int) -> torch.Generator:
    """The private CPU generator of a seeded request."""
    return torch.Generator().manual_seed(seed)


@dataclass(frozen=True, slots=True)
class SamplingMetadata:
    """Per-row sampling settings of a batch as tensors, built once per step.

    A field is None when no row needs it, so an all-greedy batch carries nothing but
    the greedy mask. Rows without a limit hold the identity value (top-k >= vocab,
    top-p 1, min-p 0); greedy rows hold temperature 1 (never used to sample).
    """

    greedy: np.ndarray  # [num_rows] bool
    temperature: torch.Tensor | None = None  # [num_rows] float32; None: all 1 (no scaling)
    top_k: torch.Tensor | None = None  # [num_rows] int64
    top_p: torch.Tensor | None = None  # [num_rows] float32
    min_p: torch.Tensor | None = None  # [num_rows] float32

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams]) -> SamplingMetadata:
        """Gather one batch's settings; cheap (no tensors) when every row is greedy."""
        greedy = np.fromiter((p.is_greedy for p in params), dtype=bool, count=len(params))
        if greedy.all():
            return cls(greedy)
        temps = [1.0 if g else p.temperature for p, g in zip(params, greedy)]
        top_k = top_p = min_p = None
        if any(p.top_k is not None for p in params):
            top_k = torch.tensor([_TOP_K_ALL if p.top_k is None else p.top_k for p in params])
        if any(p.top_p < 1.0 for p in params):
            top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
        if any(p.min_p > 0.0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32)
        temperature = (
            None if all(t == 1.0 for t in temps) else torch.tensor(temps, dtype=torch.float32)
        )
        return cls(greedy, temperature, top_k, top_p, min_p)

    @property
    def num_rows(self) -> int:
        """Rows in the batch."""
        return int(self.greedy.shape[0])

    @property
    def all_greedy(self) -> bool:
        """True when the whole batch is an argmax (no probabilities needed)."""
        return bool(self.greedy.all())

    def select(self, rows: np.ndarray) -> SamplingMetadata:
        """The settings of a subset of rows, in the given order."""
        idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        return SamplingMetadata(
            self.greedy[rows], *(None if t is None else t[idx] for t in self._tensors())
        )

    def repeat(self, counts: np.ndarray) -> SamplingMetadata:
        """Row ``i``'s settings repeated ``counts[i]`` times (one per verified position)."""
        reps = torch.from_numpy(np.asarray(counts, dtype=np.int64))
        return SamplingMetadata(
            np.repeat(self.greedy, counts),
            *(None if t is None else t.repeat_interleave(reps) for t in self._tensors()),
        )

    def probs(self, logits: torch.Tensor) -> torch.Tensor:  # [num_rows, V] -> [num_rows, V]
        """The target distribution of each (non-greedy) row after all processing."""
        return probs_from_logits(logits, self.temperature, self.top_k, self.top_p, self.min_p)

    def _tensors(self) -> tuple[torch.Tensor | None, ...]:
        """The per-row tensors, in constructor order (for select / repeat)."""
        return (self.temperature, self.top_k, self.top_p, self.min_p)


def process_logits(
    logits: torch.Tensor,  # [N, V] float32
    temperature: torch.Tensor | None,  # [N] float32 (> 0)
    top_k: torch.Tensor | None = None,  # [N] int64; >= V keeps every token
    top_p: torch.Tensor | None = None,  # [N] float32 in (0, 1]
    min_p: torch.Tensor | None = None,  # [N] float32 in [0, 1]
) -> torch.Tensor:  # [N, V] float32, removed tokens at -inf
    """Temperature, then min-p, top-k, top-p (vLLM's order); never edits ``logits`` in place."""
    out = logits.float()
    if temperature is not None:
        out = out / temperature.to(out.dtype).unsqueeze(1)
    if min_p is not None:
        rows = torch.nonzero(min_p > 0).squeeze(1)
        if rows.numel():
            sub = _rows(out, rows)
            probs = sub.softmax(-1)
            keep = probs >= probs.amax(-1, keepdim=True) * min_p[rows].unsqueeze(1)
            out = _put_rows(out, logits, rows, sub.masked_fill(~keep, float("-inf")))
    if top_k is not None:
        k = top_k.clamp(1, out.shape[1])
        rows = torch.nonzero(k < out.shape[1]).squeeze(1)
        if rows.numel():
            sub, kr = _rows(out, rows), k[rows]
            kth = sub.topk(int(kr.max()), dim=-1).values.gather(1, (kr - 1).unsqueeze(1))
            out = _put_rows(out, logits, rows, sub.masked_fill(sub < kth, float("-inf")))
    if top_p is not None:
        rows = torch.nonzero(top_p < 1).squeeze(1)
        if rows.numel():
            out = _put_rows(out, logits, rows, _apply_top_p(_rows(out, rows), top_p[rows]))
    return out


def _rows(out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:  # [N, V] -> [M, V]
    """The selected rows; no gather when every row is selected."""
    return out if rows.numel() == out.shape[0] else out[rows]


def _put_rows(
    out: torch.Tensor, original: torch.Tensor, rows: torch.Tensor, values: torch.Tensor
) -> torch.Tensor:  # [N, V]
    """Write processed rows (a fresh tensor), copying first only if ``out`` is the caller's."""
    if rows.numel() == out.shape[0]:
        return values
    if out is original:
        out = out.clone()
    out[rows] = values
    return out


def _apply_top_p(
    logits: torch.Tensor, top_p: torch.Tensor  # [M, V], [M]
) -> torch.Tensor:  # [M, V]
    """Keep the most likely tokens until their mass reaches top_p (ties at the edge kept)."""
    probs = logits.softmax(-1)
    n = min(TOP_P_CANDIDATES, probs.shape[1])
    ranked = probs.topk(n, dim=-1).values  # [M, n] descending
    short = torch.nonzero(ranked.sum(-1) < top_p).squeeze(1)
    if short.numel():  # the nucleus is wider than the candidates: rank everything
        full = probs[short].sort(dim=-1, descending=True).values
        ranked = torch.cat([ranked, ranked.new_zeros(ranked.shape[0], full.shape[1] - n)], 1)
        ranked[short] = full
    mass_before = ranked.cumsum(-1) - ranked  # mass of strictly more likely tokens
    num_keep = (mass_before < top_p.unsqueeze(1)).sum(-1).clamp(min=1)
    cutoff = ranked.gather(1, (num_keep - 1).unsqueeze(1))  # smallest kept probability
    return logits.masked_fill(probs < cutoff, float("-inf"))


def probs_from_logits(
    logits: torch.Tensor,  # [N, V]
    temperature: torch.Tensor | None,  # [N]
    top_k: torch.Tensor | None = None,  # [N]
    top_p: torch.Tensor | None = None,  # [N]
    min_p: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [N, V] float32, rows sum to 1
    """Processed probabilities: the p (and q) of rejection sampling."""
    return process_logits(logits, temperature, top_k, top_p, min_p).softmax(-1)


def draw_uniforms(
    generators: Sequence[torch.Generator | None], counts: Sequence[int]
) -> torch.Tensor:  # [sum(counts)] float64 in [0, 1), row after row
    """Row ``i`` draws ``counts[i]`` uniforms from its own generator (unseeded: torch's)."""
    total = int(sum(counts))
    seeded = [i for i, g in enumerate(generators) if g is not None and counts[i] > 0]
    if not seeded:
        return torch.rand(total, dtype=torch.float64)
    out = torch.empty(total, dtype=torch.float64)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    for i in seeded:
        out[starts[i] : starts[i + 1]] = torch.rand(
            counts[i], generator=generators[i], dtype=torch.float64
        )
    unseeded = [i for i, g in enumerate(generators) if g is None and counts[i] > 0]
    if unseeded:
        idx = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in unseeded])
        out[torch.from_numpy(idx)] = torch.rand(len(idx), dtype=torch.float64)
    return out


def categorical(
    weights: torch.Tensor,  # [N, V] >= 0, any positive total (need not be normalised)
    u: torch.Tensor,  # [N] float64 in [0, 1)
) -> torch.Tensor:  # [N] int64
    """Inverse-CDF draw, one uniform per row; a zero-weight token is never chosen."""
    cdf = weights.double().cumsum(-1)
    target = (u.double() * cdf[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    over = torch.nonzero(idx >= weights.shape[1]).squeeze(1)
    if over.numel():  # u * total rounded up to total: take the last positive token
        last = (weights[over] > 0).flip(-1).int().argmax(-1)
        idx[over] = weights.shape[1] - 1 - last
    return idx


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N] int64
    """``logits.argmax(-1)``, in one C pass per row where the kernels are built.

    Greedy decoding takes this every step: torch's single-thread CPU argmax costs ~30 us
    a 49k-vocab row here (~150 us for a 5-row verify), the kernel a few. Same answer,
    ties and NaN included (first index of the maximum; a NaN wins).
    """
    if (
        ARGMAX != "native"
        or logits.dtype != torch.float32
        or logits.ndim != 2
        or logits.device.type != "cpu"
        or not logits.is_contiguous()
        or logits.shape[1] == 0
    ):
        return logits.argmax(-1)
    return kernels.argmax_f32(logits)


def sample(
    logits: torch.Tensor,  # [N, V]
    metadata: SamplingMetadata,
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:  # [N] int64
    """Plain sampling: argmax for greedy rows, one uniform per random row from its generator."""
    if logits.ndim != 2 or logits.shape[0] != metadata.num_rows:
        raise ValueError(
            f"logits must be [num_rows={metadata.num_rows}, vocab], got {tuple(logits.shape)}"
        )
    if len(generators) != metadata.num_rows:
        raise ValueError(f"{len(generators)} generators for {metadata.num_rows} rows")
    if metadata.all_greedy:
        return argmax_rows(logits)
    out = torch.empty(metadata.num_rows, dtype=torch.int64)
    greedy = np.flatnonzero(metadata.greedy)
    if greedy.size:
        gi = torch.from_numpy(greedy)
        out[gi] = argmax_rows(logits[gi])
    rand = np.flatnonzero(~metadata.greedy)
    ri = torch.from_numpy(rand)
    if greedy.size:
        probs = metadata.select(rand).probs(logits[ri])
    else:  # the whole batch samples: no gather
        probs = metadata.probs(logits)
    u = draw_uniforms([generators[i] for i in rand], [1] * len(rand))
    out[ri] = categorical(probs, u)
    return out
