"""The native greedy Markov pass (``core/csrc/markov.c``) picks bitwise what the torch pass picks.

The reference is the proposer's plain torch pass, written out here with the same calls
(:meth:`MarkovHead.latent`, :meth:`MarkovHead.bias`, the greedy pick's ``argmax_rows``),
one batched step per block position for every row still drafting. The kernel must give
the same tokens and previous tokens for every head type, with the screen on and off,
with windows of guessed positions (guesses that hold and guesses that fail), any lane
cap and thread count, rows of different lengths dropping out, planted exact ties across
64-output blocks and product chunks, and NaN logits; a row's picks must not depend on
what shares the call. The elementwise rounding the kernel's latent copies (tables of
torch's bf16 sigmoid/tanh, each op rounded to bf16) is checked against torch over every
bf16 value.
"""

from __future__ import annotations

import pytest
import torch
from draftwise.models import kernels, markov_kernel
from draftwise.models.kernels import KernelInputError
from draftwise.models.linear import BlockedWeight, pack_weights
from draftwise.sampling import argmax_rows
from draftwise_dspark.draft_vocab import DraftVocab
from draftwise_dspark.markov import MarkovHead, MarkovWeights
from draftwise_dspark import native as native_module
from draftwise_dspark.native import NativeMarkov, activation_tables, native_pass

pytestmark = pytest.mark.skipif(not kernels.available("markov_pass"),
                                reason="the C kernels are not built")

#: 79 blocks of 64 (the last one partial, 8 columns): three product chunks of 32 blocks
V, R = 5000, 32
KINDS = ("vanilla", "gated", "rnn")
ALL_BF16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def make_head(kind: str, h: int = 47, w2_std: float = 0.05, seed: int = 0,
              verifier_vocab: int | None = None) -> MarkovHead:
    """A random head on packed weights (h odd: the gate's K is odd); ``verifier_vocab``:
    a reduced draft vocabulary, W2's V rows a random ascending subset of W1's rows."""
    g = torch.Generator().manual_seed(seed)
    vocab = None
    if verifier_vocab is not None:
        ids = torch.randperm(verifier_vocab, generator=g)[:V].sort().values
        vocab = DraftVocab(ids.contiguous(), verifier_vocab)

    def rnd(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(shape, generator=g) * std).bfloat16()

    mats = [rnd(V, R, std=w2_std)]
    if kind == "gated":
        mats.append(rnd(R, h + R, std=0.2))
    elif kind == "rnn":
        mats.append(rnd(3 * R, 2 * R + h, std=0.2))
    if kind != "vanilla":  # four pre-activations pinned by the bias (zero weights) to
        mats[1][:4] = 0.0  # torch's saturated and denormal sigmoid/tanh results
    packed = pack_weights(mats)
    if not all(isinstance(p, BlockedWeight) for p in packed):
        pytest.skip("the native pass needs the packed bf16 layout")
    latent = None
    if kind != "vanilla":
        bias = rnd(packed[1].out_features, std=0.2)
        bias[:4] = torch.tensor([-89.0, -90.5, 12.0, -0.75])
        latent = (packed[1], bias)
    return MarkovHead(MarkovWeights(kind, rnd(verifier_vocab or V, R, std=0.3), packed[0],
                                    gate=latent if kind == "gated" else None,
                                    joint=latent if kind == "rnn" else None, vocab=vocab))


