"""The GDN hybrid (Qwen3.5 split projections, Qwen3-Next fused) against transformers.

Oracle: the transformers classes themselves, on tiny random checkpoints they saved.
Tolerances (fp32): logits within 2e-4 absolute of transformers over prefill (our and
their chunked form) and token-by-token decode (paged KV + recurrent slots vs their
DynamicCache). Speculative commit is checked bitwise where the math allows (see the test).

bf16 runs the native kernels (the backend line says which): the zero-centred norm kernel
and the partial RoPE against their torch references, the kernels a step calls against the
line, the native model against its own torch path (the same function to bf16 accuracy),
and decode/verify rows batched against each alone, bitwise (what greedy speculation and
continuous batching rely on).
"""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from draftwise.cache.recurrent import RecurrentStatePool
from draftwise.formats.errors import UnsupportedArchitectureError
from draftwise.models import kernels
from draftwise.models.attention import BACKEND_ENV
from draftwise.models.batch import KVCache, build_forward_batch
from draftwise.models.hybrid_config import HybridConfig
from draftwise.models.hybrid_ops import PartialRope, zc_rms_norm
from draftwise.models.linear import BlockedWeight
from draftwise.models.qwen3_next import Qwen3NextForCausalLM, load_hybrid, unpack_fused
from draftwise.models.rope import inv_frequencies, rope_tables

ROOT = Path(__file__).resolve().parents[3]
ATOL = 2e-4


