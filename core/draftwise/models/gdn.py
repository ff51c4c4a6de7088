"""Gated DeltaNet math: the recurrence (decode, verify) and the chunked form (prefill).

Per value head, with S in R^{d_k x d_v} (drafter-formats §4.2):

    S_t = e^{g_t} S_{t-1} + k_t [ beta_t (v_t - (e^{g_t} S_{t-1})^T k_t) ]^T ,   o_t = S_t^T q_t

The recurrence is the definition and what speculative verify needs: it yields the state
after every token, which is what the per-position spec slots keep. The chunked form
(the UT / WY transform over chunks of 64) gives the same result with matmuls and is
what makes a long prefill affordable; both are tested equal to each other and to
transformers' torch fallbacks. Everything here runs in fp32 (``mamba_ssm_dtype``).

The causal depthwise conv that precedes the recurrence keeps the last ``K-1`` pre-conv
inputs as its state, ``[C, K-1]`` per sequence, oldest first. :class:`GatedDeltaNet` is
the layer over a flat engine batch, each row on its own ``RecurrentStatePool`` slot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from draftwise.models.fused import rms_norm
from draftwise.models.linear import linear
from draftwise.models.pointwise import lanewise

if TYPE_CHECKING:
    from draftwise.cache.recurrent import RecurrentStatePool
    from draftwise.models.batch import ForwardBatch
    from draftwise.models.hybrid_config import HybridConfig

#: prefill chunk length of the chunked form (transformers and FLA use 64)
CHUNK = 64
#: rows up to this many tokens use the recurrence (decode and verify rows, k <= 7)
RECURRENT_MAX_TOKENS = 8


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:  # [..., d] -> [..., d]
    """FLA's l2 norm (rsqrt of sum + eps), so q/k match the reference kernels bit for bit."""
    return x * lanewise(torch.rsqrt, (x * x).sum(dim=-1, keepdim=True) + eps)


def gates(
    a: torch.Tensor,  # [..., H_v]
    b: torch.Tensor,  # [..., H_v]
    a_log: torch.Tensor,  # [H_v]
    dt_bias: torch.Tensor,  # [H_v]
) -> tuple[torch.Tensor, torch.Tensor]:  # g (log-decay <= 0), beta: fp32 [..., H_v]
    """Log-decay ``g = -exp(A_log) softplus(a + dt_bias)``, write strength ``beta = sigmoid(b)``."""
    g = -a_log.float().exp() * lanewise(F.softplus, a.float() + dt_bias)
    return g, lanewise(torch.sigmoid, b).float()


