"""RoPE tables start small and grow: a row's values never depend on the table's size."""

from __future__ import annotations

import pytest
import torch
from draftwise.models.rope import INITIAL_ROPE_POSITIONS, inv_frequencies, rope_tables


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_do_not_depend_on_the_table_size(threads: int, dtype: torch.dtype) -> None:
    inv, scale = inv_frequencies(64, 1e6, {"rope_type": "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 1024}, 8192)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        big_cos, big_sin = rope_tables(inv, 8192, scale, dtype)
        for size in (INITIAL_ROPE_POSITIONS, 2 * INITIAL_ROPE_POSITIONS, 3001):
            cos, sin = rope_tables(inv, size, scale, dtype)
            assert cos.shape == (size, 64)
            assert torch.equal(cos, big_cos[:size]) and torch.equal(sin, big_sin[:size])
    finally:
        torch.set_num_threads(before)


def test_a_model_grows_its_tables_past_the_initial_rows() -> None:
    from draftwise.models.config import ModelConfig
    from draftwise.models.llama import LlamaForCausalLM

    config = ModelConfig.from_hf_dict({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 128,
        "vocab_size": 32, "max_position_embeddings": 4096,
    })
    model = LlamaForCausalLM(config, torch.float32, "cpu")
    assert model.rope_cos.shape[0] == INITIAL_ROPE_POSITIONS
    model.ensure_positions(INITIAL_ROPE_POSITIONS + 1)
    assert model.rope_cos.shape[0] == 2 * INITIAL_ROPE_POSITIONS
    model.ensure_positions(3000)
    full_cos, full_sin = rope_tables(model.inv_freq, 3000, 1.0, torch.float32)
    assert torch.equal(model.rope_cos, full_cos) and torch.equal(model.rope_sin, full_sin)
