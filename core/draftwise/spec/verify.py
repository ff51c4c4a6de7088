"""Lossless verification of draft tokens against one target forward.

Vocabulary (vLLM's rejection sampler; Leviathan et al., arXiv 2211.17192):

- **draft** tokens: the k tokens a proposer suggested for a request this step;
- **accepted** tokens: the prefix of the draft that verification keeps;
- **recovered** token: replaces the first rejected draft token, sampled from the
  residual ``normalize(max(p - q, 0))`` (greedy requests: the target's argmax);
- **bonus** token: sampled from the target after all k drafts were accepted;
- **output** tokens = accepted + (recovered or bonus): 1 to k + 1 per request.

Layout: request ``i`` owns ``num_draft[i] + 1`` consecutive rows of ``target_logits``;
row ``j`` is the target's distribution for the token after the context plus
``drafts[:j]``, the last row is the bonus position. A request with no drafts is plain
sampling, bitwise the same as :func:`draftwise.sampling.sample`, so the engine sends
every sampling row through :func:`verify`, speculating or not.

Processing: before anything else, each position's logits go through the request's
penalties, logit bias, allowed / bad words and min_tokens
(:func:`draftwise.logits_process.apply_logits_processors`, ONE call on the step's logits),
each position seeing the tokens committed before the step plus the drafts before it.

Probabilities: p is the target after the request's temperature / min-p / top-k / top-p
(:meth:`SamplingMetadata.probs`, the same code as plain sampling); q is the proposer's
``draft_probs``, or one-hot at the draft token when there are none (n-gram, greedy
drafters): accept with p(x), recover from p with x removed.

Structured output: ``token_bitmask`` holds the grammar's allowed tokens at every row
(``draftwise.structured.masks``: row j is the grammar after the committed tokens plus
``drafts[:j]``); forbidden tokens go to -inf before p exists, so a draft the grammar
refuses has p = 0 and is rejected, and greedy output equals speculation off.

Randomness: a random request draws ``num_draft + 1`` uniforms per step from its own
generator (one per draft position, then one for the recovered or bonus token); greedy
requests draw nothing. Seeded requests are reproducible whatever the batch holds.

Methods: ``standard`` accepts draft j with probability min(1, p(x_j)/q(x_j)) and stops at
the first rejection. ``block`` is block verification (Sun et al. 2024, arXiv
2403.10444): with p_0 = 1 and p_i = min(1, p_{i-1} p(x_i)/q(x_i)), residual mass
r_i = sum_x max(p_i p(x | x<=i) - q(x | x<=i), 0) and h_i = r_i / (r_i + 1 - p_i)
(h_k = p_k, and h_i = 1 once p_i reaches 1), it keeps the LARGEST i with u_i < h_i and
recovers from normalize(max(p_i p - q, 0)) at that position; it accepts at least as many
tokens as ``standard`` in expectation and is just as lossless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from itertools import accumulate

import numpy as np
import torch

from draftwise.errors import DraftwiseError
from draftwise.logits_process import TokenHistory, apply_logits_processors
from draftwise.sampling import (
    SamplingMetadata,
    SamplingParams,
    argmax_rows,
    categorical,
    draw_uniforms,
)
from draftwise.structured.masks import allowed_tokens, apply_token_bitmask, bitmask_width

#: pads the per-request output buffer (vLLM's value); never a meaning in inputs
PLACEHOLDER_TOKEN_ID = -1
#: sanity bound on drafts per request in one step (vLLM's MAX_SPEC_LEN)
MAX_SPEC_LEN = 128


class VerifyMethod(str, Enum):
    """vLLM's ``rejection_sample_method`` values this engine implements."""

    STANDARD = "standard"
    BLOCK = "block"


class VerifyInputError(DraftwiseError, ValueError):
    """Inputs to verification whose shapes or values do not fit together."""