def _prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """fp32, heads before time, q/k expanded to the value heads, l2-normed, q scaled."""
    hk, hv = k.shape[2], v.shape[2]
    if hk != hv:  # each q/k head serves H_v/H_k consecutive value heads
        q = q.repeat_interleave(hv // hk, dim=2)
        k = k.repeat_interleave(hv // hk, dim=2)
    q, k, v, beta, g = (x.transpose(1, 2).float().contiguous() for x in (q, k, v, beta, g))
    q = l2norm(q)
    k = l2norm(k)
    q = q / (q.shape[-1] ** 0.5)
    return q, k, v, g, beta


def recurrent_gated_delta_rule(
    q: torch.Tensor,  # [B, T, H_k, d_k]
    k: torch.Tensor,  # [B, T, H_k, d_k]
    v: torch.Tensor,  # [B, T, H_v, d_v]
    g: torch.Tensor,  # [B, T, H_v] log-decay
    beta: torch.Tensor,  # [B, T, H_v]
    state: torch.Tensor | None = None,  # [B, H_v, d_k, d_v] fp32
    keep_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Token-by-token update; returns out ``[B, T, H_v, d_v]`` fp32, the final state, and
    (with ``keep_states``) the state after every token ``[B, T, H_v, d_k, d_v]``."""
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    bsz, hv, t_len, dk = k.shape
    dv = v.shape[-1]
    s = (
        torch.zeros(bsz, hv, dk, dv, dtype=torch.float32, device=v.device)
        if state is None
        else state.float()
    )
    out = torch.empty(bsz, hv, t_len, dv, dtype=torch.float32, device=v.device)
    kept: list[torch.Tensor] | None = [] if keep_states else None
    for t in range(t_len):
        k_t = k[:, :, t]
        s = s * lanewise(torch.exp, g[:, :, t])[..., None, None]
        mem = (s * k_t.unsqueeze(-1)).sum(dim=-2)  # what S already predicts for k_t: [B, H, d_v]
        delta = (v[:, :, t] - mem) * beta[:, :, t].unsqueeze(-1)
        s = s + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        out[:, :, t] = (s * q[:, :, t].unsqueeze(-1)).sum(dim=-2)
        if kept is not None:
            kept.append(s)
    states = torch.stack(kept, dim=1) if kept else None
    return out.transpose(1, 2), s, states


def chunk_gated_delta_rule(
    q: torch.Tensor,  # [B, T, H_k, d_k]
    k: torch.Tensor,  # [B, T, H_k, d_k]
    v: torch.Tensor,  # [B, T, H_v, d_v]
    g: torch.Tensor,  # [B, T, H_v]
    beta: torch.Tensor,  # [B, T, H_v]
    state: torch.Tensor | None = None,  # [B, H_v, d_k, d_v] fp32
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, T, H_v, d_v] fp32, final state
    """The same rule over chunks: within a chunk the delta updates are solved at once
    (unit lower-triangular system), across chunks the state is carried sequentially."""
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    bsz, hv, t_len, dk = k.shape
    dv = v.shape[-1]
    pad = (chunk - t_len % chunk) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (t_len + pad) // chunk

    def chunked(x: torch.Tensor) -> torch.Tensor:  # [B, H, T', d] -> [B, H, n, C, d]
        return x.reshape(bsz, hv, n, chunk, x.shape[-1])

    q, k, v = chunked(q), chunked(k), chunked(v)
    k_beta = k * beta.reshape(bsz, hv, n, chunk, 1)
    v_beta = v * beta.reshape(bsz, hv, n, chunk, 1)
    cum = g.reshape(bsz, hv, n, chunk).cumsum(dim=-1)  # log decay from chunk start to i
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).triu(1)
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(future, float("-inf")).exp()
    # (I + A) with A strictly lower: the delta corrections of earlier tokens in the chunk
    system = (k_beta @ k.transpose(-1, -2)) * decay
    new_v = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_read = torch.linalg.solve_triangular(
        system, k_beta * cum.exp().unsqueeze(-1), upper=False, unitriangular=True
    )
    attn = (q @ k.transpose(-1, -2)) * decay  # intra-chunk, causal (decay is 0 above)
    q_dec = q * cum.exp().unsqueeze(-1)
    k_dec = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()[..., None, None]
    s = (
        torch.zeros(bsz, hv, dk, dv, dtype=torch.float32, device=v.device)
        if state is None
        else state.float()
    )
    out = torch.empty(bsz, hv, n, chunk, dv, dtype=torch.float32, device=v.device)
    for i in range(n):
        v_new = new_v[:, :, i] - k_read[:, :, i] @ s  # the part the carried state misses
        out[:, :, i] = q_dec[:, :, i] @ s + attn[:, :, i] @ v_new
        s = s * chunk_decay[:, :, i] + k_dec[:, :, i].transpose(-1, -2) @ v_new
    out = out.reshape(bsz, hv, n * chunk, dv)[:, :, :t_len]
    return out.transpose(1, 2), s


def causal_conv(
    u: torch.Tensor,  # [B, T, C] pre-conv inputs
    weight: torch.Tensor,  # [C, K] depthwise taps, oldest first
    conv_state: torch.Tensor | None = None,  # [B, C, K-1] the last K-1 inputs before u
    keep_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """SiLU(depthwise causal conv); returns out ``[B, T, C]`` (dtype of u), the new state
    ``[B, C, K-1]`` and (with ``keep_states``) the state after every token ``[B, T, C, K-1]``.

    Written as K fp32 multiply-adds rather than ``F.conv1d`` so that a token's output does
    not depend on how many tokens share the call (needed for spec-on == spec-off).
    """
    bsz, t_len, c = u.shape
    taps = weight.shape[1]
    if conv_state is None:
        conv_state = torch.zeros(bsz, c, taps - 1, dtype=u.dtype, device=u.device)
    x = torch.cat((conv_state.transpose(1, 2).to(u.dtype), u), dim=1)  # [B, K-1+T, C]
    w = weight.float()
    acc = x[:, 0:t_len].float() * w[:, 0]
    for j in range(1, taps):
        acc = acc + x[:, j : j + t_len].float() * w[:, j]
    out = lanewise(F.silu, acc.to(u.dtype))
    new_state = x[:, t_len:].transpose(1, 2).contiguous()
    states = None
    if keep_states:  # window ending at token t: x[t+1 : t+K]
        idx = torch.arange(t_len, device=u.device)[:, None] + torch.arange(1, taps, device=u.device)
        states = x[:, idx].permute(0, 1, 3, 2).contiguous()  # [B, T, C, K-1]
    return out, new_state, states


def _param(*shape: int, dtype: torch.dtype, device: str | torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class GatedDeltaNet(nn.Module):
    """A GDN mixer over the flat batch; each row reads and writes its own state slot."""

    def __init__(
        self, c: HybridConfig, index: int, dtype: torch.dtype, device: str | torch.device
    ) -> None:
        super().__init__()
        self.c, self.index, self.eps = c, index, c.base.rms_norm_eps
        kw: dict[str, Any] = {"dtype": dtype, "device": device}
        # qkv | z | b | a in one matmul (Qwen3.5 order; Qwen3-Next is reordered at load)
        self.in_proj = _param(
            c.conv_dim + c.value_dim + 2 * c.num_v_heads, c.base.hidden_size, **kw
        )
        self.conv_weight = _param(c.conv_dim, c.conv_kernel, **kw)
        self.a_log, self.dt_bias = _param(c.num_v_heads, **kw), _param(c.num_v_heads, **kw)
        self.norm = _param(c.head_v_dim, **kw)
        self.out_weight = _param(c.base.hidden_size, c.value_dim, **kw)
        #: the gated norm as a C kernel (set by the layer from the model's backend)
        self.native = False

    def forward(
        self,
        x: torch.Tensor,
        batch: ForwardBatch,
        states: RecurrentStatePool,  # x: [T, hidden]
    ) -> torch.Tensor:  # [T, hidden]
        """Project, run every row over its slot's state, gated-norm, project out."""
        c = self.c
        proj = linear(x, self.in_proj)
        u, rest = proj[:, : c.conv_dim], proj[:, c.conv_dim :]
        z = rest[:, : c.value_dim].reshape(-1, c.num_v_heads, c.head_v_dim)
        g, beta = gates(
            rest[:, -c.num_v_heads :],
            rest[:, c.value_dim : -c.num_v_heads],
            self.a_log,
            self.dt_bias,
        )
        out = torch.empty(x.shape[0], c.num_v_heads, c.head_v_dim, dtype=x.dtype, device=x.device)
        slots = batch.state_slots_cpu
        for rows, spans, recurrent in _row_groups(batch.query_lens_cpu, states.max_spec_positions):
            idx = torch.cat([torch.arange(s, e, device=x.device) for s, e in spans]).view(
                len(rows), -1
            )
            o = self._rows(u[idx], g[idx], beta[idx], [slots[i] for i in rows], states, recurrent)
            out[idx.flatten()] = o.flatten(0, 1).to(x.dtype)
        y = (rms_norm(out, self.norm, self.eps, self.native) * lanewise(F.silu, z.float())
             ).to(x.dtype)
        return linear(y.flatten(1), self.out_weight)

    def _rows(
        self,
        u: torch.Tensor,  # [B, q, conv_dim]
        g: torch.Tensor,  # [B, q, H_v]
        beta: torch.Tensor,  # [B, q, H_v]
        slots: list[int],
        states: RecurrentStatePool,
        recurrent: bool,
    ) -> torch.Tensor:  # [B, q, H_v, d_v] fp32
        """Rows of equal length: read state, advance, write state (and spec positions)."""
        c, bsz, q = self.c, u.shape[0], u.shape[1]
        idx = torch.tensor(slots, dtype=torch.long, device=u.device)
        conv_live, ssm_live = states.state("conv", self.index), states.state("ssm", self.index)
        spec = recurrent and q > 1 and states.max_spec_positions > 0
        mixed, conv_new, conv_kept = causal_conv(
            u, self.conv_weight, conv_live[idx], keep_states=spec
        )
        qq = mixed[..., : c.key_dim].reshape(bsz, q, c.num_k_heads, c.head_k_dim)
        kk = mixed[..., c.key_dim : 2 * c.key_dim].reshape(bsz, q, c.num_k_heads, c.head_k_dim)
        vv = mixed[..., 2 * c.key_dim :].reshape(bsz, q, c.num_v_heads, c.head_v_dim)
        if recurrent:
            o, s_new, kept = recurrent_gated_delta_rule(
                qq, kk, vv, g, beta, ssm_live[idx], keep_states=spec
            )
        else:
            (o, s_new), kept = chunk_gated_delta_rule(qq, kk, vv, g, beta, ssm_live[idx]), None
        conv_live[idx] = conv_new.to(conv_live.dtype)
        ssm_live[idx] = s_new
        if spec and kept is not None and conv_kept is not None:
            n = min(q - 1, states.max_spec_positions)  # the state after the last token is live
            states.spec_states("conv", self.index)[idx, :n] = conv_kept[:, :n].to(conv_live.dtype)
            states.spec_states("ssm", self.index)[idx, :n] = kept[:, :n]
        return o


def _row_groups(
    query_lens: list[int], max_spec: int
) -> list[tuple[list[int], list[tuple[int, int]], bool]]:
    """(rows, token spans, recurrent?): short rows batched by length, each long row alone."""
    limit = max(RECURRENT_MAX_TOKENS, 1 + max_spec)
    short: dict[int, tuple[list[int], list[tuple[int, int]]]] = {}
    groups: list[tuple[list[int], list[tuple[int, int]], bool]] = []
    start = 0
    for row, q in enumerate(query_lens):
        if 0 < q <= limit:
            rows, spans = short.setdefault(q, ([], []))
            rows.append(row)
            spans.append((start, start + q))
        elif q > 0:
            groups.append(([row], [(start, start + q)], False))
        start += q
    groups.extend((rows, spans, True) for rows, spans in short.values())
    return groups
