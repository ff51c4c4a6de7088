"""The llama family in one implementation: Llama, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm).

Written for CPU decode speed in eager torch: q/k/v and gate/up are fused into one
weight each at load (two matmuls per layer instead of five), RoPE tables are built once,
RoPE runs on q and k together, and the final norm and LM head only see the rows whose
logits are wanted. With the C kernels a layer is C calls only (``DecoderLayer._run_native``):
RoPE and attention read q, k and v as offsets into the fused projection output, and each
layer's last residual add is the next layer's ``add_rms_norm`` (the same bf16 sum). Where
every projection is GGUF-quantized, the layers are ONE C call instead (``models.stack``:
the same kernels in the same order, so the same bits; ``backend.choose_layers``). The numerics
follow transformers' op for op (RMSNorm in fp32 cast back before the weight, cos/sin in
the model dtype) so the oracle tests stay tight.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from draftwise.gpu.quant import DeviceQuantWeight
from draftwise.models import kernels
from draftwise.models.attention import AttentionMetadata, paged_attention
from draftwise.models.backend import Backend, decide_backend, gemm_kind
from draftwise.models.batch import ForwardBatch, KVCache, ModelOutput
from draftwise.models.config import ModelConfig
from draftwise.models.fused import add_rms_norm, apply_rope_, rms_norm, silu_mul
from draftwise.models.linear import BlockedWeight, Weight, is_packed, linear, pack_weights
from draftwise.models.quant import QuantWeight, dequant_rows, linear_quant
from draftwise.models.rope import INITIAL_ROPE_POSITIONS, apply_rope, inv_frequencies, rope_tables
from draftwise.models.stack import (
    DecoderPlan,
    StackCaches,
    StackLayer,
    decoder_plan,
    run_layers,
    stack_caches,
)


def _param(*shape: int, dtype: torch.dtype, device: str | torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


#: a weight the loader sets after construction (GGUF-quantized): no memory until then
_EXTERNAL = "meta"


class DecoderLayer(nn.Module):
    """Attention + SwiGLU MLP, pre-norm, with fused projections."""

    #: the projection weights :meth:`pack_weights` reorders
    _LINEARS = ("qkv_weight", "o_weight", "gate_up_weight", "down_weight")

    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        dtype: torch.dtype,
        device: str | torch.device,
        external: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__()
        c = config
        self.eps = c.rms_norm_eps
        self.num_heads, self.num_kv_heads, self.head_dim = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        )
        self.q_size, self.kv_size, self.inter = c.q_size, c.kv_size, c.intermediate_size
        self.scale = c.head_dim**-0.5
        self.window = c.window_of(layer)
        #: run the small ops as C kernels (set by the model with its attention backend)
        self.native = False

        def p(*shape: int) -> nn.Parameter:
            return _param(*shape, dtype=dtype, device=device)

        def w(name: str, *shape: int) -> nn.Parameter:  # a projection, maybe set later
            return _param(*shape, dtype=dtype, device=_EXTERNAL if name in external else device)

        self.input_norm = p(c.hidden_size)
        self.qkv_weight = w("qkv_weight", c.q_size + 2 * c.kv_size, c.hidden_size)
        self.qkv_bias = p(c.q_size + 2 * c.kv_size) if c.attention_bias else None
        # q_norm and k_norm side by side, one row per head, so one norm covers both
        heads = c.num_attention_heads + c.num_key_value_heads
        self.qk_norm = p(heads, c.head_dim) if c.qk_norm else None
        self.o_weight = w("o_weight", c.hidden_size, c.q_size)
        self.o_bias = p(c.hidden_size) if c.o_proj_bias else None
        self.post_norm = p(c.hidden_size)
        self.gate_up_weight = w("gate_up_weight", 2 * c.intermediate_size, c.hidden_size)
        self.gate_up_bias = p(2 * c.intermediate_size) if c.mlp_bias else None
        self.down_weight = w("down_weight", c.hidden_size, c.intermediate_size)
        self.down_bias = p(c.hidden_size) if c.mlp_bias else None

    def set_packed(self, name: str, packed: Weight) -> None:
        """Swap one of the four projection weights for its packed copy (after loading).

        The dense parameter is dropped, not kept beside the packed one, so packing costs
        no memory; :meth:`LlamaForCausalLM.weight_slots` is unusable afterwards.
        """
        if packed is not getattr(self, name):
            del self._parameters[name]
            setattr(self, name, packed)

    def forward(
        self,
        h: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,  # [T, 1, head_dim]
        sin: torch.Tensor,  # [T, 1, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
        v_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden]
        """One decoder layer over the flat token batch."""
        h, delta = self.run(h, None, cos, sin, k_cache, v_cache, meta)
        return h + delta

    def run(
        self,
        h: torch.Tensor,  # [T, hidden] the residual stream
        delta: torch.Tensor | None,  # [T, hidden] the previous layer's MLP output, not added
        cos: torch.Tensor,  # [T, 1, head_dim]
        sin: torch.Tensor,  # [T, 1, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        rope: kernels.RopeRows | None = None,
        cache: kernels.PagedCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (residual, this layer's MLP output)
        """The layer with its last residual add left to the caller: the next layer's
        input norm takes it (one ``add_rms_norm`` C call instead of a torch add and a
        norm). ``rope`` and ``cache``: the step's RoPE rows and this layer's caches, checked
        once per step by the model; q, k and v then stay offsets into the fused projection."""
        if rope is not None and cache is not None and meta.index is not None \
                and self.qk_norm is None:
            return self._run_native(h, delta, rope, cache, meta.index)
        t = h.shape[0]
        native = self.native
        if delta is None:
            x = rms_norm(h, self.input_norm, self.eps, native)
        else:
            h, x = add_rms_norm(h, delta, self.input_norm, self.eps, native)
        qkv = linear(x, self.qkv_weight, self.qkv_bias)
        qk = qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim)
        if self.qk_norm is not None:
            qk = rms_norm(qk, self.qk_norm, self.eps)
        qk = apply_rope_(qk, cos, sin) if native else apply_rope(qk, cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        attn = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale, self.window)
        h, x = add_rms_norm(h, self.o_proj(attn), self.post_norm,
                            self.eps, native)
        act = silu_mul(linear(x, self.gate_up_weight, self.gate_up_bias), native)
        return h, self.down_proj(act)

    def o_proj(self, attn: torch.Tensor) -> torch.Tensor:  # [T, q_size] -> [T, hidden]
        """The attention output projection (a method so tensor parallel's row-parallel
        layer, ``models.tp.layers``, can reduce its partial sums before the bias)."""
        return linear(attn, self.o_weight, self.o_bias)

    def down_proj(self, act: torch.Tensor) -> torch.Tensor:  # [T, inter] -> [T, hidden]
        """The MLP's down projection (row-parallel under tensor parallel, as ``o_proj``)."""
        return linear(act, self.down_weight, self.down_bias)

    def stack_layer(self) -> StackLayer | None:
        """This layer for ``models.stack.decoder_plan``, or None where it cannot run there (a
        projection not GGUF-quantized, or q/k norms)."""
        weights = (self.qkv_weight, self.o_weight, self.gate_up_weight, self.down_weight)
        if self.qk_norm is not None or not all(isinstance(w, QuantWeight) for w in weights):
            return None
        qkv, o, gate_up, down = cast(tuple[QuantWeight, ...], weights)
        return StackLayer(self.input_norm, self.post_norm, qkv, self.qkv_bias, o, self.o_bias,
                          gate_up, self.gate_up_bias, down, self.down_bias, self.window)

    def _run_native(
        self,
        h: torch.Tensor,  # [T, hidden]
        delta: torch.Tensor | None,  # [T, hidden]
        rope: kernels.RopeRows,
        cache: kernels.PagedCache,
        index: kernels.AttentionIndex,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`run` as C calls only, the model's native backend decided (``models.fused``
        holds each op's torch reference; the kernels check what they are given)."""
        if delta is None:
            x = kernels.rms_norm(h, self.input_norm, self.eps)
        else:
            h, x = kernels.add_rms_norm(h, delta, self.input_norm, self.eps)
        qkv = linear(x, self.qkv_weight, self.qkv_bias)
        kernels.rope_qkv_(qkv, self.num_heads + self.num_kv_heads, rope)
        attn = kernels.paged_attention_qkv(qkv, self.num_heads, cache, index, self.window,
                                           self.scale)
        h, x = kernels.add_rms_norm(h, self.o_proj(attn), self.post_norm,
                                    self.eps)
        act = kernels.silu_mul(linear(x, self.gate_up_weight, self.gate_up_bias))
        return h, self.down_proj(act)


class LlamaForCausalLM(nn.Module):
    """A llama-family decoder over paged KV; ``forward(batch, kv) -> ModelOutput``."""

    #: the decoder layer built per layer (tensor parallel's model builds its own)
    layer_class: type[DecoderLayer] = DecoderLayer
    # buffers (declared for type checkers; registered in __init__)
    inv_freq: torch.Tensor  # [head_dim // 2] fp32
    rope_cos: torch.Tensor  # [positions, head_dim]
    rope_sin: torch.Tensor  # [positions, head_dim]

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cpu",
        external: frozenset[str] = frozenset(),
        backend: Backend | None = None,
    ) -> None:
        """``external``: weights the loader sets later with :meth:`set_quantized` (their
        dense parameters get no memory): ``embed_weight``, ``lm_head_weight`` and
        ``layers.<i>.<projection>`` names. ``backend``: the kernels to run, decided by the
        loader (:func:`~draftwise.models.backend.decide_backend`; None decides here)."""
        super().__init__()
        self.config = config
        self._dtype, self._device = dtype, torch.device(device)

        def p(name: str, *shape: int) -> nn.Parameter:
            return _param(*shape, dtype=dtype, device=_EXTERNAL if name in external else device)

        self.embed_weight: nn.Parameter | QuantWeight | DeviceQuantWeight = p(
            "embed_weight", config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            self.layer_class(config, i, dtype, device, frozenset(
                n.split(".", 2)[2] for n in external if n.startswith(f"layers.{i}.")))
            for i in range(config.num_hidden_layers)
        )
        self.norm_weight = p("norm_weight", config.hidden_size)
        self.lm_head_weight: nn.Parameter | QuantWeight | DeviceQuantWeight = (
            self.embed_weight
            if config.tie_word_embeddings
            else p("lm_head_weight", config.vocab_size, config.hidden_size)
        )
        inv_freq, self._rope_scaling = inv_frequencies(
            config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings
        )
        if config.rope_freq_factors is not None:
            inv_freq = inv_freq / torch.tensor(config.rope_freq_factors, dtype=torch.float32)
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)
        empty = torch.empty(0, config.head_dim, dtype=dtype, device=device)
        self.register_buffer("rope_cos", empty, persistent=False)
        self.register_buffer("rope_sin", empty.clone(), persistent=False)
        self._windows = tuple({config.window_of(i) for i in range(config.num_hidden_layers)})
        #: every kernel choice, made once (``models.backend``)
        self.backend = backend or decide_backend(dtype, device, config.head_dim)
        #: ``native`` (the C kernel) or ``torch``; see ``models.attention``
        self.attention_backend = self.backend.attention
        #: the small per-token ops run as C kernels too (``models.fused``)
        self.native = self.backend.elementwise == "native"
        for layer in self.decoder_layers():
            layer.native = self.native
        #: the LM head packed by :meth:`pack_weights` (None: not packed, use ``lm_head_weight``)
        self._lm_head_packed: Weight | None = None
        #: every layer for ``models.stack`` (set by :meth:`pack_weights` where
        #: ``backend.layers`` is native), and the KV cache it last ran on
        self._stack: DecoderPlan | None = None
        self._stack_caches: StackCaches | None = None
        self.ensure_positions(min(INITIAL_ROPE_POSITIONS, config.max_position_embeddings))

    # -- what the engine and drafters read ------------------------------------------------
    @property
    def num_layers(self) -> int:
        """Decoder layers (one KV cache entry each)."""
        return self.config.num_hidden_layers

    @property
    def num_kv_heads(self) -> int:
        """KV heads per layer, for cache allocation."""
        return self.config.num_key_value_heads

    @property
    def head_dim(self) -> int:
        """Per-head width, for cache allocation."""
        return self.config.head_dim

    @property
    def dtype(self) -> torch.dtype:
        """Activation (and KV cache) dtype; dense weights have it too."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self._device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        """Token embeddings (shared with drafters); a quantized table dequantizes the rows."""
        if isinstance(self.embed_weight, QuantWeight):
            return dequant_rows(self.embed_weight, ids, self._dtype)
        if isinstance(self.embed_weight, DeviceQuantWeight):
            return self.embed_weight.rows(ids, self._dtype)
        return F.embedding(ids, self.embed_weight)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, hidden]
        """The norm applied before the LM head."""
        return rms_norm(hidden, self.norm_weight, self.config.rms_norm_eps, self.native)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        """float32 logits of already-normed hidden states (shared with drafters)."""
        head = self.lm_head_weight if self._lm_head_packed is None else self._lm_head_packed
        if isinstance(head, QuantWeight):  # fp32 straight from the accumulators
            return linear_quant(hidden, head, out_f32=True)
        return linear(hidden, head).float()  # a DeviceQuantWeight too: models.linear

    def set_quantized(self, name: str, weight: QuantWeight | DeviceQuantWeight) -> None:
        """Install a GGUF-quantized weight declared ``external`` at construction.

        ``name`` is ``embed_weight`` (a tied LM head shares it), ``lm_head_weight`` or
        ``layers.<i>.<projection>``.
        """
        if name == "embed_weight":
            tied = self.lm_head_weight is self.embed_weight
            del self._parameters["embed_weight"]
            self.embed_weight = weight
            if tied:
                self._parameters.pop("lm_head_weight", None)
                self.lm_head_weight = weight
        elif name == "lm_head_weight":
            del self._parameters["lm_head_weight"]
            self.lm_head_weight = weight
        else:
            _, index, attr = name.split(".", 2)
            self.decoder_layers()[int(index)].set_packed(attr, weight)

    def pack_weights(self) -> None:
        """Pack every dense projection and the LM head for this machine (see
        ``models.linear``); quantized ones are packed already.

        Called once after the weights are loaded. A tied dense LM head gets its own packed
        copy (the embedding lookup needs the dense table).
        """
        slots = [(layer, name) for layer in self.decoder_layers() for name in layer._LINEARS
                 if isinstance(getattr(layer, name), torch.Tensor)]
        head = self.lm_head_weight
        dense = [getattr(layer, name) for layer, name in slots]
        if isinstance(head, torch.Tensor):
            dense.append(head)
        packed = pack_weights(dense, self.backend.dense_gemm)
        for (layer, name), weight in zip(slots, packed):
            layer.set_packed(name, weight)
        if isinstance(head, (QuantWeight, DeviceQuantWeight)):
            self._lm_head_packed = head
        else:
            self._lm_head_packed = packed[-1] if is_packed(packed[-1]) else None
        self._stack = None
        if self.backend.layers == "native":
            stack = [layer.stack_layer() for layer in self.decoder_layers()]
            if all(s is not None for s in stack) and self.native:
                first = self.decoder_layers()[0]
                self._stack = decoder_plan(
                    cast(list[StackLayer], stack), first.num_heads, first.num_kv_heads,
                    first.head_dim, first.eps, first.scale)
            else:  # the printed backend says what runs
                self.backend = replace(self.backend, layers="per-op")

    @property
    def packed(self) -> bool:
        """Whether :meth:`pack_weights` ran and reordered the weights (see ``models.linear``)."""
        return self._lm_head_packed is not None

    @property
    def weight_backend(self) -> str:
        """How the projections and LM head run: ``quant`` (GGUF-quantized, ``models.quant``),
        ``native``, ``onednn`` or ``dense``, joined with ``+`` when they differ."""
        layers = self.decoder_layers()
        weights = [getattr(layer, n) for layer in layers for n in layer._LINEARS]
        head = self.lm_head_weight if self._lm_head_packed is None else self._lm_head_packed
        kinds = []
        for w in [*weights, head]:
            kind = ("quant" if isinstance(w, (QuantWeight, DeviceQuantWeight)) else "native"
                    if isinstance(w, BlockedWeight) else "onednn" if w.is_mkldnn else "dense")
            if kind not in kinds:
                kinds.append(kind)
        return "+".join(kinds)

    def gemm_kinds(self) -> list[tuple[str, str]]:
        """(stored type, kernel) of every projection and the LM head as placed now."""
        layers = self.decoder_layers()
        weights = [getattr(layer, n) for layer in layers for n in layer._LINEARS]
        head = self.lm_head_weight if self._lm_head_packed is None else self._lm_head_packed
        return [gemm_kind(w) for w in [*weights, head]]

    @property
    def weight_bytes(self) -> int:
        """Bytes of the projections and LM head one decode step streams."""
        layers = self.decoder_layers()
        weights = [getattr(layer, n) for layer in layers for n in layer._LINEARS]
        head = self.lm_head_weight if self._lm_head_packed is None else self._lm_head_packed
        total = 0
        for w in [*weights, head]:
            if isinstance(w, (QuantWeight, DeviceQuantWeight)):
                total += w.nbytes
            elif isinstance(w, BlockedWeight):
                total += w.data.nbytes
            else:
                total += w.numel() * w.element_size()
        return total

    def decoder_layers(self) -> list[DecoderLayer]:
        """The layers, typed."""
        return [cast(DecoderLayer, layer) for layer in self.layers]

    def ensure_positions(self, n: int) -> None:
        """Grow the RoPE tables to cover positions ``< n`` (host-side check, no sync)."""
        if n <= self.rope_cos.shape[0]:
            return
        size = max(n, 2 * self.rope_cos.shape[0])
        cos, sin = rope_tables(self.inv_freq.cpu(), size, self._rope_scaling, self.dtype)
        self.rope_cos, self.rope_sin = cos.to(self.device), sin.to(self.device)

    # -- the step -------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache) -> ModelOutput:
        """Write this step's K/V, attend, return logits at ``batch.logits_indices``."""
        self.ensure_positions(batch.max_seq_len)
        meta = AttentionMetadata.build(
            batch,
            kv.block_size,
            self._windows,
            backend=self.attention_backend,
            num_blocks=kv.num_blocks,
        )
        cos = self.rope_cos[batch.positions].unsqueeze(1)
        sin = self.rope_sin[batch.positions].unsqueeze(1)
        h = self.embed(batch.input_ids)
        wanted = set(batch.hidden_layers)
        hidden: dict[int, torch.Tensor] = {}
        rope: kernels.RopeRows | None = None
        caches: list[kernels.PagedCache | None] = [None] * self.num_layers
        delta, stacked = None, False
        if self.native and meta.index is not None:  # checked here, once for every layer
            rope = kernels.rope_rows(cos, sin, h.shape[0], self.head_dim)
            paged = kv.paged()  # checked once per cache
            if self._stack is not None:  # every layer in one C call
                stack = self._stack_caches
                if stack is None or stack.caches is not paged:
                    stack = self._stack_caches = stack_caches(self._stack, paged)
                h, delta, hidden = run_layers(self._stack, stack, h, wanted, rope, meta.index)
                stacked = True
            else:
                caches = list(paged)
        if not stacked:
            for i, layer in enumerate(self.decoder_layers()):
                h, delta = layer.run(h, delta, cos, sin, kv.k[i], kv.v[i], meta, rope, caches[i])
                if i in wanted:
                    hidden[i] = h + delta
        if delta is not None:
            h = h + delta
        rows = h.index_select(0, batch.logits_indices)
        return ModelOutput(logits=self.lm_head(self.final_norm(rows)), hidden_states=hidden)

    # -- weights --------------------------------------------------------------------------
    def weight_slots(self) -> dict[str, torch.Tensor]:
        """HF tensor name -> the view of our (fused) parameter it is copied into."""
        if self.packed:
            raise RuntimeError("weights are packed for inference; weight_slots() is load-time only")
        c = self.config
        slots: dict[str, torch.Tensor] = {"model.norm.weight": self.norm_weight.data}
        if isinstance(self.embed_weight, torch.Tensor):
            slots["model.embed_tokens.weight"] = self.embed_weight.data
        if not c.tie_word_embeddings and isinstance(self.lm_head_weight, torch.Tensor):
            slots["lm_head.weight"] = self.lm_head_weight.data
        q, kv, inter = c.q_size, c.kv_size, c.intermediate_size
        for i, layer in enumerate(self.decoder_layers()):
            p = f"model.layers.{i}."
            slots[p + "input_layernorm.weight"] = layer.input_norm.data
            slots[p + "post_attention_layernorm.weight"] = layer.post_norm.data
            for name, part in (
                ("q", slice(0, q)),
                ("k", slice(q, q + kv)),
                ("v", slice(q + kv, None)),
            ):
                if isinstance(layer.qkv_weight, torch.Tensor):
                    slots[f"{p}self_attn.{name}_proj.weight"] = layer.qkv_weight.data[part]
                if layer.qkv_bias is not None:
                    slots[f"{p}self_attn.{name}_proj.bias"] = layer.qkv_bias.data[part]
            if isinstance(layer.o_weight, torch.Tensor):
                slots[p + "self_attn.o_proj.weight"] = layer.o_weight.data
            if layer.o_bias is not None:
                slots[p + "self_attn.o_proj.bias"] = layer.o_bias.data
            if layer.qk_norm is not None:
                slots[p + "self_attn.q_norm.weight"] = layer.qk_norm.data[: c.num_attention_heads]
                slots[p + "self_attn.k_norm.weight"] = layer.qk_norm.data[c.num_attention_heads :]
            for name, part in (("gate", slice(0, inter)), ("up", slice(inter, None))):
                if isinstance(layer.gate_up_weight, torch.Tensor):
                    slots[f"{p}mlp.{name}_proj.weight"] = layer.gate_up_weight.data[part]
                if layer.gate_up_bias is not None:
                    slots[f"{p}mlp.{name}_proj.bias"] = layer.gate_up_bias.data[part]
            if isinstance(layer.down_weight, torch.Tensor):
                slots[p + "mlp.down_proj.weight"] = layer.down_weight.data
            if layer.down_bias is not None:
                slots[p + "mlp.down_proj.bias"] = layer.down_bias.data
        return slots


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape the checkpoint must have (q/k norms: ``[head_dim]``)."""
    c = config
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
        "model.norm.weight": (c.hidden_size,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (c.hidden_size,)
        shapes[p + "post_attention_layernorm.weight"] = (c.hidden_size,)
        for name, width in (("q", c.q_size), ("k", c.kv_size), ("v", c.kv_size)):
            shapes[f"{p}self_attn.{name}_proj.weight"] = (width, c.hidden_size)
            if c.attention_bias:
                shapes[f"{p}self_attn.{name}_proj.bias"] = (width,)
        shapes[p + "self_attn.o_proj.weight"] = (c.hidden_size, c.q_size)
        if c.o_proj_bias:
            shapes[p + "self_attn.o_proj.bias"] = (c.hidden_size,)
        if c.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (c.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (c.head_dim,)
        for name in ("gate", "up"):
            shapes[f"{p}mlp.{name}_proj.weight"] = (c.intermediate_size, c.hidden_size)
            if c.mlp_bias:
                shapes[f"{p}mlp.{name}_proj.bias"] = (c.intermediate_size,)
        shapes[p + "mlp.down_proj.weight"] = (c.hidden_size, c.intermediate_size)
        if c.mlp_bias:
            shapes[p + "mlp.down_proj.bias"] = (c.hidden_size,)
    return shapes
