"""SamplingParams validation, the shared logits processing, and seeded sampling."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from draftwise import sampling as sampling_mod
from draftwise.sampling import (
    SamplingMetadata,
    SamplingParams,
    categorical,
    draw_uniforms,
    make_generator,
    probs_from_logits,
    process_logits,
    sample,
)

# -- SamplingParams --------------------------------------------------------------------


def test_defaults_follow_vllm():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.max_tokens, p.n) == (1.0, 1.0, None, 0.0,
                                                                             16, 1)
    assert p.stop == () and p.stop_token_ids == () and not p.ignore_eos
    assert p.skip_special_tokens and not p.include_stop_str_in_output and not p.is_greedy


@pytest.mark.parametrize("off", [0, -1, None])
def test_top_k_off_values_are_stored_as_none(off):
    assert SamplingParams(top_k=off).top_k is None
    assert SamplingParams(top_k=5).top_k == 5


def test_greedy_threshold_and_stop_normalisation():
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(temperature=5e-6).is_greedy
    assert not SamplingParams(temperature=1e-4).is_greedy
    p = SamplingParams(stop="###", stop_token_ids=[7, 9])
    assert p.stop == ("###",) and p.stop_strings == ("###",)
    assert p.stop_token_ids_set == frozenset({7, 9})
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"n": 129}, "n", "[1, 128]"),
        ({"n": 0}, "n", "[1, 128]"),
        ({"presence_penalty": 2.5}, "presence_penalty", "[-2.0, 2.0]"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty", "[-2.0, 2.0]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty", "> 0"),
        ({"logit_bias": {"7": 101.0}}, "logit_bias", "[-100.0, 100.0]"),
        ({"logit_bias": {"seven": 1.0}}, "logit_bias", "token ids"),
        ({"logit_bias": {-3: 1.0}}, "logit_bias", ">= 0"),
        ({"allowed_token_ids": []}, "allowed_token_ids", "not be empty"),
        ({"allowed_token_ids": [1, -2]}, "allowed_token_ids", ">= 0"),
        ({"bad_words": [" "]}, "bad_words", "non-empty"),
        ({"min_tokens": 17}, "min_tokens", "max_tokens=16"),
        ({"min_tokens": -1}, "min_tokens", "[0, max_tokens"),
        ({"logprobs": 21}, "logprobs", "[0, 20]"),
        ({"prompt_logprobs": -1}, "prompt_logprobs", "[0, 20]"),
        ({"temperature": -0.5}, "temperature", ">= 0"),
        ({"top_p": 0.0}, "top_p", "(0, 1]"),
        ({"top_p": 1.5}, "top_p", "(0, 1]"),
        ({"top_k": -2}, "top_k", "0 / -1 to disable"),
        ({"min_p": 1.5}, "min_p", "[0, 1]"),
        ({"max_tokens": 0}, "max_tokens", "at least 1"),
        ({"stop": ["ok", ""]}, "stop", "non-empty"),
        ({"stop_token_ids": [3, -1]}, "stop_token_ids", ">= 0"),
        ({"seed": 2**70}, "seed", "64 bits"),
        ({"best_of": 2}, "best_of", "Extra inputs"),
        # the bounds the step's tensors need (int64 top-k, float32 temperature)
        ({"top_k": 2**63}, "top_k", "int64"),
        ({"top_k": 10**400}, "top_k", "int64"),
        ({"temperature": float("inf")}, "temperature", "finite"),
        ({"temperature": float("nan")}, "temperature", "finite"),
        ({"temperature": 1e39}, "temperature", "float32"),
        ({"top_p": float("nan")}, "top_p", "(0, 1]"),
        ({"min_p": float("nan")}, "min_p", "[0, 1]"),
        ({"max_tokens": 2**63}, "max_tokens", "int64"),
        ({"n": 10**5000}, "n", "over 4000 digits"),
        ({"stop": ["x"] * 65}, "stop", "at most 64"),
        ({"stop": "y" * 1025}, "stop", "at most 1024 characters"),
        ({"stop": "a\ud800"}, "stop", "lone surrogate U+D800"),
        ({"stop_token_ids": list(range(1025))}, "stop_token_ids", "at most 1024"),
        ({"stop_token_ids": [2**63]}, "stop_token_ids", ">= 0"),
    ],
)
def test_bad_values_name_their_field(kwargs, field, words):
    with pytest.raises(ValidationError) as info:
        SamplingParams(**kwargs)
    err = info.value.errors()[0]
    assert err["loc"] == (field,)
    assert words in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("key", ["\u0663", " 5 ", "5_0", "+5", "-5", "5.0", "0x5", "\uff15", "",
                                 "1" * 5000, True])
def test_logit_bias_keys_are_ascii_decimal_token_ids_only(key):
    """``int()`` takes an Arabic-Indic 3, spaces and underscores: each a token the client
    never wrote."""
    with pytest.raises(ValidationError) as info:
        SamplingParams(logit_bias={key: 1.0})
    assert info.value.errors()[0]["loc"] == ("logit_bias",)
    assert "token ids" in str(info.value)
    if isinstance(key, str) and key and len(key) < 40:
        assert repr(key) in str(info.value)  # the key, as sent


def test_logit_bias_good_keys_and_one_token_named_twice():
    p = SamplingParams(logit_bias={"0": 1.0, "5": -2.0, "007": 3.0, "128000": 4.0, 9: 5.0})
    assert p.logit_bias == {0: 1.0, 5: -2.0, 7: 3.0, 128000: 4.0, 9: 5.0}
    with pytest.raises(ValidationError, match="token 5 twice"):
        SamplingParams(logit_bias={"5": 1.0, "05": -100.0})


def test_largest_accepted_values_build_sampling_tensors():
    """Every value validation lets through must survive the step's tensor building."""
    edge = SamplingParams(temperature=float(np.finfo(np.float32).max), top_k=2**63 - 1,
                          top_p=1e-300, min_p=1.0, seed=2**64 - 1, max_tokens=2**63 - 1,
                          stop=["s" * 1024] * 64, stop_token_ids=[2**63 - 1])
    meta = SamplingMetadata.from_params([edge, SamplingParams(temperature=0)])
    logits = torch.randn(2, 50)
    tokens = sample(logits, meta, [make_generator(edge.seed), None])
    assert 0 <= int(tokens[0]) < 50 and int(tokens[1]) == int(logits[1].argmax())