def torch_pass(head: MarkovHead, hidden: torch.Tensor, base: torch.Tensor, counts: list[int],
               anchors: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The proposer's plain greedy pass (full product at every position)."""
    starts = torch.tensor([0, *counts[:-1]]).cumsum(0)
    tok = torch.empty(base.shape[0], dtype=torch.int64)
    prev_of = torch.empty_like(tok)
    prev, first = torch.tensor(anchors), starts
    state = head.init_state(len(counts), hidden.dtype, hidden.device)
    live = list(range(len(counts)))
    for j in range(max(counts)):
        sel = [i for i, r in enumerate(live) if counts[r] > j]
        if len(sel) < len(live):
            keep = torch.tensor(sel)
            live = [live[i] for i in sel]
            prev, first = prev.index_select(0, keep), first.index_select(0, keep)
            if state is not None:
                state = state.index_select(0, keep)
        at = first + j
        prev_of[at] = prev
        u, state = head.latent(prev, hidden.index_select(0, at), state)
        pick = argmax_rows((base.index_select(0, at) + head.bias(u)).contiguous())
        tok[at] = pick
        prev = head.feed(pick)
    return tok, prev_of


def inputs(counts: list[int], h: int = 47, spread: float = 2.0, seed: int = 1
           ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    g = torch.Generator().manual_seed(seed)
    n = sum(counts)
    hidden = torch.randn(n, h, generator=g).bfloat16()
    base = (torch.randn(n, V, generator=g) * spread).bfloat16().float()
    anchors = torch.randint(0, V, (len(counts),), generator=g).tolist()
    return hidden, base, anchors


def native(head: MarkovHead, hidden: torch.Tensor, base: torch.Tensor, counts: list[int],
           anchors: list[int], *, depth: int = 0, lanes: int = 16, screen: bool = False,
           give_up: int = 4) -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:
    nat = native_pass(head, hidden.shape[1])
    assert nat is not None
    return markov_kernel.markov_pass(nat.kernel, hidden, base, counts, anchors, depth=depth,
                               lanes=lanes, screen=screen, give_up=give_up, max_blocks=10,
                               guess_tokens=64, w2_rows=head.w2_rows() if depth else None)


# -- the latent's elementwise arithmetic, over every bf16 value -------------------------------
def test_tables_are_torchs_bf16_activations_in_the_shapes_the_pass_uses() -> None:
    """Every bf16 input, as the gate's contiguous [R, r] and as the rnn's strided slices
    of a [R, 3r] projection output."""
    tables = activation_tables()
    for i, fn in enumerate((torch.sigmoid, torch.tanh)):
        for x in (ALL_BF16.view(256, 256), ALL_BF16[: 341 * 192].view(341, 192)[:, 64:128],
                  ALL_BF16[-227 * 192 :].view(227, 192)[:, 128:]):
            idx = x.contiguous().view(torch.int16).long() & 0xFFFF
            assert torch.equal(tables[i][idx], fn(x).view(torch.int16))


def test_the_rnn_update_rounds_each_op_to_bf16_once() -> None:
    """markov.c computes bf16(1 - g), bf16(a * b), bf16(a + b) from exact fp32 values;
    torch's bf16 ops must agree for every g (and random pairs for the two-input ops)."""
    finite = ALL_BF16[torch.isfinite(ALL_BF16)]
    assert torch.equal((1 - finite).view(torch.int16),
                       (1.0 - finite.float()).bfloat16().view(torch.int16))
    g = torch.Generator().manual_seed(5)
    a = finite[torch.randint(0, finite.numel(), (200_000,), generator=g)]
    b = finite[torch.randint(0, finite.numel(), (200_000,), generator=g)]
    for got, want in (((a * b), (a.float() * b.float())), ((a + b), (a.float() + b.float()))):
        assert torch.equal(got.view(torch.int16), want.bfloat16().view(torch.int16))


# -- the pass ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("counts", [[1], [7], [15], [3, 7, 1, 5], [15, 2, 9], [4, 4, 4, 4, 4, 4]])
def test_full_products_pick_what_the_torch_pass_picks(kind: str, counts: list[int]) -> None:
    head = make_head(kind)
    hidden, base, anchors = inputs(counts)
    want = torch_pass(head, hidden, base, counts, anchors)
    tok, prev, stats = native(head, hidden, base, counts, anchors)
    assert torch.equal(tok, want[0]) and torch.equal(prev, want[1])
    assert stats["kept"] == sum(counts) and stats["certified"] == 0
    assert stats["products"] == max(counts)  # one position per product, rows together


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("spread", "w2_std"), [(8.0, 0.02), (2.0, 0.05), (0.05, 0.5)])
def test_screen_and_windows_pick_what_the_torch_pass_picks(kind: str, spread: float,
                                                           w2_std: float) -> None:
    """A bias small against the margins (the screen certifies, guesses hold), middling,
    and large (the screen gives up, guesses fail and windows are cut)."""
    head = make_head(kind, w2_std=w2_std)
    counts = [15, 6, 11, 1]
    hidden, base, anchors = inputs(counts, spread=spread, seed=3)
    want = torch_pass(head, hidden, base, counts, anchors)
    seen = {}
    for depth, lanes, screen in ((0, 16, True), (3, 16, False), (14, 16, True), (14, 64, False),
                                 (5, 2, True), (2, 1, False)):
        tok, prev, stats = native(head, hidden, base, counts, anchors, depth=depth,
                                  lanes=lanes, screen=screen, give_up=1000)
        assert torch.equal(tok, want[0]) and torch.equal(prev, want[1]), (depth, lanes, screen)
        seen[(depth, lanes, screen)] = stats
    if spread > 5:
        assert seen[(0, 16, True)]["certified"] > 0, "a small bias must be certified"
        assert seen[(14, 64, False)]["products"] < max(counts), "guesses must hold"
    if spread < 1:
        assert seen[(14, 64, False)]["guesses"] > seen[(14, 64, False)]["guesses_held"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_reduced_draft_vocabulary_feeds_target_ids(kind: str) -> None:
    """W2 over 5000 draft tokens, W1 over 7000 verifier ids: tokens stay draft indices,
    every pick reaches the next latent as its target id (d2t), in windows whose guesses
    are compared as target ids too; anchors anywhere in W1's rows."""
    head = make_head(kind, verifier_vocab=7000, w2_std=0.02)
    assert head.w.vocab is not None
    counts = [15, 6, 11, 1]
    hidden, base, _ = inputs(counts, spread=8.0, seed=3)
    anchors = [6999, 0, 5123, 4999]
    want = torch_pass(head, hidden, base, counts, anchors)
    ids = head.w.vocab.ids
    assert bool((want[1] >= V).any()), "some previous tokens must be ids past W2's rows"
    for depth, lanes, screen in ((0, 16, True), (3, 16, False), (14, 64, False), (2, 1, False)):
        tok, prev, stats = native(head, hidden, base, counts, anchors, depth=depth,
                                  lanes=lanes, screen=screen, give_up=1000)
        assert torch.equal(tok, want[0]) and torch.equal(prev, want[1]), (depth, lanes, screen)
        if depth and lanes > 1:  # a small bias: guesses hold when compared as target ids
            assert stats["guesses_held"] > stats["guesses"] // 2, (depth, stats)
    at = 0
    for n, a in zip(counts, anchors):  # prev_j: the anchor, then d2t of the pick before
        assert int(want[1][at]) == a
        assert torch.equal(want[1][at + 1 : at + n], ids[want[0][at : at + n - 1]])
        at += n
    identity = make_head(kind, verifier_vocab=7000)  # the same weights fed draft indices
    identity.w.vocab = None
    with pytest.raises(KernelInputError, match="W2 is"):
        native(identity, hidden, base, counts, anchors)
    nat = native_pass(head, 47)
    assert nat is not None
    bad = ids.clone()
    bad[-1] = 7000
    with pytest.raises(KernelInputError, match="d2t holds ids outside W1's 7000 rows"):
        markov_kernel.markov_kernel_head(kind, head.w.w1, head.w.w2, activation_tables(), 47,
                                   {"gated": head.w.gate, "rnn": head.w.joint}.get(kind),
                                   head.row_norms, bad)


def near_ties(head: MarkovHead, hidden: torch.Tensor, counts: list[int], anchors: list[int]
              ) -> torch.Tensor:  # [N, V] fp32
    """``base_j = 10 - bias_j`` of the torch pass's own latents along its own picks, one
    random token 2e-6 (two fp32 ulps of 10) higher: every corrected logit is 10 within
    fp32 rounding and that token wins by two ulps, so a bias one bf16 ulp off anywhere (a
    latent or a product that rounds differently) moves the pick."""
    base = torch.empty(sum(counts), V)
    g = torch.Generator().manual_seed(11)
    at = 0
    for n, prev in zip(counts, anchors):
        state = head.init_state(1, hidden.dtype, hidden.device)
        for _ in range(n):
            u, state = head.latent(torch.tensor([prev]), hidden[at : at + 1], state)
            bias = head.bias(u)
            base[at] = 10.0 - bias[0]
            base[at, int(torch.randint(0, V, (1,), generator=g))] += 2e-6
            prev = int(argmax_rows((base[at : at + 1] + bias).contiguous())[0])
            at += 1
    return base


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("depth", "screen"), [(0, False), (6, True)])
def test_near_ties_everywhere_pick_what_the_torch_pass_picks(kind: str, depth: int,
                                                             screen: bool) -> None:
    head = make_head(kind, w2_std=0.2)
    counts = [15, 4, 9]
    hidden, _, anchors = inputs(counts, seed=10)
    base = near_ties(head, hidden, counts, anchors)
    want = torch_pass(head, hidden, base, counts, anchors)
    got = native(head, hidden, base, counts, anchors, depth=depth, screen=screen)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert len(set(want[0].tolist())) > 3, "the picks must move around the vocabulary"


@pytest.mark.parametrize("kind", KINDS)
def test_a_rows_picks_do_not_depend_on_what_shares_the_call(kind: str) -> None:
    head = make_head(kind)
    counts = [9, 15, 4]
    hidden, base, anchors = inputs(counts, seed=4)
    together = native(head, hidden, base, counts, anchors, depth=4, screen=True)
    at = 0
    for i, n in enumerate(counts):
        alone = native(head, hidden[at : at + n].contiguous(), base[at : at + n].contiguous(),
                       [n], [anchors[i]], depth=2, lanes=3)
        assert torch.equal(alone[0], together[0][at : at + n])
        assert torch.equal(alone[1], together[1][at : at + n])
        at += n


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_thread_count_changes_nothing(threads: int) -> None:
    head = make_head("rnn")
    counts = [7, 3]
    hidden, base, anchors = inputs(counts, seed=6)
    want = torch_pass(head, hidden, base, counts, anchors)
    kernels.set_kernel_threads(threads)
    try:
        got = native(head, hidden, base, counts, anchors, depth=3)
    finally:
        kernels.set_kernel_threads(None)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("screen", [False, True])
def test_planted_ties_pick_the_first_index(kind: str, screen: bool) -> None:
    """Three tokens tie exactly after correction at the first position: in chunk 0, in
    chunk 1 and in the last (partial) block; the pick is the first, by both paths."""
    head = make_head(kind, w2_std=0.01)
    hidden, _, _ = inputs([2], seed=7)
    anchors = [11]
    u, _ = head.latent(torch.tensor(anchors), hidden[:1], head.init_state(1, hidden.dtype,
                                                                           hidden.device))
    bias = head.bias(u)[0]
    base = torch.full((2, V), -50.0)
    for v in (130, 64 * 33 + 5, V - 3):
        base[0, v] = 10.0 - float(bias[v])
    base[1] = torch.linspace(-1, 1, V)
    corrected = base[0] + bias
    ties = (corrected == corrected.max()).nonzero().flatten().tolist()
    assert len(ties) == 3
    want = torch_pass(head, hidden, base, [2], anchors)
    got = native(head, hidden, base, [2], anchors, screen=screen, depth=1)
    assert int(got[0][0]) == ties[0] == int(want[0][0])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_the_screen_keeps_a_bias_aligned_with_its_row() -> None:
    """(test_markov's case, on the kernel's screen) u along W2[v0] gives v0 nearly the
    whole Cauchy-Schwarz bias, and only that bias lifts it over v1: a bound much tighter
    than |W2[v]| |u| rules the right answer out."""
    head = make_head("vanilla", w2_std=0.3)
    dense = head.w2_rows().float()
    hidden, _, _ = inputs([1])
    for v0 in (70, 64 * 40 + 3, V - 2):
        head.w.w1[5] = (dense[v0] / dense[v0].norm() * 2.0).bfloat16()
        u, _ = head.latent(torch.tensor([5]), hidden, None)
        bias = head.bias(u)[0]
        v1 = int(bias.argmin())
        base = torch.full((1, V), -100.0)
        base[0, v1] = -float(bias[v1])
        base[0, v0] = -0.9 * float(bias[v0])
        tok, _, stats = native(head, hidden, base, [1], [5], screen=True)
        assert int(tok[0]) == v0 and stats["certified"] == 1


def test_nan_logits_pick_the_first_nan_and_minus_inf_rows_the_first_index() -> None:
    head = make_head("vanilla")
    hidden, base, anchors = inputs([3], seed=8)
    base[0, 4000], base[0, 90] = float("nan"), float("nan")
    base[1] = float("-inf")
    want = torch_pass(head, hidden, base, [3], anchors)
    for screen in (False, True):
        got = native(head, hidden, base, [3], anchors, screen=screen)
        assert int(got[0][0]) == 90 and int(got[0][1]) == 0
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_native_markov_runs_its_windows_on_its_hit_rate() -> None:
    head = make_head("rnn", w2_std=0.02)
    nat = native_pass(head, 47)
    assert isinstance(nat, NativeMarkov)
    counts = [15]
    hidden, base, anchors = inputs(counts, spread=8.0, seed=9)
    want = torch_pass(head, hidden, base, counts, anchors)
    for _ in range(3):
        tok, prev, stats = nat.run(hidden, base, counts, anchors, screen=False, give_up=4)
        assert torch.equal(tok, want[0]) and torch.equal(prev, want[1])
    assert nat.hits.p > 0.5 and stats["products"] < 8


def test_bad_inputs_are_refused_before_the_kernel_runs() -> None:
    head = make_head("gated")
    nat = native_pass(head, 47)
    assert nat is not None
    hidden, base, anchors = inputs([3])
    call = dict(depth=0, lanes=4, screen=False, give_up=4, max_blocks=8, guess_tokens=64)
    with pytest.raises(KernelInputError, match="hidden"):
        markov_kernel.markov_pass(nat.kernel, hidden.float(), base, [3], anchors, **call)
    with pytest.raises(KernelInputError, match="base"):
        markov_kernel.markov_pass(nat.kernel, hidden, base[:, :-1].contiguous(), [3], anchors, **call)
    with pytest.raises(KernelInputError, match="sum"):
        markov_kernel.markov_pass(nat.kernel, hidden, base, [2], anchors, **call)
    with pytest.raises(KernelInputError, match="anchor"):
        markov_kernel.markov_pass(nat.kernel, hidden, base, [3], [V], **call)
    with pytest.raises(KernelInputError, match="projection"):
        markov_kernel.markov_kernel_head("rnn", head.w.w1, head.w.w2, activation_tables(),  # type: ignore[arg-type]
                                   47, head.w.gate)  # type: ignore[arg-type]
    assert native_pass(make_head("vanilla"), 47) is not None


# -- through the engine -----------------------------------------------------------------------
def engine_passes(target_dir, drafter, use_native: bool, sampled: bool
                  ) -> tuple[list[tuple[torch.Tensor, ...]], list[list[int]], dict]:
    """Every Markov pass's (tokens, previous tokens[, q]) of a batched generation, on the
    native pass or the torch pass (the proposer's switch), and the outputs."""
    from draftwise import LLM, SamplingParams

    from .test_engine import PROMPTS, fixed

    extra = {"draft_sample_method": "probabilistic"} if sampled else {}
    llm = LLM(model=str(target_dir), dtype="bfloat16", max_num_seqs=4,
              speculative_config=fixed(drafter, **extra))
    prop = llm.engine.spec.proposers[0]
    assert prop.native is not None, "a rank-32 bf16 drafter runs the native pass"
    if not use_native:
        prop.native = None
    seen: list[tuple[torch.Tensor, ...]] = []
    real = prop._markov_pass

    def record(*a):
        out = real(*a)
        seen.append(tuple(x.clone() for x in out if x is not None))
        return out

    prop._markov_pass = record
    # sampled mode with a mixed batch: rows at temperature 0 and 0.8 (the torch pass) and
    # all-greedy batches (the native pass, q one-hot) both occur as requests finish
    params = [SamplingParams(temperature=0.8 if sampled and i == 0 else 0.0, seed=3 + i,
                             max_tokens=12 + 4 * i, ignore_eos=True) for i in range(len(PROMPTS))]
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    return seen, [o.outputs[0].token_ids for o in outs], llm.engine.spec.proposer_stats()[0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sampled", [False, True])
def test_the_engine_drafts_the_same_on_either_pass(target_dir, tmp_path, kind: str,
                                                   sampled: bool) -> None:
    from .conftest import save_dspark

    drafter = save_dspark(tmp_path / kind, target_dir, kind=kind, rank=32, markov_std=0.3)
    got, out, stats = engine_passes(target_dir, drafter, True, sampled)
    want, want_out, _ = engine_passes(target_dir, drafter, False, sampled)
    assert out == want_out and len(got) == len(want) > 0
    for a, b in zip(got, want):
        assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    assert stats["markov_native_picks"] > 0


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_on_the_native_pass_is_identical_to_speculation_off(target_dir, tmp_path,
                                                                   kind: str) -> None:
    from ..conftest import assert_clean, generate
    from .conftest import save_dspark
    from .test_engine import PROMPTS, spec

    drafter = save_dspark(tmp_path / kind, target_dir, kind=kind, rank=32)
    want = [generate(target_dir, None, [p])[0][0] for p in PROMPTS]
    got, llm = generate(target_dir, spec(drafter), PROMPTS, max_num_seqs=4)
    assert got == want
    stats = llm.engine.spec.proposer_stats()[0]
    assert stats["markov_native_picks"] == stats["markov_steps"] > 0
    assert_clean(llm)


def test_the_torch_pass_runs_where_the_kernel_cannot(monkeypatch) -> None:
    """One decision (``native_pass``): no built kernel, or a W2 not packed for it (fp32,
    oneDNN, GGUF-quantized drafters), leaves the pass to torch."""
    head = make_head("rnn")
    assert native_pass(head, 47) is not None
    dense = MarkovHead(MarkovWeights("vanilla", head.w.w1, head.w2_rows().float()))
    assert native_pass(dense, 47) is None
    monkeypatch.setattr(native_module, "markov_pass_built", lambda: False)
    assert native_pass(head, 47) is None
