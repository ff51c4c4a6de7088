"""Tensor parallel's two errors: a split refused before anything loads, a rank lost mid-run."""

from __future__ import annotations

from draftwise.errors import DraftwiseError, EngineConfigError


class TensorParallelConfigError(EngineConfigError):
    """A tensor-parallel setting this target or build cannot run; the message says what
    would (raised before any weight is read)."""


class TensorParallelRankError(DraftwiseError, RuntimeError):
    """A rank died or stopped answering: the step's requests fail with this, and every later
    step fails at once (the group cannot be rebuilt under a running engine)."""
