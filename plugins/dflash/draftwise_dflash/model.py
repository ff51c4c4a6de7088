"""The DFlash draft decoder over the core's paged KV (z-lab ``DFlashDraftModel``).

Two passes per engine step, each batched over every drafting row:

1. :meth:`DFlashModel.write_context`: the target's hidden states of the newly committed
   positions (the tapped layers, concatenated) -> ``fc`` -> ``hidden_norm`` give the
   context features; in every draft layer they become K/V through that layer's own
   ``k_proj``/``v_proj`` (then ``k_norm`` and RoPE at their positions), written into the
   draft's KV at those positions. Context is written once per committed position.
2. :meth:`DFlashModel.block_hidden`: the block ``[anchor, MASK x (B-1)]`` at positions
   ``anchor .. anchor+B-1`` runs through the layers; each block query attends to the row's
   context and to the whole block (non-causal; sliding layers causal with their window),
   and the block's own K/V is written after the context as scratch that the core's
   frontier never counts (the next context write overwrites it). The draft's ``norm``
   closes it; the LM head is the target's.

DFlash2 wraps each attention and MLP sublayer in a grouped dynamic causal depthwise
convolution within the block (:mod:`draftwise_dflash.conv`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from draftwise.kit import (
    AttentionMetadata,
    Backend,
    DecoderLayer,
    ForwardBatch,
    KVCache,
    add_rms_norm,
    apply_rope,
    apply_rope_,
    decide_backend,
    inv_frequencies,
    linear,
    rms_norm,
    rope_tables,
    silu_mul,
    write_kv,
)

from draftwise_dflash.config import DFlashConfig
from draftwise_dflash.conv import BlockConv, SelectorWeights


@dataclass(slots=True)
class DFlashWeights:
    """The drafter's own tensors (the embedding and LM head are the target's)."""

    fc: torch.Tensor  # [H, len(target_layer_ids) * H]
    hidden_norm: torch.Tensor  # [H]
    norm: torch.Tensor  # [H]
    layers: list[DecoderLayer]
    #: DFlash2: per layer (attention conv, MLP conv)
    convs: list[tuple[BlockConv, BlockConv]] = field(default_factory=list)
    selector: SelectorWeights | None = None


class DFlashModel:
    """Context K/V writes and the block forward (module doc), on the target's device."""

    def __init__(self, cfg: DFlashConfig, weights: DFlashWeights, dtype: torch.dtype,
                 device: torch.device, backend: Backend | None = None) -> None:
        """``backend``: the target's (``LlamaForCausalLM.backend``): the drafter runs the
        kernels the target runs, at its own head size; None decides for this dtype."""
        self.cfg, self.w = cfg, weights
        self.dtype, self.device = dtype, device
        c = cfg.decoder
        self.eps = c.rms_norm_eps
        self.num_layers = c.num_hidden_layers
        self.num_heads, self.num_kv_heads, self.head_dim = (
            c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        decided = backend or decide_backend(dtype, device, c.head_dim)
        self.backend = decided.attention_for(c.head_dim)
        #: the small per-token ops as C kernels too, with the native attention
        self.native = self.backend == "native"
        inv, self._scaling = inv_frequencies(
            c.head_dim, c.rope_theta, c.rope_scaling, c.max_position_embeddings)
        self._inv = inv
        self._cos = torch.empty(0, c.head_dim, dtype=dtype)
        self._sin = torch.empty(0, c.head_dim, dtype=dtype)
        self.windows = [
            None if not causal else c.window_of(i) for i, causal in enumerate(cfg.causal)
        ]

    def rope(self, positions: torch.Tensor, max_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows ``[T, 1, head_dim]`` (tables grown on demand, host-side check)."""
        if max_pos > self._cos.shape[0]:
            size = max(max_pos, 2 * self._cos.shape[0], 256)
            cos, sin = rope_tables(self._inv, size, self._scaling, self.dtype)
            self._cos, self._sin = cos.to(self.device), sin.to(self.device)
        return self._cos[positions].unsqueeze(1), self._sin[positions].unsqueeze(1)

    def context_features(self, taps: list[torch.Tensor]) -> torch.Tensor:  # -> [T, H]
        """``hidden_norm(fc(concat(taps)))``: one tensor per target layer id, in order."""
        x = torch.cat([t.to(self.dtype) for t in taps], dim=-1)
        return rms_norm(linear(x, self.w.fc), self.w.hidden_norm, self.eps)

    def write_context(
        self,
        ctx: torch.Tensor,  # [T, H] context features
        positions: torch.Tensor,  # [T]
        slots: torch.Tensor,  # [T] flat KV slots
        kv: KVCache,
    ) -> None:
        """Every layer's context K/V at its slots (rule 1 of the module doc)."""
        if ctx.shape[0] == 0:
            return
        cos, sin = self.rope(positions, int(positions.max()) + 1)
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        q_size = h * d
        for i, layer in enumerate(self.w.layers):
            qkv = linear(ctx, layer.qkv_weight, layer.qkv_bias)
            k = qkv[:, q_size : q_size + kvh * d].reshape(-1, kvh, d)
            if layer.qk_norm is not None:
                k = rms_norm(k, layer.qk_norm[h:], self.eps)
            k = apply_rope(k, cos, sin)
            v = qkv[:, q_size + kvh * d :].reshape(-1, kvh, d).contiguous()
            write_kv(k.contiguous(), v, kv.k[i], kv.v[i], slots)

    def block_hidden(
        self,
        x: torch.Tensor,  # [T, H] block embeddings (already scaled)
        batch: ForwardBatch,  # the blocks: one row per drafting request
        kv: KVCache,
        block_index: torch.Tensor,  # [T] each token's offset inside its block
    ) -> torch.Tensor:  # [T, H], after the draft's final norm
        """The block through every layer (rule 2 of the module doc)."""
        cos, sin = self.rope(batch.positions, batch.max_seq_len)
        metas: dict[int | None | str, AttentionMetadata] = {}
        for i, layer in enumerate(self.w.layers):
            causal = self.cfg.causal[i]
            key: int | None | str = self.windows[i] if causal else "block"
            if key not in metas:
                metas[key] = AttentionMetadata.build(
                    batch, kv.block_size, {self.windows[i]} if causal else (None,),
                    backend=self.backend, num_blocks=kv.num_blocks, causal=causal,
                )
            convs = self.w.convs[i] if self.w.convs else None
            x = _layer(layer, x, cos, sin, kv.k[i], kv.v[i], metas[key], self.windows[i],
                       convs, block_index, self.eps, self.native)
        return rms_norm(x, self.w.norm, self.eps, self.native)


def _layer(
    layer: DecoderLayer,
    h: torch.Tensor,  # [T, H]
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    window: int | None,
    convs: tuple[BlockConv, BlockConv] | None,
    block_index: torch.Tensor,  # [T]
    eps: float,
    native: bool = False,
) -> torch.Tensor:  # [T, H]
    """One draft layer: the Qwen3 decoder layer, with DFlash2's convolutions around each
    sublayer (``prepare`` after the pre-norm, ``finish`` on the sublayer's output)."""
    from draftwise.kit import paged_attention

    t = h.shape[0]
    x = rms_norm(h, layer.input_norm, eps, native)
    kernel = None
    if convs is not None:
        x, kernel = convs[0].prepare(x, block_index)
    qkv = linear(x, layer.qkv_weight, layer.qkv_bias)
    qk = qkv[:, : layer.q_size + layer.kv_size].view(t, -1, layer.head_dim)
    if layer.qk_norm is not None:
        qk = rms_norm(qk, layer.qk_norm, eps)
    qk = apply_rope_(qk, cos, sin) if native else apply_rope(qk, cos, sin)
    q, k = qk[:, : layer.num_heads], qk[:, layer.num_heads :]
    v = qkv[:, layer.q_size + layer.kv_size :].view(t, layer.num_kv_heads, layer.head_dim)
    attn = linear(paged_attention(q, k, v, k_cache, v_cache, meta, layer.scale, window),
                  layer.o_weight, layer.o_bias)
    if convs is not None and kernel is not None:
        attn = convs[0].finish(attn, kernel, block_index)
    h, x = add_rms_norm(h, attn, layer.post_norm, eps, native)
    if convs is not None:
        x, kernel = convs[1].prepare(x, block_index)
    mlp = linear(silu_mul(linear(x, layer.gate_up_weight, layer.gate_up_bias), native),
                 layer.down_weight, layer.down_bias)
    if convs is not None and kernel is not None:
        mlp = convs[1].finish(mlp, kernel, block_index)
    return h + mlp


__all__ = ["DFlashModel", "DFlashWeights"]
