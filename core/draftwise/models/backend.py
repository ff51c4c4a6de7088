"""Which kernels run, decided once per load: one frozen :class:`Backend` value.

A decode step runs four kinds of kernel: attention, the GEMMs (one per weight type),
the small elementwise ops and the greedy argmax, on some number of threads. Each used
to be chosen where it ran (the model, the packer, the GGUF planner, the sampler and
the thread setup each asked the environment and the build again). Now
:func:`decide_backend` applies every rule once, from the model's dtype, device and head
size, the build and the ``DRAFTWISE_*`` overrides, and the model, the loader and the
plugins read the value it returns (``LlamaForCausalLM.backend``). Two rules live here
(:func:`keep_quantized`, :func:`choose_layers`: environment and build facts only); the
other two stay beside their kernels (``attention.choose_backend``,
``linear.weight_backend``), which import nothing from the models that run them.

What runs per weight type is known once the weights are placed, so bootstrap completes
the value with :meth:`Backend.finish` (the GEMM table from the loaded weights, and the
thread split) and prints :meth:`Backend.line` at start-up; ``bench`` and ``generate
--json`` carry :meth:`Backend.as_dict`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from draftwise.models import kernels

#: ``auto`` | ``native`` | ``0``: whether GGUF-quantized weights stay quantized
#: (``docs/quantized-weights.md``)
QUANT_ENV = "DRAFTWISE_QUANT"
#: ``auto`` (default: one C call per run of layers where the model allows) or ``per-op``
#: (a C call per op: the A/B of ``core/csrc/decoder_stack.c``)
LAYERS_ENV = "DRAFTWISE_DECODER_STACK"

#: the greedy argmax: a build fact (the C pass gives torch's answer, ties and NaN included)
ARGMAX = "native" if kernels.available("argmax_f32") else "torch"


@dataclass(frozen=True, slots=True)
class Backend:
    """What a model runs; see the module doc. Strings, so it prints and serialises as is."""

    #: ``native`` (core/csrc/paged_attention.c) or ``torch``
    attention: str
    #: RMSNorm, RoPE, SiLU-and-multiply: ``native`` (elementwise.c) or ``torch``
    elementwise: str
    #: ``native`` (argmax_f32) or ``torch``
    argmax: str
    #: how float weights in the model dtype are packed: ``native``, ``onednn`` or ``dense``
    dense_gemm: str
    #: GGUF-quantized weights stay quantized (``models.quant``); else why not (for a notice)
    quantized: bool
    quantized_why_not: str
    #: stored weight type -> the GEMM that runs it, e.g. ``("Q4_K", "quant-avx512vnni")``,
    #: ``("Q4_K+Q5_K", "quant-avx512vnni+avx2")`` (a fused weight's kernels per segment)
    gemm: tuple[tuple[str, str], ...] = ()
    #: the C kernels' worker threads, and torch's intra-op threads beside them
    threads: int | None = None
    torch_threads: int | None = None
    #: whether the native attention runs here at all (any head size it takes)
    native_attention: bool = False
    #: ``native``: a run of llama decoder layers is one C call (``decoder_stack.c``) where
    #: a model's projections are all GGUF-quantized (the model sets ``per-op`` otherwise);
    #: ``per-op``: a C call per op (:func:`choose_layers`)
    layers: str = "per-op"
    #: a recurrent mixer's kernel where the model has one (the GDN hybrids: ``torch``, as
    #: there is no C kernel for the delta rule and its causal conv); None: no such layers
    recurrence: str | None = None

    def attention_for(self, head_dim: int) -> str:
        """The attention another decoder of ``head_dim`` (a drafter) on this target runs:
        native where it can run at that head size, as the target's own rule says."""
        from draftwise.models.attention import native_head_dim

        return "native" if self.native_attention and native_head_dim(head_dim) else "torch"

    @property
    def native_gemm(self) -> bool:
        """Whether any GEMM runs on draftwise's worker pool (then torch gets one thread)."""
        return any(kind.startswith(("native", "quant")) for _, kind in self.gemm)

    def finish(self, gemm: Iterable[tuple[str, str]], threads: int) -> Backend:
        """The value with the GEMM table of the placed weights and the thread split: the
        pool's threads for the native GEMMs and torch at one (its OpenMP workers would spin
        on the same cores), or all threads to torch when no native GEMM runs."""
        kinds: dict[str, list[str]] = {}
        for stored, kind in gemm:
            if kind not in kinds.setdefault(stored, []):
                kinds[stored].append(kind)
        table = tuple(sorted((stored, "+".join(k)) for stored, k in kinds.items()))
        done = dataclasses.replace(self, gemm=table)
        if done.native_gemm:
            return dataclasses.replace(done, threads=threads, torch_threads=1)
        return dataclasses.replace(done, threads=None, torch_threads=threads)

    def line(self) -> str:
        """One start-up line naming every kernel that runs."""
        gemm = ", ".join(f"{t}={k}" for t, k in self.gemm) or "none"
        pool = "torch's" if self.threads is None else str(self.threads)
        recurrence = "" if self.recurrence is None else f" recurrence={self.recurrence}"
        return (f"backend: attention={self.attention} gemm[{gemm}] "
                f"elementwise={self.elementwise}{recurrence} argmax={self.argmax} "
                f"layers={self.layers} "
                f"threads={pool} (torch {self.torch_threads})")

    def as_dict(self) -> dict[str, Any]:
        """For JSON reports (bench, ``generate --json``)."""
        return {
            "attention": self.attention,
            "gemm": dict(self.gemm),
            "elementwise": self.elementwise,
            "argmax": self.argmax,
            "layers": self.layers,
            "threads": self.threads,
            "torch_threads": self.torch_threads,
            **({} if self.recurrence is None else {"recurrence": self.recurrence}),
        }


