"""Build an engine's parts in the order that refuses early: config, then weights.

The speculative config is parsed and checked against the installed plugins before a
byte of weights is read; engine settings are checked next; then the draft stage detects
each drafter's checkpoint from its own files and completes the config (k); only then is
the target loaded, the drafts loaded, ONE KV pool sized for the target and every draft
(one memory budget, stated in the startup log) and allocated once, and the proposers
built over it.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from draftwise.cache.manager import KVCacheManager
from draftwise.engine_args import EngineArgs
from draftwise.errors import EngineConfigError
from draftwise.prefill_budget import PrefillBudget, attention_context_scale, logits_share
from draftwise.runner import ModelRunner, kv_bytes_per_token
from draftwise.scheduler import Scheduler

if TYPE_CHECKING:
    from draftwise.spec.adaptive import DepthPolicy
    from draftwise.config import ResolvedSpeculativeConfig
    from draftwise.spec.draft_stage import DetectedDraft
    from draftwise.models.prefault import Ahead
    from draftwise.models.backend import Backend
    from draftwise.models.loader import LoadedModel
    from draftwise.plugins.registry import SpeculatorRegistry
    from draftwise.spec.speculation import Speculation
    from draftwise.speculator import KVLayout, TargetHeader

_DTYPES = ("auto", "bfloat16", "float32", "float16")
logger = logging.getLogger("draftwise.bootstrap")


@dataclass(slots=True)
class EngineParts:
    """Everything LLMEngine holds, built in a checked order."""

    spec_config: ResolvedSpeculativeConfig | None
    loaded: LoadedModel
    runner: ModelRunner
    kv: KVCacheManager
    scheduler: Scheduler
    max_model_len: int
    speculation: Speculation | None


def check_args(args: EngineArgs) -> None:
    """Refuse settings by name before anything is loaded."""
    if args.dtype not in _DTYPES:
        raise EngineConfigError(f"dtype {args.dtype!r} is not supported; use one of {_DTYPES}")
    positive = {
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "block_size": args.block_size,
    }
    for name, value in positive.items():
        if not isinstance(value, int) or value < 1:
            raise EngineConfigError(f"{name} must be a positive integer, got {value!r}")
    threshold = args.long_prefill_token_threshold
    if not isinstance(threshold, int) or threshold < 0:
        raise EngineConfigError(
            f"long_prefill_token_threshold must be an integer >= 0 (0: off), got {threshold!r}")
    if args.max_model_len is not None and args.max_model_len < 2:
        raise EngineConfigError(f"max_model_len must be at least 2, got {args.max_model_len}")
    if args.num_threads is not None and args.num_threads < 1:
        raise EngineConfigError(f"num_threads must be at least 1, got {args.num_threads}")
    if args.num_kv_blocks is not None and args.num_kv_blocks < 2:
        raise EngineConfigError(f"num_kv_blocks must be at least 2, got {args.num_kv_blocks}")


def check_tensor_parallel(
    args: EngineArgs, spec_config: ResolvedSpeculativeConfig | None,
    registry: SpeculatorRegistry | None,
) -> int:
    """``tensor_parallel_size`` and the drafts' placement, refused by name before weights
    (the split itself is checked against the target's config when it is read)."""
    from draftwise.config.core import check_draft_tensor_parallel
    from draftwise.models.tp.plan import check_size

    tp = check_size(args.tensor_parallel_size)
    timeout = args.tensor_parallel_timeout_s
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise EngineConfigError(
            f"tensor_parallel_timeout_s must be a number of seconds > 0, got {timeout!r}")
    if spec_config is not None and registry is not None:
        with_weights = tuple(m.method for m in spec_config.drafters if m.method is not None
                             and registry.get(m.method).speculator.loader is not None)
        check_draft_tensor_parallel(spec_config.draft_tensor_parallel_size, tp, with_weights)
    return tp


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask: ``taskset``, cgroup cpusets)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def resolve_num_threads(requested: int | None, native_gemm: bool) -> int:
    """Compute threads: the user's number, else every core when the native GEMMs run, and
    one core fewer when only torch computes.

    Measured on a 2-core machine (default model, 128 greedy tokens, tok/s, 1 vs 2
    threads): quiet, 117 -> 184 end to end on 6 prompts (issue 13's numbers); loaded by
    other work (load average 10-15), 12.1 vs 12.2, 9.2 vs 12.1, 6.8 vs 9.7. The native
    pool hands out chunks to whichever thread is running (``core/csrc/threadpool.c``),
    so a busy core delays only its own chunk and every core is the right default, as it
    is llama.cpp's. torch's OpenMP workers instead spin-wait for each other: with the
    second core busy the same model once decoded at 38 tok/s on 1 thread and 0.4 on 2,
    so a torch-only model (fp32, or no C compiler) keeps a core free, as vLLM does.
    """
    if requested is not None:
        return requested
    cores = usable_cores()
    return cores if native_gemm else max(1, cores - 1)