@dataclass(slots=True)
class VerifyResult:
    """Per request: the output tokens (accepted + recovered/bonus) and the accepted count."""

    output_token_ids: list[list[int]]
    num_accepted: list[int]
    #: ``[T, V]`` the target logits after per-position processing (what was verified)
    logits: torch.Tensor | None = None

    def to_padded(self, width: int | None = None) -> torch.Tensor:  # [B, width] int64
        """vLLM's output buffer: one row per request, padded with PLACEHOLDER_TOKEN_ID."""
        width = width or max((len(t) for t in self.output_token_ids), default=1)
        out = torch.full((len(self.output_token_ids), width), PLACEHOLDER_TOKEN_ID)
        for i, toks in enumerate(self.output_token_ids):
            out[i, : len(toks)] = torch.tensor(toks, dtype=torch.int64)
        return out


@dataclass(slots=True)
class _Batch:
    """Checked inputs plus the row offsets both implementations use."""

    logits: torch.Tensor  # [T, V] float32
    drafts: np.ndarray  # [D] int64
    num_draft: np.ndarray  # [B] int64
    cu_logits: np.ndarray  # [B + 1] first logits row of each request
    cu_draft: np.ndarray  # [B + 1] first draft token of each request
    sampling: SamplingMetadata
    generators: list[torch.Generator | None]
    draft_probs: torch.Tensor | None  # [D, V]
    method: VerifyMethod


def verify(
    target_logits: torch.Tensor,  # [sum(num_draft_tokens) + B, V]
    draft_token_ids: np.ndarray | torch.Tensor | Sequence[int],  # [sum(num_draft_tokens)]
    num_draft_tokens: Sequence[int],  # [B]
    sampling: SamplingMetadata | Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],  # [B]
    draft_probs: torch.Tensor | None = None,  # [sum(num_draft_tokens), V] q, None = one-hot
    method: VerifyMethod | str = VerifyMethod.STANDARD,
    histories: Sequence[TokenHistory | None] | None = None,  # [B]
    token_bitmask: np.ndarray | None = None,  # [sum(num_draft_tokens) + B, ceil(V / 32)] int32
) -> VerifyResult:
    """Verify every request's drafts (0 drafts = plain sampling) in one vectorised pass.

    :param target_logits: the target's logits, request after request, ``num_draft + 1``
        rows each (the last one is the bonus position).
    :param draft_token_ids: all requests' draft tokens, concatenated.
    :param num_draft_tokens: drafts per request (0 allowed).
    :param sampling: per-request settings (greedy flag, temperature, top-k/p, min-p).
    :param generators: per-request generator, None for unseeded random or greedy rows.
    :param draft_probs: q of every draft position (``draft_sample_method="probabilistic"``).
    :param method: ``"standard"`` rejection sampling or ``"block"`` verification.
    :param histories: per request, what its positions condition on (penalties, bias,
        masks); None, or a None entry, for requests with no such settings.
    :param token_bitmask: the grammar's allowed tokens at every row of ``target_logits``
        (``draftwise.structured.masks``), None when no request has a grammar.
    :returns: output tokens and accepted counts per request, and the processed logits.
    """
    b = _prepare(
        target_logits, draft_token_ids, num_draft_tokens, sampling, generators, draft_probs,
        method, histories, token_bitmask,
    )
    # structured output: the grammar's mask at every verified position, before p exists
    b.logits = apply_token_bitmask(b.logits, token_bitmask)
    num_rows = len(b.num_draft)
    outputs: list[list[int]] = [[]] * num_rows  # every row is replaced below
    accepted = [0] * num_rows
    if b.sampling.all_greedy:  # the common batch: every row, no split
        _verify_greedy(b, None, outputs, accepted)
    else:
        greedy_rows = np.flatnonzero(b.sampling.greedy)
        if greedy_rows.size:
            _verify_greedy(b, greedy_rows, outputs, accepted)
        _verify_random(b, np.flatnonzero(~b.sampling.greedy), outputs, accepted)
    return VerifyResult(outputs, accepted, b.logits)


