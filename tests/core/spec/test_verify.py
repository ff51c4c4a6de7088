"""Verification: vLLM's trio (greedy tables, seeded determinism, distribution) and more."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch

from draftwise.spec import verify as verify_mod
from draftwise.sampling import SamplingMetadata, SamplingParams, make_generator, sample
from draftwise.spec.verify import (
    MAX_SPEC_LEN,
    PLACEHOLDER_TOKEN_ID,
    VerifyInputError,
    rejection_sample_reference,
    verify,
)

GREEDY = SamplingParams(temperature=0)
VOCAB = 100


def one_hot_logits(target_tokens: list[list[int]], vocab: int = VOCAB) -> torch.Tensor:
    """Logits whose argmax is the given token at each position (vLLM's create_logits_tensor)."""
    rows = [t for seq in target_tokens for t in seq]
    logits = torch.full((len(rows), vocab), -100.0)
    logits[torch.arange(len(rows)), torch.tensor(rows)] = 100.0
    return logits


def run_greedy(drafts: list[list[int]], targets: list[list[int]], method: str = "standard"):
    flat = [t for d in drafts for t in d]
    return verify(
        one_hot_logits(targets), flat, [len(d) for d in drafts], [GREEDY] * len(drafts),
        [None] * len(drafts), method=method,
    )


# -- greedy tables --------------------------------------------------------------------


@pytest.mark.parametrize("method", ["standard", "block"])
@pytest.mark.parametrize(
    ("drafts", "targets", "expected", "accepted"),
    [
        # perfect match: every draft accepted, then the bonus token
        ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]], [3]),
        # early mismatch: accepted prefix, then the target's correction
        ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5]], [1]),
        # mismatch at the first token: only the correction
        ([[7, 2, 3]], [[1, 2, 3, 4]], [[1]], [0]),
        # empty draft: plain greedy decoding (the bonus position only)
        ([[]], [[5]], [[5]], [0]),
        # mixed batch with different draft lengths
        (
            [[1, 2], [3], [], [4, 5, 6], [9, 9]],
            [[1, 2, 7], [3, 8], [6], [4, 0, 6, 1], [2, 9, 9]],
            [[1, 2, 7], [3, 8], [6], [4, 0], [2]],
            [2, 1, 0, 1, 0],
        ),
    ],
)
def test_greedy_tables(drafts, targets, expected, accepted, method):
    res = run_greedy(drafts, targets, method)
    assert res.output_token_ids == expected
    assert res.num_accepted == accepted
    ref = rejection_sample_reference(
        one_hot_logits(targets), [t for d in drafts for t in d], [len(d) for d in drafts],
        [GREEDY] * len(drafts), [None] * len(drafts), method=method,
    )
    assert torch.equal(ref, res.to_padded(ref.shape[1]))


def test_padded_buffer_uses_placeholder():
    res = run_greedy([[1, 2, 3], []], [[1, 5, 3, 4], [6]])
    buf = res.to_padded(4)
    assert buf.tolist() == [[1, 5, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID], [6] + [-1] * 3]


def test_all_greedy_batch_never_builds_probabilities():
    with mock.patch.object(SamplingMetadata, "probs", side_effect=AssertionError("softmax")):
        res = run_greedy([[1, 2], [3]], [[1, 2, 3], [4, 5]])
    assert res.output_token_ids == [[1, 2, 3], [4]]


def test_greedy_rows_in_a_mixed_batch_are_unaffected():
    targets = [[1, 2, 3], [4, 5]]
    logits = torch.cat([one_hot_logits(targets), torch.randn(3, VOCAB)])
    params = [GREEDY, GREEDY, SamplingParams(seed=3)]
    res = verify(logits, [1, 2, 4, 9, 9], [2, 1, 2], params, [None, None, make_generator(3)])
    assert res.output_token_ids[:2] == [[1, 2, 3], [4, 5]]
    assert 1 <= len(res.output_token_ids[2]) <= 3


# -- seeded determinism and plain-sampling identity -------------------------------------