def finish_backend(loaded: LoadedModel, threads: int | None) -> Backend:
    """The model's decided :class:`~draftwise.models.backend.Backend`, completed with the
    GEMM that runs each placed weight type and the threads (the user's, else
    :func:`resolve_num_threads`'s default for those GEMMs), installed on the model,
    logged as one line and applied (:func:`apply_threads`)."""
    model = loaded.model
    gemm = model.gemm_kinds()
    native = any(kind.startswith(("native", "quant")) for _, kind in gemm)
    backend = model.backend.finish(gemm, resolve_num_threads(threads, native))
    model.backend = backend
    logger.info("%s", backend.line())
    apply_threads(backend)
    return backend


def apply_threads(backend: Backend) -> None:
    """Give the compute threads to whoever does the work: torch, or the native GEMM.

    With native GEMM weights (``models.linear``: the bf16 kernel, or GGUF weights kept
    quantized, ``models.quant``) the GEMMs run on draftwise's own worker pool and torch
    keeps one thread: torch's OpenMP workers spin-wait between its ops on the cores the
    GEMM workers need. Measured on 2 cores, default model, 300-token context: 2 GEMM
    threads with torch at 1 decode in 6.6 ms; with torch also at 2, 15.9. The split is
    :meth:`Backend.finish`'s.
    """
    from draftwise.models.kernels import set_kernel_threads

    set_kernel_threads(backend.threads)
    if backend.torch_threads is not None:
        torch.set_num_threads(backend.torch_threads)


def resolve_max_model_len(args: EngineArgs, loaded: LoadedModel) -> int:
    """The context length: the user's if the model allows it, else the model's (capped)."""
    model_len = int(loaded.config.max_position_embeddings)
    if args.max_model_len is not None:
        if args.max_model_len > model_len:
            raise EngineConfigError(
                f"max_model_len {args.max_model_len} exceeds the model's "
                f"max_position_embeddings {model_len}; use at most {model_len}"
            )
        return args.max_model_len
    return min(model_len, args.default_max_model_len)