def rejection_sample_reference(
    target_logits: torch.Tensor,  # [sum(num_draft_tokens) + B, V]
    draft_token_ids: np.ndarray | torch.Tensor | Sequence[int],  # [sum(num_draft_tokens)]
    num_draft_tokens: Sequence[int],  # [B]
    sampling: SamplingMetadata | Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],  # [B]
    draft_probs: torch.Tensor | None = None,  # [sum(num_draft_tokens), V]
    method: VerifyMethod | str = VerifyMethod.STANDARD,
    histories: Sequence[TokenHistory | None] | None = None,  # [B]
    token_bitmask: np.ndarray | None = None,  # [sum(num_draft_tokens) + B, ceil(V / 32)] int32
) -> torch.Tensor:  # [B, max(num_draft_tokens) + 1] int64, PLACEHOLDER_TOKEN_ID padded
    """One request at a time, written to be read; :func:`verify` must match it token for token."""
    from draftwise.logits_process import apply_logits_processors_reference

    b = _prepare(
        target_logits, draft_token_ids, num_draft_tokens, sampling, generators, draft_probs,
        method, None, token_bitmask,
    )
    if histories is not None:
        b.logits = apply_logits_processors_reference(b.logits, b.cu_logits, histories)
    width = int(b.num_draft.max(initial=0)) + 1
    out = torch.full((len(b.num_draft), width), PLACEHOLDER_TOKEN_ID)
    for i, n in enumerate(b.num_draft.tolist()):
        logits = b.logits[b.cu_logits[i] : b.cu_logits[i + 1]]  # [n + 1, V]
        if token_bitmask is not None:  # the grammar forbids these tokens at these positions
            rows = token_bitmask[b.cu_logits[i] : b.cu_logits[i + 1]]
            logits = logits.masked_fill(~allowed_tokens(rows, logits.shape[1]), float("-inf"))
        drafts = b.drafts[b.cu_draft[i] : b.cu_draft[i + 1]].tolist()
        if b.sampling.greedy[i]:
            target = logits.argmax(-1).tolist()
            accepted = 0
            while accepted < n and drafts[accepted] == target[accepted]:
                accepted += 1
            out[i, : accepted + 1] = torch.tensor(target[: accepted + 1])
            continue
        p = b.sampling.select(np.array([i])).repeat(np.array([n + 1])).probs(logits)
        q = None if b.draft_probs is None else b.draft_probs[b.cu_draft[i] : b.cu_draft[i + 1]]
        u = draw_uniforms([b.generators[i]], [n + 1]).tolist()
        accepted, scale = 0, 1.0  # scale: block's p_tau (1 for standard)
        if b.method is VerifyMethod.STANDARD:
            while accepted < n:
                x = drafts[accepted]
                q_x = 1.0 if q is None else float(q[accepted, x])
                if not (q_x > 0 and u[accepted] < min(1.0, float(p[accepted, x]) / q_x)):
                    break
                accepted += 1
        else:
            p_i = 1.0
            for j, x in enumerate(drafts):
                q_x = 1.0 if q is None else float(q[j, x])
                p_i = min(1.0, p_i * (float(p[j, x]) / q_x if q_x > 0 else 0.0))
                if j == n - 1:
                    h = p_i
                elif p_i >= 1.0:
                    h = 1.0
                else:
                    if q is None:  # one-hot q at the next draft token
                        r = p_i * (1.0 - float(p[j + 1, drafts[j + 1]]))
                    else:
                        r = float((p_i * p[j + 1].double() - q[j + 1].double()).clamp_min(0).sum())
                    h = r / (r + 1.0 - p_i)
                if u[j] < h:  # no early stop: the LAST position that passes wins
                    accepted, scale = j + 1, p_i
        final = p[accepted].double()
        if accepted < n:  # recovered token from the residual at the stop position
            if q is None:  # max(p_tau * p - onehot(x), 0) is p without x (p_tau cancels)
                residual = final.clone()
                residual[drafts[accepted]] = 0.0
            else:
                residual = (scale * final - q[accepted].double()).clamp_min(0)
            final = residual if float(residual.sum()) > 0 else final
        token = categorical(final.unsqueeze(0), torch.tensor(u[n:]))
        out[i, :accepted] = torch.tensor(drafts[:accepted], dtype=torch.int64)
        out[i, accepted] = token[0]
    return out


