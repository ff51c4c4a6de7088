"""What a step costs, measured on this machine rather than assumed.

Adaptive depth trades expected tokens against step time, so it needs the time of a
target forward over R rows of (1 + k) tokens each, for the k and batch sizes it may use.
:func:`measure_costs` times exactly that forward (the step's own ``runner.build`` and
``runner.forward``, logits at every position as verify asks for them), over blocks taken
from the engine's pool through the cache manager and given back (a block's prefix hash is
dropped when it is handed out, so nothing the prefix cache holds is overwritten). The grid
is timed once per model file, dtype, compute threads and grid, and kept in a small JSON
file cache so the next start-up with the same settings skips it.

With one compute thread the forward is timed on the thread's own CPU clock
(``time.thread_time``): it is the forward's cost on a quiet machine whatever other
processes do (on a 2-core machine at load 9, wall-clock minima over four passes read a
1-token forward at 34 ms against 10 ms quiet, and 1 + 3 drafts at 2.03x against 1.5x,
which steered adaptive depth shallow). With several threads the CPU clock sums them, so
wall time is the measure there.

Only batches of up to :data:`STARTUP_ROWS` rows are timed at start-up; the grid's larger
batch sizes are read off their time against the forward's token count
(:func:`estimate_rows`) until the engine's own steps there replace them (below).

Between grid points :meth:`CostModel.forward_seconds` interpolates linearly in tokens,
then in rows; beyond the largest measured batch it extrapolates per row. The drafters' cost
per draft token is measured online (:meth:`CostModel.observe_draft`), as an exponentially
weighted mean over the steps that asked for drafts.

The start-up grid is a few dozen forwards timed right after loading, and on a shared
machine it is often off: five timings of the same 1-row grid here, minutes apart, read
1 + 4 drafts at 1.06x to 1.38x a plain forward, and one cached grid priced 3 tokens at
1.49x one (the engine's own steps at those sizes ran 1.10x). So the engine also times its own
decode steps' forwards (:meth:`CostModel.observe_step`): a step of R rows and T tokens
in all, with R a timed batch size and T / R a timed tokens per row, is that grid point,
and its running time (after ``MIN_STEPS`` such steps) replaces the start-up timing.
Points the engine has not run often enough are read between the ones it has (linearly)
or, beyond them, scaled from the nearest one by the start-up grid's ratio, so one bad
start-up point cannot price a depth out for good.

A step is more than its forward: scheduling, building the batch, verify, commit and the
outputs cost about the same whatever the depth (SmolLM2-135M, one thread: ~1 ms against a
~6 ms forward). Priced against the forward alone a draft token looks that much dearer
than it is (the extra share of the step it adds is smaller), which kept requests shallower
than the fastest fixed depth. So the engine measures that rest online, per batch size, on
the same clock (:meth:`CostModel.observe_overhead`), and :meth:`CostModel.step_seconds`
is the forward plus it.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftwise.disk_cache import cache_dir

if TYPE_CHECKING:
    from draftwise.cache.manager import KVCacheManager
    from draftwise.runner import ModelRunner

logger = logging.getLogger("draftwise.spec.cost_model")

#: weight of the newest step in the drafters' cost per token
DRAFT_COST_WEIGHT = 0.1
#: weight of the newest engine step in a running time (the rest of a step, a grid
#: point's forward), once its first ``MIN_STEPS`` readings set it
STEP_WEIGHT = 0.05
#: engine steps at a grid point before their running time replaces its start-up timing
MIN_STEPS = 8
#: after a grid point's first ``MIN_STEPS`` readings, the grid is recalibrated once per
#: this many more (a reading moves the running time by 1.25% at most, and noise mostly
#: cancels; a rebuild every 8 readings cost ~10 us a decode step on the default model)
RECALIBRATE_EVERY = 64
#: one reading moves a running time by at most this fraction of it (a step stalled by a
#: page fault or another process is one step, not a new price)
MAX_STEP_CHANGE = 0.25
#: timed passes over the grid (each point's minimum is kept: other load only adds time)
REPEATS = 4
#: context each timed row attends over (a typical decode position, well inside any model)
CONTEXT = 128
#: batch sizes timed at start-up; the grid's larger ones are estimated from them
#: (:func:`estimate_rows`) until the engine's own steps there replace the estimate.
#: Timing every batch size up to 32 rows took 22 s on the default model on a loaded
#: 2-core machine, and would take over a minute on the 1.5B: with adaptive depth the
#: default, that was a server's first start
STARTUP_ROWS = 2
_PROBE_ID = "draftwise-cost-probe"
#: bumped when what a cached grid means changes (then old files are simply not found)
CACHE_FORMAT = 3


@dataclass(slots=True)
class RunningTime:
    """A time the engine measures over and over (a grid point's forward, the rest of a
    step): the median of its first ``MIN_STEPS`` readings (a first step that faulted its
    pages in is one reading, not the price), then an exponentially weighted mean whose
    every move is bounded (``MAX_STEP_CHANGE``)."""

    value: float = 0.0
    count: int = 0
    first: list[float] = field(default_factory=list)
    #: the lowest reading (other load only adds time)
    low: float = float("inf")

    def add(self, seconds: float) -> None:
        """One more reading."""
        self.count += 1
        self.low = min(self.low, seconds)
        if self.count <= MIN_STEPS:
            self.first.append(seconds)
            ordered = sorted(self.first)
            self.value = ordered[len(ordered) // 2]
            return
        self.first.clear()
        bound = MAX_STEP_CHANGE * self.value
        self.value += STEP_WEIGHT * max(-bound, min(bound, seconds - self.value))


@dataclass(slots=True)
class CostModel:
    """Seconds of one target forward by (rows, tokens per row), plus drafting per token."""

    #: rows measured, ascending
    rows: list[int]
    #: tokens per row measured (1 + k), ascending
    tokens_per_row: list[int]
    #: seconds[i][j]: forward of rows[i] rows x tokens_per_row[j] tokens each
    seconds: list[list[float]]
    #: exponentially weighted seconds per draft token (0 until a draft was timed)
    draft_seconds_per_token: float = 0.0
    #: where the grid came from: "measured", "cache" or "given" (tests)
    source: str = "given"
    #: grid measurement time (0 when cached or given)
    measure_seconds: float = 0.0
    #: the batch sizes timed at start-up (the others were estimated: :func:`estimate_rows`);
    #: empty: every row (given, cached from an older grid)
    timed_rows: tuple[int, ...] = ()
    #: per batch size, the running time of a decode step outside the target forward and
    #: the drafters (empty until a step was timed: then the forward alone)
    overhead: dict[int, RunningTime] = field(default_factory=dict)
    #: the start-up grid as timed (``seconds`` is what the rule reads: this, calibrated
    #: by the engine's own steps)
    measured: list[list[float]] = field(init=False)
    #: per grid point, the forward time of the engine's steps there
    steps: list[list[RunningTime]] = field(init=False)
    #: bumped each time ``seconds`` changes (tables built from it are then stale)
    version: int = 0
    _draft_observed: bool = field(default=False, repr=False)
    #: the clock the grid was timed on, which the drafters' cost must be timed on too (a
    #: draft cost on the wall clock against a forward on the thread's CPU clock reads
    #: dearer under other processes' load, steering depth shallow)
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)

    def __post_init__(self) -> None:
        if not self.rows or not self.tokens_per_row:
            raise ValueError("a cost model needs at least one measured point")
        if len(self.seconds) != len(self.rows) or any(
            len(r) != len(self.tokens_per_row) for r in self.seconds
        ):
            raise ValueError("seconds must be a rows x tokens_per_row grid")
        self.measured = [list(r) for r in self.seconds]
        self.steps = [[RunningTime() for _ in self.tokens_per_row] for _ in self.rows]

    def observe_step(self, num_rows: int, num_tokens: int, forward: float, rest: float) -> None:
        """One decode step of the engine, on this model's clock: ``forward`` seconds of
        target forward over ``num_tokens`` tokens in ``num_rows`` rows, and ``rest``
        seconds outside the forward and the drafters."""
        self.observe_overhead(num_rows, rest)
        if num_rows not in self.rows or num_tokens % num_rows:
            return
        per_row = num_tokens // num_rows
        if per_row not in self.tokens_per_row:
            return
        i, j = self.rows.index(num_rows), self.tokens_per_row.index(per_row)
        point = self.steps[i][j]
        point.add(forward)
        lowers = self.timed and point.count < MIN_STEPS and forward < self.seconds[i][j]
        if point.count == MIN_STEPS or point.count % RECALIBRATE_EVERY == 0 or lowers:
            # an anchor now, one that had time to move, or a first reading under the
            # price (a grid timed under load): recalibrate
            self.seconds = self.calibrated()
            self.version += 1

    @property
    def timed(self) -> bool:
        """Whether the grid was timed on this machine (now or from the file cache), so
        that other processes' load may have inflated it; a given grid is taken as is."""
        return self.source in ("measured", "cache")

    def untimed_by_steps(self, num_rows: int, tokens_per_row: int) -> bool:
        """A timed grid point the engine's own steps never ran: its price is the start-up
        timing alone (adaptive depth lets a lone row run it once: ``DepthPolicy``)."""
        if not self.timed or num_rows not in self.rows or tokens_per_row not in self.tokens_per_row:
            return False
        i, j = self.rows.index(num_rows), self.tokens_per_row.index(tokens_per_row)
        return self.steps[i][j].count == 0

    def calibrated(self) -> list[list[float]]:
        """The grid the rule reads: per point its engine steps' running time once there
        were ``MIN_STEPS`` of them, or their lowest reading while it is under the start-up
        timing (anchors); between a row's anchors, linear in tokens;
        beyond them, the nearest anchor scaled by the start-up grid's ratio; a row with
        no anchor, its start-up timing scaled by the anchors' median ratio to theirs."""
        ts, out, ratios = self.tokens_per_row, [], []
        for i, measured in enumerate(self.measured):
            # an anchor: MIN_STEPS readings (their running time), or fewer whose lowest is
            # under the start-up timing (load only adds time, so a grid timed on a busy
            # machine, and cached, is pulled down by the first step that ran faster; else a
            # depth priced out at start-up is never run, so never re-timed)
            got = [point.value if point.count >= MIN_STEPS else point.low
                   for point in self.steps[i]]
            anchors = [j for j, point in enumerate(self.steps[i]) if point.count >= MIN_STEPS
                       or (self.timed and point.count and point.low < measured[j])]
            ratios += [got[j] / measured[j] for j in anchors if measured[j] > 0]
            row = list(measured)
            for j in range(len(ts)) if anchors else ():
                below = [a for a in anchors if a <= j]
                above = [a for a in anchors if a >= j]
                if below and above and below[-1] != above[0]:
                    lo, hi = below[-1], above[0]
                    w = (ts[j] - ts[lo]) / (ts[hi] - ts[lo])
                    row[j] = got[lo] + w * (got[hi] - got[lo])
                else:
                    a = below[-1] if below else above[0]
                    row[j] = got[a] * measured[j] / measured[a] if measured[a] > 0 else got[a]
            out.append(row if anchors else None)
        scale = sorted(ratios)[len(ratios) // 2] if ratios else 1.0
        return monotone([row if row is not None else [x * scale for x in measured]
                         for row, measured in zip(out, self.measured)])

    def step_seconds(self, num_rows: int, num_tokens: float) -> float:
        """Step time of ``num_rows`` rows carrying ``num_tokens`` tokens in all: the
        forward, plus the step's measured rest (:meth:`overhead_seconds`)."""
        if num_rows <= 0:
            return 0.0
        return self.forward_seconds(num_rows, num_tokens) + self.overhead_seconds(num_rows)

    def overhead_seconds(self, num_rows: int) -> float:
        """The measured rest of a step of ``num_rows`` rows, else of the nearest batch
        size measured (a step of one more or one fewer row costs about the same), else 0."""
        over = self.overhead
        if not over:
            return 0.0
        got = over.get(num_rows)
        if got is None:
            got = over[min(over, key=lambda r: (abs(r - num_rows), r))]
        return got.value

    def observe_overhead(self, num_rows: int, seconds: float) -> None:
        """One decode step's time outside the target forward and the drafters."""
        if num_rows <= 0:
            return
        rest = self.overhead.get(num_rows)
        if rest is None:
            rest = self.overhead[num_rows] = RunningTime()
        rest.add(max(0.0, seconds))

    def forward_seconds(self, num_rows: int, num_tokens: float) -> float:
        """Forward time of ``num_rows`` rows carrying ``num_tokens`` tokens in all."""
        if num_rows <= 0:
            return 0.0
        per_row = max(1.0, num_tokens / num_rows)
        rs = self.rows
        if num_rows >= rs[-1]:  # beyond what was timed: the per-row cost of the largest
            return self._at_row(len(rs) - 1, per_row) * num_rows / rs[-1]
        i = bisect.bisect_left(rs, num_rows)
        if rs[i] == num_rows or i == 0:
            return self._at_row(i, per_row) * (num_rows / rs[i] if i == 0 else 1.0)
        lo, hi = self._at_row(i - 1, per_row), self._at_row(i, per_row)
        w = (num_rows - rs[i - 1]) / (rs[i] - rs[i - 1])
        return lo + w * (hi - lo)

    def _at_row(self, i: int, per_row: float) -> float:
        """Measured row ``i`` interpolated in tokens per row (flat past the grid's ends)."""
        ts, sec = self.tokens_per_row, self.seconds[i]
        if per_row <= ts[0]:
            return sec[0]
        if per_row >= ts[-1]:
            slope = (sec[-1] - sec[-2]) / (ts[-1] - ts[-2]) if len(ts) > 1 else 0.0
            return sec[-1] + max(0.0, slope) * (per_row - ts[-1])
        j = bisect.bisect_left(ts, per_row)
        w = (per_row - ts[j - 1]) / (ts[j] - ts[j - 1])
        return sec[j - 1] + w * (sec[j] - sec[j - 1])

    def observe_draft(self, seconds: float, num_tokens: int) -> None:
        """One step's proposing time over the tokens its drafters processed (the drafts
        they made, plus any backlog a draft model caught up on first); a step that made
        none teaches nothing (an n-gram miss costs a lookup, ~1% of a step)."""
        if num_tokens <= 0:
            return
        per = seconds / num_tokens
        if not self._draft_observed:
            self.draft_seconds_per_token, self._draft_observed = per, True
        else:
            w = DRAFT_COST_WEIGHT
            self.draft_seconds_per_token = (1 - w) * self.draft_seconds_per_token + w * per

    def summary(self) -> dict[str, Any]:
        """JSON for bench reports and ``/metrics``."""
        return {
            "source": self.source,
            "measure_seconds": self.measure_seconds,
            "rows": list(self.rows),
            "timed_rows": list(self.timed_rows or self.rows),
            "tokens_per_row": list(self.tokens_per_row),
            "forward_seconds": [list(r) for r in self.seconds],
            "draft_seconds_per_token": self.draft_seconds_per_token,
            "overhead_seconds": {str(r): v.value for r, v in sorted(self.overhead.items())},
            "measured_forward_seconds": [list(r) for r in self.measured],
            "engine_steps": [[point.count for point in row] for row in self.steps],
        }


def rows_grid(max_rows: int) -> list[int]:
    """Batch sizes to time: powers of two up to ``max_rows``, and ``max_rows`` itself."""
    out, r = [], 1
    while r < max_rows:
        out.append(r)
        r *= 2
    out.append(max_rows)
    return out


def measure_costs(
    runner: ModelRunner,
    kv: KVCacheManager,
    max_k: int,
    max_rows: int,
    *,
    cache_key: dict[str, Any] | None = None,
    threads: int | None = None,
) -> CostModel:
    """Time the forward grid (or read it from the file cache when ``cache_key`` is given).

    ``threads``: the compute threads the forward runs on; 1 times it on this thread's CPU
    clock (see the module docstring), anything else (or None) on the wall clock.
    """
    rows = rows_grid(max_rows)
    tokens = list(range(1, max_k + 2))
    clock_name = "thread" if threads == 1 else "wall"
    full_key = {**cache_key, "rows": rows, "tokens": tokens, "format": CACHE_FORMAT,
                "clock": clock_name} if cache_key else None
    path = _cache_path(full_key) if full_key else None
    clock = time.thread_time if clock_name == "thread" else time.perf_counter
    if path is not None and path.is_file():
        try:
            data = json.loads(path.read_text())
            return CostModel(rows, tokens, data["seconds"], source="cache", clock=clock,
                             timed_rows=tuple(data.get("timed_rows", ())))
        except (OSError, ValueError, KeyError) as exc:
            logger.warning("cost model cache %s unreadable (%s); measuring again", path, exc)
    start = time.perf_counter()
    timed_rows = [r for r in rows if r <= STARTUP_ROWS]
    timed = monotone(_time_grid(runner, kv, timed_rows, tokens, clock))
    grid = monotone(estimate_rows(timed_rows, tokens, timed, rows))
    model = CostModel(rows, tokens, grid, source="measured",
                      measure_seconds=time.perf_counter() - start, clock=clock,
                      timed_rows=tuple(timed_rows))
    logger.info("cost model: timed %d forwards in %.2f s", len(timed_rows) * len(tokens),
                model.measure_seconds)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"key": full_key, "seconds": grid,
                                        "timed_rows": timed_rows}))
        except OSError as exc:  # a read-only home is not a reason to refuse serving
            logger.warning("cost model not cached at %s: %s", path, exc)
    return model


