"""The decoder stack (``core/csrc/decoder_stack.c``): a run of layers in one C call gives the
bits of the per-op path, whatever the batch, the hidden layers asked for or the threads.

Two copies of one GGUF model are loaded, one with ``DRAFTWISE_DECODER_STACK=per-op``, and
stepped through the same batches: prefills of unequal rows, decodes, verify-shaped rows of
several tokens, with hidden states requested mid-stack; logits and hidden states must be
``torch.equal``. A spy checks the stack really ran (and the per-op GEMMs did not).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from draftwise.bootstrap import finish_backend
from draftwise.models import kernels
from draftwise.models.backend import LAYERS_ENV
from draftwise.models.kernels import KernelInputError
from draftwise.models.loader import load_model
from draftwise.models.stack import stack_caches
from gguf import GGMLQuantizationType as Q

pytestmark = pytest.mark.skipif(not kernels.available("decoder_layers"),
                                reason="C kernels not built")

SHAPE = {"hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512, "layers": 3}


pytestmark = pytest.mark.usefixtures("restore_threads")


def pair(tiny_gguf, monkeypatch, threads: int, **kw: Any) -> tuple[Any, Any]:
    """The same file loaded twice: (stack, per-op)."""
    t = tiny_gguf(**SHAPE, **kw)
    monkeypatch.setenv(LAYERS_ENV, "per-op")
    per_op = load_model(str(t.path))
    finish_backend(per_op, threads=threads)
    monkeypatch.setenv(LAYERS_ENV, "auto")
    stack = load_model(str(t.path))
    finish_backend(stack, threads=threads)
    assert per_op.model.backend.layers == "per-op" and per_op.model._stack is None
    assert stack.model.backend.layers == "native" and stack.model._stack is not None
    return stack.model, per_op.model


def count_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    calls: Counter[str] = Counter()
    for name in ("decoder_layers", "linear_quant", "paged_attention_qkv", "add_rms_norm"):
        real = getattr(kernels, name)

        def wrapped(*a: Any, _real: Callable[..., Any] = real, _n: str = name, **k: Any) -> Any:
            calls[_n] += 1
            return _real(*a, **k)

        monkeypatch.setattr(kernels, name, wrapped)
    return calls


def run_both(stack: Any, per_op: Any, paged_runner: Any, monkeypatch) -> Counter[str]:
    """Step both models through the same batches; every output must be bitwise equal."""
    runners = (paged_runner(stack), paged_runner(per_op))
    steps: list[tuple[dict[int, list[int]], tuple[int, ...]]] = [
        ({0: [5, 40, 77, 2, 13, 9, 31], 1: [8, 3]}, ()),  # prefill, unequal rows
        ({0: [11], 1: [12]}, ()),  # decode
        ({0: [7, 21, 4, 60, 33], 1: [90]}, (0, 1)),  # verify-shaped, hidden states mid-stack
        ({1: [14, 15, 16]}, (2,)),  # the last layer's hidden state
        ({0: [17], 1: [18]}, (1,)),
    ]
    calls = count_calls(monkeypatch)
    for chunks, hidden in steps:
        (la, ha), (lb, hb) = (r.step(chunks, hidden_layers=hidden) for r in runners)
        for row in chunks:
            assert torch.equal(la[row], lb[row]), (chunks, row)
        assert ha.keys() == hb.keys() == set(hidden)
        for i in hidden:
            assert torch.equal(ha[i], hb[i]), (chunks, i)
    return calls


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["qwen2-q4k", "llama-q8_0", "qwen2-q5_0"])
def test_the_stack_gives_the_per_op_bits(tiny_gguf, monkeypatch, paged_runner, threads, kind):
    """qwen2 has q/k/v biases; Q4_K with a Q6_K v (a fused weight of two types, as in
    Q4_K_M) and the 32-blocks types."""
    arch, qtype = kind.split("-")
    types = {"q4k": (Q.Q4_K, {"attn_v": Q.Q6_K}), "q8_0": (Q.Q8_0, {}), "q5_0": (Q.Q5_0, {})}
    matrix, extra = types[qtype]
    stack, per_op = pair(tiny_gguf, monkeypatch, threads, arch=arch, matrix_type=matrix,
                         embed_type=Q.Q8_0, tied=False, tensor_types=extra)
    calls = run_both(stack, per_op, paged_runner, monkeypatch)
    # the stack ran: one call per run of layers, so the per-op kernels only in per_op's
    # steps (4 GEMMs and 1 attention a layer) and the LM head in both
    layers, steps = stack.num_layers, 5
    assert calls["decoder_layers"] == steps + 3  # hidden states split steps 3 and 5
    assert calls["paged_attention_qkv"] == steps * layers
    assert calls["linear_quant"] == steps * (4 * layers + 2)


def test_sliding_windows_reach_the_stack(tiny_gguf, monkeypatch, paged_runner):
    """Each layer's window is carried in the plan (a window shorter than the context)."""
    stack, per_op = pair(tiny_gguf, monkeypatch, 1, arch="llama", matrix_type=Q.Q4_K,
                         embed_type=Q.Q8_0, tied=False)
    for model in (stack, per_op):
        for i, layer in enumerate(model.decoder_layers()):
            layer.window = (3, None, 5)[i]
    stack.pack_weights()  # the plan is made here: again, with the windows
    run_both(stack, per_op, paged_runner, monkeypatch)
    logits_windowed, _ = paged_runner(stack).step({0: list(range(3, 12))})
    for layer in stack.decoder_layers():
        layer.window = None
    stack.pack_weights()
    logits_full, _ = paged_runner(stack).step({0: list(range(3, 12))})
    assert not torch.equal(logits_windowed[0], logits_full[0])  # the windows did something