def _verify_greedy(
    b: _Batch, rows: np.ndarray | None, outputs: list[list[int]], accepted: list[int]
) -> None:
    """Accept while draft == argmax; one argmax over the rows' logits, compared on CPU.
    ``rows``: the greedy rows, in order (None: every row)."""
    if rows is None:
        top = argmax_rows(b.logits).tolist()
        order = range(len(b.num_draft))
    else:
        pos = _ranges(b.cu_logits[rows], b.num_draft[rows] + 1)
        top = argmax_rows(b.logits[torch.from_numpy(pos)]).tolist()
        order = rows.tolist()
    drafts = b.drafts.tolist()
    counts, firsts = b.num_draft.tolist(), b.cu_draft.tolist()
    start = 0
    for r in order:
        n, d0 = counts[r], firsts[r]
        a = 0
        while a < n and drafts[d0 + a] == top[start + a]:
            a += 1
        outputs[r] = top[start : start + a + 1]
        accepted[r] = a
        start += n + 1


def _verify_random(
    b: _Batch, rows: np.ndarray, outputs: list[list[int]], accepted: list[int]
) -> None:
    """Rejection sampling (standard or block) for the random rows, vectorised across rows."""
    nd = b.num_draft[rows]  # [R]
    if rows.size == len(b.num_draft):  # the whole batch samples: no gather
        p = b.sampling.repeat(nd + 1).probs(b.logits)  # [T, V]
    else:
        pos = _ranges(b.cu_logits[rows], nd + 1)  # [T_r] logits rows of these requests
        p = b.sampling.select(rows).repeat(nd + 1).probs(b.logits[torch.from_numpy(pos)])
    dsel = torch.from_numpy(_ranges(b.cu_draft[rows], nd))  # [D_r]
    x = b.drafts[dsel.numpy()]  # [D_r]
    cu_p = _cumsum0(nd + 1)
    cu_x = _cumsum0(nd)
    x_row = np.arange(len(x)) + np.repeat(np.arange(len(rows)), nd)  # row of p per draft
    xt = torch.from_numpy(x)
    p_x = p[torch.from_numpy(x_row), xt].double().numpy()
    q = None if b.draft_probs is None else b.draft_probs[dsel]  # [D_r, V]
    q_x = np.ones(len(x)) if q is None else q[torch.arange(len(x)), xt].double().numpy()
    u = draw_uniforms([b.generators[i] for i in rows.tolist()], (nd + 1).tolist())
    is_final = np.zeros(len(u), dtype=bool)
    is_final[cu_p[1:] - 1] = True  # each row's last uniform picks the recovered/bonus token
    u_draft = u.numpy()[~is_final]  # [D_r]
    u_final = u[torch.from_numpy(is_final)]  # [R]
    if b.method is VerifyMethod.STANDARD:
        num_acc = _leading_true(u_draft < _standard_accept_prob(p_x, q_x), nd)
        scale = np.ones(len(rows))
    else:
        num_acc, scale = _block_accept(p, q, p_x, q_x, u_draft, nd, cu_x, x_row)
    final = p[torch.from_numpy(cu_p[:-1] + num_acc)].double()  # [R, V]
    rej = np.flatnonzero(num_acc < nd)
    if rej.size:
        d = torch.from_numpy(cu_x[rej] + num_acc[rej])
        rt = torch.from_numpy(rej)
        final[rt] = _residual(final[rt], None if q is None else q[d], xt[d], scale[rej])
    tokens = categorical(final, u_final).tolist()
    xs, starts = x.tolist(), cu_x.tolist()
    for j, (r, a) in enumerate(zip(rows.tolist(), num_acc.tolist())):
        outputs[r] = xs[starts[j] : starts[j] + a] + [tokens[j]]
        accepted[r] = a


def _standard_accept_prob(p_x: np.ndarray, q_x: np.ndarray) -> np.ndarray:  # [D] -> [D]
    """min(1, p/q): the acceptance probability of each draft token (0 where q is 0)."""
    ok = q_x > 0
    return np.where(ok, np.minimum(1.0, p_x / np.where(ok, q_x, 1.0)), 0.0)


