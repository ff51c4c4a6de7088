"""Every engine setting in one place, shared by the CLI, the server and the library."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class EngineArgs:
    """Engine settings; ``speculative_config`` takes the JSON object vLLM takes."""

    model: str | None = None
    speculative_config: str | dict[str, Any] | None = None
    dtype: str = "auto"
    #: ``cpu`` (the C kernels) or ``cuda`` (the same engine on the Triton kernels, where
    #: torch sees a CUDA device and triton is installed: ``models.backend.check_device``,
    #: ``docs/gpu.md``)
    device: str = "cpu"
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    #: context length; None means the model's, capped at ``default_max_model_len``
    max_model_len: int | None = None
    default_max_model_len: int = 8192
    block_size: int = 16
    #: KV cache size; None means enough for ``max_num_seqs`` full contexts, capped by memory
    num_kv_blocks: int | None = None
    kv_cache_memory_gib: float = 2.0
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    #: while any request decodes, a step computes at most this many prompt tokens' work
    #: (counted at context 0: later chunks of a long prompt are shorter), so a long prompt
    #: never stalls running streams for long (``draftwise.prefill_budget``); 0: off
    long_prefill_token_threshold: int = 256
    seed: int = 0
    #: torch intra-op threads; None means one fewer than the cores (at least 1), as vLLM
    num_threads: int | None = None
    #: seconds between spec-decode log lines; None disables the periodic line
    log_stats_interval: float | None = None
    #: what ``logprobs`` report (vLLM V1's names): "raw_logprobs" (the target's own
    #: distribution, vLLM's default) or "processed_logprobs" (what the token was drawn from)
    logprobs_mode: str = "raw_logprobs"
    #: ranks the target is split over (``draftwise.models.tp``: HF safetensors llama-family
    #: targets; gloo on CPU); ``num_threads`` is then per rank
    tensor_parallel_size: int = 1
    #: seconds a tensor-parallel collective may wait for a rank before its step fails
    tensor_parallel_timeout_s: float = 60.0
