"""Rank 0's side of tensor parallel: start the other ranks, send them each step, stop them.

The scheduler, the proposers and verify run on rank 0 only. Ranks 1..N-1 are worker
processes (``python -m draftwise.models.tp.worker``) that load their shard and then run
one forward per message. Each step's inputs (the :class:`ForwardBatch` and the KV cache's
shape) go to every worker through its stdin pipe, pickled once per step, rather than as a
``torch.distributed`` broadcast: a worker waits for the next step as long as the engine
idles, which a collective cannot do without hitting its timeout, and when rank 0 dies its
pipes close and the workers exit (EOF) instead of waiting for a timeout. The collectives
inside the forward use the group's explicit timeout (``models.tp.group``).

A worker that exited is noticed before the step is sent; one that dies or hangs during the
step makes rank 0's next collective fail, at once or after the timeout. Either way the
step's requests fail with :class:`~draftwise.models.tp.errors.TensorParallelRankError`,
and so does every later step.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
import time
import weakref
from typing import IO, cast


from draftwise.formats.default_model import resolve_model_path
from draftwise.models.batch import ForwardBatch, KVCache
from draftwise.models.loader import LoadedModel, ProgressFn, plan_hf_dir, resolve_dtype
from draftwise.models.tp.errors import TensorParallelRankError
from draftwise.models.tp.group import TPGroup
from draftwise.models.tp.load import check_target, load_shard
from draftwise.models.tp.model import TPLlamaForCausalLM
from draftwise.models.tp.plan import backend_for, check_size, refuse_format

#: seconds a worker may take to start (imports) and to load its shard
START_TIMEOUT_S = 300.0
#: a message's length prefix (bytes of the pickle that follows)
HEADER = struct.Struct("<Q")


def write_message(pipe: IO[bytes], message: object) -> None:
    """One length-prefixed pickle (the workers' only input)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(HEADER.pack(len(data)) + data)
    pipe.flush()


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Close every worker's pipe (its loop exits on EOF), then make sure it is gone."""
    for proc in procs:
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Driver:
    """The worker processes of ranks 1..N-1 and the group they share with rank 0."""

    def __init__(self, group: TPGroup, procs: list[subprocess.Popen[bytes]]) -> None:
        self.group = group
        #: rank ``i + 1``'s process is ``procs[i]``
        self.procs = procs
        self._finalizer = weakref.finalize(self, _stop, procs)

    def check_alive(self) -> None:
        """Fail (and break the group) if a worker has exited."""
        self.group.check()
        for rank, proc in enumerate(self.procs, 1):
            code = proc.poll()
            if code is not None:
                raise self.group.fail(f"rank {rank} exited with code {code}; the step")

    def send(self, batch: ForwardBatch, kv: KVCache) -> None:
        """Hand the step to every worker (see the module doc)."""
        self.check_alive()
        message = ("forward", batch, kv.num_blocks, kv.block_size)
        for rank, proc in enumerate(self.procs, 1):
            try:
                write_message(cast(IO[bytes], proc.stdin), message)  # Popen(stdin=PIPE)
            except (OSError, ValueError) as exc:  # a closed pipe: ValueError
                raise self.group.fail(f"sending the step to rank {rank}", exc) from exc

    def wait_for(self, what: str, deadline_s: float) -> None:
        """Wait until every worker signalled ``what``, failing at once if one exits."""
        end = time.monotonic() + deadline_s
        for rank, proc in enumerate(self.procs, 1):
            while not self.group.reached(what, rank):
                time.sleep(0.05)
                code = proc.poll()
                if code is not None or time.monotonic() > end:
                    why = (f"exited with code {code} (its error is on stderr)"
                           if code is not None else f"did not get there in {deadline_s:g} s")
                    raise TensorParallelRankError(
                        f"tensor parallel: rank {rank} of {len(self.procs) + 1} {why} while "
                        f"{what}")

    def close(self) -> None:
        """Stop the workers and drop the group (idempotent)."""
        self._finalizer()
        self.group.close()


def threads_per_rank(num_threads: int | None, size: int) -> int:
    """Each rank's compute threads: the user's number per rank, else the usable cores
    shared out among the ranks (they run on one machine here)."""
    if num_threads is not None:
        return num_threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    return max(1, cores // size)


def start_tensor_parallel(model: str | None, dtype: str, size: int, threads: int,
                          timeout_s: float, progress: ProgressFn | None = None) -> LoadedModel:
    """Check the split, start ranks 1..size-1, load rank 0's shard: the target rank 0 runs.

    Refusals (``TensorParallelConfigError``) come before any process starts or weight is
    read; a rank that cannot start or load fails within ``timeout_s``.
    """
    size = check_size(size)
    path = resolve_model_path(model)
    if not os.path.isdir(path):
        raise refuse_format(size, f"a GGUF target ({path}): quantized tensor parallel is not "
                            "built (a row-parallel weight would be cut along K at "
                            "quantization-block boundaries)")
    plan = plan_hf_dir(path)
    split = check_target(plan, size)
    torch_dtype = resolve_dtype(dtype)
    backend = backend_for("cpu")
    group = TPGroup(0, size, 0, backend, timeout_s, START_TIMEOUT_S)
    procs = []
    for rank in range(1, size):
        spec = {"rank": rank, "size": size, "port": group.port, "backend": backend,
                "timeout_s": timeout_s, "path": path, "dtype": str(torch_dtype).split(".")[-1],
                "threads": threads}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "draftwise.models.tp.worker", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL))
    driver = Driver(group, procs)
    try:
        driver.wait_for("joining", START_TIMEOUT_S)
        group.join()
        loaded = load_shard(plan, split, group, torch_dtype, progress)
        driver.wait_for("loaded", START_TIMEOUT_S)
    except BaseException:
        driver.close()
        raise
    cast(TPLlamaForCausalLM, loaded.model).driver = driver
    return loaded