def _block_accept(
    p: torch.Tensor,  # [T_r, V]
    q: torch.Tensor | None,  # [D_r, V]
    p_x: np.ndarray,  # [D_r]
    q_x: np.ndarray,  # [D_r]
    u: np.ndarray,  # [D_r]
    nd: np.ndarray,  # [R]
    cu_x: np.ndarray,  # [R + 1]
    x_row: np.ndarray,  # [D_r]
) -> tuple[np.ndarray, np.ndarray]:  # accepted [R], p_tau [R]
    """Block verification's accepted length (largest passing i) and the residual scale p_tau."""
    num_rows, width = len(nd), int(nd.max(initial=0))
    mask = np.arange(width) < nd[:, None]  # [R, K]
    ratio = np.zeros((num_rows, width))
    ok = q_x > 0
    ratio[mask] = np.where(ok, p_x / np.where(ok, q_x, 1.0), 0.0)
    cum = np.empty((num_rows, width))
    prev = np.ones(num_rows)
    for j in range(width):
        prev = np.minimum(1.0, prev * ratio[:, j])
        cum[:, j] = prev
    p_i = cum[mask]  # [D_r] flat, row-major = draft order
    local = np.arange(len(p_i)) - np.repeat(cu_x[:-1], nd)
    last = local == np.repeat(nd - 1, nd)
    resid = np.zeros(len(p_i))
    inner = np.flatnonzero(~last)  # position i < k: residual of the NEXT position's p and q
    if inner.size and q is None:
        resid[inner] = p_i[inner] * (1.0 - p_x[inner + 1])
    elif inner.size:
        nxt = torch.from_numpy(inner + 1)
        p_next = p[torch.from_numpy(x_row)[nxt]].double()  # [inner, V]
        scaled = torch.from_numpy(p_i[inner]).unsqueeze(1) * p_next
        resid[inner] = (scaled - q[nxt].double()).clamp_min(0).sum(-1).numpy()
    passed = u < _block_threshold(p_i, resid, last)
    best = np.zeros((num_rows, width), dtype=np.int64)
    best[mask] = np.where(passed, local + 1, 0)
    num_acc = best.max(1, initial=0)
    scale = np.ones(num_rows)
    hit = np.flatnonzero(num_acc > 0)
    scale[hit] = cum[hit, num_acc[hit] - 1]
    return num_acc, scale


def _block_threshold(
    p_i: np.ndarray, resid: np.ndarray, last: np.ndarray  # [D] each
) -> np.ndarray:  # [D]
    """h_i = r_i / (r_i + 1 - p_i); p_i at the last position; 1 once p_i reaches 1."""
    full = p_i >= 1.0
    h = np.where(full, 1.0, resid / np.where(full, 1.0, resid + 1.0 - p_i))
    return np.where(last, p_i, h)


def _residual(
    p_rows: torch.Tensor,  # [M, V] float64
    q_rows: torch.Tensor | None,  # [M, V]
    x: torch.Tensor,  # [M] the rejected draft tokens
    scale: np.ndarray,  # [M] p_tau (1 for standard)
) -> torch.Tensor:  # [M, V] float64, unnormalised
    """max(scale * p - q, 0): what a recovered token is drawn from (p if it is empty)."""
    if q_rows is None:
        w = p_rows.clone()
        w[torch.arange(len(x)), x] = 0.0
    else:
        w = (torch.from_numpy(scale).unsqueeze(1) * p_rows - q_rows.double()).clamp_min(0)
    empty = w.sum(-1) <= 0
    return torch.where(empty.unsqueeze(1), p_rows, w)


def _leading_true(flags: np.ndarray, lengths: np.ndarray) -> np.ndarray:  # [D], [R] -> [R]
    """How many leading entries of each row's slice of ``flags`` are True."""
    width = int(lengths.max(initial=0))
    pad = np.zeros((len(lengths), width + 1), dtype=bool)
    pad[:, :width][np.arange(width) < lengths[:, None]] = flags
    return pad.argmin(1)


