"""The Gated-DeltaNet hybrid target: Qwen3-Next, Qwen3.5 and Qwen3.6 (dense MLP only).

Layers alternate Gated DeltaNet (``linear_attention``) and gated full attention
(``full_attention``, usually every 4th). Full attention reuses the llama family's paged
attention and RoPE (on the first ``partial_rotary_factor`` of each head), with a
sigmoid output gate interleaved per head in ``q_proj`` and zero-centred q/k norms.
Every non-gated RMSNorm is zero-centred, ``x̂ · (1 + w)``. The GDN layers keep their
state in a :class:`~draftwise.cache.recurrent.RecurrentStatePool` slot per row
(``batch.state_slots``): short rows (decode, verify) take the recurrence and write the
state after each token into the pool's spec positions; long rows (prefill) take the
chunked form. Qwen3-Next's fused, per-key-head grouped ``in_proj_qkvz``/``in_proj_ba``
is unpacked at load into the Qwen3.5 split order, so there is one forward. The config is
``models.hybrid_config``; the small ops particular to the hybrid (zero-centred norm,
partial RoPE) are ``models.hybrid_ops``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from draftwise.formats.errors import MissingTensorError, TensorShapeError, UnexpectedTensorError
from draftwise.formats.safetensors_dir import SafetensorsCheckpoint
from draftwise.models.attention import AttentionMetadata, paged_attention
from draftwise.models.backend import Backend, decide_backend, gemm_kind
from draftwise.models.batch import ForwardBatch, KVCache, ModelOutput
from draftwise.models.fused import silu_mul
from draftwise.models.gdn import GatedDeltaNet
from draftwise.models.hybrid_config import HybridConfig
from draftwise.models.hybrid_ops import PartialRope, zc_rms_norm
from draftwise.models.linear import Weight, is_packed, linear, pack_weights
from draftwise.models.pointwise import lanewise
from draftwise.models.rope import INITIAL_ROPE_POSITIONS, inv_frequencies, rope_tables

if TYPE_CHECKING:
    from draftwise.cache.recurrent import RecurrentStatePool


def _param(*shape: int, dtype: torch.dtype, device: str | torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class GatedAttention(nn.Module):
    """Full attention with a per-head sigmoid output gate, q/k norm and partial RoPE."""

    def __init__(self, c: HybridConfig, dtype: torch.dtype, device: str | torch.device) -> None:
        super().__init__()
        b = c.base
        self.heads, self.kv_heads, self.head_dim = (
            b.num_attention_heads,
            b.num_key_value_heads,
            b.head_dim,
        )
        self.rotary_dim, self.eps, self.scale = c.rotary_dim, b.rms_norm_eps, b.head_dim**-0.5
        kw: dict[str, Any] = {"dtype": dtype, "device": device}
        self.q2 = 2 * b.q_size  # q and gate, interleaved per head
        self.qkv_weight = _param(self.q2 + 2 * b.kv_size, b.hidden_size, **kw)
        self.q_norm, self.k_norm = _param(b.head_dim, **kw), _param(b.head_dim, **kw)
        self.o_weight = _param(b.hidden_size, b.q_size, **kw)
        #: q/k norms as C kernels (set by the model from its backend)
        self.native = False

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden], normed
        rope: PartialRope,
        k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden]
        """Attend over the paged context, gate, project out."""
        t, d, h = x.shape[0], self.head_dim, self.heads
        qkv = linear(x, self.qkv_weight)
        qg = qkv[:, : self.q2].view(t, h, 2 * d)
        q, gate = qg[..., :d], qg[..., d:].reshape(t, -1)
        k = qkv[:, self.q2 : self.q2 + self.kv_heads * d].view(t, self.kv_heads, d)
        v = qkv[:, self.q2 + self.kv_heads * d :].view(t, self.kv_heads, d)
        native = self.native
        if native:  # q and k normed, then side by side for one in-place rope call
            qk = torch.cat((zc_rms_norm(q.contiguous(), self.q_norm, self.eps, True),
                            zc_rms_norm(k.contiguous(), self.k_norm, self.eps, True)), dim=1)
            qk = rope.apply(qk)
            q, k = qk[:, :h], qk[:, h:]
        else:
            q = rope.apply(zc_rms_norm(q, self.q_norm, self.eps))
            k = rope.apply(zc_rms_norm(k, self.k_norm, self.eps))
            v = v.contiguous()
        attn = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)
        return linear(attn * lanewise(torch.sigmoid, gate), self.o_weight)


class HybridLayer(nn.Module):
    """Pre-norm mixer (GDN or gated attention) + dense SwiGLU MLP, zero-centred norms."""

    def __init__(
        self, c: HybridConfig, layer: int, slot: int, dtype: torch.dtype, device: str | torch.device
    ) -> None:
        super().__init__()
        b = c.base
        kw: dict[str, Any] = {"dtype": dtype, "device": device}
        self.eps, self.inter, self.slot = b.rms_norm_eps, b.intermediate_size, slot
        self.linear = c.layer_types[layer] == "linear_attention"
        self.mixer: nn.Module = (
            GatedDeltaNet(c, slot, dtype, device)
            if self.linear
            else GatedAttention(c, dtype, device)
        )
        self.input_norm, self.post_norm = _param(b.hidden_size, **kw), _param(b.hidden_size, **kw)
        self.gate_up_weight = _param(2 * b.intermediate_size, b.hidden_size, **kw)
        self.down_weight = _param(b.hidden_size, b.intermediate_size, **kw)
        #: norms and SiLU-and-multiply as C kernels (``set_backend``)
        self.native = False

    def set_backend(self, backend: Backend) -> None:
        """Run the small ops the way ``backend`` says (layer and mixer alike)."""
        self.native = backend.elementwise == "native"
        self.mixer.native = self.native

    def linear_slots(self) -> list[tuple[nn.Module, str]]:
        """(module, attribute) of every projection weight, for packing (:func:`set_packed`)."""
        names = ("in_proj", "out_weight") if self.linear else ("qkv_weight", "o_weight")
        return [(self.mixer, n) for n in names] + [(self, "gate_up_weight"), (self, "down_weight")]

    def weight_slots(
        self, p: str, h: HybridConfig
    ) -> dict[str, tuple[tuple[int, ...], torch.Tensor]]:
        """HF names under prefix ``p`` -> (checkpoint shape, view of our parameter)."""
        c = h.base
        hid, inter = c.hidden_size, c.intermediate_size
        slots: dict[str, tuple[tuple[int, ...], torch.Tensor]] = {
            p + "input_layernorm.weight": ((hid,), self.input_norm.data),
            p + "post_attention_layernorm.weight": ((hid,), self.post_norm.data),
            p + "mlp.gate_proj.weight": ((inter, hid), self.gate_up_weight.data[:inter]),
            p + "mlp.up_proj.weight": ((inter, hid), self.gate_up_weight.data[inter:]),
            p + "mlp.down_proj.weight": ((hid, inter), self.down_weight.data),
        }
        m = self.mixer
        if isinstance(m, GatedAttention):
            q2, kvs = m.q2, c.kv_size
            slots[p + "self_attn.q_proj.weight"] = ((q2, hid), m.qkv_weight.data[:q2])
            slots[p + "self_attn.k_proj.weight"] = ((kvs, hid), m.qkv_weight.data[q2 : q2 + kvs])
            slots[p + "self_attn.v_proj.weight"] = ((kvs, hid), m.qkv_weight.data[q2 + kvs :])
            slots[p + "self_attn.o_proj.weight"] = ((hid, c.q_size), m.o_weight.data)
            slots[p + "self_attn.q_norm.weight"] = ((c.head_dim,), m.q_norm.data)
            slots[p + "self_attn.k_norm.weight"] = ((c.head_dim,), m.k_norm.data)
            return slots
        if not isinstance(m, GatedDeltaNet):
            raise TypeError(f"unknown mixer {type(m).__name__}")
        p += "linear_attn."
        cd, vd, hv = h.conv_dim, h.value_dim, h.num_v_heads
        if h.fused_projections:
            slots[p + "in_proj_qkvz.weight"] = ((cd + vd, hid), m.in_proj.data[: cd + vd])
            slots[p + "in_proj_ba.weight"] = ((2 * hv, hid), m.in_proj.data[cd + vd :])
        else:
            slots[p + "in_proj_qkv.weight"] = ((cd, hid), m.in_proj.data[:cd])
            slots[p + "in_proj_z.weight"] = ((vd, hid), m.in_proj.data[cd : cd + vd])
            slots[p + "in_proj_b.weight"] = ((hv, hid), m.in_proj.data[cd + vd : cd + vd + hv])
            slots[p + "in_proj_a.weight"] = ((hv, hid), m.in_proj.data[cd + vd + hv :])
        slots[p + "conv1d.weight"] = ((cd, 1, h.conv_kernel), m.conv_weight.data.unsqueeze(1))
        slots[p + "A_log"] = ((hv,), m.a_log.data)
        slots[p + "dt_bias"] = ((hv,), m.dt_bias.data)
        slots[p + "norm.weight"] = ((h.head_v_dim,), m.norm.data)
        slots[p + "out_proj.weight"] = ((hid, vd), m.out_weight.data)
        return slots

    def forward(
        self,
        h: torch.Tensor,  # [T, hidden]
        rope: PartialRope,
        kv: KVCache,
        meta: AttentionMetadata,
        batch: ForwardBatch,
        states: RecurrentStatePool | None,
    ) -> torch.Tensor:  # [T, hidden]
        """One layer over the flat batch; ``slot`` is its KV layer or GDN-state layer."""
        native = self.native
        x = zc_rms_norm(h, self.input_norm, self.eps, native)
        if self.linear:
            if states is None:
                raise ValueError("a GDN layer needs the RecurrentStatePool")
            h = h + self.mixer(x, batch, states)
        else:
            h = h + self.mixer(x, rope, kv.k[self.slot], kv.v[self.slot], meta)
        x = zc_rms_norm(h, self.post_norm, self.eps, native)
        gate_up = linear(x, self.gate_up_weight)
        if native:
            act = silu_mul(gate_up, True)
        else:
            act = lanewise(F.silu, gate_up[:, : self.inter]) * gate_up[:, self.inter :]
        return h + linear(act, self.down_weight)


class Qwen3NextForCausalLM(nn.Module):
    """The hybrid over paged KV + recurrent slots; ``forward(batch, kv, states)``."""

    def __init__(
        self,
        hybrid: HybridConfig,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__()
        self.hybrid, self.config = hybrid, hybrid.base
        c = hybrid.base
        kw: dict[str, Any] = {"dtype": dtype, "device": device}
        self.linear_layers = [
            i for i, t in enumerate(hybrid.layer_types) if t == "linear_attention"
        ]
        self.attention_layers = [
            i for i, t in enumerate(hybrid.layer_types) if t != "linear_attention"
        ]
        slot_of = {i: n for n, i in enumerate(self.linear_layers)}
        slot_of.update({i: n for n, i in enumerate(self.attention_layers)})
        self.embed_weight = _param(c.vocab_size, c.hidden_size, **kw)
        self.layers = nn.ModuleList(
            HybridLayer(hybrid, i, slot_of[i], dtype, device) for i in range(c.num_hidden_layers)
        )
        self.norm_weight = _param(c.hidden_size, **kw)
        self.lm_head_weight = (
            self.embed_weight
            if c.tie_word_embeddings
            else _param(c.vocab_size, c.hidden_size, **kw)
        )
        #: the LM head packed by :meth:`pack_weights` (None: not packed, use lm_head_weight)
        self._lm_head_packed: Weight | None = None
        inv_freq, self._rope_scaling = inv_frequencies(
            hybrid.rotary_dim, c.rope_theta, c.rope_scaling, c.max_position_embeddings
        )
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)
        self.register_buffer("rope_cos", torch.empty(0, hybrid.rotary_dim, **kw), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0, hybrid.rotary_dim, **kw), persistent=False)
        self.ensure_positions(min(INITIAL_ROPE_POSITIONS, c.max_position_embeddings))
        #: the kernels it runs, decided as for the llama family; the GDN recurrence and
        #: its causal conv have no C kernel and run in torch (said in the backend line)
        self.backend = dataclasses.replace(
            decide_backend(dtype, device, c.head_dim), recurrence="torch")
        for layer in self.hybrid_layers():
            layer.set_backend(self.backend)
        #: the q and k heads a full-attention layer rotates in one call
        self._rope_heads = c.num_attention_heads + c.num_key_value_heads

    # -- what the engine and drafters read (same surface as LlamaForCausalLM) -------------
    @property
    def num_layers(self) -> int:
        """KV-cache layers: the full-attention layers only."""
        return len(self.attention_layers)

    @property
    def num_kv_heads(self) -> int:
        """KV heads per attention layer."""
        return self.config.num_key_value_heads

    @property
    def head_dim(self) -> int:
        """Per-head width of the attention layers."""
        return self.config.head_dim

    @property
    def dtype(self) -> torch.dtype:
        """Weight, KV and conv-state dtype (the SSM state is fp32)."""
        return self.embed_weight.dtype

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.embed_weight.device

    def hybrid_layers(self) -> list[HybridLayer]:
        """The layers, typed."""
        return [layer for layer in self.layers if isinstance(layer, HybridLayer)]

    def recurrent_layout(self) -> tuple[int, dict[str, tuple[int, ...]], dict[str, torch.dtype]]:
        """(GDN layers, per-layer state shapes, dtypes) for a ``RecurrentStatePool``."""
        h = self.hybrid
        shapes = {
            "conv": (h.conv_dim, h.conv_kernel - 1),
            "ssm": (h.num_v_heads, h.head_k_dim, h.head_v_dim),
        }
        return len(self.linear_layers), shapes, {"conv": self.dtype, "ssm": torch.float32}

    def embed(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        """Token embeddings (shared with the MTP head)."""
        return F.embedding(ids, self.embed_weight)

    @property
    def native(self) -> bool:
        """Whether the small ops run as C kernels (the MTP head follows it)."""
        return self.backend.elementwise == "native"

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden]
        """The (zero-centred) norm before the LM head."""
        return zc_rms_norm(hidden, self.norm_weight, self.config.rms_norm_eps, self.native)

    def partial_rope(self, positions: torch.Tensor) -> PartialRope:  # positions: [T] int64
        """This forward's RoPE for the full-attention layers (shared with the MTP head); the
        caller has grown the tables (:meth:`ensure_positions`)."""
        r = self.hybrid.rotary_dim
        if self.native:
            rows = positions.repeat_interleave(self._rope_heads)
            return PartialRope(self.rope_cos, self.rope_sin, r, rows.contiguous())
        return PartialRope(self.rope_cos[positions].unsqueeze(1),
                           self.rope_sin[positions].unsqueeze(1), r)

    def attention_metadata(self, batch: ForwardBatch, kv: KVCache) -> AttentionMetadata:
        """The paged attention's per-forward indices for the backend's kernel."""
        return AttentionMetadata.build(batch, kv.block_size, backend=self.backend.attention,
                                       num_blocks=kv.num_blocks)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab] fp32
        """float32 logits of normed hidden states (shared with the MTP head)."""
        head = self.lm_head_weight if self._lm_head_packed is None else self._lm_head_packed
        return linear(hidden, head).float()

    def pack_weights(self) -> None:
        """Pack every projection and the LM head for this machine, as the llama family does.

        Called once after loading: packed bf16 projections are what make a row's bits
        independent of how many rows share the step (``models.linear``), which verify
        needs for greedy speculation to equal speculation off. The dense parameters go
        (``weight_slots`` is unusable afterwards); a tied head gets its own packed copy.
        """
        slots = [slot for layer in self.hybrid_layers() for slot in layer.linear_slots()]
        packed = pack_weights([getattr(m, n) for m, n in slots] + [self.lm_head_weight],
                              self.backend.dense_gemm)
        for (module, name), weight in zip(slots, packed):
            set_packed(module, name, weight)
        head = packed[-1]
        self._lm_head_packed = head if is_packed(head) else None
        self._gemm_weights = [getattr(m, n) for m, n in slots] + [head]

    def gemm_kinds(self) -> list[tuple[str, str]]:
        """(stored type, kernel) of every projection and the LM head (after packing)."""
        weights = getattr(self, "_gemm_weights", None) or [self.lm_head_weight]
        return [gemm_kind(w) for w in weights]

    def ensure_positions(self, n: int) -> None:
        """Grow the RoPE tables to cover positions ``< n``."""
        if n <= self.rope_cos.shape[0]:
            return
        size = max(n, 2 * self.rope_cos.shape[0])
        cos, sin = rope_tables(self.inv_freq.cpu(), size, self._rope_scaling, self.dtype)
        self.rope_cos, self.rope_sin = cos.to(self.device), sin.to(self.device)

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, kv: KVCache, states: RecurrentStatePool | None = None
    ) -> ModelOutput:
        """Write K/V and recurrent state for this step; logits at ``batch.logits_indices``."""
        if states is None or len(batch.state_slots_cpu) != batch.num_rows:
            raise ValueError(
                "a hybrid forward needs a RecurrentStatePool and one state slot per row"
            )
        self.ensure_positions(batch.max_seq_len)
        meta = self.attention_metadata(batch, kv)
        rope = self.partial_rope(batch.positions)
        h = self.embed(batch.input_ids)
        hidden: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, kv, meta, batch, states)
            if i in batch.hidden_layers:
                hidden[i] = h
        rows = h.index_select(0, batch.logits_indices)
        return ModelOutput(logits=self.lm_head(self.final_norm(rows)), hidden_states=hidden)

    # -- weights --------------------------------------------------------------------------
    def weight_slots(
        self, prefix: str = "model."
    ) -> dict[str, tuple[tuple[int, ...], torch.Tensor]]:
        """HF tensor name -> (checkpoint shape, the view of our fused parameter it fills).

        Qwen3-Next's fused ``in_proj_qkvz``/``in_proj_ba`` map to the whole ``in_proj``
        rows they cover and are reordered by :func:`unpack_fused` on the way in.
        """
        h, c = self.hybrid, self.config
        slots: dict[str, tuple[tuple[int, ...], torch.Tensor]] = {
            prefix + "embed_tokens.weight": ((c.vocab_size, c.hidden_size), self.embed_weight.data),
            prefix + "norm.weight": ((c.hidden_size,), self.norm_weight.data),
        }
        if not c.tie_word_embeddings:
            slots["lm_head.weight"] = ((c.vocab_size, c.hidden_size), self.lm_head_weight.data)
        for i, layer in enumerate(self.hybrid_layers()):
            slots.update(layer.weight_slots(f"{prefix}layers.{i}.", h))
        return slots

    def load_weights(
        self, tensors: Iterable[tuple[str, torch.Tensor]], prefix: str = "model."
    ) -> None:
        """Copy each checkpoint tensor into its slot (cast on copy; fused ones reordered)."""
        slots = self.weight_slots(prefix)
        with torch.no_grad():
            for name, tensor in tensors:
                if name.endswith(("in_proj_qkvz.weight", "in_proj_ba.weight")):
                    tensor = unpack_fused(tensor, self.hybrid, name.endswith("ba.weight"))
                slots[name][1].copy_(tensor)


def set_packed(module: nn.Module, name: str, packed: Weight) -> None:
    """Swap a dense parameter for its packed copy, dropping the dense one."""
    if packed is not getattr(module, name):
        del module._parameters[name]
        setattr(module, name, packed)


def unpack_fused(w: torch.Tensor, h: HybridConfig, is_ba: bool) -> torch.Tensor:  # [rows, hidden]
    """Qwen3-Next's per-key-head groups ``[q_h k_h v_g z_g]`` / ``[b_g a_g]`` -> ``[q k v z]``
    / ``[b a]``.

    Group g holds the H_v/H_k value heads served by key head g, so value head ``g*r + j``
    keeps its index: this is transformers' ``fix_query_key_value_ordering`` on weights.
    """
    r, hk, hid = h.num_v_heads // h.num_k_heads, h.num_k_heads, w.shape[-1]
    if is_ba:
        grouped = w.view(hk, 2 * r, hid)
        return torch.cat((grouped[:, :r].reshape(-1, hid), grouped[:, r:].reshape(-1, hid)))
    dk, rv = h.head_k_dim, r * h.head_v_dim
    grouped = w.view(hk, 2 * dk + 2 * rv, hid)
    parts = (
        grouped[:, :dk],
        grouped[:, dk : 2 * dk],
        grouped[:, 2 * dk : 2 * dk + rv],
        grouped[:, 2 * dk + rv :],
    )
    return torch.cat([part.reshape(-1, hid) for part in parts])


def load_hybrid(
    path: str, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"
) -> tuple[Qwen3NextForCausalLM, SafetensorsCheckpoint]:
    """Check the config and every tensor name/shape, then allocate once and stream weights.

    ``mtp.*`` tensors (the MTP head, read by draftwise-mtp) and vision tensors are left alone.
    """
    ckpt = SafetensorsCheckpoint(path)
    config_path = os.path.join(path, "config.json")
    hybrid = HybridConfig.from_hf_dict(ckpt.config, config_path)
    available = ckpt.hf_shapes()
    prefix = (
        "model.language_model."
        if "model.language_model.embed_tokens.weight" in available
        else "model."
    )
    model = Qwen3NextForCausalLM(hybrid, dtype, device)
    slots = model.weight_slots(prefix)
    for name, (shape, _) in slots.items():
        if name not in available:
            raise MissingTensorError(path, name, shape)
        if tuple(available[name][1]) != shape:
            raise TensorShapeError(path, available[name][0], shape, tuple(available[name][1]))
    extra = [
        n
        for n in available
        if n not in slots
        and not n.startswith(_IGNORED_PREFIXES)
        and not (n == "lm_head.weight" and hybrid.base.tie_word_embeddings)
    ]
    if extra:
        raise UnexpectedTensorError(path, extra)
    model.load_weights(ckpt.iter_tensors(list(slots)), prefix)
    model.pack_weights()
    return model, ckpt


#: checkpoint tensors the target does not own
_IGNORED_PREFIXES = ("mtp.", "model.visual.", "model.vision_tower.")
