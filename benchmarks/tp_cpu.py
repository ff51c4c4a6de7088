"""Tensor parallel on CPU: TP=2 against TP=1 decode (tokens/s), and the per-layer reduction.

Run: ``python benchmarks/tp_cpu.py [--hidden 576 --layers 30 ...]``. It saves a synthetic
llama checkpoint of the given shape (HF safetensors: tensor parallel does not load GGUF),
decodes ``--tokens`` greedy tokens from one prompt at TP=1 (1 and 2 threads) and at
TP=2 (one thread per rank: both ranks together use the machine's 2 cores), and times the two reductions a decoder layer
makes at TP=2 on a one-token ``[1, hidden]`` tensor: gloo's ``all_reduce`` and the
rank-ordered all-gather sum draftwise runs (``models.tp.group``), median of 200.
Prints one JSON object. The numbers in ``docs/scaling.md`` came from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def save_checkpoint(directory: Path, a: argparse.Namespace) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_checkpoints import save_tiny

    return save_tiny("llama", directory, hidden_size=a.hidden, num_hidden_layers=a.layers,
                     num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                     intermediate_size=a.inter, vocab_size=a.vocab,
                     max_position_embeddings=512, tie_word_embeddings=True)


def decode(path: Path, tp: int, threads: int, a: argparse.Namespace) -> float:
    from draftwise.engine import LLMEngine
    from draftwise.engine_args import EngineArgs
    from draftwise.sampling_params import SamplingParams

    eng = LLMEngine(EngineArgs(model=str(path), dtype=a.dtype, tensor_parallel_size=tp,
                               num_threads=threads, max_num_seqs=1, num_kv_blocks=64))
    params = SamplingParams(temperature=0.0, max_tokens=a.tokens, ignore_eos=True)
    best = 0.0
    for run in range(a.repeat + 1):  # the first run warms up
        eng.add_request({"prompt_token_ids": list(range(3, 35))}, params, request_id=f"r{run}")
        t0 = time.perf_counter()
        while eng.has_unfinished_requests():
            eng.step()
        if run:
            best = max(best, a.tokens / (time.perf_counter() - t0))
    if tp > 1:
        eng.runner.model.driver.close()  # type: ignore[union-attr]
    return best


def reduce_peer(port: int, hidden: int, dtype: str) -> None:
    """Rank 1 of :func:`reduce_cost` (a separate process)."""
    reduce_loop(1, port, hidden, dtype)


def reduce_loop(rank: int, port: int, hidden: int, dtype: str) -> dict[str, float]:
    import torch.distributed as dist

    from draftwise.models.tp.group import TPGroup

    torch.set_num_threads(1)
    group = TPGroup(rank, 2, port, "gloo", 30.0)
    if rank == 0:
        peer = subprocess.Popen([sys.executable, __file__, "--peer", str(group.port),
                                 "--hidden", str(hidden), "--dtype", dtype])
    group.join()
    x = torch.randn(1, hidden).to(getattr(torch, dtype))
    pg = group._pg
    out: dict[str, float] = {}
    for name, op in (("all_reduce", lambda: pg.allreduce([x.clone()]).wait()),
                     ("ordered_sum", lambda: group.reduce_sum(x))):
        times = []
        for _ in range(220):
            t0 = time.perf_counter()
            op()
            times.append(time.perf_counter() - t0)
        out[f"{name}_us"] = round(statistics.median(times[20:]) * 1e6, 1)
    if rank == 0:
        peer.wait(timeout=30)
    del dist
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--inter", type=int, default=1536)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--peer", type=int, default=None)
    a = p.parse_args()
    if a.peer is not None:
        reduce_peer(a.peer, a.hidden, a.dtype)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = save_checkpoint(Path(tmp), a)
        tps = {f"tp{tp}_threads{n}_tok_s": round(decode(path, tp, n, a), 1)
               for tp, n in ((1, 1), (1, 2), (2, 1))}  # TP=2: one thread per rank
    cost = reduce_loop(0, 0, a.hidden, a.dtype)
    print(json.dumps({"shape": vars(a), **tps, "per_reduction": cost,
                      "reductions_per_token": 2 * a.layers + 1}))


if __name__ == "__main__":
    main()