def _cumsum0(counts: np.ndarray | Sequence[int]) -> np.ndarray:  # [B] -> [B + 1]
    """Offsets: 0, c0, c0 + c1, ... summed as Python ints (a handful per batch: right
    after the forward, with the interpreter's caches cold, each numpy reduction costs
    10-20 us)."""
    seq = counts.tolist() if isinstance(counts, np.ndarray) else counts
    return np.fromiter(accumulate(seq, initial=0), dtype=np.int64, count=len(seq) + 1)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:  # [R], [R] -> [sum]
    """Concatenated ``arange(start, start + length)`` per row, without a Python loop."""
    shift = np.repeat(starts - _cumsum0(lengths)[:-1], lengths)
    return (np.arange(int(lengths.sum())) + shift).astype(np.int64)


def _prepare(
    target_logits: torch.Tensor,
    draft_token_ids: np.ndarray | torch.Tensor | Sequence[int],
    num_draft_tokens: Sequence[int],
    sampling: SamplingMetadata | Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    draft_probs: torch.Tensor | None,
    method: VerifyMethod | str,
    histories: Sequence[TokenHistory | None] | None,
    token_bitmask: np.ndarray | None = None,
) -> _Batch:
    """Check shapes and values with errors that say what does not fit; compute offsets."""
    try:
        method = VerifyMethod(method)
    except ValueError:
        valid = ", ".join(repr(m.value) for m in VerifyMethod)
        raise VerifyInputError(f"method {method!r} is not one of {valid}") from None
    # the per-request counts are a handful of ints: checked as Python ints (_cumsum0 says why)
    counts = np.asarray(num_draft_tokens, dtype=np.int64).reshape(-1).tolist()
    if counts and (min(counts) < 0 or max(counts) > MAX_SPEC_LEN):
        raise VerifyInputError(
            f"num_draft_tokens must be in [0, {MAX_SPEC_LEN}], got {counts}"
        )
    if isinstance(draft_token_ids, torch.Tensor):
        drafts = draft_token_ids.detach().cpu().numpy().astype(np.int64, copy=False).reshape(-1)
    else:
        drafts = np.asarray(draft_token_ids, dtype=np.int64).reshape(-1)
    total, num_rows = sum(counts), len(counts)
    if drafts.shape[0] != total:
        raise VerifyInputError(
            f"{drafts.shape[0]} draft tokens but num_draft_tokens sums to {total}"
        )
    if target_logits.ndim != 2 or target_logits.shape[0] != total + num_rows:
        raise VerifyInputError(
            f"target_logits must be [sum(num_draft_tokens) + num_requests = {total + num_rows}, "
            f"vocab], got {tuple(target_logits.shape)}"
        )
    vocab = target_logits.shape[1]
    if drafts.size and (drafts.min() < 0 or drafts.max() >= vocab):
        raise VerifyInputError(f"draft token ids must be in [0, {vocab}), got {drafts.tolist()}")
    if draft_probs is not None and tuple(draft_probs.shape) != (total, vocab):
        raise VerifyInputError(
            f"draft_probs must be [{total}, {vocab}], got {tuple(draft_probs.shape)}"
        )
    if token_bitmask is not None and token_bitmask.shape != (total + num_rows, bitmask_width(vocab)):
        raise VerifyInputError(
            f"token_bitmask must be [{total + num_rows}, {bitmask_width(vocab)}], "
            f"got {tuple(token_bitmask.shape)}"
        )
    if not isinstance(sampling, SamplingMetadata):
        sampling = SamplingMetadata.from_params(list(sampling))
    if sampling.num_rows != num_rows or len(generators) != num_rows:
        raise VerifyInputError(
            f"{num_rows} requests, but sampling covers {sampling.num_rows} and "
            f"{len(generators)} generators were given"
        )
    cu_logits = _cumsum0([n + 1 for n in counts])
    logits = target_logits.float()
    if histories is not None:
        if len(histories) != num_rows:
            raise VerifyInputError(f"{num_rows} requests but {len(histories)} histories")
        logits = apply_logits_processors(logits, cu_logits, histories)
    return _Batch(
        logits=logits,
        drafts=drafts,
        num_draft=np.array(counts, dtype=np.int64),
        cu_logits=cu_logits,
        cu_draft=_cumsum0(counts),
        sampling=sampling,
        generators=list(generators),
        draft_probs=draft_probs,
        method=method,
    )
