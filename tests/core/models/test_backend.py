"""One backend value (``models.backend``) and the typed kernel wrappers (``models.kernels``).

The printed line must name what runs: every wrapper is spied on while a model steps,
and each kernel the line names is called, each it does not name is not. Bad input to a
wrapper is a named error (``KernelInputError``), under ``python -O`` too.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from draftwise.bootstrap import finish_backend
from draftwise.models import kernels
from draftwise.models.attention import BACKEND_ENV
from draftwise.models.backend import Backend, decide_backend
from draftwise.models.batch import KVCache, build_forward_batch
from draftwise.models.kernels import KernelInputError
from draftwise.models.linear import BlockedWeight
from draftwise.models.loader import load_model
from draftwise.models.quant import QuantPart, QuantSegment, QuantWeight, pack_quant
from draftwise.sampling import argmax_rows
from gguf import GGMLQuantizationType as Q

pytestmark = pytest.mark.skipif(
    not kernels.available("linear_quant"), reason="C kernels not built")

WRAPPERS = ("rms_norm", "add_rms_norm", "silu_mul", "rope_", "rope_qkv_", "argmax_f32",
            "linear_bf16", "linear_quant", "paged_attention", "paged_attention_qkv",
            "decoder_layers")
SHAPE = {"hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512}


pytestmark = pytest.mark.usefixtures("restore_threads")


def spy(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count calls to every kernel wrapper (callers look them up on the module)."""
    calls: Counter[str] = Counter()
    for name in WRAPPERS:
        real = getattr(kernels, name)

        def wrapped(*args: Any, _real: Callable[..., Any] = real, _name: str = name,
                    **kw: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(kernels, name, wrapped)
    return calls


def step(model: torch.nn.Module) -> None:
    """A 6-token prefill and its greedy argmax."""
    kv = KVCache.allocate(model.num_layers, 16, 4, model.num_kv_heads, model.head_dim, model.dtype)
    batch = build_forward_batch([[5, 40, 77, 2, 13, 9]], [0], [list(range(15, -1, -1))], 4,
                                [list(range(6))])
    argmax_rows(model(batch, kv).logits)


def check_runs_as_printed(backend: Backend, calls: Counter[str]) -> None:
    line = backend.line()
    # the decoder stack runs attention, the small ops and the projections in one C call
    stack = calls["decoder_layers"]
    assert f"layers={backend.layers}" in line
    assert (stack > 0) == (backend.layers == "native")
    assert f"attention={backend.attention}" in line
    attention = calls["paged_attention"] + calls["paged_attention_qkv"] + stack
    assert (attention > 0) == (backend.attention == "native")
    elementwise = (calls["rms_norm"] + calls["add_rms_norm"] + calls["silu_mul"]
                   + calls["rope_"] + calls["rope_qkv_"] + stack)
    assert f"elementwise={backend.elementwise}" in line
    assert (elementwise > 0) == (backend.elementwise == "native")
    assert f"argmax={backend.argmax}" in line
    assert (calls["argmax_f32"] > 0) == (backend.argmax == "native")
    kinds = {kind.split("-")[0] for _, kind in backend.gemm}
    for stored, kind in backend.gemm:
        assert f"{stored}={kind}" in line
    assert (calls["linear_quant"] + stack > 0) == ("quant" in kinds)
    assert (calls["linear_bf16"] > 0) == ("native" in kinds)


@pytest.mark.parametrize("attention", ["auto", "torch"])
def test_the_printed_backend_names_what_a_quantized_gguf_runs(
    tiny_gguf, monkeypatch, attention
) -> None:
    monkeypatch.setenv(BACKEND_ENV, attention)
    t = tiny_gguf(arch="qwen2", matrix_type=Q.Q4_K, embed_type=Q.Q8_0, tied=False,
                  tensor_types={"attn_v": Q.Q6_K}, **SHAPE)
    loaded = load_model(str(t.path))
    backend = finish_backend(loaded, threads=1)
    assert loaded.model.backend is backend
    quant = f"quant-{kernels.quant_simd()}"  # the Q8_0 embedding is a lookup, not a GEMM
    assert dict(backend.gemm) == {"Q4_K": quant, "Q4_K+Q6_K": quant}
    assert backend.attention == ("torch" if attention == "torch" else "native")
    assert backend.threads == 1 and backend.torch_threads == 1  # the GEMMs are native
    assert backend.layers == ("per-op" if attention == "torch" else "native")
    calls = spy(monkeypatch)
    step(loaded.model)
    check_runs_as_printed(backend, calls)


def test_the_printed_backend_names_what_a_bf16_checkpoint_runs(tiny_checkpoint, monkeypatch):
    loaded = load_model(str(tiny_checkpoint("qwen3")), dtype="bfloat16")
    backend = finish_backend(loaded, threads=2)
    assert dict(backend.gemm) == {"bf16": f"native-{kernels.bf16_isa()}"}
    calls = spy(monkeypatch)
    step(loaded.model)
    check_runs_as_printed(backend, calls)


def test_fp32_runs_torch_everywhere_and_torch_gets_the_threads(tiny_checkpoint, monkeypatch):
    loaded = load_model(str(tiny_checkpoint("qwen3")), dtype="float32")
    backend = finish_backend(loaded, threads=2)
    assert (backend.attention, backend.elementwise) == ("torch", "torch")
    assert dict(backend.gemm) == {"float32": "torch"}
    assert (backend.threads, backend.torch_threads) == (None, 2)
    assert torch.get_num_threads() == 2 and kernels.kernel_threads() == 2
    calls = spy(monkeypatch)
    step(loaded.model)
    check_runs_as_printed(backend, calls)


def test_a_refused_override_fails_by_name(monkeypatch) -> None:
    monkeypatch.setenv(BACKEND_ENV, "native")
    with pytest.raises(RuntimeError, match=BACKEND_ENV):
        decide_backend(torch.float32, "cpu", 64)


def test_a_drafter_gets_the_targets_rule_at_its_own_head_size(monkeypatch) -> None:
    backend = decide_backend(torch.bfloat16, "cpu", 64)
    assert backend.attention_for(128) == "native" and backend.attention_for(72) == "torch"
    monkeypatch.setenv(BACKEND_ENV, "torch")
    assert decide_backend(torch.bfloat16, "cpu", 64).attention_for(128) == "torch"


BF16, F32 = torch.bfloat16, torch.float32
I64 = torch.int64


def _q8_weight(rows: int = 8, k: int = 32) -> QuantWeight:
    """A packed Q8_0 weight of random blocks (finite fp16 scales)."""
    raw = np.random.default_rng(0).integers(0, 127, (rows, k // 32, 34), dtype=np.uint8)
    raw[:, :, :2] = np.full((rows, k // 32), 1e-2, np.float16).view(np.uint8).reshape(
        rows, k // 32, 2)
    return pack_quant([QuantPart(Q.Q8_0, raw.reshape(rows, -1))], k)


def _bad_table() -> object:
    good = _q8_weight()
    return QuantWeight(good.segments, good.out_features, good.in_features,
                       good.table.clone().fill_(0))


def _short_segment() -> object:
    good = _q8_weight()
    seg = good.segments[0]
    short = QuantSegment(seg.qtype, 0, seg.rows, seg.data[:-1])
    table = torch.tensor([[int(seg.qtype), short.data.data_ptr(), 0, seg.rows]], dtype=I64)
    return QuantWeight((short,), good.out_features, good.in_features, table)


def _cache(blocks: int = 2, head_dim: int = 16) -> kernels.PagedCache:
    return kernels.paged_cache(torch.zeros(blocks, 4, 2, head_dim, dtype=BF16),
                               torch.zeros(blocks, 4, 2, head_dim, dtype=BF16))


def _index(tokens: int = 1, num_blocks: int | None = None) -> kernels.AttentionIndex:
    return kernels.attention_index(torch.zeros(tokens, dtype=I64), torch.tensor([0, tokens]),
                                   torch.tensor([tokens]), torch.zeros(1, 1, dtype=I64),
                                   num_blocks)


def _rows(tokens: int = 1) -> kernels.RopeRows:
    return kernels.rope_rows(torch.ones(tokens, 1, 16, dtype=BF16),
                             torch.ones(tokens, 1, 16, dtype=BF16), tokens, 16)


BLOCKED = BlockedWeight(torch.zeros(64 * 8, dtype=BF16), 4, 8)
BAD_CALLS: dict[str, Callable[[], object]] = {
    "rms_norm fp32": lambda: kernels.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6),
    "rms_norm width": lambda: kernels.rms_norm(torch.ones(2, 8, dtype=BF16),
                                               torch.ones(6, dtype=BF16), 1e-6),
    "add_rms_norm shapes": lambda: kernels.add_rms_norm(
        torch.ones(2, 8, dtype=BF16), torch.ones(3, 8, dtype=BF16), torch.ones(8, dtype=BF16),
        1e-6),
    "silu_mul odd": lambda: kernels.silu_mul(torch.ones(2, 7, dtype=BF16)),
    "rope strided heads": lambda: kernels.rope_(
        torch.ones(2, 4, 16, dtype=BF16).transpose(0, 1), torch.ones(4, 1, 16, dtype=BF16),
        torch.ones(4, 1, 16, dtype=BF16)),
    "rope short table": lambda: kernels.rope_(
        torch.ones(2, 4, 16, dtype=BF16), torch.ones(1, 1, 16, dtype=BF16),
        torch.ones(2, 1, 16, dtype=BF16)),
    "rope rows fp32": lambda: kernels.rope_rows(torch.ones(2, 1, 16), torch.ones(2, 1, 16),
                                                2, 16),
    "rope qkv tokens": lambda: kernels.rope_qkv_(torch.ones(2, 96, dtype=BF16), 4, _rows(1)),
    "rope qkv narrow": lambda: kernels.rope_qkv_(torch.ones(1, 48, dtype=BF16), 4, _rows(1)),
    "argmax int": lambda: kernels.argmax_f32(torch.ones(2, 5, dtype=torch.int64)),
    "argmax empty": lambda: kernels.argmax_f32(torch.ones(2, 0)),
    "blocked weight size": lambda: BlockedWeight(torch.ones(10, dtype=BF16), 4, 8),
    "blocked weight dtype": lambda: BlockedWeight(torch.ones(64 * 8), 4, 8),
    "linear_bf16 fp32 input": lambda: kernels.linear_bf16(torch.ones(1, 8), BLOCKED),
    "linear_bf16 input width": lambda: kernels.linear_bf16(torch.ones(1, 6, dtype=BF16), BLOCKED),
    "quant weight table": _bad_table,
    "quant weight truncated": _short_segment,
    "linear_quant width": lambda: kernels.linear_quant(torch.ones(1, 8, dtype=BF16),
                                                       _q8_weight()),
    "linear_quant bias": lambda: kernels.linear_quant(
        torch.ones(1, 32, dtype=BF16), _q8_weight(), torch.ones(9, dtype=BF16)),
    "quant_pack size": lambda: kernels.quant_pack(
        int(Q.Q8_0), 0, 8, 32, torch.zeros(10, dtype=torch.uint8), 8 * 34, 1),
    "dequant ids range": lambda: kernels.quant_dequant_rows(
        int(Q.Q8_0), torch.zeros(8 * 34, dtype=torch.uint8), torch.tensor([9]), 8, 32,
        torch.empty(1, 32, dtype=BF16)),
    "attention cache dtype": lambda: kernels.paged_cache(torch.ones(2, 4, 2, 16),
                                                         torch.ones(2, 4, 2, 16)),
    "attention cache shapes": lambda: kernels.paged_cache(
        torch.ones(2, 4, 2, 16, dtype=BF16), torch.ones(3, 4, 2, 16, dtype=BF16)),
    "attention index dtype": lambda: kernels.attention_index(
        torch.zeros(1, dtype=torch.int32), torch.zeros(2, dtype=I64), torch.zeros(1, dtype=I64),
        torch.zeros(1, 1, dtype=I64)),
    "attention index rows": lambda: kernels.attention_index(
        torch.zeros(1, dtype=I64), torch.zeros(3, dtype=I64), torch.zeros(1, dtype=I64),
        torch.zeros(1, 1, dtype=I64)),
    "attention head_dim": lambda: kernels.paged_attention(
        *(torch.ones(1, 2, 32, dtype=BF16),) * 3, _cache(), _index(), None, 0.25),
    "attention tokens": lambda: kernels.paged_attention(
        *(torch.ones(2, 2, 16, dtype=BF16),) * 3, _cache(), _index(1), None, 0.25),
    "attention smaller cache": lambda: kernels.paged_attention(
        *(torch.ones(1, 2, 16, dtype=BF16),) * 3, _cache(2), _index(1, num_blocks=8), None,
        0.25),
    "attention qkv width": lambda: kernels.paged_attention_qkv(
        torch.ones(1, 64, dtype=BF16), 2, _cache(), _index(), None, 0.25),
    "attention qkv tokens": lambda: kernels.paged_attention_qkv(
        torch.ones(3, 96, dtype=BF16), 2, _cache(), _index(1), None, 0.25),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_to_a_kernel_wrapper_is_a_named_error(case: str) -> None:
    with pytest.raises(KernelInputError):
        BAD_CALLS[case]()


def test_wrappers_still_refuse_under_python_O() -> None:
    code = (
        "import torch\n"
        "from draftwise.models import kernels\n"
        "assert False, 'asserts are on'\n"
    )
    asserts = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                             check=False)
    assert asserts.returncode == 0, asserts.stderr  # -O really strips asserts
    code = (
        "import torch\n"
        "from draftwise.models import kernels\n"
        "from draftwise.models.linear import BlockedWeight\n"
        "for call in (lambda: kernels.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6),\n"
        "             lambda: BlockedWeight(torch.ones(10, dtype=torch.bfloat16), 4, 8)):\n"
        "    try:\n"
        "        call()\n"
        "    except kernels.KernelInputError as exc:\n"
        "        print('refused:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.count("refused:") == 2, out.stdout + out.stderr


@pytest.mark.parametrize(("dtype", "expected"), [("bfloat16", (4, 1)), ("float32", (None, 3))])
def test_default_threads_are_every_core_with_native_gemms(
    tiny_checkpoint, monkeypatch, dtype, expected
) -> None:
    from draftwise import bootstrap

    monkeypatch.setattr(bootstrap, "usable_cores", lambda: 4)
    loaded = load_model(str(tiny_checkpoint("qwen3")), dtype=dtype)
    backend = finish_backend(loaded, threads=None)
    assert (backend.threads, backend.torch_threads) == expected
    assert f"threads={expected[0] or 'torch' + chr(39) + 's'}" in backend.line()
    assert bootstrap.resolve_num_threads(1, native_gemm=True) == 1  # the flag wins