def test_params_are_frozen():
    with pytest.raises(ValidationError):
        SamplingParams().temperature = 0.5  # type: ignore[misc]


# -- logits processing -----------------------------------------------------------------


def reference_top_k_top_p(logits: torch.Tensor, k: int | None, p: float | None) -> torch.Tensor:
    """vLLM's sort-based apply_top_k_top_p, for one row set, as the oracle."""
    srt, idx = logits.sort(dim=-1)
    if k is not None:
        kth = srt[:, -k].unsqueeze(1)
        srt = srt.masked_fill(srt < kth, float("-inf"))
    if p is not None:
        cum = srt.softmax(-1).cumsum(-1)
        mask = cum <= 1 - p
        mask[:, -1] = False
        srt = srt.masked_fill(mask, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, idx, srt)


@pytest.mark.parametrize("vocab", [50, 3000])  # 3000 also exercises the full-sort fallback
@pytest.mark.parametrize(("k", "p"), [(5, None), (None, 0.9), (None, 0.3), (20, 0.8)])
def test_top_k_top_p_match_vllm_semantics(vocab, k, p):
    g = torch.Generator().manual_seed(vocab)
    scale = 0.05 if vocab > 1024 else 2.0  # a flat row puts the nucleus beyond 1024 tokens
    logits = torch.randn(8, vocab, generator=g) * scale
    n = logits.shape[0]
    got = process_logits(
        logits,
        None,
        None if k is None else torch.full((n,), k),
        None if p is None else torch.full((n,), p),
    )
    want = reference_top_k_top_p(logits, k, p)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.allclose(got[~torch.isinf(got)], logits[~torch.isinf(got)])


def test_temperature_min_p_and_per_row_settings():
    logits = torch.tensor([[2.0, 1.0, 0.0, -3.0]] * 3)
    temperature = torch.tensor([1.0, 0.5, 2.0])
    min_p = torch.tensor([0.0, 0.0, 0.3])  # row 2 keeps tokens >= 0.3 * max prob
    out = process_logits(logits, temperature, min_p=min_p)
    assert torch.allclose(out[0], logits[0]) and torch.allclose(out[1], logits[1] * 2)
    probs2 = (logits[2] / 2).softmax(-1)
    assert torch.equal(torch.isinf(out[2]), probs2 < 0.3 * probs2.max())
    probs = probs_from_logits(logits, temperature, min_p=min_p)
    assert torch.allclose(probs.sum(-1), torch.ones(3))
    assert logits.tolist() == [[2.0, 1.0, 0.0, -3.0]] * 3  # input untouched


def test_top_k_off_rows_keep_every_token():
    md = SamplingMetadata.from_params([SamplingParams(top_k=2), SamplingParams(seed=1)])
    probs = md.probs(torch.tensor([[3.0, 2.0, 1.0, 0.0]] * 2))
    assert (probs[0] > 0).tolist() == [True, True, False, False]
    assert (probs[1] > 0).all()


def test_all_greedy_metadata_is_just_a_mask():
    md = SamplingMetadata.from_params([SamplingParams(temperature=0)] * 3)
    assert md.all_greedy and md.temperature is None and md.top_k is None and md.top_p is None
    logits = torch.randn(3, 49152)
    with mock.patch.object(sampling_mod, "probs_from_logits", side_effect=AssertionError):
        assert torch.equal(sample(logits, md, [None] * 3), logits.argmax(-1))


