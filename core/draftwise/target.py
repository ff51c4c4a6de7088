"""The target surface: what a loaded target model exposes to drafters, declared.

Why a protocol: model-based drafters (MTP heads, DFlash/DSpark blocks, a draft model's
shared head) run parts of the target, its embedding, its final norm, its LM head, its
rope tables, its kernels' backend. Before this module they reached into
``LlamaForCausalLM``'s attributes, found by reading ``models/llama.py``. Here is the
list, typed; the llama family (``models/llama.py``) and the GDN hybrid
(``models/qwen3_next.py``) implement it, ``ProposerContext.target`` and
``LoadedModel.model`` are typed with it, and a test checks both classes against it.

**Layer numbering.** ``layers[i]`` is decoder layer ``i``, 0-based, ``0 ..
config.num_hidden_layers - 1``. A hidden-state tap ``i`` (``LoadedDraft.hidden_layers``)
is the OUTPUT of decoder layer ``i``: the residual stream after it, before the next
layer's norm. Tap ``num_hidden_layers - 1`` is therefore the last layer's output BEFORE
:meth:`TargetModel.final_norm`; apply ``final_norm`` to it to get what the LM head reads.
(z-lab's DFlash and EAGLE-3 number taps the same way; an off-by-one silently costs
acceptance, so a loader checks its taps against ``num_hidden_layers``.)

Everything here is read-only for a drafter: it never changes the target's weights,
buffers or backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from draftwise.formats.tokenizer import Tokenizer
    from draftwise.models.backend import Backend
    from draftwise.models.config import ModelConfig


@runtime_checkable
class TargetModel(Protocol):
    """A target's forward parts that a drafter may run (``ctx.target.model``); read-only.

    Members (``help()`` shows only the methods' own docstrings, so all are listed here):

    - ``config``: a ``ModelConfig``: ``hidden_size``, ``num_hidden_layers``,
      ``vocab_size``, ``head_dim``, ``rms_norm_eps``, ...
    - ``backend``: the kernels this target runs on; run your own layers on the same.
    - ``layers``: the decoder layers, ``layers[i]`` is layer ``i`` (0-based).
    - ``rope_cos``, ``rope_sin``: rope tables by position, ``[positions, head_dim]``;
      ``ensure_positions(n)`` grows them to cover ``0 .. n-1``.
    - ``embed_weight``, ``lm_head_weight``: the stored tables (dense tensors or the kit's
      ``QuantWeight``; the same object when tied), for drafters that share them.
    - ``num_kv_heads``, ``head_dim``: the attention layers' shape (an own-KV draft copies
      it); ``dtype``: activation and KV dtype; ``device``: where the weights live.
    - ``embed(ids)``: ``[T]`` int64 -> ``[T, hidden]``; ``final_norm(h)``: the norm
      before the LM head, ``[N, hidden]`` -> ``[N, hidden]``; ``lm_head(h)``: float32
      logits of normed states, ``[N, hidden]`` -> ``[N, vocab]``.

    **Tap numbering.** Hidden-state taps (``LoadedDraft.hidden_layers``, or a proposer's
    own ``hidden_layers``: ``TapsHidden``) are 0-based, ``0 .. config.num_hidden_layers -
    1``; tap ``i`` is the OUTPUT of decoder layer ``i`` (the residual stream after it).
    The last tap, ``num_hidden_layers - 1``, is taken BEFORE ``final_norm``: what the LM
    head reads is ``final_norm(h)``, so ``lm_head(final_norm(h))`` of the newest row a
    draft row carries gives the token already chosen (``token_ids[-1]``). A tap outside
    the range is refused by name when the engine builds.
    """

    #: architecture facts: ``hidden_size``, ``num_hidden_layers``, ``vocab_size``,
    #: ``head_dim``, ``rms_norm_eps``, ...
    config: ModelConfig
    #: the kernels this target runs on, decided once at load (drafters run the same ones)
    backend: Backend
    #: the decoder layers, ``layers[i]`` is layer ``i`` (0-based)
    layers: Sequence[Any]
    #: rope tables by position, ``[positions, head_dim]`` (grow with
    #: :meth:`ensure_positions`)
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    #: the stored embedding and LM-head tables (dense tensors or the kit's ``QuantWeight``;
    #: the same object when tied), for drafters that share them rather than run them
    embed_weight: Any
    lm_head_weight: Any

    @property
    def num_kv_heads(self) -> int:
        """KV heads of the attention layers (an own-KV drafter's layout copies them)."""
        ...

    @property
    def head_dim(self) -> int:
        """Per-head width of the attention layers."""
        ...

    @property
    def dtype(self) -> torch.dtype:
        """Activation and KV-cache dtype."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        ...

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings: ``[T]`` int64 -> ``[T, hidden]`` in :attr:`dtype`."""
        ...

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The norm before the LM head: ``[N, hidden]`` -> ``[N, hidden]``."""
        ...

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of already-normed states: ``[N, hidden]`` -> ``[N, vocab]``."""
        ...

    def ensure_positions(self, n: int) -> None:
        """Make the rope tables cover positions ``0 .. n-1``."""
        ...


@runtime_checkable
class HybridTargetModel(TargetModel, Protocol):
    """A GDN hybrid target (Qwen3.5-style): partial rotary embedding on gated attention."""

    #: the hybrid's own config (``base`` is the llama-family :class:`ModelConfig`)
    hybrid: Any
    #: the gated-attention layers, in layer order (MTP heads copy their shape)
    attention_layers: Sequence[Any]

    def partial_rope(self, positions: torch.Tensor) -> Any:
        """The partial-rotary tables of ``positions`` (``[T]`` int64), as its attention
        layers take them."""
        ...


@runtime_checkable
class LoadedTarget(Protocol):
    """What ``ProposerContext.target`` is: the target model with its checkpoint facts.

    ``model``: the :class:`TargetModel` (its docstring lists the members and the tap
    numbering); ``config``: the same ``ModelConfig`` as ``model.config``; ``tokenizer``:
    None only for a checkpoint without one; ``eos_token_ids``; ``path``: the checkpoint
    as given; ``format``: ``"gguf"`` or ``"safetensors"``.
    """

    model: TargetModel
    config: ModelConfig
    #: None only for a checkpoint without a tokenizer (test checkpoints)
    tokenizer: Tokenizer | None
    eos_token_ids: tuple[int, ...]
    path: str
    #: "gguf" or "safetensors"
    format: str


__all__ = ["HybridTargetModel", "LoadedTarget", "TargetModel"]
