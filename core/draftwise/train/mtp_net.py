"""An MTP head as a trainable torch module, computing what the mtp plugin's proposer runs.

Why a second forward beside the plugin's ``MtpProposer``: the engine's head runs on the
paged KV cache with native kernels, which have no autograd. This module computes the same
function with plain torch ops for every position of one sequence at once, and
``tests/core/train/test_mtp.py`` checks that the engine's drafts equal its argmax.

The function (``shared/reference/drafter-formats.md`` §3.2-3.3, as
``plugins/mtp/draftwise_mtp/proposer.py`` runs a ``deepseek_nextn`` head on a llama-family
target), rule by rule:

1. pair position ``p`` joins token ``x_{p+1}`` and the target's hidden state ``h_p``: the
   OUTPUT of its last decoder layer, BEFORE the final norm (the proposer reads tap
   ``num_hidden_layers - 1``; ``draftwise.target``'s numbering);
2. ``x = eh_proj([enorm(E[x_{p+1}]) ; hnorm(h_p)])`` with plain RMSNorms ``w * x_hat`` (a
   llama target's norms are not zero-centred) and the embedding zeroed at position 0
   (DeepSeek's rule, which the plugin applies to this layout);
3. one llama decoder layer of the target's shape (its heads, MLP size, RoPE, q/k/v bias
   and q/k norms where the target has them), causal over the pair positions, RoPE at
   ``p``; then ``shared_head.norm``; the target's frozen LM head then scores ``x_{p+2}``;
4. step ``s >= 2`` (the plugin's loop for k > 1) runs the same layer on (the previous
   step's token, the previous step's output AFTER ``shared_head.norm``) at position
   ``p + s - 1``; its keys are the real pairs ``0 .. p`` and the earlier steps' own
   (scratch) entries, as in the head's KV cache.

Parameter names are the HF ``deepseek_nextn`` ones below ``model.layers.{L}.`` (``L`` the
target's layer count), so saving is a dump with a prefix (``mtp_layout.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftwise.models.rope import apply_rope, inv_frequencies, rope_tables
from draftwise.train.dflash_net import MLP, RMSNorm


@dataclass(frozen=True, slots=True)
class MtpShape:
    """The head's shape: the target's decoder layer, and which target it reads."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_target_layers: int  # the head is saved as model.layers.{this}
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    attention_bias: bool = False
    qk_norm: bool = False
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (for ``draftwise_train.json``)."""
        return {name: getattr(self, name) for name in self.__slots__}


class Attention(nn.Module):
    """Causal attention over the real pairs plus a step's scratch entries (rules 3-4)."""

    def __init__(self, s: MtpShape) -> None:
        super().__init__()
        h, q, kv = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        self.q_proj = nn.Linear(h, q, bias=s.attention_bias)
        self.k_proj = nn.Linear(h, kv, bias=s.attention_bias)
        self.v_proj = nn.Linear(h, kv, bias=s.attention_bias)
        self.o_proj = nn.Linear(q, h, bias=False)
        if s.qk_norm:
            self.q_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
            self.k_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
        self.heads, self.kv_heads, self.head_dim = s.num_heads, s.num_kv_heads, s.head_dim
        self.qk_norm = s.qk_norm

    def qkv(self, x: torch.Tensor,  # [N, H] after input_layernorm
            rope: tuple[torch.Tensor, torch.Tensor]  # [N, 1, d] each
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [N, heads|kvh, d]
        """Queries, keys (normed and rotated as the engine's layer does) and values."""
        n, d = x.shape[0], self.head_dim
        q = self.q_proj(x).view(n, self.heads, d)
        k = self.k_proj(x).view(n, self.kv_heads, d)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, *rope), apply_rope(k, *rope), self.v_proj(x).view(n, self.kv_heads, d)

    def attend(
        self,
        q: torch.Tensor,  # [N, heads, d]
        k: torch.Tensor,  # [P, kvh, d] the real pairs' keys
        v: torch.Tensor,  # [P, kvh, d]
        visible: torch.Tensor,  # [N, P] bool
        k_own: torch.Tensor | None = None,  # [N, m, kvh, d] scratch entries per query
        v_own: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [N, H]
        n, d, kvh = q.shape[0], self.head_dim, self.kv_heads
        g = self.heads // kvh
        qg = q.view(n, kvh, g, d)
        scale = d ** -0.5
        s_real = torch.einsum("nkgd,pkd->nkgp", qg, k) * scale
        s_real = s_real.masked_fill(~visible[:, None, None, :], float("-inf"))
        if k_own is None or v_own is None:
            out = torch.einsum("nkgp,pkd->nkgd", torch.softmax(s_real, -1), v)
        else:
            s_own = torch.einsum("nkgd,nmkd->nkgm", qg, k_own) * scale
            p = torch.softmax(torch.cat([s_real, s_own], -1), -1)
            t = k.shape[0]
            out = (torch.einsum("nkgp,pkd->nkgd", p[..., :t], v)
                   + torch.einsum("nkgm,nmkd->nkgd", p[..., t:], v_own))
        return self.o_proj(out.reshape(n, self.heads * d))


class SharedHead(nn.Module):
    """``shared_head.norm`` (the head's LM head is the target's: not a parameter here)."""

    def __init__(self, s: MtpShape) -> None:
        super().__init__()
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)


