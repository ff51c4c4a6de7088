"""The DFlash drafter as a trainable torch module, in z-lab's parameter names.

Why a second forward beside the plugin's ``DFlashModel``: the engine's drafter runs on
the paged KV cache with the native kernels (``write_kv``, ``paged_attention``), which have
no autograd. This module computes the same function with plain torch ops, for many blocks
of one sequence at once, and ``tests/core/train/test_dflash_net.py`` proves it equal to
the plugin's inference forward (the engine's drafts, step by step) and to z-lab's own
``DFlashDraftModel`` on the same weights.

The function (``shared/reference/drafter-formats.md`` §1.3):

1. context features ``c = hidden_norm(fc(concat(taps)))`` at positions ``0 .. T-1``;
2. in every layer, the context's K/V come from that layer's ``k_proj``/``v_proj`` (then
   ``k_norm`` and RoPE at the context positions), the block's from its own normed input;
3. block ``n`` is ``[anchor, MASK x (B-1)]`` at positions ``a_n .. a_n+B-1``; its queries see
   the context keys strictly before ``a_n`` and the whole block (bidirectional), never
   another block (SpecForge ``create_dflash_block_mask``);
4. the draft's ``norm`` closes it; the LM head is the target's (the caller applies it).

``state_dict()`` keys are exactly z-lab's safetensors names (``fc.weight``,
``layers.0.self_attn.q_proj.weight``, ...), so saving is a plain dump.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftwise.models.fused import rms_norm
from draftwise.models.rope import apply_rope, inv_frequencies, rope_tables


@dataclass(frozen=True, slots=True)
class DFlashShape:
    """The drafter's shape: its decoder (Qwen3, at the target's width) and its DFlash keys."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    max_position_embeddings: int = 2048

    def as_dict(self) -> dict[str, Any]:
        """Plain values (for the checkpoint and ``draftwise_train.json``)."""
        return {name: (list(v) if isinstance(v, tuple) else v)
                for name in self.__slots__ for v in (getattr(self, name),)}


class RMSNorm(nn.Module):
    """transformers' RMSNorm (one ``weight``), through the core's own formula."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """Qwen3 attention with q/k norms; K/V over the context and the block (rules 2-3)."""

    def __init__(self, s: DFlashShape) -> None:
        super().__init__()
        h, q, kv = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        self.q_proj = nn.Linear(h, q, bias=False)
        self.k_proj = nn.Linear(h, kv, bias=False)
        self.v_proj = nn.Linear(h, kv, bias=False)
        self.o_proj = nn.Linear(q, h, bias=False)
        self.q_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
        self.k_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
        self.heads, self.kv_heads, self.head_dim = s.num_heads, s.num_kv_heads, s.head_dim

    def forward(
        self,
        x: torch.Tensor,  # [N, B, H] the blocks, after input_layernorm
        ctx: torch.Tensor,  # [T, H] context features
        rope_block: tuple[torch.Tensor, torch.Tensor],  # [N*B, 1, d] each
        rope_ctx: tuple[torch.Tensor, torch.Tensor],  # [T, 1, d] each
        visible: torch.Tensor,  # [N, T] bool: context key t is before block n's anchor
    ) -> torch.Tensor:  # [N, B, H]
        n, b, _ = x.shape
        t = ctx.shape[0]
        kvh, d = self.kv_heads, self.head_dim
        g = self.heads // kvh
        flat = x.reshape(n * b, -1)
        q = apply_rope(self.q_norm(self.q_proj(flat).view(n * b, self.heads, d)), *rope_block)
        kb = apply_rope(self.k_norm(self.k_proj(flat).view(n * b, kvh, d)), *rope_block)
        vb = self.v_proj(flat).view(n, b, kvh, d)
        kc = apply_rope(self.k_norm(self.k_proj(ctx).view(t, kvh, d)), *rope_ctx)
        vc = self.v_proj(ctx).view(t, kvh, d)
        q = q.view(n, b, kvh, g, d)
        kb = kb.view(n, b, kvh, d)
        scale = d ** -0.5
        s_ctx = torch.einsum("nbkgd,tkd->nkgbt", q, kc) * scale
        s_ctx = s_ctx.masked_fill(~visible[:, None, None, None, :], float("-inf"))
        s_blk = torch.einsum("nbkgd,nckd->nkgbc", q, kb) * scale
        p = torch.softmax(torch.cat([s_ctx, s_blk], dim=-1), dim=-1)
        out = (torch.einsum("nkgbt,tkd->nbkgd", p[..., :t], vc)
               + torch.einsum("nkgbc,nckd->nbkgd", p[..., t:], vb))
        return self.o_proj(out.reshape(n, b, self.heads * d))


class MLP(nn.Module):
    """SwiGLU, as every Qwen3 and llama layer (the MTP head's too, ``mtp_net``)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """One pre-norm decoder layer (z-lab ``Qwen3DFlashDecoderLayer``)."""

    def __init__(self, s: DFlashShape) -> None:
        super().__init__()
        self.self_attn = Attention(s)
        self.mlp = MLP(s.hidden_size, s.intermediate_size)
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, rope_block: Any, rope_ctx: Any,
                visible: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope_block, rope_ctx, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashNet(nn.Module):
    """The drafter's own weights and its block forward (module doc, rules 1-4)."""

    def __init__(self, shape: DFlashShape) -> None:
        super().__init__()
        s = self.shape = shape
        self.fc = nn.Linear(len(s.target_layer_ids) * s.hidden_size, s.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(s) for _ in range(s.num_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self._inv, self._scaling = inv_frequencies(
            s.head_dim, s.rope_theta, s.rope_scaling, s.max_position_embeddings)

    def init_weights(self, seed: int, std: float = 0.02) -> None:
        """transformers' Qwen3 init (matrices N(0, std), norms 1), from one seed."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows ``[P, 1, d]`` at ``positions`` (the core's tables, so the engine's)."""
        cos, sin = rope_tables(self._inv, int(positions.max()) + 1, self._scaling,
                               torch.float32)
        return cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)

    def forward(
        self,
        taps: torch.Tensor,  # [T, len(taps) * H] the target's tapped states, concatenated
        blocks: torch.Tensor,  # [N, B, H] embeddings of [anchor, MASK x (B-1)]
        anchors: torch.Tensor,  # [N] int64, each block's first position (1 <= a <= T)
    ) -> torch.Tensor:  # [N, B, H] after the draft's final norm
        """Every block of one sequence at once; context of block n = positions < a_n."""
        t = int(anchors.max())
        ctx = self.hidden_norm(self.fc(taps[:t]))
        b = blocks.shape[1]
        positions = (anchors[:, None] + torch.arange(b)).reshape(-1)
        rope_block = self.rope(positions)
        rope_ctx = self.rope(torch.arange(t))
        visible = torch.arange(t)[None, :] < anchors[:, None]
        x = blocks
        for layer in self.layers:
            x = layer(x, ctx, rope_block, rope_ctx, visible)
        return self.norm(x)


__all__ = ["DFlashNet", "DFlashShape"]
