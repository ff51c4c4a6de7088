"""What the step profilers share (``batched_step_profile.py``, ``decode_profile.py``,
``draft_model_step.py``, ``hybrid_step.py``): the kernel wrappers they time, a span timed
in process CPU and wall at once, and the report written the one way.

Both clocks, because this machine is shared: wall time moves with other processes' load,
process CPU (every thread of this process) mostly does not, so a report carries both and
the load average it ran under.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


#: every ``models.kernels`` entry point a forward calls, timed per call by the profilers
#: (one list: a kernel missing from a profiler's copy was counted as "outside kernels",
#: as the attention was in ``batched_step_profile``'s)
KERNEL_WRAPPERS: tuple[str, ...] = (
    "linear_quant", "linear_bf16", "paged_attention", "paged_attention_qkv", "rms_norm",
    "add_rms_norm", "silu_mul", "rope_", "rope_qkv_", "argmax_f32", "quant_dequant_rows",
)


@dataclass(slots=True)
class Span:
    """Seconds one timed block took: ``cpu`` of this process (all its threads), ``wall``."""

    cpu: float = 0.0
    wall: float = 0.0


@contextmanager
def cpu_wall() -> Iterator[Span]:
    """Time the ``with`` block; the yielded span is filled when the block ends.

    For blocks of a whole step or more: the context manager's own microsecond is inside
    the span (per-kernel timers keep their raw ``perf_counter`` pair).
    """
    span = Span()
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        yield span
    finally:
        span.cpu, span.wall = time.process_time() - c0, time.perf_counter() - w0


def write_report(report: dict[str, Any], out: str | None) -> None:
    """The report with the load average it ran under, as JSON on stdout and in ``out``."""
    report["loadavg"] = os.getloadavg()
    text = json.dumps(report, indent=2)
    if out:
        Path(out).write_text(text)
    print(text)