def _builder():
    spec = importlib.util.spec_from_file_location(
        "build_tiny_hybrid", ROOT / "scripts" / "build_tiny_hybrid.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def tiny(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, _builder().build(tmp_path_factory.mktemp(request.param), request.param)


class HybridRunner:
    """Rows over scattered paged KV blocks and their own recurrent slots, one forward per step."""

    def __init__(self, model: Qwen3NextForCausalLM, max_spec: int = 4, block_size: int = 4) -> None:
        self.model, self.block_size = model, block_size
        self.kv = KVCache.allocate(
            model.num_layers, 64, block_size, model.num_kv_heads, model.head_dim, model.dtype
        )
        layers, shapes, dtypes = model.recurrent_layout()
        self.pool = RecurrentStatePool(8, shapes, layers, dtypes, max_spec_positions=max_spec)
        self.free = torch.randperm(64, generator=torch.Generator().manual_seed(1)).tolist()
        self.tables: dict[str, list[int]] = {}
        self.lengths: dict[str, int] = {}

    def step(self, chunks: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """Feed ``chunks[row]`` to each row; logits of every fed token."""
        for r in chunks:
            if r not in self.pool:
                self.pool.allocate(r)
        starts = [self.lengths.get(r, 0) for r in chunks]
        tables = []
        for r, s in zip(chunks, starts):
            t = self.tables.setdefault(r, [])
            while len(t) * self.block_size < s + len(chunks[r]):
                t.append(self.free.pop())
            tables.append(t)
        batch = build_forward_batch(
            list(chunks.values()),
            starts,
            tables,
            self.block_size,
            [list(range(len(c))) for c in chunks.values()],
            state_slots=self.pool.slots(list(chunks)),
        )
        out = self.model(batch, self.kv, self.pool).logits
        res, off = {}, 0
        for r, s in zip(chunks, starts):
            res[r] = out[off : off + len(chunks[r])]
            self.lengths[r] = s + len(chunks[r])
            off += len(chunks[r])
        return res


def hf_model(path: Path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_config_refuses_moe_by_name(tiny) -> None:
    kind, path = tiny
    cfg = json.loads((path / "config.json").read_text())
    hybrid = HybridConfig.from_hf_dict(cfg)
    assert hybrid.rotary_dim == 4 and hybrid.layer_types[-1] == "full_attention"
    assert hybrid.fused_projections == (kind == "qwen3_next") and hybrid.mtp_num_hidden_layers == 1
    with pytest.raises(UnsupportedArchitectureError, match="mixture-of-experts.*num_experts=512"):
        HybridConfig.from_hf_dict({**cfg, "num_experts": 512})


#: the three ways an NVFP4 export declares itself (``formats.nvfp4.declaration``)
NVFP4_DECLARATIONS = {
    "modelopt": {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}},
    "compressed-tensors": {"quantization_config": {
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}},
    "hf_quant_config.json": {},
}


@pytest.mark.parametrize("declared", sorted(NVFP4_DECLARATIONS))
@pytest.mark.parametrize("arch", ["Qwen3_5ForCausalLM", "Qwen3NextForCausalLM"])
def test_an_nvfp4_hybrid_is_refused_by_name_before_any_weight(tmp_path, arch, declared) -> None:
    """NVFP4 runs for the llama family only: a GDN hybrid export declaring it is refused
    from its config alone (the directory holds no weights), naming the architecture and
    what works instead, never loaded some other way."""
    from draftwise.formats.nvfp4 import NvFp4Error
    from draftwise.models.loader import load_model

    cfg = {**_builder().TINY, "architectures": [arch], **NVFP4_DECLARATIONS[declared]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if declared == "hf_quant_config.json":
        (tmp_path / declared).write_text(json.dumps(
            {"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head"]}}))
    with pytest.raises(NvFp4Error, match=f"an NVFP4 {arch} checkpoint: the GDN hybrid loads "
                       "bf16/fp16/fp32 weights only .* Instead: a bf16 export"):
        load_model(str(tmp_path))


def test_unpack_fused_matches_transformers_ordering(tmp_path) -> None:
    import transformers
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    b = _builder()
    config = transformers.Qwen3NextConfig(**b.TINY, num_experts=0)
    layer = Qwen3NextGatedDeltaNet(config, 0)
    hybrid = HybridConfig.from_hf_dict(
        {**config.to_dict(), "architectures": ["Qwen3NextForCausalLM"]}
    )
    x = torch.randn(1, 3, config.hidden_size)
    q, k, v, z, bb, a = layer.fix_query_key_value_ordering(
        layer.in_proj_qkvz(x), layer.in_proj_ba(x)
    )
    qkvz = x @ unpack_fused(layer.in_proj_qkvz.weight.detach(), hybrid, False).T
    ba = x @ unpack_fused(layer.in_proj_ba.weight.detach(), hybrid, True).T
    kd, vd = hybrid.key_dim, hybrid.value_dim
    ref = torch.cat([t.reshape(1, 3, -1) for t in (q, k, v, z)], -1)
    torch.testing.assert_close(qkvz, ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(ba, torch.cat((bb, a), -1), atol=1e-6, rtol=0)
    assert qkvz.shape[-1] == 2 * kd + 2 * vd


def test_prefill_and_decode_match_transformers(tiny) -> None:
    _, path = tiny
    ours, _ = load_hybrid(str(path), torch.float32)
    ref = hf_model(path)
    prompt = torch.randint(0, 256, (1, 70), generator=torch.Generator().manual_seed(0))
    runner = HybridRunner(ours)
    logits = runner.step({"a": prompt[0].tolist()})["a"]
    out = ref(prompt, use_cache=True)
    torch.testing.assert_close(logits, out.logits[0], atol=ATOL, rtol=0)
    cache, tok = out.cache, int(out.logits[0, -1].argmax())
    for _ in range(6):
        mine = runner.step({"a": [tok]})["a"][0]
        out = ref(torch.tensor([[tok]]), cache=cache, use_cache=True)
        torch.testing.assert_close(mine, out.logits[0, -1], atol=ATOL, rtol=0)
        cache, tok = out.cache, int(out.logits[0, -1].argmax())


#: second step: a decode row, a verify-shaped row and a short chunk, in one forward
SECOND = {"x": [7], "y": [7, 8, 9, 10], "z": list(range(30, 42))}


def test_mixed_batch_rows_use_their_own_state(tiny) -> None:
    _, path = tiny
    model, _ = load_hybrid(str(path), torch.float32)
    gen = torch.Generator().manual_seed(2)
    p1, p2, p3 = (torch.randint(0, 256, (n,), generator=gen).tolist() for n in (30, 5, 12))
    alone = {}
    for name, p in (("x", p1), ("y", p2), ("z", p3)):
        r = HybridRunner(model)
        first = r.step({name: p})[name]
        alone[name] = (first, r.step({name: SECOND[name]})[name])
    mixed = HybridRunner(model)
    first = mixed.step({"x": p1, "y": p2, "z": p3})
    second = mixed.step({"z": SECOND["z"], "x": SECOND["x"], "y": SECOND["y"]})
    for name in "xyz":
        torch.testing.assert_close(first[name], alone[name][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(second[name], alone[name][1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("accepted", [0, 1, 2, 3])
def test_partial_accept_commits_the_state_of_the_accepted_prefix(
    tiny, accepted: int, dtype
) -> None:
    """bf16 weights: bitwise (oneDNN's bf16 GEMM is row-invariant, the recurrence is per
    token). fp32 weights: fp32 GEMM blocking depends on the row count, so 1e-5 abs + rel."""
    _, path = tiny
    model, _ = load_hybrid(str(path), dtype)
    tol = {"atol": 0, "rtol": 0} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    prompt = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(3)).tolist()
    verify = [11, 22, 33, 44]  # x_last + 3 drafts
    spec = HybridRunner(model)
    spec.step({"r": prompt})
    spec.step({"r": verify})
    spec.pool.commit(["r"], [accepted], [3])
    plain = HybridRunner(model)
    plain.step({"r": prompt})
    plain.step({"r": verify[: accepted + 1]})
    for name in ("conv", "ssm"):
        for layer in range(spec.pool.num_layers):
            got = spec.pool.state(name, layer)[spec.pool.slot("r")]
            want = plain.pool.state(name, layer)[plain.pool.slot("r")]
            # same per-token recurrence; only the projections see a different row count
            torch.testing.assert_close(got, want, **tol)
    # and the next token after the commit sees the same logits either way (KV truncated by
    # the next write: position accepted+1 is overwritten)
    spec.lengths["r"] = plain.lengths["r"]
    torch.testing.assert_close(spec.step({"r": [5]})["r"], plain.step({"r": [5]})["r"], **tol)


# -- bf16: the native kernels ------------------------------------------------------------
BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def tiny35(tmp_path_factory) -> Path:
    return _builder().build(tmp_path_factory.mktemp("native-hybrid"), "qwen3_5")


def _ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


needs_kernels = pytest.mark.skipif(not kernels.available("rms_norm_zc"),
                                   reason="C kernels not built")


@needs_kernels
@pytest.mark.parametrize("dim", [64, 256, 100])
def test_zero_centred_norm_kernel_matches_torch(dim: int) -> None:
    torch.manual_seed(0)
    x = (torch.randn(23, dim) * 3).to(BF16)
    w = (torch.randn(dim) * 0.3).to(BF16)  # zero-centred weights: around 0, some < -1
    ours, ref = zc_rms_norm(x, w, 1e-6, native=True), zc_rms_norm(x, w, 1e-6)
    # one rounding either way; only the fp32 sum of squares / rsqrt may differ
    assert _ulps_apart(ours, ref).max() <= 1
    assert (ours != ref).float().mean() < 0.02
    assert torch.equal(zc_rms_norm(x[7:8], w, 1e-6, native=True), ours[7:8])  # rows alone
    if dim % 16 == 0:  # per-head weights over [T, heads, d]: the q/k norm shape
        heads, wd = x.view(23, -1, 16), w[:16].contiguous()
        assert _ulps_apart(zc_rms_norm(heads, wd, 1e-6, True),
                           zc_rms_norm(heads, wd, 1e-6)).max() <= 1


@needs_kernels
def test_partial_rope_native_is_bitwise_the_torch_path() -> None:
    torch.manual_seed(0)
    d, r, heads = 16, 4, 6
    inv, scaling = inv_frequencies(r, 10000.0, None, 512)
    cos_t, sin_t = rope_tables(inv, 512, scaling, BF16)
    positions = torch.tensor([0, 3, 511, 40, 41])
    x = torch.randn(5, heads, d).to(BF16)
    ref = PartialRope(cos_t[positions].unsqueeze(1), sin_t[positions].unsqueeze(1), r).apply(x)
    native = PartialRope(cos_t, sin_t, r, positions.repeat_interleave(heads))
    out = native.apply(x.clone())
    assert torch.equal(out, ref)
    with pytest.raises(kernels.KernelInputError, match="position outside"):
        PartialRope(cos_t, sin_t, r, torch.full((5 * heads,), 512)).apply(x.clone())


def _spy(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    calls: Counter[str] = Counter()
    for name in ("rms_norm", "rms_norm_zc", "silu_mul", "rope_", "paged_attention",
                 "linear_bf16"):
        real = getattr(kernels, name)

        def wrapped(*a: Any, _real: Callable[..., Any] = real, _name: str = name,
                    **kw: Any) -> Any:
            calls[_name] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(kernels, name, wrapped)
    return calls


@needs_kernels
def test_the_backend_line_names_native_kernels_and_the_torch_recurrence(tiny35, monkeypatch):
    model, _ = load_hybrid(str(tiny35), BF16)
    b = model.backend
    assert (b.attention, b.elementwise, b.recurrence) == ("native", "native", "torch")
    line = b.finish(model.gemm_kinds(), 2).line()
    assert "attention=native" in line and "elementwise=native recurrence=torch" in line
    assert f"bf16=native-{kernels.bf16_isa()}" in line
    assert b.as_dict()["recurrence"] == "torch"
    calls = _spy(monkeypatch)
    HybridRunner(model).step({"a": list(range(3, 13))})
    full, linear_layers = len(model.attention_layers), len(model.linear_layers)
    assert calls["paged_attention"] == full
    assert calls["rope_"] == full
    # per layer: input and post norm; per attention layer q and k; the final norm
    assert calls["rms_norm_zc"] == 2 * len(model.layers) + 2 * full + 1
    assert calls["rms_norm"] == linear_layers  # the GDN's gated norm (llama rounding)
    assert calls["silu_mul"] == len(model.layers)
    assert calls["linear_bf16"] == 4 * len(model.layers) + 1  # + the LM head


@needs_kernels
def test_native_path_is_the_torch_path_to_bf16_accuracy(tiny35, monkeypatch) -> None:
    native, _ = load_hybrid(str(tiny35), BF16)
    monkeypatch.setenv(BACKEND_ENV, "torch")
    plain, _ = load_hybrid(str(tiny35), BF16)
    assert (plain.backend.attention, plain.backend.elementwise) == ("torch", "torch")
    prompt = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(5)).tolist()
    a, b = HybridRunner(native), HybridRunner(plain)
    la, lb = a.step({"r": prompt})["r"], b.step({"r": prompt})["r"]
    for tok in (7, 70, 170):
        la = torch.cat((la, a.step({"r": [tok]})["r"]))
        lb = torch.cat((lb, b.step({"r": [tok]})["r"]))
    scale = lb.abs().max()
    assert (la - lb).abs().max() < 0.05 * scale  # bf16 rounding apart, not a different model
    assert (la.argmax(-1) == lb.argmax(-1)).float().mean() >= 0.9


@needs_kernels
def test_native_attention_layer_is_its_torch_path(tiny35) -> None:
    """Each full-attention mixer, native (C norms, in-place partial RoPE, C attention) vs
    torch, on the same input: rounding apart. Checked per layer because the tiny random
    model amplifies rounding: flipping 1 ulp in 2% of the kernels' outputs moves its
    logits by up to 4.6% of their scale, more than a wrong weight does (q normed with
    k_norm's weights: 2.0%), so the whole-model check above cannot tell them apart. Here
    (measured, of the layer's output scale): equal on this machine; 1 ulp flipped in 30%
    of the kernels' outputs max 0.32%, mean 0.075%; q normed with k_norm's weights max
    5.1%, mean 0.86%; RoPE before the norms max 3.3%, mean 0.61%."""
    from draftwise.models.attention import AttentionMetadata

    model, _ = load_hybrid(str(tiny35), BF16)
    assert model.native
    n, bs = 11, 4
    batch = build_forward_batch([list(range(3, 3 + n))], [0], [[2, 0, 1]], bs,
                                [list(range(n))])
    x = (torch.randn(n, model.config.hidden_size,
                     generator=torch.Generator().manual_seed(3)) * 0.5).to(BF16)
    cos, sin = model.rope_cos, model.rope_sin
    r = model.hybrid.rotary_dim
    for i in model.attention_layers:
        mixer = model.layers[i].mixer
        outs = []
        for native in (True, False):
            kv = KVCache.allocate(1, 4, bs, model.num_kv_heads, model.head_dim, BF16)
            meta = AttentionMetadata.build(batch, bs, backend="native" if native else "torch",
                                           num_blocks=4)
            rope = (model.partial_rope(batch.positions) if native else
                    PartialRope(cos[batch.positions].unsqueeze(1),
                                sin[batch.positions].unsqueeze(1), r))
            mixer.native = native
            try:
                outs.append(mixer(x, rope, kv.k[0], kv.v[0], meta))
            finally:
                mixer.native = True
        ours, ref = outs
        err = (ours.float() - ref.float()).abs()
        scale = ref.float().abs().max()
        assert err.max() <= 0.02 * scale and err.mean() <= 2e-3 * scale, (i, err.max(), scale)


@needs_kernels
def test_batched_rows_are_bitwise_each_row_alone(tiny35) -> None:
    """Decode rows (q = 1) and verify rows (q = 4) share the recurrence and the GEMMs."""
    model, _ = load_hybrid(str(tiny35), BF16)
    assert any(isinstance(w, BlockedWeight) for w in model._gemm_weights)
    gen = torch.Generator().manual_seed(4)
    prompts = {n: torch.randint(0, 256, (ln,), generator=gen).tolist()
               for n, ln in (("a", 9), ("b", 17), ("c", 5))}
    steps = [{"a": [3], "b": [4], "c": [5]}, {"a": [6, 7, 8, 9], "b": [1, 2, 3, 4], "c": [11]}]
    alone: dict[str, list[torch.Tensor]] = {}
    for name, p in prompts.items():
        r = HybridRunner(model)
        r.step({name: p})
        alone[name] = [r.step({name: s[name]})[name] for s in steps]
    together = HybridRunner(model)
    together.step(prompts)
    got = [together.step(s) for s in steps]
    for name in prompts:
        for i in range(len(steps)):
            assert torch.equal(got[i][name], alone[name][i]), (name, i)