def _physical_memory_bytes() -> int:
    """This machine's memory in bytes (0 where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return 0


def size_kv_cache(
    args: EngineArgs, loaded: LoadedModel, max_model_len: int, drafts: Sequence[KVLayout] = ()
) -> int:
    """Blocks to allocate: the user's number, or what the memory budget holds.

    One budget for everything that lives per block: the target's K/V and the K/V of every
    draft that keeps its own cache in the pool (same block ids, same block size).
    """
    target = kv_bytes_per_token(loaded) * args.block_size
    draft = sum(d.bytes_per_token for d in drafts) * args.block_size
    per_block = target + draft
    need = math.ceil(max_model_len / args.block_size) + 1
    if args.num_kv_blocks is not None:
        blocks = args.num_kv_blocks
    else:
        want = args.max_num_seqs * need
        budget = int(args.kv_cache_memory_gib * 2**30 // per_block)
        blocks = min(want, budget)
    machine = _physical_memory_bytes()
    if machine and blocks * per_block > machine:
        # (the pool is lazily zeroed, so the kernel may even map it, but it cannot be
        # filled; a pool past the machine's memory is refused by name, not met by an
        # OSError traceback from the allocation)
        raise EngineConfigError(
            f"num_kv_blocks={blocks} needs {blocks * per_block / 2**30:.1f} GiB of KV cache "
            f"({per_block} bytes a block of {args.block_size} tokens), more than this "
            f"machine's {machine / 2**30:.1f} GiB of memory; use at most "
            f"{machine // per_block} blocks, or leave num_kv_blocks unset (the pool is then "
            "sized by kv_cache_memory_gib)")
    if blocks < need:
        raise EngineConfigError(
            f"the KV cache ({blocks} blocks of {args.block_size} tokens) cannot hold one "
            f"request of max_model_len {max_model_len} ({need} blocks); raise "
            "num_kv_blocks / kv_cache_memory_gib or lower max_model_len"
        )
    mib = 2**20
    logger.info(
        "KV cache: %d blocks x %d tokens = %.1f MiB (target %.1f MiB%s), %s",
        blocks, args.block_size, blocks * per_block / mib, blocks * target / mib,
        f", drafts {blocks * draft / mib:.1f} MiB in {len(drafts)} cache(s)" if drafts else "",
        f"num_kv_blocks={args.num_kv_blocks}" if args.num_kv_blocks is not None
        else f"budget kv_cache_memory_gib={args.kv_cache_memory_gib:g}",
    )
    return blocks


def build_depth_policy(
    spec_config: ResolvedSpeculativeConfig,
    runner: ModelRunner,
    kv: KVCacheManager,
    args: EngineArgs,
    threads: int,
    k: int,
) -> DepthPolicy:
    """Adaptive depth over a cost model timed on this machine (or read from its cache)."""
    from draftwise.spec.adaptive import DepthPolicy
    from draftwise.spec.cost_model import measure_costs
    from draftwise.disk_cache import code_identity, model_identity

    settings = spec_config.adaptive
    if settings is None:
        raise ValueError("build_depth_policy needs a config with adaptive settings")
    model = runner.model
    key = None
    if settings.cost_cache:
        key = {
            "model": model_identity(runner.loaded.path),
            "code": code_identity(),
            "dtype": str(next(model.parameters()).dtype),
            "threads": threads,
            "backend": str(model.backend.as_dict()),
            "block_size": args.block_size,
        }
    rows = min(args.max_num_seqs, settings.max_measured_rows)
    cost = measure_costs(runner, kv, k, rows, cache_key=key, threads=threads)
    return DepthPolicy(settings, k, cost)


def lazy_target_header(path: str) -> Callable[[], TargetHeader]:
    """The target's header, read on the first call only: a draft is checked against it
    before the target's weights load (one header read, ~0.02 s for the default model,
    ~0.1-0.2 s for a 1.5B GGUF's metadata and vocabulary), and a config whose drafts
    need no such check never reads it."""
    from functools import cache

    from draftwise.models.inspect import inspect_model, target_header

    @cache
    def read() -> TargetHeader:
        return target_header(inspect_model(path))

    return read


def build_engine_parts(
    args: EngineArgs, progress: Any = None, reserved: Ahead | None = None
) -> EngineParts:
    """Config, draft detection, target weights, draft weights, one KV pool, proposers.

    ``reserved``: memory for the target's quantized weights, faulting in since before the
    imports (``models.arena``); handed back if a refusal comes first.
    """
    try:
        return _build_engine_parts(args, progress, reserved)
    finally:
        if reserved is not None:
            reserved.finish()


def check_device_engine(
    args: EngineArgs, tp: int, spec_config: ResolvedSpeculativeConfig | None,
    hidden_drafter: bool,
) -> None:
    """Refuse by name, before any weights are read, what has no path on the Triton kernels
    yet (``models.backend.choose_kernels`` decides them: a CUDA device, or the interpreter
    in tests): tensor parallel, a drafter reading the target's hidden states (MTP,
    DFlash, DSpark) and block verification. Never a silent run on the CPU."""
    from draftwise.gpu.device import DeviceUnavailableError
    from draftwise.models.backend import choose_kernels

    if choose_kernels(args.device) != "triton":
        return
    where = f"device {args.device} with the Triton kernels (docs/gpu.md)"
    if tp > 1:
        raise DeviceUnavailableError(
            f"--tensor-parallel-size {tp} does not run on {where} yet; use 1 there, or "
            "--device cpu")
    if spec_config is None:
        return
    if hidden_drafter:
        raise DeviceUnavailableError(
            f"speculative method {spec_config.method or 'drafter_chain'!r} reads the "
            f"target's hidden states, which does not run on {where} yet; use method 'ngram' or 'draft_model' there, "
            "or --device cpu")
    if spec_config.rejection_sample_method != "standard":
        raise DeviceUnavailableError(
            f"rejection_sample_method {spec_config.rejection_sample_method!r} has no device "
            f"kernel on {where}; use 'standard' there, or --device cpu")


def _build_engine_parts(
    args: EngineArgs, progress: Any, reserved: Ahead | None
) -> EngineParts:
    from draftwise.config import parse_speculative_config
    from draftwise.spec.draft_stage import (
        build_speculation,
        detect_drafts,
        draft_kv_layouts,
        load_drafts,
        reads_target_hidden,
        uses_next_token,
    )
    from draftwise.formats.default_model import resolve_model_path
    from draftwise.models.backend import check_device
    from draftwise.models.loader import load_model
    from draftwise.plugins.manager import load_speculators
    from draftwise.spec.speculation import max_draft_len

    check_device(args.device)  # first: a device that cannot run refuses before anything
    spec_config = parse_speculative_config(args.speculative_config)
    registry = load_speculators() if spec_config is not None else None
    if registry is not None and spec_config is not None:
        registry.ensure_buildable(spec_config)
    check_args(args)
    tp = check_tensor_parallel(args, spec_config, registry)
    detected: list[DetectedDraft] = []
    if registry is not None and spec_config is not None:  # the drafts' own files, no weights
        target_path = resolve_model_path(args.model)
        spec_config, detected = detect_drafts(
            spec_config, registry, target_path, target=lazy_target_header(target_path)
        )
    check_device_engine(args, tp, spec_config, reads_target_hidden(detected))
    torch.set_num_threads(args.num_threads or usable_cores())  # for loading
    threads_arg = args.num_threads
    if tp > 1:  # ranks 1..tp-1 start here (draftwise.models.tp.driver)
        from draftwise.models.tp.driver import start_tensor_parallel, threads_per_rank

        threads_arg = threads_per_rank(args.num_threads, tp)
        loaded = start_tensor_parallel(args.model, args.dtype, tp, threads_arg,
                                       args.tensor_parallel_timeout_s, progress)
    else:
        loaded = load_model(args.model, dtype=args.dtype, device=args.device,
                            progress=progress, reserved=reserved)
    drafts = load_drafts(detected, loaded)
    backend = finish_backend(loaded, threads_arg)
    threads = backend.threads or backend.torch_threads or 1
    max_model_len = resolve_max_model_len(args, loaded)
    num_blocks = size_kv_cache(args, loaded, max_model_len, draft_kv_layouts(detected, drafts))
    k = max_draft_len(spec_config) if spec_config is not None else 0
    runner = ModelRunner(
        loaded, num_blocks, args.block_size, max_num_seqs=args.max_num_seqs, max_spec_positions=k
    )
    # recurrent state cannot be skipped to a cached prefix
    prefix = args.enable_prefix_caching and not runner.has_recurrent_state
    kv = KVCacheManager(
        num_blocks, args.block_size, enable_prefix_caching=prefix,
        drop_last_cached_block=uses_next_token(detected),
        hit_needs_drafts_ready=reads_target_hidden(detected),
    )
    scheduler = Scheduler(
        kv,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=max_model_len,
        num_spec_tokens=k,
        k_for_batch=spec_config.k_for_batch if spec_config and spec_config.k_schedule else None,
        enable_chunked_prefill=args.enable_chunked_prefill,
        prefill_budget=PrefillBudget(args.long_prefill_token_threshold,
                                     attention_context_scale(loaded.config),
                                     logits_share(loaded.config)),
    )
    speculation = None
    if registry is not None and spec_config is not None:
        speculation = build_speculation(
            spec_config, detected, drafts, registry, loaded,
            max_model_len=max_model_len, num_blocks=num_blocks, block_size=args.block_size,
        )
        if spec_config.adaptive is not None:
            policy = build_depth_policy(spec_config, runner, kv, args, threads, k)
            speculation.policy = scheduler.depth_policy = policy
        logger.info("%s", spec_config.depth_line())
    return EngineParts(spec_config, loaded, runner, kv, scheduler, max_model_len, speculation)
