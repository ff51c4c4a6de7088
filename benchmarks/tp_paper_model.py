"""The paper model of ``docs/scaling.md`` (## GPUs and tensor parallelism): batch-1 decode
of a 7B and a 70B model at tensor parallel 1/2/4/8 on H100s over NVLink, with and without
speculation, from published bandwidths and the decode roofline. Prints the markdown table.

Nothing here was measured: every input is a constant below, each stated in the document.
"""

from __future__ import annotations

HBM = 3.35e12  # bytes/s, H100 SXM HBM3 (published peak)
NVLINK = 450e9  # bytes/s one direction (NVLink 4: 900 GB/s bidirectional, published)
ALLREDUCE_LATENCY = 8e-6  # s per small all-reduce on NVLink (assumed: NCCL/custom, 5-20 us)
GPU_MEMORY = 80e9
CONTEXT = 4096

MODELS = {  # params, layers, hidden, kv heads, head dim (Llama-3-8B-like / Llama-3-70B)
    "7B": (7.0e9, 32, 4096, 8, 128),
    "70B": (70.0e9, 80, 8192, 8, 128),
}
DRAFT = (0.5e9, 24, 896, 2, 64)  # a 0.5B draft model (Qwen2.5-0.5B-like), bf16, TP 1
K, ALPHA = 4, 0.7  # drafts per step; per-token acceptance rate (assumed)
NGRAM_TAU = 2.0  # mean accepted length of n-gram drafting on code/agentic text (assumed)


def step_seconds(model: tuple[float, int, int, int, int], tp: int) -> float:
    """One forward of a few tokens at batch 1: weights + KV over HBM, per GPU, plus two
    all-reduces of one hidden vector per layer (latency-bound at these sizes)."""
    params, layers, hidden, kv, dim = model
    weights = 2 * params / tp
    kv_bytes = 2 * layers * kv * dim * 2 * CONTEXT / min(tp, kv)
    comm = 0.0 if tp == 1 else 2 * layers * (ALLREDUCE_LATENCY + 2 * hidden * 2 / NVLINK)
    return (weights + kv_bytes) / HBM + comm


def main() -> None:
    """Print the table: ms per step, tokens/s without and with speculation."""
    tau = (1 - ALPHA ** (K + 1)) / (1 - ALPHA)
    draft = K * step_seconds(DRAFT, 1)
    print(f"(draft model: mean accepted length {tau:.2f} at k={K}, alpha={ALPHA}; "
          f"n-gram: {NGRAM_TAU}; draft cost {draft * 1e3:.2f} ms a step)\n")
    print("| model | TP | fits | step ms | of it all-reduce ms | tok/s off | tok/s n-gram "
          "| tok/s draft model | draft-model speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, model in MODELS.items():
        for tp in (1, 2, 4, 8):
            fits = 2 * model[0] / tp < 0.9 * GPU_MEMORY
            step = step_seconds(model, tp)
            comm = 0.0 if tp == 1 else 2 * model[1] * (ALLREDUCE_LATENCY
                                                        + 2 * model[2] * 2 / NVLINK)
            off = 1 / step
            ngram = NGRAM_TAU / step
            spec = tau / (step + draft)
            print(f"| {name} | {tp} | {'yes' if fits else 'no'} | {step * 1e3:.2f} | "
                  f"{comm * 1e3:.2f} | {off:.0f} | {ngram:.0f} | {spec:.0f} | "
                  f"{spec / off:.2f}x |")


if __name__ == "__main__":
    main()
