"""Every stored weight type in one table: what its bytes are and what runs them.

Why one table: a weight type's facts (its number in a file, its block layout, its packed
size, the kernel that multiplies it, how it dequantizes, what it refuses) were spread
over the modules that each switched on the type: the GGUF header's size table and
integer refusal, the reader's float views, the load plan's native and float sets, the
packer's block sizes and NVFP4's tile formula, so NVFP4 touched 16 source files. Now a
type is one :class:`WeightType` in this table; the GGUF header (``gguf_header``), the
reader (``gguf``, ``gguf_file``), the load plan (``models.gguf_weights``), the packer and
GEMM (``models.quant``) and the backend line (``models.backend``) read it. A new type
touches its format reader (only for a new container), its kernel (``core/csrc``) and one
:func:`register` call (docs/architecture.md, section 6).

A :class:`WeightType` *is* its number, an ``int``, as gguf-py's ``GGMLQuantizationType``
members are: the number a GGUF file stores (so ``WeightType == GGMLQuantizationType.Q4_K``
holds, and either keys the same dict). :attr:`WeightType.kernel` is the number the C
kernels know the type by (``DW_*`` in ``core/csrc/quant.h``): the type's own number for
every built-in type, an existing kernel's for a type registered under a new number whose
blocks an existing kernel runs, None for a type that is dequantized at load.

Decided at load, never per call: the header turns a file's number into its
:class:`WeightType` once, and a packed weight (``models.quant.QuantWeight``) carries the
record and its kernel number in the table the C call follows; nothing on the decode path
looks a type up.

The table is process-wide state (what a number in a file means), written by this module's
own registrations at import and by :func:`register`; :func:`registered` scopes a
registration (tests). This module imports numpy and gguf-py's constants only (no torch,
no gguf-py package: reading a header stays cheap).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import numpy.typing as npt

from draftwise.formats.ggml import GGML_QUANT_SIZES, GGMLQuantizationType

if TYPE_CHECKING:
    from typing_extensions import Self

#: outputs per tile of the packed layout (``DW_TILE``: eight rows interleaved)
TILE = 8
#: containers a type is stored in: a GGUF file's blocks, or safetensors tensors its own
#: reader packs (NVFP4: codes and scales in separate tensors, ``formats.nvfp4``)
CONTAINERS = ("gguf", "safetensors")

#: stored bytes (uint8, whole blocks) -> their values (any float dtype)
Dequantize = Callable[[npt.NDArray[np.uint8]], npt.NDArray[Any]]


class WeightTypeError(ValueError):
    """A registration that would make a number or a kernel mean two things."""


class UnknownWeightTypeError(KeyError):
    """A number no registered type has (a file's, a caller's)."""

    def __init__(self, number: int) -> None:
        super().__init__(f"no weight type is registered under number {number}")
        self.number = number


class NoDequantizationError(ValueError):
    """A weight type with no dequantization was asked for float values (an integer type,
    or a registered type that declared none): the reader turns it into its own named
    error with the file and tensor."""


class WeightType(int):
    """One stored weight type: its number, block layout, packed size, kernel and dequant.

    Frozen: the packed weights and plans made from it rely on its facts not moving.
    """

    name: str
    #: ``gguf`` (stored as GGUF blocks, packed row by row) or ``safetensors``
    container: str
    #: weights per stored block (NVFP4: per kernel block of 32, two fp8 scales)
    block_k: int
    #: bytes per stored block
    block_bytes: int
    #: float storage (F32, F16, BF16, F64): widened or cast, never a dequantization notice
    dense: bool
    #: the C kernels' number for it (``core/csrc/quant.h``); None: dequantized at load
    kernel: int | None
    #: packed bytes per tile before its blocks (NVFP4: eight fp32 row multipliers)
    tile_header: int
    #: why no weight may be stored in this type, read after "stored as <name>" (None: it may be)
    refusal: str | None
    _dequantize: Dequantize | None

    def __new__(
        cls,
        number: int,
        name: str,
        *,
        block_k: int,
        block_bytes: int,
        container: str = "gguf",
        dense: bool = False,
        kernel: int | None = None,
        tile_header: int = 0,
        refusal: str | None = None,
        dequantize: Dequantize | None = None,
    ) -> Self:
        """Check the facts once: a record that cannot describe whole blocks is refused."""
        if container not in CONTAINERS:
            raise WeightTypeError(f"weight type {name}: container {container!r} is not one "
                                  f"of {CONTAINERS}")
        if block_k < 1 or block_bytes < 1 or tile_header < 0 or number < 0:
            raise WeightTypeError(f"weight type {name} (#{number}): blocks of {block_k} "
                                  f"weights in {block_bytes} bytes, tile header "
                                  f"{tile_header}: each must be positive")
        self = super().__new__(cls, number)
        facts = {"name": name, "container": container, "block_k": block_k,
                 "block_bytes": block_bytes, "dense": dense, "kernel": kernel,
                 "tile_header": tile_header, "refusal": refusal, "_dequantize": dequantize}
        self.__dict__.update(facts)
        return self

    def __setattr__(self, key: str, value: object) -> NoReturn:
        raise AttributeError(f"weight type {self.name} is frozen ({key})")

    def __repr__(self) -> str:
        return f"<WeightType {self.name}: {int(self)}>"

    def __reduce__(self) -> tuple[Callable[[int], WeightType], tuple[int]]:
        """Pickled as its number: the receiving process's table says what it means."""
        return weight_type, (int(self),)

    @property
    def native(self) -> bool:
        """Whether a C kernel multiplies it kept packed (else it is dequantized at load)."""
        return self.kernel is not None

    def row_bytes(self, k: int) -> int:
        """Stored bytes of one row of ``k`` weights (``k`` a multiple of :attr:`block_k`)."""
        return k // self.block_k * self.block_bytes

    def packed_bytes(self, rows: int, k: int) -> int:
        """Bytes of ``rows`` x ``k`` weights in tiles: rows padded to :data:`TILE`, each
        tile its header, then its eight rows' blocks (the stored bytes, nothing widened)."""
        return -(-rows // TILE) * (self.tile_header + k // self.block_k * TILE * self.block_bytes)

    def dequantize(self, raw: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:  # [n]
        """Stored bytes as float32 values, flat; :class:`NoDequantizationError` where this
        type has none (its reader names the file and tensor)."""
        if self._dequantize is None:
            raise NoDequantizationError(f"{self.name} has no dequantization")
        return np.asarray(self._dequantize(raw), dtype=np.float32).reshape(-1)


#: number -> type (names are labels, not keys: GGML's own NVFP4, #40, and ours, #256,
#: are both called NVFP4, as gguf-py and the checkpoints call them)
_TYPES: dict[int, WeightType] = {}


def weight_type(number: int) -> WeightType:
    """The registered type of ``number`` (a file's number, a ``GGMLQuantizationType``)."""
    found = _TYPES.get(int(number))
    if found is None:
        raise UnknownWeightTypeError(int(number))
    return found


def weight_types() -> tuple[WeightType, ...]:
    """Every registered type, by number."""
    return tuple(sorted(_TYPES.values(), key=int))


def register(wtype: WeightType) -> WeightType:
    """Add a type to the table. Refused (:class:`WeightTypeError`), never overridden: a
    number already registered, and a :attr:`~WeightType.kernel` of another
    type whose block layout differs (that kernel would read other bytes)."""
    number = int(wtype)
    if number in _TYPES:
        raise WeightTypeError(f"weight type {wtype.name} (#{number}): {_TYPES[number]!r} is "
                              "registered under that number already")
    if wtype.kernel is not None and wtype.kernel != number:
        runs = _TYPES.get(wtype.kernel)
        if runs is None or runs.kernel != wtype.kernel:
            raise WeightTypeError(f"weight type {wtype.name} names kernel #{wtype.kernel}, "
                                  "which no registered type runs")
        layout = (wtype.container, wtype.block_k, wtype.block_bytes, wtype.tile_header)
        if layout != (runs.container, runs.block_k, runs.block_bytes, runs.tile_header):
            raise WeightTypeError(f"weight type {wtype.name} names {runs.name}'s kernel but "
                                  "stores other blocks: that kernel would read other bytes")
    _TYPES[number] = wtype
    return wtype


@contextmanager
def registered(wtype: WeightType) -> Iterator[WeightType]:
    """``wtype`` registered inside the block and gone after it (tests, tools)."""
    register(wtype)
    try:
        yield wtype
    finally:
        del _TYPES[int(wtype)]


# -- the built-in types --------------------------------------------------------------------

def _bf16_to_f32(raw: npt.NDArray[np.uint8]) -> npt.NDArray[Any]:
    """bf16 bytes as float32: the upper half of each float (exact)."""
    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _gguf_py(number: int) -> Dequantize:
    """gguf-py's dequantization of a GGML type, imported when first called (rare: a type
    the kernels do not run), so a load that needs none never imports gguf-py's package."""

    def dequantize(raw: npt.NDArray[np.uint8]) -> Any:
        from gguf.quants import dequantize as gguf_dequantize

        return gguf_dequantize(raw, GGMLQuantizationType(number))

    return dequantize


#: float storage read as numpy views, as gguf-py reads them (the norms and biases of
#: every model: no gguf-py import)
_FLOAT_VIEWS: dict[str, Dequantize] = {
    "F32": lambda raw: raw.view(np.float32),
    "F16": lambda raw: raw.view(np.float16),
    "BF16": _bf16_to_f32,
    "F64": lambda raw: raw.view(np.float64),
}
#: the GGML types the C quantized GEMM runs (``core/csrc/gemm_quant*.c``), by their number
_NATIVE_GGML = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
_INTEGERS = ("I8", "I16", "I32", "I64")
_INTEGER_REFUSAL = ("(integers); a weight must be a float or quantized GGML type, and "
                    "draftwise does not cast integers to floats")


def _register_ggml() -> None:
    """Every type gguf-py's constants know, with its block layout from them."""
    for member in GGMLQuantizationType:
        if member not in GGML_QUANT_SIZES:
            continue
        block_k, block_bytes = GGML_QUANT_SIZES[member]
        name, number = member.name, int(member)
        register(WeightType(
            number, name, block_k=block_k, block_bytes=block_bytes,
            dense=name in _FLOAT_VIEWS,
            kernel=number if name in _NATIVE_GGML else None,
            refusal=_INTEGER_REFUSAL if name in _INTEGERS else None,
            dequantize=_FLOAT_VIEWS.get(name) or (None if name in _INTEGERS else _gguf_py(number)),
        ))


_register_ggml()

#: NVFP4 from safetensors (ModelOpt, compressed-tensors; ``formats.nvfp4``): e2m1 codes
#: and an fp8-e4m3 scale per 16 weights, a global multiplier per row; packed by
#: ``models.quant.pack_nvfp4`` (tile: 32 bytes of row multipliers, then 144 bytes per 32
#: inputs). Not a GGML type: 256 is the C kernels' number (GGML's own NVFP4 is another
#: block format). Its reader dequantizes it itself.
NVFP4 = register(WeightType(256, "NVFP4", container="safetensors", block_k=32,
                            block_bytes=18, tile_header=32, kernel=256))

__all__ = [
    "NVFP4",
    "NoDequantizationError",
    "TILE",
    "UnknownWeightTypeError",
    "WeightType",
    "WeightTypeError",
    "register",
    "registered",
    "weight_type",
    "weight_types",
]
