"""ModelConfig parsing, the architecture registry, and RoPE against transformers."""

from __future__ import annotations

import pytest
import torch
from draftwise.formats.errors import ConfigError, UnsupportedArchitectureError
from draftwise.models.config import ModelConfig
from draftwise.models.registry import check_hf_config, model_class, supported_names
from draftwise.models.rope import apply_rope, inv_frequencies, rope_tables

BASE = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 256,
    "vocab_size": 512,
}


def test_old_and_new_rope_keys() -> None:
    old = ModelConfig.from_hf_dict(
        {
            **BASE,
            "architectures": ["LlamaForCausalLM"],
            "rope_theta": 500000.0,
            "rope_scaling": {"type": "linear", "factor": 2.0},
            "eos_token_id": [7, 8],
        }
    )
    new = ModelConfig.from_hf_dict(
        {
            **BASE,
            "architectures": ["LlamaForCausalLM"],
            "rope_parameters": {"rope_theta": 500000.0, "rope_type": "linear", "factor": 2.0},
            "eos_token_id": [7, 8],
        }
    )
    assert old == new
    assert old.rope_theta == 500000.0 and old.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert old.eos_token_ids == (7, 8) and old.head_dim == 32
    plain = ModelConfig.from_hf_dict({**BASE, "model_type": "llama", "rope_scaling": None})
    assert plain.architecture == "LlamaForCausalLM" and plain.rope_scaling is None


def test_family_flags() -> None:
    qwen2 = ModelConfig.from_hf_dict({**BASE, "architectures": ["Qwen2ForCausalLM"]})
    assert qwen2.attention_bias and not qwen2.o_proj_bias and not qwen2.qk_norm
    qwen3 = ModelConfig.from_hf_dict(
        {**BASE, "architectures": ["Qwen3ForCausalLM"], "head_dim": 64, "attention_bias": True}
    )
    assert qwen3.qk_norm and qwen3.attention_bias and qwen3.o_proj_bias and qwen3.q_size == 256
    mistral = ModelConfig.from_hf_dict(
        {**BASE, "architectures": ["MistralForCausalLM"], "sliding_window": 64}
    )
    assert [mistral.window_of(i) for i in range(4)] == [64] * 4
    swa = ModelConfig.from_hf_dict(
        {
            **BASE,
            "architectures": ["Qwen2ForCausalLM"],
            "use_sliding_window": True,
            "sliding_window": 32,
            "max_window_layers": 2,
        }
    )
    assert [swa.window_of(i) for i in range(4)] == [None, None, 32, 32]
    off = ModelConfig.from_hf_dict(
        {**BASE, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 32}
    )
    assert off.window_of(3) is None


def test_missing_key_and_partial_rotary() -> None:
    broken = {k: v for k, v in BASE.items() if k != "vocab_size"}
    with pytest.raises(ConfigError, match="vocab_size"):
        ModelConfig.from_hf_dict({**broken, "architectures": ["LlamaForCausalLM"]}, "c.json")
    with pytest.raises(ConfigError, match="partial_rotary_factor"):
        ModelConfig.from_hf_dict(
            {**BASE, "architectures": ["LlamaForCausalLM"], "partial_rotary_factor": 0.5}
        )


def test_registry_refusals() -> None:
    with pytest.raises(UnsupportedArchitectureError) as err:
        check_hf_config({**BASE, "architectures": ["FalconForCausalLM"]}, "config.json")
    assert "'FalconForCausalLM'" in str(err.value) and "unknown" in str(err.value)
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "gguf:llama"):
        assert name in str(err.value) and name in supported_names()
    with pytest.raises(UnsupportedArchitectureError, match="mixture-of-experts"):
        check_hf_config({**BASE, "architectures": ["Qwen3MoeForCausalLM"]}, "config.json")
    with pytest.raises(UnsupportedArchitectureError, match="mixture-of-experts"):
        check_hf_config(
            {**BASE, "architectures": ["LlamaForCausalLM"], "num_local_experts": 8}, "c.json"
        )
    gelu = ModelConfig.from_hf_dict(
        {**BASE, "architectures": ["LlamaForCausalLM"], "hidden_act": "gelu"}
    )
    with pytest.raises(ConfigError, match="gelu"):
        model_class(gelu, "config.json")


def _hf_rope(rope_parameters: dict, dtype: torch.dtype, positions: torch.Tensor):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(**BASE, max_position_embeddings=4096, rope_parameters=rope_parameters)
    emb = LlamaRotaryEmbedding(cfg)
    x = torch.zeros(1, dtype=dtype)
    return emb.inv_freq, emb.attention_scaling, emb(x, positions[None])


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "default", "rope_theta": 100000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 512,
        },
        {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_is_bitwise_transformers(params: dict, dtype: torch.dtype) -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    positions = torch.tensor([0, 1, 5, 77, 1000, 4095])
    ref_inv, ref_scale, (ref_cos, ref_sin) = _hf_rope(params, dtype, positions)
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    inv, scale = inv_frequencies(32, params["rope_theta"], scaling, 4096)
    assert torch.equal(inv, ref_inv) and scale == pytest.approx(ref_scale)
    cos, sin = rope_tables(inv, 4096, scale, dtype)
    assert torch.equal(cos[positions], ref_cos[0])
    q = torch.randn(len(positions), 4, 32).to(dtype)
    k = torch.randn(len(positions), 2, 32).to(dtype)
    ref_q, ref_k = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], ref_cos, ref_sin
    )
    both = apply_rope(torch.cat([q, k], 1), cos[positions][:, None], sin[positions][:, None])
    assert torch.equal(both[:, :4], ref_q[0].transpose(0, 1))
    assert torch.equal(both[:, 4:], ref_k[0].transpose(0, 1))


def test_unsupported_rope_type() -> None:
    with pytest.raises(ConfigError, match="'dynamic'"):
        inv_frequencies(32, 10000.0, {"rope_type": "dynamic", "factor": 2.0}, 2048)
