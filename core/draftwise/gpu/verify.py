"""The verify step on device: greedy acceptance and rejection sampling in one Triton kernel.

The rule is :mod:`draftwise.spec.verify`'s ``standard`` method, unchanged (its module doc has
the vocabulary): a greedy request accepts drafts while each equals the target's argmax
and emits the argmax at the stop; a random request accepts draft ``x`` at position ``j``
with probability min(1, p(x)/q(x)) (q one-hot when the proposer gave no
``draft_probs``), stops at the first rejection, and draws the recovered token from
normalize(max(p - q, 0)) or, after accepting everything, the bonus token from p.

What stays on the host, and why: the inputs are checked and the logits processed by the
CPU verify's own code (:func:`draftwise.spec.verify._prepare`, the token bitmask, and
:meth:`SamplingMetadata.probs` for p), so the two paths cannot drift on what p is; the
uniforms are drawn on the host from each request's own ``torch.Generator``
(:func:`draftwise.sampling.draw_uniforms`, the same draws in the same order as the CPU
verify), which is what keeps a seeded request reproducible whatever the batch holds.
The kernel does the per-position work: argmax, accept tests, residual, and the
inverse-CDF draw. So :func:`verify_on_device` returns the CPU verify's tokens (the
tests compare them token for token, and run the CPU verify's chi-square test on it);
the one place they may differ is a draw landing within rounding of a CDF boundary
(the kernel's cumulative sum is tiled, torch's is sequential), a probability ~1e-15.

Block verification (``method="block"``) has no kernel: asking for it here is refused
by name (:class:`DeviceVerifyError`); the CPU verify runs it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from draftwise.gpu.device import check_kernel_device, is_interpreted
from draftwise.logits_process import TokenHistory
from draftwise.sampling import SamplingMetadata, SamplingParams, draw_uniforms
from draftwise.structured.masks import apply_token_bitmask
from draftwise.spec.verify import (
    PLACEHOLDER_TOKEN_ID,
    VerifyInputError,
    VerifyMethod,
    VerifyResult,
    _prepare,
    _ranges,
)

#: most elements of one program's ``[BLOCK_R, BLOCK_V]`` tile on a GPU (registers), and
#: under the interpreter (which runs programs one after another in Python, ~0.5 s each:
#: fewer, larger programs; a request's tokens do not depend on the tile, module doc)
TILE = 8192
INTERPRETER_TILE = 1 << 17
#: vocabulary tile (a function of the vocabulary only: it fixes the reduction order)
MAX_BLOCK_V = 1024


class DeviceVerifyError(VerifyInputError):
    """A verify setting the device kernel does not implement (the CPU verify does)."""


def verify_on_device(
    target_logits: torch.Tensor,  # [sum(num_draft_tokens) + B, V] on the kernel's device
    draft_token_ids: np.ndarray | torch.Tensor | Sequence[int],  # [sum(num_draft_tokens)]
    num_draft_tokens: Sequence[int],  # [B]
    sampling: SamplingMetadata | Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],  # [B]
    draft_probs: torch.Tensor | None = None,  # [sum(num_draft_tokens), V]
    method: VerifyMethod | str = VerifyMethod.STANDARD,
    histories: Sequence[TokenHistory | None] | None = None,  # [B]
    token_bitmask: np.ndarray | None = None,  # [sum(num_draft_tokens) + B, ceil(V / 32)]
) -> VerifyResult:
    """:func:`draftwise.spec.verify.verify`'s contract, computed by the Triton kernel."""
    from draftwise.gpu.triton_verify import next_power_of_2, verify_kernel

    b = _prepare(target_logits, draft_token_ids, num_draft_tokens, sampling, generators,
                 draft_probs, method, histories, token_bitmask)
    if b.method is not VerifyMethod.STANDARD:
        raise DeviceVerifyError(
            f"method {b.method.value!r} has no device kernel; use method 'standard' on the "
            "device, or the CPU verify (draftwise.spec.verify.verify), which runs both")
    logits = apply_token_bitmask(b.logits, token_bitmask).contiguous()  # [T, V]
    device = logits.device
    check_kernel_device(verify_kernel, logits)
    num_rows, vocab = len(b.num_draft), logits.shape[1]
    nd = b.num_draft
    u = torch.zeros(logits.shape[0], dtype=torch.float64)
    probs = logits  # read only by random requests; an all-greedy batch builds none
    rand = np.flatnonzero(~b.sampling.greedy)
    if rand.size:
        pos = torch.from_numpy(_ranges(b.cu_logits[rand], nd[rand] + 1)).to(device)
        probs = torch.zeros_like(logits)
        probs[pos] = b.sampling.select(rand).repeat(nd[rand] + 1).probs(logits[pos]).float()
        u[pos.cpu()] = draw_uniforms([b.generators[i] for i in rand.tolist()],
                                     (nd[rand] + 1).tolist())
    q = logits if b.draft_probs is None else b.draft_probs.to(device).float().contiguous()
    max_k = int(nd.max(initial=0))
    out = torch.full((num_rows, max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64,
                     device=device)
    num_acc = torch.zeros(num_rows, dtype=torch.int64, device=device)
    block_v = min(next_power_of_2(vocab), MAX_BLOCK_V)
    tile = INTERPRETER_TILE if is_interpreted(verify_kernel) else TILE
    block_r = min(next_power_of_2(max(num_rows, 1)), max(1, tile // block_v))

    def host(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)

    if num_rows:
        verify_kernel[(triton_cdiv(num_rows, block_r),)](
            logits, probs, q, host(b.drafts), host(nd), host(b.cu_logits), host(b.cu_draft),
            host(b.sampling.greedy.astype(np.int64)), u.to(device), out, num_acc,
            num_rows, vocab, max_k, out.stride(0),
            HAS_Q=b.draft_probs is not None, BLOCK_R=block_r, BLOCK_V=block_v,
        )
    counts = num_acc.tolist()
    rows = out.tolist()
    return VerifyResult([row[: a + 1] for row, a in zip(rows, counts)], counts, logits)


def triton_cdiv(n: int, d: int) -> int:
    """Programs needed for ``n`` items, ``d`` a program."""
    return -(-n // d)