def estimate_rows(timed_rows: list[int], tokens: list[int], timed: list[list[float]],
                  rows: list[int]) -> list[list[float]]:
    """The ``rows`` x ``tokens`` grid from the timed batch sizes: a timed point as timed,
    any other as a function of the forward's token count n = rows x tokens per row.

    Why n: a CPU forward streams every weight once (the cost at n = 1) and then computes
    per token, so over the small batches timed, time against n is the curve, and beyond
    them it goes on at the least-squares slope of the points past n = 1 (the per-token
    cost once the weights are streamed).
    Attention over the timing context is per token too. Points read off the curve are
    estimates: the engine's own steps at that batch size replace them
    (:meth:`CostModel.calibrated`)."""
    by_n: dict[int, list[float]] = {}
    for r, row in zip(timed_rows, timed):
        for t, sec in zip(tokens, row):
            by_n.setdefault(r * t, []).append(sec)
    ns = sorted(by_n)
    ys: list[float] = []
    for n in ns:  # the mean of the shapes with n tokens; never below a smaller n
        ys.append(max([sum(by_n[n]) / len(by_n[n]), *ys[-1:]]))

    # beyond the largest n timed: the least-squares slope over every n past the first
    # (the last segment alone read the default model's 8-row 2-token forward at 2.06x a
    # 1-token one against 1.73x timed; the fit over all of them, 1.84x)
    xs, zs = ns[1:], ys[1:]
    slope = 0.0
    if len(xs) >= 2:
        mx, mz = sum(xs) / len(xs), sum(zs) / len(zs)
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (z - mz) for x, z in zip(xs, zs)) / var if var else 0.0
    elif len(ns) == 2:
        slope = (ys[1] - ys[0]) / (ns[1] - ns[0])

    def at(n: int) -> float:
        if n <= ns[0] or len(ns) == 1:
            return ys[0] * (n / ns[0] if len(ns) == 1 and n > ns[0] else 1.0)
        if n >= ns[-1]:
            return ys[-1] + max(0.0, slope) * (n - ns[-1])
        j = bisect.bisect_left(ns, n)
        if ns[j] == n:
            return ys[j]
        w = (n - ns[j - 1]) / (ns[j] - ns[j - 1])
        return ys[j - 1] + w * (ys[j] - ys[j - 1])

    timed_at = dict(zip(timed_rows, timed))
    return [list(timed_at[r]) if r in timed_at else [at(r * t) for t in tokens] for r in rows]


