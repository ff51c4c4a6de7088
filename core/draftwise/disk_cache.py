"""Where draftwise keeps files between runs, and what names them.

Its own module because two caches at opposite ends of the code share it: the cost grid
(``spec/cost_model.py``, measured with the engine) and the packed-weights file
(``models/packed_cache.py``, written while the weights load). Each names its files by a
hash over :func:`model_identity` and :func:`code_identity`; neither should import the
other to find out how.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """``$DRAFTWISE_CACHE_DIR``, else ``$XDG_CACHE_HOME/draftwise``, else ``~/.cache/draftwise``."""
    own = os.environ.get("DRAFTWISE_CACHE_DIR")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "draftwise" if xdg else Path.home() / ".cache" / "draftwise"


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


__all__ = ["cache_dir", "code_identity", "model_identity"]