def test_a_model_the_stack_cannot_run_says_so(tiny_gguf, monkeypatch):
    """Q/k norms (qwen3) stay per-op, and the printed backend says so."""
    monkeypatch.setenv(LAYERS_ENV, "auto")
    t = tiny_gguf(arch="qwen3", matrix_type=Q.Q8_0, embed_type=Q.Q8_0, **SHAPE)
    loaded = load_model(str(t.path))
    backend = finish_backend(loaded, threads=1)
    assert loaded.model._stack is None and backend.layers == "per-op"
    assert "layers=per-op" in backend.line()


def test_a_bad_override_and_bad_inputs_are_named(tiny_gguf, monkeypatch):
    monkeypatch.setenv(LAYERS_ENV, "fast")
    with pytest.raises(ValueError, match=LAYERS_ENV):
        load_model(str(tiny_gguf(**SHAPE).path))
    monkeypatch.setenv(LAYERS_ENV, "auto")
    model = load_model(str(tiny_gguf(matrix_type=Q.Q4_K, **SHAPE).path)).model
    plan = model._stack
    from draftwise.models.batch import KVCache

    kv = KVCache.allocate(model.num_layers, 8, 4, model.num_kv_heads, model.head_dim,
                          model.dtype)
    caches = stack_caches(plan, kv.paged())
    with pytest.raises(KernelInputError, match="caches"):
        stack_caches(plan, kv.paged()[:2])
    index = kernels.attention_index(torch.zeros(1, dtype=torch.int64),
                                    torch.tensor([0, 1]), torch.tensor([1]),
                                    torch.zeros(1, 2, dtype=torch.int64), 8)
    cos = torch.ones(1, 1, model.head_dim, dtype=torch.bfloat16)
    rope = kernels.rope_rows(cos, cos.clone(), 1, model.head_dim)
    h = torch.randn(1, plan.hidden).bfloat16()
    with pytest.raises(KernelInputError, match="layers"):
        kernels.decoder_layers(plan, caches, h, None, 0, model.num_layers + 1, rope, index)
    with pytest.raises(KernelInputError, match="must be"):
        kernels.decoder_layers(plan, caches, h.float(), None, 0, 1, rope, index)
    with pytest.raises(KernelInputError, match="delta"):
        kernels.decoder_layers(plan, caches, h, h[:, :8].contiguous(), 0, 1, rope, index)
    out_h, out_d = kernels.decoder_layers(plan, caches, h, None, 0, 1, rope, index)
    assert out_h.shape == out_d.shape == h.shape


def test_a_long_prefill_past_the_kept_scratch(tiny_gguf, monkeypatch, paged_runner):
    """decoder_stack.c keeps 4 Mi bf16 of scratch per thread; a longer step (here 200
    tokens of ~25.6k values each) takes its own buffer: the same bits either way."""
    monkeypatch.setitem(SHAPE, "ffn", 8192)
    stack, per_op = pair(tiny_gguf, monkeypatch, 2, arch="qwen2", matrix_type=Q.Q8_0,
                         embed_type=Q.Q8_0, tied=False)
    prompt = [(7 * i + 3) % 200 + 3 for i in range(200)]
    (la, _), (lb, _) = (paged_runner(m).step({0: prompt}) for m in (stack, per_op))
    assert torch.equal(la[0], lb[0])
