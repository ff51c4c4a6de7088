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

Between grid points :meth:`CostModel.step_seconds` interpolates linearly in tokens, then
in rows; beyond the largest measured batch it extrapolates per row. The drafters' cost per
draft token is measured online (:meth:`CostModel.observe_draft`), as an exponentially
weighted mean over the steps that asked for drafts.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from draftwise.cache.manager import KVCacheManager
    from draftwise.runner import ModelRunner

logger = logging.getLogger("draftwise.cost_model")

#: weight of the newest step in the drafters' cost per token
DRAFT_COST_WEIGHT = 0.1
#: timed passes over the grid (each point's minimum is kept: other load only adds time)
REPEATS = 4
#: context each timed row attends over (a typical decode position, well inside any model)
CONTEXT = 128
_PROBE_ID = "draftwise-cost-probe"
#: bumped when what a cached grid means changes (then old files are simply not found)
CACHE_FORMAT = 2


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

    def step_seconds(self, num_rows: int, num_tokens: float) -> float:
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

    def observe_draft(self, seconds: float, num_tokens_asked: int) -> None:
        """One step's proposing time over the tokens its drafters processed (the drafts
        asked for, plus any backlog a draft model caught up on first)."""
        if num_tokens_asked <= 0:
            return
        per = seconds / num_tokens_asked
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
            "tokens_per_row": list(self.tokens_per_row),
            "forward_seconds": [list(r) for r in self.seconds],
            "draft_seconds_per_token": self.draft_seconds_per_token,
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
            return CostModel(rows, tokens, data["seconds"], source="cache", clock=clock)
        except (OSError, ValueError, KeyError) as exc:
            logger.warning("cost model cache %s unreadable (%s); measuring again", path, exc)
    start = time.perf_counter()
    grid = monotone(_time_grid(runner, kv, rows, tokens, clock))
    model = CostModel(rows, tokens, grid, source="measured",
                      measure_seconds=time.perf_counter() - start, clock=clock)
    logger.info("cost model: timed %d forwards in %.2f s", len(rows) * len(tokens),
                model.measure_seconds)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"key": full_key, "seconds": grid}))
        except OSError as exc:  # a read-only home is not a reason to refuse serving
            logger.warning("cost model not cached at %s: %s", path, exc)
    return model


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


def cache_dir() -> Path:
    """``$DRAFTWISE_CACHE_DIR``, else ``$XDG_CACHE_HOME/draftwise``, else ``~/.cache/draftwise``."""
    own = os.environ.get("DRAFTWISE_CACHE_DIR")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "draftwise" if xdg else Path.home() / ".cache" / "draftwise"


def _cache_path(key: dict[str, Any]) -> Path:
    """One file per (model file, dtype, threads, grid, ...): the key's hash names it."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    return cache_dir() / "cost-model" / f"{digest[:24]}.json"


def code_identity() -> dict[str, Any]:
    """What identifies the code that ran the timing: the package version and the compiled
    kernels (a rebuilt or upgraded kernel changes every cost, so it must not reuse a grid
    timed on the old one)."""
    import draftwise

    out: dict[str, Any] = {"version": getattr(draftwise, "__version__", "")}
    try:
        from draftwise import _cpu_kernels

        st = Path(_cpu_kernels.__file__).stat()
        out["kernels"] = {"size": st.st_size, "mtime": st.st_mtime_ns}
    except (ImportError, OSError, TypeError):
        out["kernels"] = None
    return out


def model_identity(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What identifies a checkpoint for the cache: its path, size and modification time."""
    p = Path(path)
    try:
        st = p.stat()
        return {"path": str(p.resolve()), "size": st.st_size, "mtime": st.st_mtime_ns}
    except OSError:
        return {"path": str(p)}


__all__ = [
    "CostModel", "cache_dir", "code_identity", "measure_costs", "model_identity", "monotone",
    "rows_grid",
]
