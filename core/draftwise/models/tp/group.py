"""One tensor-parallel process group and the two collectives a forward needs, in a fixed order.

**Reduction order.** Row-parallel projections and the vocab-parallel embedding produce
one partial sum per rank. :meth:`TPGroup.reduce_sum` all-gathers the partials and adds
them in rank order (``p0 + p1 + ...``) on every rank, so every rank holds the same bits
and a run gives the same bits as the last one, whatever algorithm the backend's
all-reduce would pick for a message size (gloo's ring and halving-doubling chunk the
tensor differently, so its sums' order varies with size and world). The price is
``size`` times the bytes of an all-reduce, measured in ``docs/scaling.md``.

**Logits.** :meth:`TPGroup.gather_vocab` all-gathers each rank's vocabulary columns,
so rank 0 verifies against the full row (the other ranks drop theirs).

**Failure.** The group is made with an explicit ``timeout``: a rank that dies makes the
next collective fail at once (its sockets close) or, if it hangs, after the timeout. Both
become :class:`~draftwise.models.tp.errors.TensorParallelRankError`, and the group is
marked broken so every later call fails at once instead of waiting again.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from draftwise.models.tp.errors import TensorParallelRankError


class TPGroup:
    """This process's rank in a group of ``size``: its own TCP store and process group
    (not ``torch.distributed``'s default group, so nothing process-wide is set and two
    engines may live in one process)."""

    def __init__(self, rank: int, size: int, port: int, backend: str, timeout_s: float,
                 start_timeout_s: float = 300.0, address: str = "127.0.0.1") -> None:
        """Rank 0 opens the store (``port`` 0: a free one, then :attr:`port` says which);
        the others connect to it. ``timeout_s`` bounds each collective; start-up (imports,
        loading a shard) may take up to ``start_timeout_s``."""
        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        #: why the group is unusable (None: healthy)
        self.broken: str | None = None
        try:
            wait = timedelta(seconds=max(timeout_s, start_timeout_s))
            self.store = dist.TCPStore(  # type: ignore[attr-defined]
                address, port, size, rank == 0, timeout=wait, wait_for_workers=False)
            #: the store's port (rank 0 passes it to the others)
            self.port = int(self.store.port)
        except Exception as exc:  # noqa: BLE001 - any start-up failure is the same to a user
            raise TensorParallelRankError(
                f"tensor parallel: rank {rank} of {size} could not reach the group's store at "
                f"{address}:{port} within {timeout_s:g} s: {type(exc).__name__}: {exc}"
            ) from exc
        self._backend = backend
        #: gloo's (or NCCL's) process group once joined: a ``torch.distributed`` Backend
        self._pg: Any = None

    def signal(self, what: str) -> None:
        """Tell rank 0 this rank reached ``what`` (``joining``, ``loaded``)."""
        self.store.set(f"{what}/{self.rank}", "1")

    def reached(self, what: str, rank: int) -> bool:
        """Whether ``rank`` signalled ``what`` yet (does not wait)."""
        return bool(self.store.check([f"{what}/{rank}"]))

    def join(self) -> None:
        """Form the process group (blocks until every rank joined, or the timeout)."""
        timeout = timedelta(seconds=self.timeout_s)
        try:
            if self._backend == "nccl":  # the CUDA path: stated, not run on these machines
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                self._pg = dist.ProcessGroupNCCL(self.store, self.rank, self.size, opts)
            else:
                self._pg = dist.ProcessGroupGloo(self.store, self.rank, self.size, timeout)
        except Exception as exc:  # noqa: BLE001
            raise self.fail("joining the group", exc) from exc

    def check(self) -> None:
        """Fail at once if a collective already failed."""
        if self.broken is not None:
            raise TensorParallelRankError(self.broken)

    def fail(self, what: str, exc: BaseException | None = None) -> TensorParallelRankError:
        """Mark the group broken and return the error that says so."""
        cause = "" if exc is None else f": {type(exc).__name__}: {str(exc).splitlines()[0]}"
        self.broken = (f"tensor parallel: {what} failed on rank {self.rank} of {self.size} (a "
                       f"rank died or did not answer within {self.timeout_s:g} s){cause}. "
                       "The engine cannot run further steps; restart it")
        return TensorParallelRankError(self.broken)

    def _gather(self, x: torch.Tensor, what: str) -> list[torch.Tensor]:
        self.check()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        if self._pg is None:
            raise TensorParallelRankError("tensor parallel: the group was not joined")
        try:
            self._pg.allgather([parts], [x.contiguous()]).wait()
        except Exception as exc:  # noqa: BLE001 - gloo raises RuntimeError/DistBackendError
            raise self.fail(what, exc) from exc
        return parts

    def reduce_sum(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        """The sum of every rank's ``x``, added in rank order (the same bits everywhere)."""
        parts = self._gather(x, "all-reduce")
        out = parts[0]
        for part in parts[1:]:
            out = out + part
        return out

    def gather_vocab(self, x: torch.Tensor) -> torch.Tensor:  # [N, V/size] -> [N, V padded]
        """Every rank's vocabulary columns side by side, in rank order."""
        return torch.cat(self._gather(x, "logits all-gather"), dim=-1)

    def close(self) -> None:
        """Drop the group and the store (the other ranks' next collective then fails)."""
        self._pg = None
        self.broken = self.broken or "tensor parallel: the group was closed"