def monotone(grid: list[list[float]]) -> list[list[float]]:
    """More rows or more tokens never cost less: a point timed low under another process's
    load is lifted to its smaller neighbours' time (running maximum along both axes)."""
    out = [list(row) for row in grid]
    for i, row in enumerate(out):
        for j in range(len(row)):
            below = [row[j - 1]] if j else []
            if i:
                below.append(out[i - 1][j])
            row[j] = max([row[j], *below])
    return out


def _time_grid(
    runner: ModelRunner, kv: KVCacheManager, rows: list[int], tokens: list[int],
    clock: Callable[[], float] = time.perf_counter,
) -> list[list[float]]:
    """Min seconds per grid point over ``REPEATS`` passes of the whole grid.

    The passes go over every point in turn rather than repeating one point at a time, so a
    burst of another process's load lands on different points in different passes and the
    minimum of each point escapes it. The first pass only warms the kernels' buffers.
    """
    recurrent = runner.has_recurrent_state
    start = 0 if recurrent else CONTEXT
    ids = [f"{_PROBE_ID}-{i}" for i in range(max(rows))]
    best = [[float("inf")] * len(tokens) for _ in rows]
    try:
        for req_id in ids:
            if not kv.allocate_slots(req_id, start + max(tokens)):
                from draftwise.errors import EngineConfigError

                raise EngineConfigError(
                    f"adaptive depth's cost model times batches of up to {max(rows)} rows "
                    f"of {start + max(tokens)} positions, which the KV pool "
                    f"({kv.capacity} blocks) cannot hold; lower "
                    "draftwise.adaptive.max_measured_rows or raise num_kv_blocks"
                )
        tables = [kv.block_table(r) for r in ids]
        for rep in range(REPEATS + 1):
            for i, r in enumerate(rows):
                for j, t in enumerate(tokens):
                    batch = runner.build(
                        [[1] * t for _ in range(r)], [start] * r, tables[:r],
                        [list(range(t)) for _ in range(r)], (), ids[:r],
                    )
                    t0 = clock()
                    runner.forward(batch)
                    if rep:
                        best[i][j] = min(best[i][j], clock() - t0)
                    for req_id in ids[:r]:  # a recurrent row restarts from zero state
                        runner.release(req_id)
        return best
    finally:
        for req_id in ids:
            runner.release(req_id)
            if req_id in kv:
                kv.free(req_id)


def _cache_path(key: dict[str, Any]) -> Path:
    """One file per (model file, dtype, threads, grid, ...): the key's hash names it."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    return cache_dir() / "cost-model" / f"{digest[:24]}.json"


__all__ = ["CostModel", "RunningTime", "measure_costs", "monotone", "rows_grid"]
