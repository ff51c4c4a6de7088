"""The draft's config.json read into DFlashConfig, and the block plan, without an engine."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from draftwise.speculator import DraftRow
from draftwise_dflash.config import DFlashConfigError, build_target_layer_ids, parse_config
from draftwise_dflash.proposer import plan_blocks, slots_of

BASE: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "intermediate_size": 128, "vocab_size": 100, "num_target_layers": 36,
}


def cfg(**over: Any) -> Any:
    d = {**BASE, "dflash_config": {"mask_token_id": 5}}
    sub = over.pop("dflash_config", {})
    d["dflash_config"].update(sub)
    d.update(over)
    return parse_config(d, "config.json")


def test_zlab_fallback_layer_ids() -> None:
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-4B-DFlash-b16
    assert build_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert build_target_layer_ids(28, 1) == [14]
    assert cfg(num_hidden_layers=5).target_layer_ids == (1, 9, 17, 25, 33)


def test_block_size_in_either_place() -> None:
    assert cfg().block_size == 16  # z-lab's default
    assert cfg(block_size=8).block_size == 8
    assert cfg(dflash_config={"block_size": 10}).block_size == 10
    assert cfg(block_size=10, dflash_config={"block_size": 10}).num_speculative_tokens == 9
    with pytest.raises(DFlashConfigError, match="disagree"):
        cfg(block_size=8, dflash_config={"block_size": 16})


def test_mask_token_either_way() -> None:
    assert cfg(dflash_config={"mask_token_id": 7}).mask_token_id == 7
    c = parse_config({**BASE, "mask_token_id": 9}, "c")
    assert c.mask_token_id == 9
    c = parse_config({**BASE, "dflash_config": {"mask_token": "<|MASK|>"}}, "c")
    assert c.mask_token_id is None and c.mask_token == "<|MASK|>"
    with pytest.raises(DFlashConfigError, match="no mask token"):
        parse_config(BASE, "c")


def test_causality_per_layer() -> None:
    types = ["sliding_attention", "full_attention"]
    c = cfg(layer_types=types, sliding_window=64)
    assert c.causal == (True, False) and c.decoder.window_of(0) == 64
    assert c.decoder.window_of(1) is None
    assert cfg(is_causal=True).causal == (True, True)
    assert cfg(dflash_config={"causal": True}).causal == (True, True)
    with pytest.raises(DFlashConfigError, match="disagree"):
        cfg(is_causal=True, dflash_config={"causal": False})
    with pytest.raises(DFlashConfigError, match="non-causal sliding window is not implemented"):
        cfg(layer_types=types, sliding_window=64, is_causal=False)
    with pytest.raises(DFlashConfigError, match="integer sliding_window"):
        cfg(layer_types=types)


def test_dflash2_keys_required_and_checked() -> None:
    v2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}
    c = cfg(architectures=["DFlash2DraftModel"], dflash_config=v2)
    assert c.v2 is not None and c.v2.selector_top_k == 4
    with pytest.raises(DFlashConfigError, match="needs dflash_config.selector_rank"):
        cfg(architectures=["DFlash2DraftModel"],
            dflash_config={k: v for k, v in v2.items() if k != "selector_rank"})
    with pytest.raises(DFlashConfigError, match="does not divide hidden_size=64"):
        cfg(architectures=["DFlash2DraftModel"], dflash_config={**v2, "conv_group_size": 24})
    with pytest.raises(DFlashConfigError, match="not a DFlash drafter"):
        cfg(architectures=["Qwen3ForCausalLM"])


def row(n: int, kv: int, want: int, hidden: int | None = None) -> DraftRow:
    h = {0: torch.zeros(n - 1 - kv if hidden is None else hidden, 4)}
    return DraftRow("r", np.arange(n), want, num_kv_computed=kv, block_table=[3, 1, 4],
                    hidden=h)


def test_block_plan() -> None:
    rows = [row(10, 4, 7), row(10, 9, 2), row(10, 4, 0), row(10, 4, 7, hidden=2)]
    plans = plan_blocks(rows, 3, (0,))
    # a full context, a row already current, no room, stale hidden states: not drafted
    assert [(p.index, list(p.context), p.anchor_pos, p.drafts) for p in plans] == [
        (0, [4, 5, 6, 7, 8], 9, 3), (1, [], 9, 2)]
    assert slots_of([3, 1, 4], range(3, 6), 4) == [15, 4, 5]
