"""Ranks 1..N-1 of tensor parallel: load this rank's shard, then one forward per message.

Started by rank 0 (``models.tp.driver``) as ``python -m draftwise.models.tp.worker
<json>``. It reads length-prefixed pickles from stdin: ``("forward", batch, num_blocks,
block_size)`` runs the step's forward on this rank's shard (its KV cache allocated on the
first step, sized like rank 0's with this rank's KV heads); EOF or ``("stop",)`` ends it.
A failure exits non-zero after printing why: rank 0's next collective then fails.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import IO, Any

import torch

from draftwise.models.batch import KVCache
from draftwise.models.kernels import set_kernel_threads
from draftwise.models.loader import plan_hf_dir, resolve_dtype
from draftwise.models.tp.driver import HEADER
from draftwise.models.tp.group import TPGroup
from draftwise.models.tp.load import check_target, load_shard


def read_message(pipe: IO[bytes]) -> Any:
    """The next message, or None at EOF (rank 0 is gone or closed the pipe)."""
    import pickle

    head = pipe.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (length,) = HEADER.unpack(head)
    data = pipe.read(length)
    if len(data) < length:
        return None
    return pickle.loads(data)  # noqa: S301 - rank 0's own pipe, never a network peer


def serve(spec: dict[str, Any], pipe: IO[bytes]) -> None:
    """Join, load, then run forwards until the pipe closes."""
    group = TPGroup(spec["rank"], spec["size"], spec["port"], spec["backend"],
                    spec["timeout_s"])
    group.signal("joining")
    group.join()
    plan = plan_hf_dir(spec["path"])
    loaded = load_shard(plan, check_target(plan, spec["size"]), group,
                        resolve_dtype(spec["dtype"]))
    model = loaded.model
    backend = model.backend.finish(model.gemm_kinds(), spec["threads"])
    model.backend = backend
    set_kernel_threads(backend.threads)
    torch.set_num_threads(backend.torch_threads or 1)
    group.signal("loaded")  # rank 0 waits for this before its first step
    kv: KVCache | None = None
    while (message := read_message(pipe)) is not None and message[0] == "forward":
        _, batch, num_blocks, block_size = message
        if kv is None or (kv.num_blocks, kv.block_size) != (num_blocks, block_size):
            kv = KVCache.allocate(num_layers=model.num_layers, num_blocks=num_blocks,
                                  block_size=block_size, num_kv_heads=model.num_kv_heads,
                                  head_dim=model.head_dim, dtype=model.dtype)
        model(batch, kv)


def main(argv: list[str]) -> int:
    """The process entry: 0 when rank 0 closed the pipe, 1 after a failure."""
    sys.stdout = sys.stderr  # rank 0's stdout is the user's
    try:
        serve(json.loads(argv[1]), sys.stdin.buffer)
    except Exception:  # noqa: BLE001 - reported, and rank 0's collective fails next
        print(f"draftwise tensor-parallel worker failed:\n{traceback.format_exc()}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