def random_batch(seed: int, num_rows: int, vocab: int = 50, max_k: int = 4, probs: bool = False):
    """Random logits, drafts and mixed sampling settings (some greedy, some seeded)."""
    g = torch.Generator().manual_seed(seed)
    nd = torch.randint(0, max_k + 1, (num_rows,), generator=g).tolist()
    logits = torch.randn(sum(nd) + num_rows, vocab, generator=g) * 2
    drafts = torch.randint(0, vocab, (sum(nd),), generator=g)
    choices = [
        GREEDY,
        SamplingParams(seed=11),
        SamplingParams(temperature=0.7, top_k=8, seed=12),
        SamplingParams(top_p=0.8, min_p=0.05, seed=13),
        SamplingParams(temperature=1.3, seed=14),
    ]
    params = [choices[i % len(choices)] for i in range(num_rows)]
    dp = torch.rand(sum(nd), vocab, generator=g).pow(3).softmax(-1) if probs else None
    return logits, drafts, nd, params, dp


def gens(params: list[SamplingParams]) -> list[torch.Generator | None]:
    return [None if p.seed is None else make_generator(p.seed) for p in params]


@pytest.mark.parametrize("method", ["standard", "block"])
@pytest.mark.parametrize("probs", [False, True])
def test_fast_path_matches_reference_token_for_token(method, probs):
    for seed in range(6):
        logits, drafts, nd, params, dp = random_batch(seed, 12, probs=probs)
        fast = verify(logits, drafts, nd, params, gens(params), dp, method)
        ref = rejection_sample_reference(logits, drafts, nd, params, gens(params), dp, method)
        assert torch.equal(fast.to_padded(ref.shape[1]), ref)
        assert fast.num_accepted == [len(t) - 1 for t in fast.output_token_ids]


@pytest.mark.parametrize("method", ["standard", "block"])
def test_same_seeds_same_outputs(method):
    logits, drafts, nd, params, dp = random_batch(1, 20, probs=True)
    a = verify(logits, drafts, nd, params, gens(params), dp, method)
    b = verify(logits, drafts, nd, params, gens(params), dp, method)
    assert a == b


@pytest.mark.parametrize("method", ["standard", "block"])
@pytest.mark.parametrize("probs", [False, True])
def test_seeded_row_ignores_batch_composition(method, probs):
    vocab = 30
    g = torch.Generator().manual_seed(0)
    mine_logits = torch.randn(4, vocab, generator=g)
    mine_drafts = [3, 4, 5]
    mine_q = torch.rand(3, vocab, generator=g).softmax(-1)
    mine = SamplingParams(temperature=0.9, seed=1234)
    alone = verify(
        mine_logits, mine_drafts, [3], [mine], [make_generator(1234)],
        mine_q if probs else None, method,
    )
    for other_rows in (1, 5):
        nd = [2] * other_rows
        other_logits = torch.randn(3 * other_rows, vocab, generator=g)
        logits = torch.cat([other_logits, mine_logits])
        drafts = torch.randint(0, vocab, (2 * other_rows,), generator=g).tolist() + mine_drafts
        params = [SamplingParams()] * other_rows + [mine]
        q = torch.cat([torch.rand(2 * other_rows, vocab).softmax(-1), mine_q]) if probs else None
        together = verify(
            logits, drafts, nd + [3], params, [None] * other_rows + [make_generator(1234)], q,
            method,
        )
        assert together.output_token_ids[-1] == alone.output_token_ids[0]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(seed=5),
        SamplingParams(temperature=0.6, top_k=10, seed=6),
        SamplingParams(top_p=0.5, min_p=0.02, seed=7),
    ],
)
def test_zero_draft_row_is_plain_sampling_bitwise(params):
    """Speculation off (sample) and a row with no drafts (verify) give the same tokens."""
    g = torch.Generator().manual_seed(9)
    batch = [params, GREEDY, SamplingParams(seed=8)]
    gen_a, gen_b = gens(batch), gens(batch)
    for _ in range(10):
        logits = torch.randn(3, 4000, generator=g) * 3
        off = sample(logits, SamplingMetadata.from_params(batch), gen_a).tolist()
        on = verify(logits, [], [0, 0, 0], batch, gen_b).output_token_ids
        assert on == [[t] for t in off]


def test_each_random_row_draws_num_draft_plus_one_uniforms():
    logits, drafts, nd, _, dp = random_batch(3, 4, max_k=3)
    params = [SamplingParams(seed=s) for s in range(4)]
    used = gens(params)
    verify(logits, drafts, nd, params, used, dp)
    for s, (g, n) in enumerate(zip(used, nd)):
        fresh = make_generator(s)
        torch.rand(n + 1, generator=fresh, dtype=torch.float64)
        assert torch.equal(g.get_state(), fresh.get_state())


# -- the distribution test -------------------------------------------------------------

DV = 6  # tiny vocabulary
CONTEXT_TOKEN = 0


