"""This process's own peak resident memory: the one place every report reads it from.

Why not ``resource.getrusage(RUSAGE_SELF).ru_maxrss``: on Linux it is the larger of the
process's own high-water mark and ``signal->maxrss``, which ``exec`` sets from the
address space it replaces. A child started by fork (or vfork, as ``subprocess`` does)
and exec therefore reports its parent's peak at the spawn whenever that is larger: a
start-up probe spawned by a benchmark holding several engines said 8668 MiB for a run
of 1.4 GB. ``VmHWM`` in ``/proc/self/status`` is the high-water mark of this address
space alone (it starts at exec). Where there is no ``/proc`` (macOS), ``ru_maxrss`` is
what there is (in bytes there; KiB on Linux).
"""

from __future__ import annotations

import sys

#: the line of ``/proc/self/status`` holding the peak resident set, in kB
_STATUS_FILE, _HWM_KEY = "/proc/self/status", "VmHWM:"


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far, in bytes (``VmHWM``; see the module doc)."""
    try:
        with open(_STATUS_FILE, encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith(_HWM_KEY):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def peak_rss_mib() -> float:
    """:func:`peak_rss_bytes` in MiB."""
    return peak_rss_bytes() / 2**20
