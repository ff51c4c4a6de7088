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
#: ``auto`` (default: ``triton`` on a CUDA device, ``cpu`` on the CPU) or ``triton`` (the
#: Triton kernels on CPU tensors under ``TRITON_INTERPRET=1``: how CI tests the device
#: engine without a GPU; test-only, never faster)
KERNELS_ENV = "DRAFTWISE_KERNELS"

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
    #: ``cpu`` (the C/oneDNN kernels above) or ``triton`` (``draftwise.gpu``: paged
    #: attention, the GGUF matmuls on the file's bytes, the verify step; torch ops for the
    #: rest). :func:`choose_kernels` decides it; every other field follows from it
    kernels: str = "cpu"

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
        # the CPU kernels' line as it always was; the Triton backend says so first
        family = "" if self.kernels == "cpu" else f"kernels={self.kernels} "
        return (f"backend: {family}attention={self.attention} gemm[{gemm}] "
                f"elementwise={self.elementwise}{recurrence} argmax={self.argmax} "
                f"layers={self.layers} "
                f"threads={pool} (torch {self.torch_threads})")

    def as_dict(self) -> dict[str, Any]:
        """For JSON reports (bench, ``generate --json``)."""
        return {
            "kernels": self.kernels,
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

    ``cpu`` always runs. ``cuda`` runs where torch sees a CUDA device and triton is
    installed (the facts :func:`draftwise.gpu.cuda_unavailable_reason` reads): the same
    engine with the Triton kernels (:func:`choose_kernels`). Elsewhere it is refused,
    saying what would work; never a silent fall-back to the CPU.
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


def choose_kernels(device: torch.device | str) -> str:
    """``cpu`` or ``triton``: which family of kernels a model on ``device`` runs (the rule
    only: :func:`decide_backend` is its one caller outside tests).

    A CUDA device runs the Triton kernels (nothing else runs there). On the CPU the C
    kernels run unless ``DRAFTWISE_KERNELS=triton`` asks for the Triton ones on CPU
    tensors, which only Triton's interpreter can do: refused by name without triton or
    without ``TRITON_INTERPRET=1``, and ``cpu`` kernels on a CUDA device are refused too.
    """
    from draftwise.gpu.device import INTERPRET_ENV, DeviceUnavailableError, triton_available

    wanted = os.environ.get(KERNELS_ENV, "auto")
    if wanted not in ("auto", "cpu", "triton"):
        raise ValueError(f"{KERNELS_ENV}={wanted!r}: use auto, cpu or triton")
    kind = torch.device(device).type
    if kind == "cuda":
        if wanted == "cpu":
            raise DeviceUnavailableError(
                f"{KERNELS_ENV}=cpu on device cuda: the C kernels run on the CPU only; unset "
                f"it (cuda runs the Triton kernels) or use --device cpu")
        return "triton"
    if kind != "cpu":
        raise DeviceUnavailableError(f"device {kind}: draftwise runs on cpu or cuda")
    if wanted != "triton":
        return "cpu"
    if not triton_available():
        raise DeviceUnavailableError(
            f"{KERNELS_ENV}=triton: triton is not installed (pip install 'draftwise[gpu]'); "
            "unset it to run the CPU kernels")
    if os.environ.get(INTERPRET_ENV, "0") in ("", "0"):
        raise DeviceUnavailableError(
            f"{KERNELS_ENV}=triton on the CPU runs the Triton kernels under their "
            f"interpreter only: set {INTERPRET_ENV}=1 too (tests), or use --device cuda on a "
            "machine with a GPU, or unset it for the CPU kernels")
    return "triton"


def decide_backend(dtype: torch.dtype, device: torch.device | str, head_dim: int) -> Backend:
    """Every kernel choice for a model of ``dtype`` on ``device`` with ``head_dim``.

    Raises (``ValueError``/``RuntimeError`` naming the variable) when a ``DRAFTWISE_*``
    override asks for a kernel that cannot run here: refused, never downgraded.
    """
    from draftwise.models.attention import choose_backend
    from draftwise.models.linear import weight_backend

    if choose_kernels(device) == "triton":
        return _triton_backend(dtype, device)
    attention = choose_backend(dtype, head_dim, device)
    keep, why = keep_quantized(dtype, device)
    # validated together with the native attention (same dtype/device conditions)
    elementwise = "native" if attention == "native" else "torch"
    return Backend(
        attention=attention,
        elementwise=elementwise,
        layers=choose_layers(elementwise),
        argmax=ARGMAX,
        dense_gemm=weight_backend(dtype, device),
        quantized=keep,
        quantized_why_not=why,
        # 16: a head size the kernel always takes, so this asks about dtype/device/build
        native_attention=choose_backend(dtype, 16, device) == "native",
    )


def _triton_backend(dtype: torch.dtype, device: torch.device | str) -> Backend:
    """The Triton kernels' backend: paged attention and the GGUF matmuls from
    ``draftwise.gpu``, dense weights through torch's matmul, the small ops as torch ops.

    bf16 is refused by name: the interpreter has no bf16 arithmetic, so no bf16 result of
    these kernels was ever checked (fp16 and fp32 were)."""
    from draftwise.gpu.device import DeviceUnavailableError

    if dtype not in (torch.float32, torch.float16):
        name = str(dtype).removeprefix("torch.")
        raise DeviceUnavailableError(
            f"dtype {name} on device {torch.device(device).type} (the Triton kernels): "
            "untested, as Triton's interpreter cannot run bf16 arithmetic; use --dtype "
            "float16 or float32 there, or --device cpu for bf16")
    from draftwise.models.attention import BACKEND_ENV
    from draftwise.models.linear import PACK_ENV

    for env, c_only in ((BACKEND_ENV, ("native",)), (PACK_ENV, ("native", "onednn"))):
        if os.environ.get(env, "auto") in c_only:
            raise DeviceUnavailableError(
                f"{env}={os.environ[env]} asks for a CPU C kernel, but the model runs on "
                f"the Triton kernels on device {torch.device(device).type}; unset it there, "
                "or use --device cpu")
    keep = os.environ.get(QUANT_ENV, "auto") != "0"
    return Backend(
        attention="triton", elementwise="torch", argmax="torch", dense_gemm="dense",
        quantized=keep, quantized_why_not="" if keep else f"{QUANT_ENV}=0",
        kernels="triton",
    )


def refuse_on_device(backend: Backend, device: torch.device | str, what: str,
                     instead: str) -> None:
    """Raise ``DeviceUnavailableError`` naming ``what`` and the device when the Triton
    kernels run (something with no device path yet), instead of running it on the CPU."""
    from draftwise.gpu.device import DeviceUnavailableError

    if backend.kernels == "triton":
        raise DeviceUnavailableError(
            f"{what} does not run on device {torch.device(device).type} with the Triton "
            f"kernels yet (docs/gpu.md); {instead}")


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
    from draftwise.gpu.quant import DeviceQuantWeight
    from draftwise.models.linear import BlockedWeight
    from draftwise.models.quant import QuantWeight

    if isinstance(weight, DeviceQuantWeight):
        return "+".join(dict.fromkeys(weight.qtypes)), "triton"
    if isinstance(weight, QuantWeight):
        paths = dict.fromkeys(kernels.quant_simd(s.qtype.kernel) for s in weight.segments)
        return "+".join(dict.fromkeys(weight.qtypes)), "quant-" + "+".join(paths)
    if isinstance(weight, BlockedWeight):
        return "bf16", f"native-{kernels.bf16_isa()}"
    dtype = str(weight.dtype).removeprefix("torch.")
    return dtype, "onednn" if weight.is_mkldnn else "torch"  # torch: cuBLAS on a GPU