def test_metadata_select_and_repeat():
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.5, top_p=0.9)]
    md = SamplingMetadata.from_params(params)
    assert md.temperature is not None and md.top_p is not None and md.min_p is None
    rep = md.repeat(np.array([2, 3]))
    assert rep.greedy.tolist() == [True, True, False, False, False]
    assert rep.temperature.tolist() == [1.0, 1.0, 0.5, 0.5, 0.5]
    sel = md.select(np.array([1]))
    assert sel.greedy.tolist() == [False] and sel.top_p.tolist() == pytest.approx([0.9])


# -- randomness ------------------------------------------------------------------------


def test_categorical_never_picks_zero_weight_and_handles_edges():
    w = torch.tensor([[0.0, 1.0, 0.0, 2.0, 0.0]] * 4)
    # u = 1 is outside [0, 1) but must still land on a positive-weight token
    u = torch.tensor([0.0, 0.3333, 0.34, 1.0], dtype=torch.float64)
    assert categorical(w, u).tolist() == [1, 1, 3, 3]


def test_categorical_matches_its_distribution():
    p = torch.tensor([0.1, 0.0, 0.5, 0.15, 0.25])
    n = 40_000
    u = torch.rand(n, generator=make_generator(0), dtype=torch.float64)
    counts = np.bincount(categorical(p.expand(n, -1), u).numpy(), minlength=5)
    expected = p.numpy() * n
    nz = expected > 0
    chi2 = (((counts - expected) ** 2)[nz] / expected[nz]).sum()
    assert counts[1] == 0 and chi2 < 25  # df = 3; 25 is far in the tail


def test_seeded_rows_draw_only_from_their_generator():
    gens = [make_generator(1), None, make_generator(2)]
    u = draw_uniforms(gens, [2, 3, 1])
    assert u.shape == (6,)
    assert torch.equal(u[:2], torch.rand(2, generator=make_generator(1), dtype=torch.float64))
    assert torch.equal(u[5:], torch.rand(1, generator=make_generator(2), dtype=torch.float64))


def test_seeded_sampling_ignores_batch_composition():
    g = torch.Generator().manual_seed(0)
    mine = SamplingParams(temperature=0.8, top_k=50, seed=42)
    steps = [torch.randn(1, 1000, generator=g) for _ in range(5)]
    alone_gen = [make_generator(42)]
    alone = [sample(x, SamplingMetadata.from_params([mine]), alone_gen).item() for x in steps]
    batch = [SamplingParams(), SamplingParams(temperature=0), mine, SamplingParams(seed=1)]
    md = SamplingMetadata.from_params(batch)
    gens = [None, None, make_generator(42), make_generator(1)]
    together = []
    for x in steps:
        logits = torch.cat([torch.randn(2, 1000), x, torch.randn(1, 1000)])
        together.append(sample(logits, md, gens)[2].item())
    assert together == alone


def test_sample_checks_shapes():
    md = SamplingMetadata.from_params([SamplingParams()] * 2)
    with pytest.raises(ValueError, match="num_rows=2"):
        sample(torch.randn(3, 10), md, [None] * 2)
    with pytest.raises(ValueError, match="generators"):
        sample(torch.randn(2, 10), md, [None])


def test_argmax_rows_is_torch_argmax_ties_nan_and_inf_included() -> None:
    """The C argmax greedy decoding uses must answer exactly as torch.argmax."""
    from draftwise.models.kernels import KERNELS
    from draftwise.sampling import argmax_rows

    torch.manual_seed(0)
    cases = [torch.randn(r, v) for r, v in ((5, 49152), (1, 7), (3, 16), (2, 17), (4, 100))]
    cases.append(torch.randint(0, 3, (64, 300)).float())  # many ties: the first index wins
    # widths around the kernel's vector widths (8 lanes on AVX2, 16 with AVX-512), the
    # maximum in the scalar tail, and signed zeros (equal: the first wins)
    cases += [torch.randn(3, v) for v in (8, 9, 15, 24, 31, 33)]
    tail = torch.zeros(2, 41)
    tail[0, 40] = 1.0
    tail[1, 35] = float("nan")
    cases.append(tail)
    zeros = torch.full((2, 20), -1.0)
    zeros[0, 3], zeros[0, 17] = -0.0, 0.0
    zeros[1, 3], zeros[1, 17] = 0.0, -0.0
    cases.append(zeros)
    cases.append(torch.full((3, 40), -float("inf")))
    x = torch.zeros(2, 50)
    x[0, 33] = x[0, 40] = 1.0
    x[1, 2], x[1, 3], x[1, 20] = 5.0, float("nan"), float("nan")  # the first NaN wins
    cases.append(x)
    for x in cases:
        assert torch.equal(argmax_rows(x), x.argmax(-1)), x.shape
    assert KERNELS is None or hasattr(KERNELS, "argmax_f32")
    # non-contiguous or non-fp32 rows take torch's path, same answer
    y = torch.randn(6, 300)
    assert torch.equal(argmax_rows(y[::2]), y[::2].argmax(-1))
    assert torch.equal(argmax_rows(y.bfloat16()), y.bfloat16().argmax(-1))
