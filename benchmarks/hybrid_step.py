"""Decode-step time of the GDN hybrid: native kernels vs the torch path, interleaved.

A random Qwen3.5-style hybrid of a chosen size (``scripts/build_tiny_hybrid.py``'s
builder with the sizes below, saved by transformers) is loaded twice in bf16: as decided
(native attention and elementwise kernels) and with ``DRAFTWISE_ATTENTION=torch`` (every
small op and the attention in torch, the pre-native path; both pack the projections
for the native GEMM). Each then runs ``--steps`` decode steps of 1 and of ``--rows``
rows after a ``--prompt``-token prefill, alternating the two models step block by step
block so machine load hits both alike. Times are per step, CPU seconds of this process
(``time.process_time``: robust to other processes' load at 1 thread) and wall.

    python benchmarks/hybrid_step.py --size small --threads 1
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # timing.py beside this script

SIZES: dict[str, dict[str, int]] = {
    "tiny": {},
    # ~110M parameters: wide enough that the ops, not Python, set the step time
    "small": {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 3072,
              "vocab_size": 16384, "linear_num_key_heads": 4, "linear_num_value_heads": 8,
              "linear_key_head_dim": 128, "linear_value_head_dim": 128,
              "max_position_embeddings": 4096},  # fmt: skip
}


def build_checkpoint(size: str, directory: Path) -> Path:
    """The builder's hybrid with ``SIZES[size]`` over its tiny defaults (MTP head off)."""
    spec = importlib.util.spec_from_file_location("build_tiny_hybrid",
                                                  ROOT / "scripts" / "build_tiny_hybrid.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    mod.TINY = {**mod.TINY, **SIZES[size]}
    return mod.build(directory, "qwen3_5", mtp=False)


def load(path: Path, torch_path: bool) -> Any:
    from draftwise.models.qwen3_next import load_hybrid

    if torch_path:
        os.environ["DRAFTWISE_ATTENTION"] = "torch"
    try:
        return load_hybrid(str(path), torch.bfloat16)[0]
    finally:
        os.environ.pop("DRAFTWISE_ATTENTION", None)


class Rows:
    """``rows`` sequences on their own KV blocks and state slots, stepped together."""

    def __init__(self, model: Any, rows: int, prompt: int, steps: int) -> None:
        from draftwise.cache.recurrent import RecurrentStatePool
        from draftwise.models.batch import KVCache

        self.model, self.rows, self.bs = model, rows, 16
        per = -(-(prompt + steps + 8) // self.bs)
        self.kv = KVCache.allocate(model.num_layers, rows * per, self.bs, model.num_kv_heads,
                                   model.head_dim, model.dtype)  # fmt: skip
        layers, shapes, dtypes = model.recurrent_layout()
        self.pool = RecurrentStatePool(rows, shapes, layers, dtypes, max_spec_positions=0)
        self.names = [f"r{i}" for i in range(rows)]
        for n in self.names:
            self.pool.allocate(n)
        self.tables = [list(range(i * per, (i + 1) * per)) for i in range(rows)]
        self.lengths = [0] * rows
        gen = torch.Generator().manual_seed(0)
        for i in range(rows):
            ids = torch.randint(0, model.config.vocab_size, (prompt,), generator=gen).tolist()
            self.step([i], [ids])

    def step(self, which: list[int], ids: list[list[int]]) -> None:
        from draftwise.models.batch import build_forward_batch

        batch = build_forward_batch(
            ids, [self.lengths[i] for i in which], [self.tables[i] for i in which], self.bs,
            [[len(t) - 1] for t in ids], state_slots=self.pool.slots([self.names[i] for i in which]))
        self.model(batch, self.kv, self.pool)
        for i, t in zip(which, ids):
            self.lengths[i] += len(t)

    def decode(self) -> None:
        self.step(list(range(self.rows)), [[7] for _ in range(self.rows)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--blocks", type=int, default=3, help="alternating blocks of steps")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from draftwise.models.kernels import set_kernel_threads
    from timing import cpu_wall, write_report

    torch.set_num_threads(1)
    set_kernel_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(args.size, Path(tmp) / "hybrid")
        models = {"native": load(path, False), "torch": load(path, True)}
    report: dict[str, Any] = {"size": args.size, "threads": args.threads, "prompt": args.prompt,
                              "backends": {k: m.backend.line() for k, m in models.items()}}
    for rows in sorted({1, args.rows}):
        runs = {k: Rows(m, rows, args.prompt, args.steps * args.blocks) for k, m in models.items()}
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        wall: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.blocks):
            for k, r in runs.items():
                r.decode()  # warm
                for _ in range(args.steps):
                    with cpu_wall() as span:
                        r.decode()
                    cpu[k].append(span.cpu)
                    wall[k].append(span.wall)
        report[f"rows={rows}"] = {
            k: {"cpu_ms": 1e3 * statistics.median(cpu[k]), "wall_ms": 1e3 * statistics.median(wall[k]),
                "tok_per_s_wall": rows / statistics.median(wall[k])}
            for k in runs}  # fmt: skip
        n, t = report[f"rows={rows}"]["native"], report[f"rows={rows}"]["torch"]
        print(f"rows={rows}: native {n['cpu_ms']:.2f} ms cpu / {n['wall_ms']:.2f} wall, "
              f"torch {t['cpu_ms']:.2f} / {t['wall_ms']:.2f}: "
              f"{t['cpu_ms'] / n['cpu_ms']:.2f}x cpu", file=sys.stderr)
    write_report(report, args.out)


if __name__ == "__main__":
    main()
