"""Time draftwise.gpu's Triton kernels on a CUDA device at Qwen2.5-Coder-1.5B's shapes.

Run by ``benchmarks/device_check.sh`` on a lent GPU (never in CI: it needs CUDA). Each
kernel is timed with ``triton.testing.do_bench`` (median of repeated launches, caches
warm) beside a cuBLAS/torch baseline of the same work, and the bytes it must read are
turned into an effective bandwidth to set against the card's (H100 HBM3: 3.35 TB/s).
Writes one JSON object (``--out``), and prints it.

Shapes (Qwen2.5-1.5B): 12 query heads, 2 kv heads, head 128; MLP 1536 -> 8960 (Q4_K
gate/up), 8960 -> 1536 (Q6_K down); vocabulary 151,936; block size 16.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np
import torch


def bench_attention(out: dict[str, Any]) -> None:
    """Decode (1 query row) and verify (k + 1 = 5) over 32 sequences of context 1024."""
    from triton.testing import do_bench

    from draftwise.gpu.attention import paged_attention

    h, kvh, d, bs, rows, ctx = 12, 2, 128, 16, 32, 1024
    blocks = rows * (ctx + 16) // bs + 1
    kc = torch.randn(blocks, bs, kvh, d, device="cuda", dtype=torch.float16)
    vc = torch.randn_like(kc)
    for label, qlen in (("decode", 1), ("verify_k4", 5)):
        per = -(-(ctx + qlen) // bs)
        tables = (torch.arange(rows * per, device="cuda").view(rows, per) + 1)
        seq = torch.full((rows,), ctx + qlen, device="cuda")
        qsl = torch.arange(rows + 1, device="cuda") * qlen
        pos = torch.arange(ctx, ctx + qlen, device="cuda").repeat(rows)
        row = torch.arange(rows, device="cuda").repeat_interleave(qlen)
        slots = tables[row, pos // bs] * bs + pos % bs
        t = rows * qlen
        q = torch.randn(t, h, d, device="cuda", dtype=torch.float16)
        k = torch.randn(t, kvh, d, device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        ms = do_bench(lambda: paged_attention(q, k, v, kc, vc, slots, qsl, seq, tables,
                                              d ** -0.5))
        kv_bytes = 2 * rows * (ctx + qlen) * kvh * d * 2
        # baseline: SDPA over the same contexts already gathered densely (no paging)
        kd = kc[1:1 + rows * per].view(rows, per * bs, kvh, d)[:, :ctx + qlen]
        kd = kd.transpose(1, 2).repeat_interleave(h // kvh, 1).contiguous()
        qd = q.view(rows, qlen, h, d).transpose(1, 2)
        sdpa = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, kd))
        out[f"attention_{label}"] = {
            "rows": rows, "context": ctx, "query_rows": qlen, "ms": ms,
            "kv_GBps": kv_bytes / ms / 1e6, "sdpa_dense_ms": sdpa,
        }


def bench_quant(out: dict[str, Any]) -> None:
    """GEMV (M=1), verify-sized (M=5) and batch (M=32) products with GGUF weights."""
    from triton.testing import do_bench

    from draftwise.gpu.quant import BLOCKS, dequantize_reference, quant_matmul

    rng = np.random.default_rng(0)
    for name, qtype, n, k in (("Q4_K", 12, 8960, 1536), ("Q6_K", 14, 1536, 8960),
                              ("Q8_0", 8, 8960, 1536)):
        per, size = BLOCKS[qtype]
        raw = rng.integers(0, 256, (n * k // per, size), dtype=np.uint8)
        f16 = {8: (0,), 12: (0, 2), 14: (208,)}[qtype]
        for off in f16:
            raw[:, off:off + 2] = rng.uniform(-0.02, 0.02, len(raw)).astype(
                np.float16).view(np.uint8).reshape(-1, 2)
        w = torch.from_numpy(raw.reshape(n, -1)).cuda()
        dense = dequantize_reference(w.cpu(), qtype, k).half().cuda()
        for m in (1, 5, 32):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            ms = do_bench(lambda: quant_matmul(x, w, qtype))
            ref = do_bench(lambda: x @ dense.T)
            out[f"gemm_{name}_m{m}"] = {
                "n": n, "k": k, "ms": ms, "weight_GBps": w.numel() / ms / 1e6,
                "fp16_cublas_ms": ref,
            }


def bench_verify(out: dict[str, Any]) -> None:
    """32 requests with 4 drafts each over a 151,936 vocabulary, greedy and random."""
    from triton.testing import do_bench

    from draftwise.gpu.verify import verify_on_device
    from draftwise.sampling_params import SamplingParams

    rows, k, vocab = 32, 4, 151_936
    logits = torch.randn(rows * (k + 1), vocab, device="cuda")
    drafts = torch.randint(0, vocab, (rows * k,)).tolist()
    for label, params in (("greedy", SamplingParams(temperature=0)),
                          ("random", SamplingParams(temperature=0.8))):
        ms = do_bench(lambda: verify_on_device(logits, drafts, [k] * rows, [params] * rows,
                                               [None] * rows))
        out[f"verify_{label}"] = {"rows": rows, "k": k, "vocab": vocab, "ms": ms}


def main() -> int:
    """Run every section; a failing section is recorded with its error, the rest still run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device; nothing to time", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for section in (bench_attention, bench_quant, bench_verify):
        try:
            section(report)
        except Exception as exc:  # noqa: BLE001 - one broken section must not hide the others
            report[section.__name__] = {"error": f"{type(exc).__name__}: {exc}"}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
