"""The engine on the Triton kernels (``Backend.kernels == "triton"``): the same engine,
scheduler and plugins, with the model's attention through ``draftwise.gpu.attention``, the
GGUF projections through ``draftwise.gpu.quant`` on the file's blocks, and verify through
``draftwise.gpu.verify``.

On a CUDA machine these run ``device="cuda"``; here they run on CPU tensors under Triton's
interpreter (``DRAFTWISE_KERNELS=triton``, the conftest sets ``TRITON_INTERPRET=1``). The
CPU engine (the C kernels, the reference) runs the same requests. Shapes are the smallest
that still cover what matters: block size 4 (a prompt's context spans several blocks),
GQA (4 heads over 2 KV heads), k + 1 verify rows, and K = 256 so Q4_K and Q6_K blocks
exist (one super-block a row).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from draftwise import LLM, SamplingParams
from draftwise.bootstrap import check_device_engine
from draftwise.config import parse_speculative_config
from draftwise.engine_args import EngineArgs
from draftwise.gpu.device import DeviceUnavailableError
from draftwise.models.backend import KERNELS_ENV
from gguf import GGMLQuantizationType as Q
from tiny_checkpoints import perturbed_copy, save_tiny, save_tiny_hybrid
from tiny_gguf import write_tiny_gguf

HAS_CUDA = torch.cuda.is_available()
PROMPTS = [
    [5, 9, 17, 33, 41, 62, 70, 80, 90, 100],  # greedy falls into a loop: n-gram accepts
    [3, 4, 5, 3, 4, 5, 3, 4],
    [120, 11, 250, 31],
]
#: greedy, long enough that decode runs past the prompt's blocks
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
ENGINE: dict[str, Any] = {"block_size": 4, "num_kv_blocks": 48, "max_model_len": 48}


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Q8_0 projections, Q6_K attn_v (a fused q|k|v of two types) and LM head, Q4_K down."""
    path = tmp_path_factory.mktemp("device") / "tiny-q.gguf"
    write_tiny_gguf(path, matrix_type=Q.Q8_0, tied=False, hidden=256, heads=4, kv_heads=2,
                    ffn=256, layers=2,
                    tensor_types={"attn_v": Q.Q6_K, "ffn_down": Q.Q4_K, "output": Q.Q6_K})
    return path


@pytest.fixture(scope="module")
def hf_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("device-hf"), seed=5, std=0.25,
                     num_hidden_layers=2)


