"""``n > 1``: one request, n independent samples that share the prompt's cached KV.

As in vLLM V1, a request with ``n`` samples becomes ``n`` child requests in the batch,
each with ``n = 1`` and, when the parent has a seed, the seed ``seed + index`` (so a
seeded request is reproducible sample by sample). The prompt's K/V is computed once:
with prefix caching on, children 1..n-1 wait until child 0 has finished its prefill and
then find the prompt's full blocks in the prefix cache; the last, partial block is
recomputed by each. With prefix caching off every child computes its own prompt.

The engine reports the parent: one cumulative output per step in which any child
progressed, with one completion per child (``index``), finished when every child is.
A child that fails fails the request: its siblings are aborted and their blocks freed.
The parent itself is a plain record, ``draftwise.request.ParentRequest``.
"""

from __future__ import annotations

from draftwise.sampling_params import SamplingParams

_SEED_SPAN = 2**64


def child_params(params: SamplingParams) -> list[SamplingParams]:
    """The n children's settings: n = 1 each, seeds ``seed + index`` (vLLM's rule)."""
    out = []
    for i in range(params.n):
        update: dict[str, object] = {"n": 1}
        if params.seed is not None:
            seed = params.seed + i
            update["seed"] = seed - _SEED_SPAN if seed >= _SEED_SPAN else seed
        out.append(params.model_copy(update=update))
    return out


__all__ = ["child_params"]