#: the devices ``--device`` names
DEVICES = ("cpu", "cuda")


def check_device(device: str) -> None:
    """Refuse ``device`` by name unless an engine can run on it here; called first at
    start-up, before any weights are read.

    ``cpu`` is the engine every other rule in this module decides for. ``cuda`` is
    refused in both cases, each saying what would work: without a CUDA device or triton
    (the facts :func:`draftwise.gpu.cuda_unavailable_reason` reads), and with them,
    because the engine's forward, runner and verify are not yet placed on a CUDA device:
    only ``draftwise.gpu``'s kernels are, and ``benchmarks/device_check.sh`` is what runs
    them on a GPU (``docs/gpu.md``). Never a silent fall-back to the CPU.
    """
    from draftwise.gpu.device import DeviceUnavailableError, cuda_unavailable_reason

    if device not in DEVICES:
        raise DeviceUnavailableError(f"device {device!r} is not one of {', '.join(DEVICES)}")
    if device == "cpu":
        return
    reason = cuda_unavailable_reason()
    if reason is not None:
        raise DeviceUnavailableError(
            f"--device cuda cannot run on this machine: {reason}. Use --device cpu (the "
            "default), or run on a machine with an NVIDIA GPU, a CUDA build of torch and "
            "triton")
    raise DeviceUnavailableError(
        "--device cuda: this machine has a CUDA device, but draftwise's engine does not "
        "run on it yet (only its Triton kernels do: draftwise.gpu, checked by "
        "benchmarks/device_check.sh; docs/gpu.md). Use --device cpu")


def decide_backend(dtype: torch.dtype, device: torch.device | str, head_dim: int) -> Backend:
    """Every kernel choice for a model of ``dtype`` on ``device`` with ``head_dim``.

    Raises (``ValueError``/``RuntimeError`` naming the variable) when a ``DRAFTWISE_*``
    override asks for a kernel that cannot run here: refused, never downgraded.
    """
    from draftwise.models.attention import choose_backend
    from draftwise.models.linear import weight_backend

    attention = choose_backend(dtype, head_dim, device)
    keep, why = keep_quantized(dtype, device)
    # validated together with the native attention (same dtype/device conditions)
    elementwise = "native" if attention == "native" else "torch"
    return Backend(
        attention=attention,
        elementwise=elementwise,
        layers=choose_layers(elementwise),
        argmax=ARGMAX if torch.device(device).type == "cpu" else "torch",
        dense_gemm=weight_backend(dtype, device),
        quantized=keep,
        quantized_why_not=why,
        # 16: a head size the kernel always takes, so this asks about dtype/device/build
        native_attention=choose_backend(dtype, 16, device) == "native",
    )


def keep_quantized(dtype: torch.dtype, device: torch.device | str) -> tuple[bool, str]:
    """Whether quantized GGUF weights stay quantized here, and if not, why (for the notice).

    The rule only: :func:`decide_backend` is its one caller outside tests.

    Raises ``ValueError`` when ``DRAFTWISE_QUANT=native`` asks for what cannot run.
    """
    from draftwise.models.quant import quant_kernels_available

    wanted = os.environ.get(QUANT_ENV, "auto")
    if wanted not in ("auto", "1", "native", "0"):
        raise ValueError(f"{QUANT_ENV}={wanted!r}: use auto, native or 0")
    why = ""
    if wanted == "0":
        why = f"{QUANT_ENV}=0"
    elif not quant_kernels_available():
        why = "the quantized kernels are not built in this install (no C compiler)"
    elif torch.device(device).type != "cpu":
        why = f"device {torch.device(device).type} (the quantized kernels are CPU kernels)"
    elif dtype != torch.bfloat16:
        why = f"dtype {str(dtype).removeprefix('torch.')} (the quantized kernels take bf16 " \
              "activations; use --dtype auto)"
    if why and wanted == "native":
        raise ValueError(f"{QUANT_ENV}=native cannot run: {why}")
    return not why, why


def choose_layers(elementwise: str) -> str:
    """``native`` or ``per-op``: how a model with the native small ops runs its decoder
    layers (the rule only: :func:`decide_backend` is its one caller).

    ``native`` still needs every projection GGUF-quantized, which the model knows once its
    weights are packed (:meth:`LlamaForCausalLM.pack_weights`)."""
    wanted = os.environ.get(LAYERS_ENV, "auto")
    if wanted not in ("auto", "per-op"):
        raise ValueError(f"{LAYERS_ENV}={wanted!r}: use auto or per-op")
    native = elementwise == "native" and kernels.available("decoder_layers")
    return "native" if native and wanted == "auto" else "per-op"


def gemm_kind(weight: Any) -> tuple[str, str]:
    """(stored type, kernel) of one placed weight: ``models.quant.QuantWeight``,
    ``models.linear.BlockedWeight``, a oneDNN-packed or a dense tensor."""
    from draftwise.models.linear import BlockedWeight
    from draftwise.models.quant import QuantWeight

    if isinstance(weight, QuantWeight):
        paths = dict.fromkeys(kernels.quant_simd(s.qtype.kernel) for s in weight.segments)
        return "+".join(dict.fromkeys(weight.qtypes)), "quant-" + "+".join(paths)
    if isinstance(weight, BlockedWeight):
        return "bf16", f"native-{kernels.bf16_isa()}"
    dtype = str(weight.dtype).removeprefix("torch.")
    return dtype, "onednn" if weight.is_mkldnn else "torch"
