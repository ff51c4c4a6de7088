"""Linear layers for CPU decode: weights packed once at load, rows that never depend on M.

Decode on CPU streams every weight from memory once per step, so the GEMM's bandwidth
is the step time. Three layouts, chosen once at load (:func:`weight_backend`):

- ``native``: the C kernel ``core/csrc/gemm_bf16.c`` (bf16 weights; vdpbf16ps on
  AVX512-BF16 builds, AVX2 FMAs or portable vectors elsewhere: ``KERNELS.linear_bf16_isa``).
  The weight becomes one sequential stream (:class:`BlockedWeight`, in huge pages:
  :func:`pack_weights`); on AVX512-BF16 one core reaches 38-41 GB/s at 1-5 rows, against
  ~22 GB/s for oneDNN's packed kernel and ~13 GB/s for ``F.linear``. Every output is one
  fp32 accumulator taking the K pairs in order, so a row's bits never depend on how many
  rows share the call (or on which row it is). On CPUs without AVX512 (AVX2 only) it is
  the only batch-invariant bf16 path: oneDNN's bf16 GEMM needs AVX512 there and
  ``F.linear`` rounds differently with the row count.
- ``onednn``: the weight reordered into oneDNN's blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's freezing pass does), run
  with ``_linear_pointwise``: bitwise ``F.linear`` (measured for M = 1..700). oneDNN's
  M >= 2 kernel is batch-invariant; its M == 1 path (a GEMV) reduces long K in another
  order, so a single bf16/fp16 row is run as two.
- ``dense``: ``F.linear``. fp32 weights always stay dense and use MKL, which is accurate
  but not batch-invariant at any M (fp32 models are the oracle dtype, not the
  speculative one).

GGUF-quantized weights are none of these: they stay in their stored type
(:class:`draftwise.models.quant.QuantWeight`, packed by the loader) and :func:`linear`
hands them to ``linear_quant``; under the Triton kernels (``Backend.kernels``) they are
the file's blocks on the device (:class:`draftwise.gpu.quant.DeviceQuantWeight`) and
:func:`linear` runs ``draftwise.gpu.quant.quant_matmul`` on them.

``DRAFTWISE_PACK_WEIGHTS`` picks one: ``auto`` (default: native, else onednn, else
dense), ``native``, ``onednn``, or ``0`` (dense). Asking for one this build or dtype
cannot run is an error that says why, not a quiet fallback.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from draftwise.gpu.quant import DeviceQuantWeight
from draftwise.models import kernels
from draftwise.models.hugepages import huge_page_tensor
from draftwise.models.quant import QuantWeight

#: ``auto`` | ``native`` | ``onednn`` | ``0`` (dense); see the module doc
PACK_ENV = "DRAFTWISE_PACK_WEIGHTS"
#: outputs per block of the native layout (four 16-lane fp32 accumulators)
BLOCK_N = 64


@dataclass(frozen=True)
class BlockedWeight:
    """A bf16 ``[out, in]`` weight in the native kernel's layout.

    ``data`` is ``[ceil(out/64), ceil(in/2), 64, 2]``: for each block of 64 outputs, each
    pair of input columns as 64 (w[2k], w[2k+1]) pairs, zero-padded. One block is one
    contiguous run of memory, and the blocks follow each other, so the GEMM reads the
    whole weight as one stream.
    """

    data: torch.Tensor
    out_features: int
    in_features: int
    #: ``data.data_ptr()``, read once: the kernel's argument
    address: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Checked here, once, so a GEMM call checks only its activations."""
        need = self.numel_for(self.out_features, self.in_features)
        data = self.data
        if (data.dtype != torch.bfloat16 or not data.is_contiguous() or not data.is_cpu
                or data.numel() != need or min(self.out_features, self.in_features) < 1):
            raise kernels.KernelInputError(
                f"a packed bf16 weight [{self.out_features}, {self.in_features}] is {need} "
                f"contiguous bf16 CPU values, got {data.dtype} {data.numel()} on {data.device}")
        object.__setattr__(self, "address", data.data_ptr())

    @staticmethod
    def numel_for(out_features: int, in_features: int) -> int:
        """Elements of the packed layout (whole blocks of 64 outputs, whole column pairs)."""
        return -(-out_features // BLOCK_N) * BLOCK_N * -(-in_features // 2) * 2

    @classmethod
    def pack(cls, weight: torch.Tensor, out: torch.Tensor | None = None) -> BlockedWeight:
        """Reorder a dense ``[out, in]`` bf16 weight into ``out`` (1-D, :meth:`numel_for`
        elements) or new memory; a copy either way, so the dense one can go."""
        n, k = weight.shape
        blocks, pairs = -(-n // BLOCK_N), -(-k // 2)
        padded = weight.new_zeros(blocks * BLOCK_N, pairs * 2)
        padded[:n, :k] = weight.detach()
        layout = padded.view(blocks, BLOCK_N, pairs, 2).permute(0, 2, 1, 3)
        if out is None:
            return cls(layout.contiguous(), n, k)
        data = out.view(blocks, pairs, BLOCK_N, 2)
        data.copy_(layout)
        return cls(data, n, k)

    def unpack(self) -> torch.Tensor:  # [out, in]
        """The dense weight again (tests, debugging)."""
        blocks, pairs = self.data.shape[:2]
        dense = self.data.permute(0, 2, 1, 3).reshape(blocks * BLOCK_N, pairs * 2)
        return dense[: self.out_features, : self.in_features].contiguous()


def native_available() -> bool:
    """Whether the C kernels were built (``setup.py``); the GEMM then exists for any CPU."""
    return kernels.available("linear_bf16")


def _onednn_available(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return False


def weight_backend(dtype: torch.dtype, device: torch.device | str = "cpu") -> str:
    """``native``, ``onednn`` or ``dense``: how weights of ``dtype`` are packed here.

    Raises ``ValueError`` when ``DRAFTWISE_PACK_WEIGHTS`` asks for a layout this build,
    machine or dtype cannot run (fp32 weights are dense whatever it says).
    """
    wanted = os.environ.get(PACK_ENV, "auto")
    if wanted not in ("auto", "1", "native", "onednn", "0", "dense"):
        raise ValueError(f"{PACK_ENV}={wanted!r}: use auto, native, onednn or 0 (dense)")
    if wanted in ("0", "dense") or torch.device(device).type != "cpu" or dtype == torch.float32:
        return "dense"
    if wanted == "native" and not (native_available() and dtype == torch.bfloat16):
        why = "bf16 weights" if native_available() else (
            "the C kernels (no C compiler was found when draftwise was installed)")
        raise ValueError(f"{PACK_ENV}=native needs {why}; use auto or onednn")
    if wanted == "onednn" and not _onednn_available(dtype):
        raise ValueError(f"{PACK_ENV}=onednn: oneDNN cannot run {dtype} here; use auto or 0")
    if wanted in ("auto", "1", "native") and native_available() and dtype == torch.bfloat16:
        return "native"
    return "onednn" if _onednn_available(dtype) else "dense"


def can_pack(weight: torch.Tensor) -> bool:
    """Whether :func:`pack_weight` would reorder ``weight``."""
    if weight.dim() != 2:
        return False
    return weight_backend(weight.dtype, weight.device) != "dense"


Weight = torch.Tensor | BlockedWeight | QuantWeight | DeviceQuantWeight


def _backend_of(weight: torch.Tensor) -> str:
    return weight_backend(weight.dtype, weight.device) if weight.dim() == 2 else "dense"


def _pack(weight: torch.Tensor, backend: str, out: torch.Tensor | None = None) -> Weight:
    if backend == "native":
        return BlockedWeight.pack(weight, out)
    if backend == "onednn":
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)
    return weight


def pack_weight(weight: torch.Tensor) -> Weight:  # [out, in] -> packed
    """The weight in the faster layout for this machine (see module doc), or unchanged."""
    return _pack(weight, _backend_of(weight))


def pack_weights(weights: Sequence[torch.Tensor], layout: str | None = None) -> list[Weight]:
    """:func:`pack_weight` for a model's weights at once; the native ones share one arena
    in huge-page memory (``models.hugepages``: a 5-row GEMM then streams as fast as 1 row).

    ``layout``: the model's decided layout for its dtype (``Backend.dense_gemm``); None
    decides per weight (tests). fp32 or 1-D weights stay dense either way.
    """
    backends = [_backend_of(w) if layout is None or w.dim() != 2 or w.dtype == torch.float32
                else layout for w in weights]
    sizes = [BlockedWeight.numel_for(*w.shape) if b == "native" else 0
             for w, b in zip(weights, backends)]
    arena = huge_page_tensor(sum(sizes), torch.bfloat16) if any(sizes) else None
    out: list[Weight] = []
    offset = 0
    for w, backend, size in zip(weights, backends, sizes):
        out.append(_pack(w, backend, None if arena is None else arena[offset : offset + size]))
        offset += size
    return out


def is_packed(weight: Weight) -> bool:
    """A weight :func:`pack_weight` reordered or a GGUF-quantized one (it only works with
    :func:`linear`)."""
    return isinstance(weight, (BlockedWeight, QuantWeight, DeviceQuantWeight)) \
        or weight.is_mkldnn


def linear(
    x: torch.Tensor,  # [T, in]
    weight: Weight,  # [out, in], dense or packed
    bias: torch.Tensor | None = None,  # [out]
) -> torch.Tensor:  # [T, out]
    """``x @ weight.T + bias`` whose rows do not depend on T (bf16/fp16; see module doc)."""
    if isinstance(weight, QuantWeight):
        return kernels.linear_quant(x, weight, bias)
    if isinstance(weight, DeviceQuantWeight):  # the Triton kernel on the file's blocks
        return weight.matmul(x, bias)
    if isinstance(weight, BlockedWeight):
        return kernels.linear_bf16(x, weight, bias)
    single = x.shape[0] == 1 and x.dtype != torch.float32
    if single:
        x = x.expand(2, x.shape[1])
    if weight.is_mkldnn:
        out = torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    else:
        out = F.linear(x, weight, bias)
    return out[:1] if single else out

