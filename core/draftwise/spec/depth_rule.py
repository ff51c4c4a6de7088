"""The batch rule of adaptive depth: every row's k, chosen for the whole batch at once.

Its own module because it is one pure function on numbers (rates, caps, a step-time
curve), tested on tables with no engine, while ``spec/adaptive.py`` keeps the state it
reads (each request's estimate, the population, the cost model) and decides when to call
it. :func:`choose_depths` adds draft positions across the batch in order of the
cumulative acceptance they buy, and keeps the prefix that maximises expected tokens per
second of step time (or, for the ``fair`` objective, the sum of each row's log rate).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

#: relative throughput gain below which a deeper draft is not worth its risk
MIN_GAIN = 1e-3
#: the same threshold for the fair objective, which is a sum of logs
LOG_MIN_GAIN = math.log1p(MIN_GAIN)


def choose_depths(
    rates: Sequence[Sequence[float]],
    draft_rates: Sequence[Sequence[float]],
    caps: Sequence[int],
    step_seconds: Callable[[float], float],
    draft_seconds_per_token: float = 0.0,
    floors: Sequence[int] | None = None,
    fair: bool = False,
) -> list[int]:
    """Each row's k in ``floors[i]..caps[i]`` maximising the batch's expected rate.

    :param rates: per row, conditional acceptance per position (at least ``caps[i]``).
    :param draft_rates: per row and position, the chance a draft comes back there.
    :param step_seconds: forward seconds of this batch given its total (expected) tokens.
    :param draft_seconds_per_token: proposing cost per draft token.
    :param floors: per row, drafts it keeps whatever the rule says (rows another rule
        decided: their tokens still weigh on the step time); None: 0 for every row.
    :param fair: the objective. False: the batch's expected tokens per second (what a
        server with requests waiting for a slot wants: a row that finishes sooner lets
        one in). True: the sum over rows of the log of each row's expected tokens per
        second (proportional fairness: what a batch with nobody waiting wants, where a
        row's draft tokens slow every batch-mate and finishing it early frees a slot no
        one takes; a draft is verified only if it buys its own row more, in ratio, than
        it costs all the rows together). With one row the two are the same choice.

    Adding draft j of row i buys its cumulative acceptance ``c_ij`` (non-increasing in
    j) for one token of forward, so the best allocation of any n draft tokens takes the n
    largest ``c_ij`` (fair: the n largest gains in the log of the row's expected tokens,
    ``log(E_ij / E_i,j-1)``, also non-increasing in j); the best n is found by walking
    them in order. Scaling both the gain and the tokens of position j by the chance
    ``d_ij`` that a draft is made there keeps the order and prices in the drafts the
    drafter does not make.
    """
    # (this runs twice a step: plain loops and comparisons, not min/max calls, keep it a
    # few microseconds)
    num_rows = len(caps)
    floor = list(floors) if floors is not None else [0] * num_rows
    if not any(caps):
        return [0] * num_rows
    fair = fair and num_rows > 1
    # (order key, row, draft rate, gain): the key is the gain, except that a fair gain is
    # capped at the row's previous one so that a row's positions stay in order
    cands: list[tuple[float, int, float, float]] = []
    gain = tokens = float(num_rows)
    drafted = log_gain = 0.0  # (fair) sum over rows of log E_i
    for i, cap in enumerate(caps):
        cum, row_rates, row_drafts, kept = 1.0, rates[i], draft_rates[i], floor[i]
        expected, last = 1.0, float("inf")  # (fair) the row's E so far, its last log gain
        for j in range(cap):
            p, d = row_rates[j], row_drafts[j]
            cum *= 1.0 if p > 1.0 else (p if p > 0.0 else 0.0)
            d = 1.0 if d > 1.0 else (d if d > 0.0 else 0.0)
            if j < kept:  # kept whatever: part of the step, not a choice
                expected += d * cum
                gain, tokens, drafted = gain + d * cum, tokens + d, drafted + d
            elif fair:
                step = math.log1p(d * cum / expected)
                expected += d * cum
                last = step if step < last else last
                cands.append((last, i, d, step))
            else:
                cands.append((cum, i, d, cum))
        if fair:
            log_gain += math.log(expected)
    if num_rows > 1:  # one row's are in order already: cumulative acceptance never grows
        cands.sort(key=_by_gain)  # stable: a row's positions stay in order
    best_n = 0
    seconds = step_seconds(tokens) + draft_seconds_per_token * drafted
    seconds = seconds if seconds > 1e-12 else 1e-12
    if fair:
        best = log_gain - num_rows * math.log(seconds)
        for n, (_key, _i, d, g) in enumerate(cands, 1):
            log_gain += g
            tokens += d
            drafted += d
            seconds = step_seconds(tokens) + draft_seconds_per_token * drafted
            value = log_gain - num_rows * math.log(seconds if seconds > 1e-12 else 1e-12)
            if value > best + LOG_MIN_GAIN:
                best, best_n = value, n
    else:
        best = gain / seconds
        for n, (cum, _i, d, _g) in enumerate(cands, 1):
            gain += d * cum
            tokens += d
            drafted += d
            seconds = step_seconds(tokens) + draft_seconds_per_token * drafted
            tput = gain / (seconds if seconds > 1e-12 else 1e-12)
            if tput > best * (1.0 + MIN_GAIN):
                best, best_n = tput, n
    ks = [min(f, c) for f, c in zip(floor, caps)]
    for cand in cands[:best_n]:
        ks[cand[1]] += 1
    return ks


def _by_gain(cand: tuple[float, int, float, float]) -> float:
    """Sort key of :func:`choose_depths`'s candidates: largest cumulative acceptance first."""
    return -cand[0]


__all__ = ["LOG_MIN_GAIN", "MIN_GAIN", "choose_depths"]