def chain_tables(seed: int = 2, alpha: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """Target and draft "models": fixed tables p(x_t | x_{t-1}) and q(x_t | x_{t-1})."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(DV, alpha), DV), rng.dirichlet(np.full(DV, alpha), DV)


def processed(table: np.ndarray, temperature: float, top_k: int | None) -> np.ndarray:
    """Independent numpy version of temperature + top-k, for the expected distribution."""
    logits = np.log(table) / temperature
    if top_k is not None:
        kth = np.sort(logits, 1)[:, -top_k][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def generate(target, draft, method, probabilistic, params, num_seqs, k, length, seed,
             verify_fn=verify):
    """Speculative generation of ``length`` tokens for many independent sequences at once.

    ``verify_fn``: the verify under test (the device kernel's tests pass theirs)."""
    rng = np.random.default_rng(seed)
    seqs: list[list[int]] = [[] for _ in range(num_seqs)]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        while True:
            idx = [i for i in range(num_seqs) if len(seqs[i]) < length]
            if not idx:
                break
            n = len(idx)
            cur = np.array([seqs[i][-1] if seqs[i] else CONTEXT_TOKEN for i in idx])
            drafts = np.empty((n, k), np.int64)
            q_rows = np.empty((n, k, DV))
            t_rows = np.empty((n, k + 1, DV))
            for j in range(k):  # the draft model samples x_j ~ q(. | x_{j-1})
                t_rows[:, j], q_rows[:, j] = target[cur], draft[cur]
                cur = (rng.random(n)[:, None] > draft[cur].cumsum(1)).sum(1).clip(max=DV - 1)
                drafts[:, j] = cur
            t_rows[:, k] = target[cur]
            res = verify_fn(
                torch.from_numpy(np.log(t_rows).reshape(-1, DV)).float(),
                drafts.reshape(-1),
                [k] * n,
                SamplingMetadata.from_params([params]).repeat(np.array([n])),
                [None] * n,
                torch.from_numpy(q_rows.reshape(-1, DV)).float() if probabilistic else None,
                method,
            )
            for i, toks in zip(idx, res.output_token_ids):
                seqs[i].extend(toks)
    return np.array([s[:length] for s in seqs])


def chi_square(samples: np.ndarray, p: np.ndarray) -> tuple[float, float, float]:
    """Chi-square of the joint distribution of the first tokens vs the exact chain.

    Returns (statistic, threshold at significance 1e-6, total variation distance);
    cells expected below 5 are pooled.
    """
    length = samples.shape[1]
    exact = p[CONTEXT_TOKEN]
    for _ in range(length - 1):
        exact = exact[..., None] * p.reshape((1,) * (exact.ndim - 1) + (DV, DV))
    exact = exact.ravel()
    n = len(samples)
    observed = np.bincount(np.ravel_multi_index(samples.T, [DV] * length), minlength=DV**length)
    expected = exact * n
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    stat = float(((obs - exp) ** 2 / np.where(keep, exp, 1))[keep].sum())
    assert observed[exact == 0].sum() == 0, "a token the target gives probability 0 was emitted"
    df = int(keep.sum()) - 1
    z = 4.75  # one-sided normal quantile of 1e-6; Wilson-Hilferty approximation below
    threshold = df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3
    tv = 0.5 * float(np.abs(observed / n - exact).sum())
    return stat, threshold, tv


NUM_SEQS, K, LENGTH = 30_000, 3, 3
PLAIN = (SamplingParams(), 1.0, None)
PROCESSED = (SamplingParams(temperature=0.7, top_k=4), 0.7, 4)


@pytest.mark.parametrize(
    ("method", "probabilistic", "setting"),
    [
        ("standard", False, PLAIN),
        ("standard", True, PROCESSED),
        ("block", False, PROCESSED),
        ("block", True, PLAIN),
    ],
)
def test_output_distribution_is_the_target(method, probabilistic, setting):
    target, draft = chain_tables()
    params, temperature, top_k = setting
    samples = generate(target, draft, method, probabilistic, params, NUM_SEQS, K, LENGTH, 0)
    stat, threshold, tv = chi_square(samples, processed(target, temperature, top_k))
    assert stat < threshold, f"chi2={stat:.1f} >= {threshold:.1f} (TV {tv:.4f})"


@pytest.mark.parametrize("method", ["standard", "block"])
def test_greedy_speculation_equals_plain_greedy_decoding(method):
    """Spec-on vs spec-off identity for greedy requests, whatever the drafts are."""
    target, draft = chain_tables()
    chain = [CONTEXT_TOKEN]
    for _ in range(8):
        chain.append(int(target[chain[-1]].argmax()))
    spec = generate(target, draft, method, True, GREEDY, 20, K, 8, 0)
    plain = generate(target, draft, method, False, GREEDY, 20, 0, 8, 0)
    assert (spec == chain[1:]).all() and (plain == chain[1:]).all()


_right_residual = verify_mod._residual
WRONG_RULES = {
    # accept with min(1, q/p) instead of min(1, p/q)
    "accept_q_over_p": (
        "standard", True, {"_standard_accept_prob": lambda p, q: np.minimum(1.0, q / p)}
    ),
    # recover from p instead of the residual max(p - q, 0)
    "recover_from_p": ("standard", False, {"_residual": lambda p, q, x, s: p}),
    "recover_from_p_probabilistic": ("standard", True, {"_residual": lambda p, q, x, s: p}),
    # block: threshold h_i = p_i, without the residual mass
    "block_h_without_residual": ("block", True, {"_block_threshold": lambda p, r, last: p}),
    "block_h_without_residual_one_hot": (
        "block", False, {"_block_threshold": lambda p, r, last: p}
    ),
    # block: recover from max(p - q, 0) instead of max(p_tau * p - q, 0)
    "block_residual_without_p_tau": (
        "block", True,
        {"_residual": lambda p, q, x, s: _right_residual(p, q, x, np.ones_like(s))},
    ),
}


@pytest.mark.parametrize("rule", sorted(WRONG_RULES))
def test_distribution_test_detects_a_wrong_rule(rule):
    method, probabilistic, patch = WRONG_RULES[rule]
    target, draft = chain_tables()
    with mock.patch.multiple(verify_mod, **patch):
        samples = generate(target, draft, method, probabilistic, SamplingParams(), NUM_SEQS, K,
                           LENGTH, 0)
    stat, threshold, tv = chi_square(samples, processed(target, 1.0, None))
    assert stat > threshold, f"{rule} not detected: chi2={stat:.1f} < {threshold:.1f}"


# -- input errors ---------------------------------------------------------------------


def test_bad_inputs_raise_typed_errors():
    logits = torch.randn(5, 10)
    p2 = [SamplingParams(seed=1)] * 2
    ok = dict(target_logits=logits, draft_token_ids=[1, 2, 3], num_draft_tokens=[2, 1],
              sampling=p2, generators=[None, None])
    verify(**ok)
    cases = {
        "target_logits": dict(target_logits=torch.randn(4, 10)),
        "draft tokens but": dict(draft_token_ids=[1, 2]),
        "draft token ids must be in": dict(draft_token_ids=[1, 2, 10]),
        "draft_probs must be": dict(draft_probs=torch.rand(3, 9)),
        "generators": dict(generators=[None]),
        "not one of": dict(method="typical"),
        "num_draft_tokens must be": dict(num_draft_tokens=[3, -1]),
    }
    for message, change in cases.items():
        with pytest.raises(VerifyInputError, match=message):
            verify(**{**ok, **change})
    n = MAX_SPEC_LEN + 1
    with pytest.raises(VerifyInputError, match=str(MAX_SPEC_LEN)):
        verify(torch.randn(n + 1, 10), [0] * n, [n], p2[:1], [None])


def test_block_accepts_more_than_standard_with_draft_probabilities():
    """Block verification is lossless AND longer on average (Sun et al.); guards against a
    "block" that silently runs standard rejection sampling."""
    target, draft = chain_tables()
    rng = np.random.default_rng(0)
    n, cur = 30_000, np.zeros(30_000, dtype=np.int64)
    drafts, q, t = np.empty((n, K), np.int64), np.empty((n, K, DV)), np.empty((n, K + 1, DV))
    for j in range(K):
        t[:, j], q[:, j] = target[cur], draft[cur]
        cur = (rng.random(n)[:, None] > draft[cur].cumsum(1)).sum(1).clip(max=DV - 1)
        drafts[:, j] = cur
    t[:, K] = target[cur]
    md = SamplingMetadata.from_params([SamplingParams()]).repeat(np.array([n]))
    mean = {}
    for method in ("standard", "block"):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            res = verify(
                torch.from_numpy(np.log(t).reshape(-1, DV)).float(), drafts.reshape(-1), [K] * n,
                md, [None] * n, torch.from_numpy(q.reshape(-1, DV)).float(), method,
            )
        mean[method] = float(np.mean(res.num_accepted))
    assert mean["block"] > mean["standard"] + 0.04, mean
