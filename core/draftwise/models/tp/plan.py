"""What a tensor-parallel split needs of the target, refused by name where it cannot run.

Each rank holds whole attention heads and whole KV heads (Megatron: q/k/v column-parallel
by head), so both counts must divide by the size; the MLP's intermediate width too. The
vocabulary is padded to a multiple of the size (Megatron pads it as well), so any vocab
runs. Refused, with what works instead: a size that does not divide, a GGUF target
(quantized tensor parallel is not built: a row-parallel weight would have to be cut at
quantization-block boundaries along K), an NVFP4 or GDN-hybrid checkpoint, and a machine
without the backend's collectives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from draftwise.models.config import ModelConfig
from draftwise.models.tp.errors import TensorParallelConfigError


@dataclass(frozen=True, slots=True)
class Split:
    """A checked split of one target over ``size`` ranks: what each rank holds."""

    size: int
    #: the checkpoint's own architecture (full sizes)
    full: ModelConfig
    #: vocabulary rows per rank (the last rank's tail past ``full.vocab_size`` is padding)
    vocab_per_rank: int

    @property
    def local(self) -> ModelConfig:
        """The config one rank's model is built with: its heads, KV heads, MLP width and
        vocabulary rows (hidden size, head size and layers unchanged)."""
        c = self.full
        return replace(c, num_attention_heads=c.num_attention_heads // self.size,
                       num_key_value_heads=c.num_key_value_heads // self.size,
                       intermediate_size=c.intermediate_size // self.size,
                       vocab_size=self.vocab_per_rank)


def _instead(config: ModelConfig) -> str:
    """The sizes this model does split into (every rank whole heads, KV heads, MLP rows)."""
    g = math.gcd(config.num_attention_heads, config.num_key_value_heads,
                 config.intermediate_size)
    return ", ".join(str(n) for n in range(1, g + 1) if g % n == 0 and n <= 64)


def plan_split(config: ModelConfig, size: int) -> Split:
    """The split of ``config`` over ``size`` ranks, or a refusal naming what divides."""
    key = f"tensor_parallel_size={size}"
    c = config
    for what, count in (("attention heads", c.num_attention_heads),
                        ("KV heads", c.num_key_value_heads),
                        ("MLP intermediate rows", c.intermediate_size)):
        if count % size:
            raise TensorParallelConfigError(
                f"{key} is refused: the model's {count} {what} do not divide into {size} "
                f"ranks (each rank holds whole heads and an equal MLP share; KV heads are "
                f"not replicated). Instead: tensor_parallel_size in {{{_instead(c)}}}.")
    return Split(size, c, -(-c.vocab_size // size))


def check_size(size: object) -> int:
    """``tensor_parallel_size`` is a positive integer."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise TensorParallelConfigError(
            f"tensor_parallel_size={size!r} is refused: it must be a positive integer "
            "(1: no tensor parallel)")
    return size


def refuse_format(size: int, what: str) -> TensorParallelConfigError:
    """A target kind tensor parallel does not load (GGUF, NVFP4, GDN hybrid)."""
    return TensorParallelConfigError(
        f"tensor_parallel_size={size} is refused for {what}. Instead: an HF safetensors "
        "llama-family directory in bfloat16/float16/float32, or tensor_parallel_size=1.")


def backend_for(device: torch.device | str) -> str:
    """The collectives' backend: NCCL on CUDA, gloo on CPU (refused where absent)."""
    import torch.distributed as dist

    kind = torch.device(device).type
    name = "nccl" if kind == "cuda" else "gloo"
    ok = dist.is_available() and (dist.is_nccl_available() if name == "nccl"
                                  else dist.is_gloo_available())
    if not ok:
        raise TensorParallelConfigError(
            f"tensor_parallel_size > 1 on {kind} needs torch.distributed with {name}, which "
            "this torch build lacks. Instead: tensor_parallel_size=1.")
    return name