class MtpNet(nn.Module):
    """The head's own weights and its forward (module doc, rules 1-4)."""

    def __init__(self, shape: MtpShape) -> None:
        super().__init__()
        s = self.shape = shape
        h = s.hidden_size
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.enorm = RMSNorm(h, s.rms_norm_eps)
        self.hnorm = RMSNorm(h, s.rms_norm_eps)
        self.input_layernorm = RMSNorm(h, s.rms_norm_eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(h, s.rms_norm_eps)
        self.mlp = MLP(s.hidden_size, s.intermediate_size)
        self.shared_head = SharedHead(s)
        self._inv, self._scaling = inv_frequencies(
            s.head_dim, s.rope_theta, s.rope_scaling, s.max_position_embeddings)

    def init_weights(self, seed: int, std: float = 0.02) -> None:
        """Matrices N(0, std), biases 0, norms 1, from one seed."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows ``[P, 1, d]`` at ``positions`` (the core's tables, so the engine's)."""
        cos, sin = rope_tables(self._inv, int(positions.max()) + 1, self._scaling,
                               torch.float32)
        return cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)

    def fuse(self, emb: torch.Tensor,  # [N, H] E[token]
             hidden: torch.Tensor,  # [N, H]
             positions: torch.Tensor) -> torch.Tensor:  # [N] -> [N, H]
        """Rule 2: the input fusion (embedding zeroed at position 0)."""
        e = self.enorm(emb).masked_fill((positions == 0)[:, None], 0.0)
        return self.eh_proj(torch.cat([e, self.hnorm(hidden)], dim=-1))

    def mlp_out(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The layer's residual tail and ``shared_head.norm``."""
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return self.shared_head.norm(x)

    def forward(
        self,
        emb_next: torch.Tensor,  # [P, H] E[x_{p+1}] for p = 0 .. P-1
        hidden: torch.Tensor,  # [P, H] the target's h_p (rule 1)
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:  # [P, H], (K, V) [P, kvh, d]
        """Step 1 at every pair position (causal): outputs and the real pairs' K/V."""
        p = emb_next.shape[0]
        pos = torch.arange(p)
        x = self.fuse(emb_next, hidden, pos)
        q, k, v = self.self_attn.qkv(self.input_layernorm(x), self.rope(pos))
        causal = pos[None, :] <= pos[:, None]
        return self.mlp_out(x, self.self_attn.attend(q, k, v, causal)), (k, v)

    def step(
        self,
        emb_prev: torch.Tensor,  # [N, H] E[previous step's token]
        feedback: torch.Tensor,  # [N, H] the previous step's output (after shared_head.norm)
        anchors: torch.Tensor,  # [N] the pair position p each chain started from
        s: int,  # this step, 2 ..
        real: tuple[torch.Tensor, torch.Tensor],  # forward()'s K/V
        own: list[tuple[torch.Tensor, torch.Tensor]],  # earlier steps' scratch K/V [N, kvh, d]
    ) -> torch.Tensor:  # [N, H]
        """Rule 4: one recursive step at positions ``anchors + s - 1``; appends its own
        K/V to ``own``."""
        pos = anchors + (s - 1)
        x = self.fuse(emb_prev, feedback, pos)
        q, k, v = self.self_attn.qkv(self.input_layernorm(x), self.rope(pos))
        own.append((k, v))
        k_own = torch.stack([kv[0] for kv in own], dim=1)
        v_own = torch.stack([kv[1] for kv in own], dim=1)
        visible = torch.arange(real[0].shape[0])[None, :] <= anchors[:, None]
        return self.mlp_out(x, self.self_attn.attend(q, *real, visible, k_own, v_own))


def chain_logits(
    net: MtpNet,
    embed: torch.Tensor,  # [V, H] the target's embedding
    head: torch.Tensor,  # [V, H] the target's LM head (its dtype is the GEMMs')
    ids: torch.Tensor,  # [T] int64 the sequence
    hidden: torch.Tensor,  # [>= T-1, H] the target's last layer before its final norm
    anchors: torch.Tensor,  # [N] int64, 1 <= a <= T-1: the last committed position
    depth: int,
    teacher: bool,
) -> list[torch.Tensor]:  # per step s = 1 .. depth: [N, V] float32 logits for token a + s
    """Steps 1 .. ``depth`` from each anchor (pair position ``a - 1``, rule 4). Step
    ``s >= 2`` is fed the recorded token ``a + s - 1`` (``teacher``, training) or the
    previous step's argmax (what the engine drafts)."""
    t = ids.shape[0]
    out, real = net(embed[ids[1:]], hidden[:t - 1])
    p = anchors - 1
    x = out[p]

    def logits(rows: torch.Tensor) -> torch.Tensor:
        return F.linear(rows.to(head.dtype), head).float()

    steps = [logits(x)]
    own: list[tuple[torch.Tensor, torch.Tensor]] = []
    for s in range(2, depth + 1):
        tok = ids[(anchors + s - 1).clamp(max=t - 1)] if teacher else steps[-1].argmax(-1)
        x = net.step(embed[tok], x, p, s, real, own)
        steps.append(logits(x))
    return steps


__all__ = ["MtpNet", "MtpShape", "chain_logits"]