@pytest.fixture(scope="module")
def hf_draft(hf_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target, jittered: it agrees with the target often, not always."""
    return perturbed_copy(hf_target, tmp_path_factory.mktemp("device-draft") / "d", scale=0.015)


def run(monkeypatch: pytest.MonkeyPatch, kernels: str, model: Path, prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams] = GREEDY, spec: Any = None,
        dtype: str = "float32", **extra: Any) -> tuple[list[list[int]], LLM]:
    """Every prompt's tokens from an engine on ``kernels`` (``triton``: the device engine
    as this machine can run it; ``cpu``: the C kernels)."""
    device = "cpu"
    monkeypatch.delenv(KERNELS_ENV, raising=False)
    if kernels == "triton" and HAS_CUDA:
        device = "cuda"
    elif kernels == "triton":
        monkeypatch.setenv(KERNELS_ENV, "triton")
    llm = LLM(str(model), speculative_config=spec, dtype=dtype, device=device,
              max_num_seqs=len(prompts), **{**ENGINE, **extra})
    assert llm.engine.runner.model.backend.kernels == kernels
    outs = llm.generate(prompts, params)
    return [list(o.outputs[0].token_ids) for o in outs], llm


def ngram(k: int = 3) -> dict[str, Any]:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
            "draftwise": {"adaptive": False}}


def test_gguf_greedy_equals_the_cpu_engine_batched_and_with_ngram(monkeypatch, gguf_path):
    """Q8_0/Q4_K/Q6_K weights stay blocks on the device. The device engine's tokens are
    the CPU engine's (fp32: the C path dequantizes at load, the kernel in registers), a
    row alone or batched with others, and n-gram speculation (k + 1 verify rows, the
    device verify) changes none of them. (One test: each interpreted engine run costs
    seconds.)"""
    want = [run(monkeypatch, "cpu", gguf_path, [p])[0][0] for p in PROMPTS]
    alone, llm = run(monkeypatch, "triton", gguf_path, PROMPTS[:1])
    backend = llm.engine.runner.model.backend
    assert backend.attention == "triton"
    assert dict(backend.gemm) == {"Q4_K": "triton", "Q6_K": "triton", "Q8_0": "triton",
                                  "Q8_0+Q6_K": "triton"}
    batched, _ = run(monkeypatch, "triton", gguf_path, PROMPTS)
    assert alone[0] == batched[0] and batched == want
    spec, llm = run(monkeypatch, "triton", gguf_path, PROMPTS, spec=ngram())
    assert spec == batched
    assert llm.engine.spec.metrics.num_accepted_tokens > 0


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_hf_greedy_equals_the_cpu_engine(monkeypatch, hf_target, dtype):
    want, _ = run(monkeypatch, "cpu", hf_target, PROMPTS[:2], dtype=dtype)
    got, _ = run(monkeypatch, "triton", hf_target, PROMPTS[:2], dtype=dtype)
    assert got == want


def test_draft_model_greedy_equals_spec_off_and_the_cpu_engine(monkeypatch, hf_target,
                                                               hf_draft):
    spec = {"method": "draft_model", "model": str(hf_draft), "num_speculative_tokens": 3,
            "draftwise": {"adaptive": False}}
    got, llm = run(monkeypatch, "triton", hf_target, PROMPTS[:2], spec=spec)
    plain, _ = run(monkeypatch, "triton", hf_target, PROMPTS[:2])
    cpu, _ = run(monkeypatch, "cpu", hf_target, PROMPTS[:2], spec=spec)
    assert got == plain == cpu
    m = llm.engine.spec.metrics
    assert m.num_draft_tokens > 0 and m.num_accepted_tokens > 0


def test_seeded_sampling_on_device_draws_the_cpu_engines_tokens(monkeypatch, hf_target):
    """The device verify keeps the CPU verify's rule and uniforms (its chi-square test is
    ``test_verify.py``): seeded requests, with and without n-gram drafts, draw the same
    tokens as on the CPU engine."""
    params = [SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9, seed=s,
                             ignore_eos=True) for s in (1, 2)]
    want, _ = run(monkeypatch, "cpu", hf_target, PROMPTS[:2], params, spec=ngram(2))
    got, _ = run(monkeypatch, "triton", hf_target, PROMPTS[:2], params, spec=ngram(2))
    assert got == want


def test_what_has_no_device_path_is_refused_by_name(monkeypatch, tmp_path, hf_target):
    """Refused at start-up with the device named, never run on the CPU instead."""
    device = "cuda" if HAS_CUDA else "cpu"
    if not HAS_CUDA:
        monkeypatch.setenv(KERNELS_ENV, "triton")
    engine = {**ENGINE, "device": device}
    with pytest.raises(DeviceUnavailableError, match=f"dtype bfloat16 on device {device}"):
        LLM(str(hf_target), dtype="bfloat16", **engine)
    monkeypatch.setenv("DRAFTWISE_ATTENTION", "native")
    with pytest.raises(DeviceUnavailableError, match="DRAFTWISE_ATTENTION=native asks for a CPU"):
        LLM(str(hf_target), dtype="float32", **engine)
    monkeypatch.delenv("DRAFTWISE_ATTENTION")
    hybrid = save_tiny_hybrid(tmp_path / "hybrid", mtp=False)
    with pytest.raises(DeviceUnavailableError, match="a GDN hybrid .* does not run on device"):
        LLM(str(hybrid), dtype="float32", **engine)
    args = EngineArgs(model=str(hf_target), device=device)
    block = parse_speculative_config({**ngram(), "rejection_sample_method": "block"})
    with pytest.raises(DeviceUnavailableError, match="'block' has no device kernel"):
        check_device_engine(args, 1, block, hidden_drafter=False)
    mtp = parse_speculative_config({"method": "mtp", "num_speculative_tokens": 1})
    with pytest.raises(DeviceUnavailableError, match="method 'mtp' reads the target's hidden"):
        check_device_engine(args, 1, mtp, hidden_drafter=True)
    with pytest.raises(DeviceUnavailableError, match="--tensor-parallel-size 2"):
        check_device_engine(args, 2, None, hidden_drafter=False)
