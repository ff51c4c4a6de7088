"""MtpProposer on the tiny Qwen3.5 hybrid: spec-on == spec-off, witnesses, refusals.

The loop below is the engine's step in miniature (propose -> ONE target forward over
``[x_last, d_1..d_k]`` -> greedy verify -> KV truncate + recurrent commit -> hidden
states of the committed positions to the proposer), so the test needs no engine.
bf16 weights: the target forward is batch-invariant there, so identity is exact.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from draftwise.cache.recurrent import RecurrentStatePool
from draftwise.config import RefusedValueError
from draftwise.models.batch import KVCache, build_forward_batch
from draftwise.models.qwen3_next import load_hybrid
from draftwise.speculator import DraftInput, DraftRow
from draftwise_mtp.loader import MtpHeadError, detect, load_head
from draftwise_mtp.options import MtpOptions
from draftwise_mtp.proposer import MtpProposer

ROOT = Path(__file__).resolve().parents[3]


def builder():
    spec = importlib.util.spec_from_file_location(
        "build_tiny_hybrid", ROOT / "scripts" / "build_tiny_hybrid.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory) -> Path:
    return builder().build(tmp_path_factory.mktemp("hybrid-mtp"), "qwen3_5")


@pytest.fixture(scope="module")
def target(hybrid_dir):
    model, _ = load_hybrid(str(hybrid_dir), torch.bfloat16)
    return model


class PadFirstColumn(MtpProposer):
    """Control: one head forward, the row padded with its first draft."""

    def _continue(self, rows, drafts, tok, feedback, w) -> None:
        for j, (i, _, _, want) in enumerate(rows):
            drafts[i].extend([int(tok[j])] * (want - 1))


def generate(model, prompt: list[int], n: int, proposer: MtpProposer | None = None, k: int = 0):
    """Greedy generation through paged KV + recurrent slots, speculating when given a proposer."""
    bs = 4
    kv = KVCache.allocate(model.num_layers, 64, bs, model.num_kv_heads, model.head_dim, model.dtype)
    pool, slots = None, None
    if hasattr(model, "recurrent_layout"):  # the hybrid; a llama target rolls back by position only
        layers, shapes, dtypes = model.recurrent_layout()
        pool = RecurrentStatePool(2, shapes, layers, dtypes, max_spec_positions=max(k, 1))
        slots = [pool.allocate("r")]
    table = list(range(63, -1, -1))  # scattered, descending block ids
    last = model.config.num_hidden_layers - 1
    tokens, out, steps = list(prompt), [], 0
    feed, start = list(prompt), 0
    drafts: list[int] = []
    while len(out) < n:
        batch = build_forward_batch(
            [feed],
            [start],
            [table],
            bs,
            [list(range(len(feed) - len(drafts) - 1, len(feed)))],
            hidden_layers=(last,),
            state_slots=slots,
        )
        res = model(batch, kv, pool) if pool is not None else model(batch, kv)
        target_tokens = res.logits.argmax(-1).tolist()
        acc = 0
        while acc < len(drafts) and drafts[acc] == target_tokens[acc]:
            acc += 1
        new = drafts[:acc] + [target_tokens[acc]]
        if drafts and pool is not None:
            pool.commit(["r"], [acc], [len(drafts)])
        committed = len(feed) - len(drafts) + acc
        if proposer is not None:
            proposer.add_hidden("r", start, res.hidden_states[last][:committed])
        start += committed
        tokens += new
        out += new
        steps += 1
        drafts = []
        if proposer is not None and len(out) < n:
            d = proposer.propose(
                DraftInput([DraftRow("r", np.asarray(tokens, dtype=np.int64), max_draft=k)])
            )
            drafts = [int(t) for t in d.row(0)]
        feed = [tokens[-1]] + drafts
    return out[:n], steps


PROMPT = [5, 17, 99, 3, 250, 42, 42, 7, 128, 64, 1, 2, 3]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_speculation_on_is_token_identical_to_off(hybrid_dir, target, k: int) -> None:
    plain, _ = generate(target, PROMPT, 24)
    proposer = MtpProposer(load_head(str(hybrid_dir), target), target, k)
    spec, _ = generate(target, PROMPT, 24, proposer, k)
    assert spec == plain
    w = proposer.witness
    assert w.rows > 0 and w.draft_forwards > 0
    assert w.extra_forwards == (k - 1) * w.rows  # one row per propose: k-1 extra forwards each
    if k >= 2:
        assert w.rows_beyond_copy > 0


def test_control_that_pads_its_row_is_seen_by_the_witnesses(hybrid_dir, target) -> None:
    head = load_head(str(hybrid_dir), target)
    real, control = MtpProposer(head, target, 4), PadFirstColumn(head, target, 4)
    plain, _ = generate(target, PROMPT, 16)
    assert generate(target, PROMPT, 16, real, 4)[0] == plain
    assert generate(target, PROMPT, 16, control, 4)[0] == plain  # lossless either way
    assert real.witness.extra_forwards == 3 * real.witness.rows > 0
    assert control.witness.extra_forwards == 0 and control.witness.rows_beyond_copy == 0
    assert real.witness.rows_beyond_copy > 0


def test_loop_reuses_the_head_on_its_own_output(hybrid_dir, target) -> None:
    """Draft i+1 is the head applied to (draft i, its own output): check one step by hand."""
    head = load_head(str(hybrid_dir), target)
    p = MtpProposer(head, target, 2)
    generate(target, PROMPT, 1, p, 2)  # prefill only: hidden states for the prompt arrive
    tokens = np.asarray(PROMPT + [int(generate(target, PROMPT, 1)[0][0])], dtype=np.int64)
    d = p.propose(DraftInput([DraftRow("r", tokens, max_draft=2)]))
    assert d.num_draft_tokens == [2] and p.last_witness.draft_forwards == 2


def test_head_layout_and_sharing(hybrid_dir, target) -> None:
    head = load_head(str(hybrid_dir), target)
    assert detect(str(hybrid_dir)) == "safetensors:qwen3_next"
    assert head.num_layers == 1 and head.lm_head is None and head.zero_centred
    assert len(head.names) == 15


def test_refusals_by_name(tmp_path, target) -> None:
    bare = builder().build(tmp_path / "bare", "qwen3_5", mtp=False)
    with pytest.raises(MtpHeadError, match="no MTP head in this checkpoint"):
        detect(str(bare))
    with pytest.raises(RefusedValueError, match="divisible by the checkpoint's n_predict=2"):
        MtpOptions().check_checkpoint(3, {"mtp_num_hidden_layers": 2})
    moe = builder().build(tmp_path / "moe", "qwen3_5")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(moe / "model.safetensors"))
    tensors["mtp.layers.0.mlp.experts.0.up_proj.weight"] = torch.zeros(4, 4)
    save_file(tensors, str(moe / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(MtpHeadError, match="mixture-of-experts"):
        load_head(str(moe), target)


class TruthDrafter:
    """Drafts the true greedy continuation with one corrupted position: every accept length."""

    def __init__(self, truth: list[int], prompt_len: int, k: int) -> None:
        self.truth, self.prompt_len, self.k, self.calls = truth, prompt_len, k, 0
        self.accept_lengths: set[int] = set()

    def add_hidden(self, req_id: str, start: int, hidden: torch.Tensor) -> None:
        if start > self.prompt_len:  # committed = 1 + accepted drafts of the last propose
            self.accept_lengths.add(hidden.shape[0] - 1)

    def propose(self, batch: DraftInput):
        from draftwise.speculator import Drafts

        pos = len(batch.rows[0].token_ids) - self.prompt_len
        row = list(self.truth[pos : pos + self.k])
        bad = self.calls % (self.k + 1)  # k+1 means: no corruption, full accept
        if bad < len(row):
            row[bad] = (row[bad] + 1) % 256
        self.calls += 1
        return Drafts.from_lists([row])


def test_every_accept_length_commits_the_right_recurrent_state(target) -> None:
    k = 3
    plain, _ = generate(target, PROMPT, 30)
    truth = TruthDrafter(plain, len(PROMPT), k)
    spec, steps = generate(target, PROMPT, 30, truth, k)
    assert spec == plain
    assert truth.accept_lengths >= {0, 1, 2, 3} and steps < 30


def nextn_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny llama target, and a copy carrying a DeepSeek-V3-style nextn layer L."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file
    from tiny_checkpoints import save_tiny

    plain = save_tiny("llama", tmp_path / "llama", seed=4)
    nextn = tmp_path / "llama-nextn"
    shutil.copytree(plain, nextn)
    cfg = json.loads((nextn / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (nextn / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(nextn / "model.safetensors"))
    n, hid = cfg["num_hidden_layers"], cfg["hidden_size"]
    gen = torch.Generator().manual_seed(9)
    for name, t in list(tensors.items()):  # the nextn block: a re-drawn copy of layer 0
        if name.startswith("model.layers.0."):
            tensors[name.replace("layers.0.", f"layers.{n}.")] = t + 0.02 * torch.randn(
                t.shape, generator=gen
            )
    p = f"model.layers.{n}."
    tensors[p + "eh_proj.weight"] = 0.08 * torch.randn(hid, 2 * hid, generator=gen)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        tensors[p + norm + ".weight"] = 1 + 0.1 * torch.randn(hid, generator=gen)
    tensors[p + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, str(nextn / "model.safetensors"), metadata={"format": "pt"})
    return plain, nextn


@pytest.mark.parametrize("k", [1, 3])
def test_deepseek_nextn_layout_on_a_llama_target(tmp_path, k: int) -> None:
    from draftwise.models.loader import load_model

    plain_dir, nextn_dir = nextn_checkpoint(tmp_path)
    target = load_model(str(plain_dir), dtype="bfloat16").model
    assert detect(str(nextn_dir)) == "safetensors:deepseek_nextn"
    head = load_head(str(nextn_dir), target)
    assert head.layout == "deepseek_nextn" and head.lm_head is not None and not head.zero_centred
    assert head.mask_first_embedding
    proposer = MtpProposer(head, target, k)
    prompt = [7, 300, 21, 9, 9, 450, 3, 18]
    assert generate(target, prompt, 16, proposer, k)[0] == generate(target, prompt, 16)[0]
    assert proposer.witness.rows > 0
    assert proposer.witness.extra_forwards == (k - 1) * proposer.witness.rows


def test_hidden_bookkeeping_gaps_and_restarts(hybrid_dir, target) -> None:
    p = MtpProposer(load_head(str(hybrid_dir), target), target, 2)
    h = torch.zeros(5, target.config.hidden_size)
    p.add_hidden("r", 0, h)
    assert p._seqs["r"].kv_len == 0 and p._seqs["r"].pending.shape[0] == 5
    p.add_hidden("r", 5, h[:2])
    assert p._seqs["r"].pending.shape[0] == 7
    p.add_hidden("r", 9, h[:1])  # positions 7, 8 never arrived: no drafts for this request
    assert p._seqs["r"].kv_len < 0
    row = DraftRow("r", np.arange(12, dtype=np.int64), max_draft=2)
    assert p.propose(DraftInput([row])).num_draft_tokens == [0]
    p.add_hidden("r", 0, h)  # restart (recompute after preemption): usable again
    assert p._seqs["r"].kv_len == 0
    assert p.propose(
        DraftInput([DraftRow("r", np.arange(6, dtype=np.int64), 2)])
    ).num_draft_tokens == [2]


def test_qwen3_next_fused_target_drafts_losslessly(tmp_path) -> None:
    path = builder().build(tmp_path / "next", "qwen3_next")
    model, _ = load_hybrid(str(path), torch.bfloat16)
    proposer = MtpProposer(load_head(str(path), model), model, 2)
    assert generate(model, PROMPT, 12, proposer, 2)[0] == generate(model, PROMPT, 12)[0]
    assert proposer.witness.extra_forwards == proposer.witness.rows > 0
