"""Adaptive depth's decision rule, tested with injected timings (the rule, not the clock)."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.spec.adaptive import AcceptanceEstimate, DepthPolicy
from draftwise.spec.depth_rule import choose_depths
from draftwise.config.adaptive import AdaptiveConfig
from draftwise.spec.cost_model import CostModel


def linear(base: float, per_token: float):
    """A forward whose time grows linearly in the batch's tokens."""
    return lambda tokens: base + per_token * tokens


def test_expected_tokens_is_the_geometric_formula() -> None:
    a = 0.7
    est = AcceptanceEstimate([a] * 5)
    for k in range(6):
        assert est.expected_tokens(k) == pytest.approx((1 - a ** (k + 1)) / (1 - a))


def test_free_drafts_are_taken_to_the_cap() -> None:
    # drafts cost nothing: any positive acceptance is worth verifying
    assert choose_depths([[0.2] * 4], [[1.0] * 4], [4], linear(1.0, 0.0)) == [4]


def test_expensive_drafts_turn_speculation_off() -> None:
    # one extra token costs half the plain step: only well-accepted drafts pay
    assert choose_depths([[0.5] * 4], [[1.0] * 4], [4], linear(1.0, 1.0)) == [0]
    assert choose_depths([[0.99] * 4], [[1.0] * 4], [4], linear(1.0, 1.0)) == [4]


def test_depth_is_the_argmax_of_tokens_per_second() -> None:
    rates, base, per = [0.9, 0.8, 0.3, 0.3], 10.0, 2.0
    est = AcceptanceEstimate(rates)
    best = max(range(5), key=lambda k: est.expected_tokens(k) / (base + per * (1 + k)))
    assert choose_depths([rates], [[1.0] * 4], [4], linear(base, per)) == [best] == [2]


def test_batch_gives_drafts_to_the_rows_that_accept() -> None:
    ks = choose_depths(
        [[0.95] * 4, [0.1] * 4, [0.8] * 4], [[1.0] * 4] * 3, [4, 4, 2], linear(3.0, 1.0)
    )
    assert ks[1] == 0 and ks[0] >= ks[2] > 0 and ks[2] <= 2


def test_batch_choice_is_the_exhaustive_optimum() -> None:
    """Against every allocation of two rows, with drafts not always made (short n-gram
    matches): a linear step cost makes the optimum a threshold on cumulative acceptance,
    which is what walking the candidates in order finds."""
    import itertools

    rates = [[0.9, 0.7, 0.5, 0.3], [0.6, 0.6, 0.6, 0.6]]
    made = [[1.0, 0.8, 0.5, 0.2], [0.9, 0.3, 0.1, 0.05]]
    step = linear(1.0, 0.3)

    def tput(ks: tuple[int, ...]) -> float:
        gain = tokens = 2.0
        for r, d, k in zip(rates, made, ks):
            cum = 1.0
            for j in range(k):
                cum *= r[j]
                gain += d[j] * cum
                tokens += d[j]
        return gain / step(tokens)

    best = max(tput(ks) for ks in itertools.product(range(5), repeat=2))
    chosen = choose_depths(rates, made, [4, 4], step)
    assert tput(tuple(chosen)) == pytest.approx(best, rel=2e-3)


def test_fair_choice_is_the_exhaustive_optimum_of_the_log_rates() -> None:
    """The fair objective (sum over rows of log E_i, minus rows x log step) against every
    allocation of three rows, with floors and drafts not always made."""
    import itertools
    import math

    rates = [[0.97, 0.95, 0.9, 0.9], [0.3, 0.3, 0.3, 0.3], [0.7, 0.6, 0.5, 0.4]]
    made = [[1.0, 1.0, 0.9, 0.8], [0.9, 0.5, 0.2, 0.1], [1.0, 0.7, 0.5, 0.3]]
    step = linear(6.0, 0.4)

    def value(ks: tuple[int, ...]) -> float:
        logs, tokens = 0.0, 3.0
        for r, d, k in zip(rates, made, ks):
            cum, e = 1.0, 1.0
            for j in range(k):
                cum *= r[j]
                e += d[j] * cum
                tokens += d[j]
            logs += math.log(e)
        return logs - 3 * math.log(step(tokens))

    for floors in ([0, 0, 0], [0, 2, 0]):
        allowed = [ks for ks in itertools.product(range(5), repeat=3)
                   if all(k >= f for k, f in zip(ks, floors))]
        best = max(value(ks) for ks in allowed)
        chosen = choose_depths(rates, made, [4, 4, 4], step, floors=floors, fair=True)
        assert all(k >= f for k, f in zip(chosen, floors))
        assert value(tuple(chosen)) == pytest.approx(best, abs=2e-3)


def test_fair_keeps_one_row_from_slowing_seven() -> None:
    """One row accepting nearly everything, seven accepting little, and a draft token
    costing 9% of the step (8 rows on one thread here): throughput verifies the first
    row's drafts (the batch makes more tokens per second), fair does not (its 1.97x
    costs the seven others 9% each); with drafts at 2% of the step both verify them."""
    rates = [[0.97] * 4] + [[0.1] * 4] * 7
    made, caps = [[1.0] * 4] * 8, [4] * 8
    dear = linear(3.0, 1.0)  # 11 at 8 tokens, +1 per draft
    cheap = linear(9.4, 0.2)
    assert choose_depths(rates, made, caps, dear) == [4, 0, 0, 0, 0, 0, 0, 0]
    assert choose_depths(rates, made, caps, dear, fair=True) == [0] * 8
    assert choose_depths(rates, made, caps, cheap, fair=True) == [4, 0, 0, 0, 0, 0, 0, 0]


def test_fair_and_throughput_agree_on_one_row() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        rates = [sorted(rng.uniform(0, 1, 4), reverse=True)]
        made = [list(rng.uniform(0.2, 1, 4))]
        step = linear(1.0, float(rng.uniform(0.01, 1.0)))
        assert choose_depths(rates, made, [4], step, fair=True) == choose_depths(
            rates, made, [4], step)


@pytest.mark.parametrize(("objective", "waiting", "fair"), [
    ("auto", 0, True), ("auto", 3, False), ("throughput", 0, False), ("fair", 3, True),
])
def test_objective_follows_the_queue(objective: str, waiting: int, fair: bool) -> None:
    pol = policy(objective=objective)
    pol.set_waiting(waiting)
    assert pol.fair is fair


def test_draft_cost_counts() -> None:
    free = choose_depths([[0.7] * 4], [[1.0] * 4], [4], linear(1.0, 0.05), 0.0)
    dear = choose_depths([[0.7] * 4], [[1.0] * 4], [4], linear(1.0, 0.05), 1.0)
    assert free == [4] and dear == [0]


def policy(**settings) -> DepthPolicy:
    # a forward of r rows x t tokens costs r * (1 + 0.5 t) "seconds": drafts are dear
    rows, toks = [1, 2, 4], [1, 2, 3, 4, 5]
    grid = [[r * (1 + 0.5 * t) for t in toks] for r in rows]
    return DepthPolicy(AdaptiveConfig(**settings), 4, CostModel(rows, toks, grid))


def test_off_rows_are_probed_and_recover() -> None:
    pol = policy(prior=0.1, probe_interval=3, probe_depth=2)
    est = pol.new_estimate()
    seen = [pol.choose([est], [4])[0] for _ in range(6)]
    assert seen == [2, 0, 0, 2, 0, 0]  # its first decode step is a probe, then every 3rd
    for _ in range(4):  # the text turned repetitive: every probe is accepted
        pol.observe(est, 2, 2, 2)
    assert est.rates[0] > 0.7 and pol.choose([est], [4])[0] > 0


def test_observe_updates_only_reached_positions() -> None:
    est = AcceptanceEstimate([0.5] * 4)
    est.observe(0.5, num_asked=4, num_drafted=4, num_accepted=1)  # 0 held, 1 failed, 2-3 unseen
    assert est.rates == [0.75, 0.25, 0.5, 0.5] and est.draft_rates == [1.0] * 4
    est.observe(0.5, num_asked=3, num_drafted=1, num_accepted=0)  # a 1-token draft, rejected
    assert est.rates == [0.375, 0.25, 0.5, 0.5]
    assert est.draft_rates == [1.0, 0.5, 0.5, 1.0]  # position 3 was not asked for


def test_cap_bounds_the_choice() -> None:
    pol = policy(prior=1.0)
    assert pol.choose([pol.new_estimate(), pol.new_estimate()], [1, 0]) == [1, 0]


def test_failed_probes_back_off_and_an_accepted_one_resets() -> None:
    pol = policy(prior=0.0, probe_interval=2, probe_backoff=2.0, max_probe_interval=8)
    est = pol.new_estimate()

    def next_probe() -> int:
        """Steps until the next probe; the probe's drafts are all rejected."""
        for n in range(1, 100):
            if pol.choose([est], [4])[0]:
                return n
        raise AssertionError("never probed")

    gaps = []
    for _ in range(5):
        gaps.append(next_probe())
        pol.observe(est, 1, 1, 0)  # drafted, rejected
    # the first decode step is a probe; then 4, 8, capped at max_probe_interval
    assert gaps == [1, 4, 8, 8, 8] and est.probe_fails == 5
    assert next_probe() == 8
    pol.observe(est, 1, 1, 1)  # the text turned repetitive: the probe held
    assert est.probe_fails == 0
    est.rates[0] = 0.0  # (the rule keeps it off: only the probe timing is under test)
    assert next_probe() == 2


def test_a_probe_that_got_no_draft_does_not_back_off() -> None:
    pol = policy(prior=0.0, probe_interval=3)
    est = pol.new_estimate()
    assert pol.choose([est], [4]) == [1] and est.probing  # the first step's probe
    pol.observe(est, 1, 0, 0)  # the lookup found nothing: no evidence either way
    assert est.probe_fails == 0 and not est.probing
    assert pol.probe_interval(est) == 3


def test_no_backoff_keeps_the_interval() -> None:
    pol = policy(prior=0.0, probe_interval=3, probe_backoff=1.0)
    est = pol.new_estimate()
    est.probe_fails = 10
    assert pol.probe_interval(est) == 3


def test_the_starting_rates_are_a_weak_prior() -> None:
    """A fresh request's own first outcomes outweigh the population's rates: with
    prior_strength 1 the first rejection halves p_1, the second takes a third more, and
    only then does the running mean settle to ew_weight."""
    pol = policy(prior=0.8, prior_strength=1.0, ew_weight=0.25)
    est = pol.new_estimate()
    pol.observe(est, 1, 1, 0)
    assert est.rates[0] == pytest.approx(0.4)
    pol.observe(est, 1, 1, 0)
    assert est.rates[0] == pytest.approx(0.4 * 2 / 3)
    pol.observe(est, 1, 1, 0)
    assert est.rates[0] == pytest.approx(0.4 * 2 / 3 * 3 / 4)
    pol.observe(est, 1, 1, 0)
    assert est.rates[0] == pytest.approx(0.4 * 2 / 3 * 3 / 4 * 3 / 4)  # w = ew_weight now
    assert est.seen[:2] == [4, 0] and est.draft_seen[:2] == [4, 0]


def test_a_weak_prior_turns_a_bad_prompt_off_sooner() -> None:
    """Optimistic population rates (grounded prompts ran first), then a prompt whose
    drafts all fail: it stops drafting after fewer wasted steps than at ew_weight alone."""

    def wasted(strength: float) -> int:
        pol = policy(prior=0.95, prior_strength=strength, probe_interval=1000)
        est, n = pol.new_estimate(), 0
        while pol.choose([est], [4])[0]:
            n += 1
            pol.observe(est, 4, 4, 0)
        return n

    assert wasted(1.0) < wasted(1000.0)  # 1000: effectively ew_weight from the start


def test_step_seconds_table_matches_the_cost_model() -> None:
    pol = policy()
    for rows in (1, 3, 4, 9):
        f = pol.step_seconds(rows)
        for tokens in (rows, rows + 0.5, rows + 1.0, rows * 2.7, rows * 5.0):
            assert f(tokens) == pytest.approx(pol.cost.step_seconds(rows, tokens))


def test_a_draft_is_priced_against_the_whole_step() -> None:
    """A forward of 2 tokens costs 1.2x one of 1; the step around it costs 0.5 more
    whatever its tokens. At 15% acceptance a draft does not pay against the forward
    alone (1.15 / 1.2 < 1) but does against the whole step (1.15 / 1.7 > 1 / 1.5): the
    rule reads the measured rest."""
    rows, toks = [1], [1, 2, 3, 4, 5]
    pol = DepthPolicy(AdaptiveConfig(), 4, CostModel(rows, toks, [[1.0 + 0.2 * (t - 1)
                                                                  for t in toks]]))
    rates = [[0.15, 0.0, 0.0, 0.0]]
    assert choose_depths(rates, [[1.0] * 4], [4], pol.step_seconds(1)) == [0]
    pol.cost.observe_overhead(1, 0.5)
    assert pol.step_seconds(1)(2.0) == pytest.approx(1.7)
    assert choose_depths(rates, [[1.0] * 4], [4], pol.step_seconds(1)) == [1]


def test_an_unreached_position_reads_the_rate_before_it() -> None:
    """Drafts at positions 1-2 always held and 3-4 were never reached: a fixed prior of
    0.4 there would keep the request at depth 2 for ever; the rule reads them as the
    rate before them and goes to the full depth (where it then measures them)."""
    rows, toks = [1], [1, 2, 3, 4, 5]
    cost = CostModel(rows, toks, [[1.0 + 0.3 * t for t in toks]])
    pol = DepthPolicy(AdaptiveConfig(prior=0.4), 4, cost)
    est = pol.new_estimate()
    for _ in range(8):
        pol.observe(est, 2, 2, 2)
    assert est.rates[2:] == [0.4, 0.4] and pol.rates(est)[2:] == pytest.approx(
        [est.rates[1]] * 2)
    assert choose_depths([est.rates], [est.draft_rates], [4],
                         pol.step_seconds(1)) == [2]  # what the fixed prior would pick
    assert pol.choose([est], [4]) == [4]
    pol.observe(est, 4, 4, 2)  # reached at last: position 3 measured (rejected)
    assert pol.rates(est)[2] == est.rates[2] < 0.4


def test_the_population_rate_of_an_unreached_position_is_not_final() -> None:
    """The population measured position 3 low on an earlier, unlike request: a request
    that has not reached it still tries it once its own position 2 holds, and its own
    measurement then rules (low: back to depth 2)."""
    rows, toks = [1], [1, 2, 3, 4, 5]
    pol = DepthPolicy(AdaptiveConfig(prior=0.9), 4, CostModel(rows, toks, [[1.0 + 0.3 * t for t in toks]]))
    early = pol.new_estimate()
    for _ in range(6):
        pol.observe(early, 3, 3, 2)  # position 3 always rejected
    pop3 = pol.population.rates[2]
    assert pop3 < 0.5
    est = pol.new_estimate()
    assert est.rates[2] == pop3 and pol.rates(est)[2] == est.rates[1]
    pol.observe(est, 2, 2, 2)  # its own first draft held (positions 1-2 only)
    assert pol.choose([est], [4]) == [4]
    for _ in range(6):
        pol.observe(est, 4, 4, 2)  # its own measurement: position 3 fails here too
    assert pol.rates(est)[2] == est.rates[2] < 0.2 and pol.choose([est], [4]) == [2]


def test_a_fresh_request_starts_at_probe_depth() -> None:
    """Optimistic population rates do not buy a fresh request a deep first draft: it
    drafts probe_depth until one of its own drafts is verified, then the rule rules."""
    pol = policy(prior=1.0, probe_depth=1)
    est = pol.new_estimate()
    assert pol.choose([est], [4]) == [1] and est.probing and est.num_probes == 1
    pol.observe(est, 1, 0, 0)  # the lookup found nothing: still nothing verified
    assert pol.choose([est], [4]) == [1] and not est.probing  # capped, not a probe again
    pol.observe(est, 1, 1, 1)
    assert pol.choose([est], [4]) == [4]


def test_a_fresh_request_is_probed_first_even_when_the_rule_says_off() -> None:
    pol = policy(prior=0.0)
    est = pol.new_estimate()
    assert choose_depths([est.rates], [est.draft_rates], [4], pol.step_seconds(1)) == [0]
    assert pol.choose([est], [4]) == [1] and est.probing
    assert pol.choose([est], [4]) == [0]  # one forced probe per request, not one per step
    assert pol.choose([pol.new_estimate()], [0]) == [0]  # a row that may not draft: none


def test_draft_cost_is_per_token_processed() -> None:
    """A catch-up pass over a backlog is spread over every token it fed, not charged to
    the one probe token that triggered it."""
    cost = CostModel([1], [1, 2], [[1.0, 2.0]])
    cost.observe_draft(1.0, 100)
    assert cost.draft_seconds_per_token == pytest.approx(0.01)


# -- evidence: acceptance per value of the drafter's evidence (n-gram's match length) -----


def learn(pol: DepthPolicy, value: int, accepted: int, times: int, drafted: int = 4) -> None:
    """Another request's drafts on ``value``, each verified with ``accepted`` held."""
    other = pol.new_estimate()
    for _ in range(times):
        pol.observe(other, drafted, drafted, accepted, evidence=value)


def test_floors_are_kept_and_weigh_on_the_step() -> None:
    """A row another rule decided keeps its drafts, and its tokens count in the step the
    other rows are decided for: the choice is the optimum with that row fixed."""
    step = linear(1.0, 0.25)
    assert choose_depths([[0.0] * 4], [[1.0] * 4], [4], step, floors=[3]) == [3]
    assert choose_depths([[0.0] * 4], [[1.0] * 4], [2], step, floors=[3]) == [2]  # cap rules
    rates = [[0.5] * 4, [0.7, 0.6, 0.5, 0.4]]

    def tput(k1: int, k2: int) -> float:
        gain = tokens = 2.0
        for r, k in zip(rates, (k1, k2)):
            cum = 1.0
            for j in range(k):
                cum *= r[j]
                gain, tokens = gain + cum, tokens + 1
        return gain / step(tokens)

    for fixed in range(5):
        best = max(range(5), key=lambda k: tput(fixed, k))
        got = choose_depths(rates, [[1.0] * 4] * 2, [fixed, 4], step, floors=[fixed, 0])
        assert got[0] == fixed and tput(fixed, got[1]) == pytest.approx(tput(fixed, best),
                                                                        rel=2e-3)


def test_cut_follows_the_evidence() -> None:
    """Drafts on 1-token matches fail, on 4-token matches hold: a fresh request's draft is
    cut on weak evidence and verified in full on strong, whatever its overall rates say."""
    pol = policy()
    learn(pol, 1, 0, 12)
    learn(pol, 4, 4, 12)
    est = pol.new_estimate()
    assert pol.cut([est, est], [4, 4], [1, 4]) == [0, 4]


def test_cut_leaves_rows_without_evidence_or_adaptive_depth() -> None:
    pol = policy()
    learn(pol, 1, 0, 12)
    est = pol.new_estimate()
    # no evidence, a row at fixed depth (no estimate), and an empty draft: untouched
    assert pol.cut([est, None, est], [3, 2, 0], [None, 1, 1]) == [3, 2, 0]
    assert pol.cut([est, None], [4, 2], [1, None]) == [0, 2]


def test_a_requests_own_outcomes_outweigh_the_pool_for_its_evidence() -> None:
    """The pool learned 2-token matches hold (grounded prompts first); this request's
    2-token matches fail: after a rejection or two its drafts on them are cut, while a
    fresh request still starts from the pool."""
    pol = policy()
    learn(pol, 2, 4, 12)
    est = pol.new_estimate()
    assert pol.cut([est], [4], [2]) == [4]
    pol.observe(est, 4, 4, 0, evidence=2)
    pol.observe(est, 4, 4, 0, evidence=2)
    assert pol.cut([est], [4], [2]) == [0]
    assert pol.cut([pol.new_estimate()], [4], [2]) == [4]


def test_observe_with_evidence_updates_that_value_only() -> None:
    pol = policy(prior=0.5)
    est = pol.new_estimate()
    pol.observe(est, 4, 3, 1, evidence=3)
    assert set(est.by_evidence) == {3} and set(pol.pooled) == {3}
    assert est.by_evidence[3].seen == [1, 1, 0, 0]
    assert est.by_evidence[3].rates[0] > 0.5 > est.by_evidence[3].rates[1]
    pol.observe(est, 4, 0, 0, evidence=2)  # nothing drafted: nothing to learn about 2
    assert set(est.by_evidence) == {3}
    assert "acceptance_rate_per_pos_by_evidence" in est.as_dict()


def test_depth_is_reserved_for_the_best_evidence() -> None:
    """Overall rates average weak and strong matches (too low for the full depth); the
    reservation reads the strong matches' rates, and the cut then trims weak ones."""
    rows, toks = [1], [1, 2, 3, 4, 5]
    pol = DepthPolicy(AdaptiveConfig(prior=0.5), 4,  # each draft token as dear as a step
                      CostModel(rows, toks, [[1.0 + 1.0 * t for t in toks]]))
    est = pol.new_estimate()
    for _ in range(8):
        pol.observe(est, 4, 4, 4, evidence=4)
        pol.observe(est, 4, 4, 0, evidence=1)
    assert choose_depths([pol.rates(est)], [est.draft_rates], [4], pol.step_seconds(1)) == [0]
    assert pol.choose([est], [4]) == [4]
    assert pol.cut([est, est], [4, 4], [4, 1]) == [4, 0]


def test_an_own_kv_drafter_is_charged_only_the_catch_up_before_its_ridealong_draft() -> None:
    """The last draft of a fully accepted step rides along in the first draft forward:
    not catch-up. A row back from k = 0 (or its prompt) is catch-up beyond those two."""
    from types import SimpleNamespace

    from draftwise.spec.speculation import catch_up_tokens

    def row(num_tokens: int, kv: int) -> SimpleNamespace:
        return SimpleNamespace(token_ids=list(range(num_tokens)), num_kv_computed=kv)

    assert catch_up_tokens([row(10, 9)]) == 0  # after a rejection: the last token only
    assert catch_up_tokens([row(10, 8)]) == 0  # all accepted: last draft + bonus token
    assert catch_up_tokens([row(10, 3), row(30, 0), row(5, 8)]) == 5 + 28


def dear_drafts(**settings) -> DepthPolicy:
    """One row; a draft token costs 0.8 of a plain step: only acceptance above 0.8 pays
    (so a probe could pay, while the prior's 0.6 would not)."""
    rows, toks = [1], [1, 2, 3, 4, 5]
    return DepthPolicy(AdaptiveConfig(**settings), 4,
                       CostModel(rows, toks, [[1.0 + 0.8 * (t - 1) for t in toks]]))


def test_a_probe_is_cut_like_any_row_and_still_learns() -> None:
    """Drafts dearer than the prior's worth: the fresh request's first step is a probe
    (the engine has seen no evidence yet), its draft is cut on its evidence like any row's,
    and what verify's output says about the dropped draft moves the request's and the
    pool's rates for that evidence (the probe is not wasted, and costs no forward)."""
    from draftwise.spec.step import StepDrafts

    pol = dear_drafts(prior=0.6, probe_depth=1)
    est = pol.new_estimate()
    assert pol.choose([est], [4]) == [1] and est.probing
    keep = pol.cut([est], [1], [4])
    assert keep == [0]
    drafts = StepDrafts(np.array([7]), [1], [0], None, [{}], [4]).cut(keep)
    made, held, known = drafts.made_outcome(0, 0, [7])  # the target picked the draft
    assert (made, held, known) == (1, 1, 1)
    pol.observe(est, 1, made, held, evidence=4, num_known=known)
    assert pol.pooled[4].rates[0] > 0.6 and est.by_evidence[4].rates[0] > 0.6
    assert est.probe_fails == 0 and not est.probing


def test_a_request_whose_cut_matches_hold_learns_it() -> None:
    """The pool learned that 1-token matches fail; this request's hold. Its drafts on
    them are cut every step, yet the first dropped draft is known from verify's output,
    so after a few steps its own rates for that evidence pass the break-even and its
    drafts are verified. Observing only what was verified, it never would."""

    def steps_until_verified(learn_dropped: bool) -> int | None:
        pol = policy()
        learn(pol, 1, 0, 12)
        est = pol.new_estimate()
        for n in range(12):
            if pol.cut([est], [4], [1]) != [0]:
                return n
            # cut to nothing: verify's token is the first draft, which would have held
            pol.observe(est, 4, 4, 1 if learn_dropped else 0, evidence=1,
                        num_known=1 if learn_dropped else 0)
        return None

    assert steps_until_verified(False) is None
    n = steps_until_verified(True)
    assert n is not None and 0 < n <= 4


def test_with_evidence_a_fresh_request_is_not_held_at_probe_depth() -> None:
    """Once the engine has seen evidence, a fresh request is reserved the depth its best
    evidence earns from its first step (no probe-depth warm-up) and its draft is cut on
    the engine's rates for the evidence it actually has: its strong matches are
    verified in full at once, its weak ones cut."""
    pol = policy()
    learn(pol, 1, 0, 12)
    learn(pol, 4, 4, 12)
    fresh = pol.new_estimate()
    assert pol.choose([fresh], [4]) == [4] and not fresh.probing and fresh.num_probes == 0
    assert pol.cut([fresh, fresh], [4, 4], [4, 1]) == [4, 0]


def test_a_sampled_draft_is_never_cut_on_its_evidence() -> None:
    """Only one-hot rows are cut on evidence: a sampled row's value could follow its own
    draw, and a cut decided on the draw is not lossless."""
    import torch

    from draftwise.spec.speculation import evidence_to_cut_on

    q = torch.full((2, 4), 0.25)
    assert evidence_to_cut_on([3, 1, None], [None, q, None]) == [3, None, None]


def compute_bound_policy(**settings) -> DepthPolicy:
    """One row's forward costs the same at 1 or 3 tokens; at 4 rows every token costs a
    full share (two tokens a row take twice as long as one): what a 1.5B target does on 2
    cores at 1 and at 6-8 rows."""
    rows, toks = [1, 4], [1, 2, 3]
    grid = [[1.0, 1.0, 1.0], [4.0 * 1.0, 4.0 * 2.0, 4.0 * 3.0]]
    return DepthPolicy(AdaptiveConfig(**settings), 2, CostModel(rows, toks, grid))


@pytest.mark.parametrize("objective", ["throughput", "fair"])
def test_a_probe_that_cannot_pay_waits_for_a_step_where_it_can(objective: str) -> None:
    """At 4 rows a held draft adds exactly the step time it saves (minus nothing): no
    acceptance makes it pay, so the parked row is not probed however long it waits; alone,
    the same row is probed at once (its count was kept)."""
    pol = compute_bound_policy(prior=0.0, probe_interval=2, objective=objective)
    ests = [pol.new_estimate() for _ in range(4)]
    for est in ests:  # past the first-step probe: parked at k = 0 by failed drafts
        est.num_probes, est.seen[0] = 1, 1
    pol.cost.draft_seconds_per_token = 0.01
    for _ in range(10):
        assert pol.choose(ests, [2] * 4) == [0, 0, 0, 0]
    assert all(e.steps_off == 10 and not e.probing for e in ests)
    assert pol.choose(ests[:1], [2]) == [1] and ests[0].probing and ests[0].steps_off == 0


def test_probe_could_pay_is_the_one_step_optimistic_bound() -> None:
    pol = compute_bound_policy()
    ones = [(1.0, 1.0)] * 4
    seconds = pol.step_seconds(4)
    # 4 rows at k = 0: +1 token for +1 share of the step; it needs a cheaper forward
    assert not pol.probe_could_pay([0] * 4, ones, ones, seconds, 1)
    one = pol.step_seconds(1)
    assert pol.probe_could_pay([0], ones[:1], ones[:1], one, 1)
    pol.cost.draft_seconds_per_token = 2.0  # a draft dearer than the step it saves
    assert not pol.probe_could_pay([0], ones[:1], ones[:1], one, 1)


def test_a_fresh_request_waits_for_its_first_probe_where_none_could_pay() -> None:
    """In a batch where no acceptance pays, a fresh request's first-step probe waits too
    (a draft model's would catch up on the whole prompt for nothing); alone, it probes."""
    pol = compute_bound_policy(prior=1.0, probe_interval=2)
    ests = [pol.new_estimate() for _ in range(4)]
    assert pol.choose(ests, [2] * 4) == [0] * 4 and not any(e.num_probes for e in ests)
    assert pol.choose(ests[:1], [2]) == [1] and ests[0].probing and ests[0].num_probes == 1


def test_a_batch_whose_drafts_are_never_verified_rests() -> None:
    pol = policy(prior=1.0, probe_interval=2)
    ests = [pol.new_estimate(), pol.new_estimate()]
    for _ in range(2):  # asked for drafts, none verified (cut, or the lookups missed)
        assert any(pol.choose(ests, [4, 4]))
        pol.rest.step_verified(False)
    off = [e.steps_off for e in ests]
    assert pol.choose(ests, [4, 4]) == [0, 0] and pol.choose(ests, [4, 4]) == [0, 0]
    assert [e.steps_off for e in ests] == off  # a resting step is not a parked row's step
    pol.rest.step_verified(False)  # (a step that asked for nothing does not count)
    assert any(pol.choose(ests, [4, 4]))  # the rest is over
    pol.rest.step_verified(True)
    assert pol.summary()["batch_rest"] == {"enabled": True, "rests": 1, "rested_steps": 2}


def test_a_new_request_ends_the_batch_rest() -> None:
    pol = policy(prior=1.0, probe_interval=2)
    ests = [pol.new_estimate()]
    for _ in range(2):
        pol.choose(ests, [4])
        pol.rest.step_verified(False)
    assert pol.choose(ests, [4]) == [0]
    ests.append(pol.new_estimate())  # it may be grounded where the first is open text
    assert all(pol.choose(ests, [4, 4]))


def test_batch_rest_off_decides_every_step() -> None:
    pol = policy(prior=1.0, probe_interval=1, batch_rest=False)
    est = pol.new_estimate()
    for _ in range(20):
        assert pol.choose([est], [4])[0]
        pol.rest.step_verified(False)


def test_a_price_that_refuses_every_probe_is_re_measured_past_the_longest_interval() -> None:
    """One cold first call priced a drafter's token above the step it saves, so the check
    refused every probe, and only drafting re-measures the price: a request (and the engine)
    stayed at k = 0 for good. Past ``max_probe_interval`` it probes anyway, once."""
    pol = compute_bound_policy(prior=1.0, probe_interval=2, max_probe_interval=6)
    est = pol.new_estimate()
    est.num_probes, est.seen[0] = 1, 1  # past its first-step probe
    pol.cost.draft_seconds_per_token = 2.0  # dearer than the one-row step (1.0)
    ks = [pol.choose([est], [2])[0] for _ in range(6)]
    assert ks == [0, 0, 0, 0, 0, 1] and est.probing
    pol.cost.observe_draft(0.01, 1)  # the probe's draft: the price moves
    assert pol.cost.draft_seconds_per_token < 2.0


def test_a_lone_row_times_a_price_the_engine_never_ran_once() -> None:
    """A timed grid priced a draft out for a lone row (2 tokens at 3x one): no probe could
    pay, so the depth was never run and its price never re-timed (the default model's
    cached grid did this, and nothing drafted). The first probe runs anyway, and its
    drafts are not cut; once the point has a reading, the check decides again."""
    cost = CostModel([1], [1, 2, 3, 4, 5], [[1.0, 3.0, 3.2, 3.4, 3.6]], source="cache")
    pol = DepthPolicy(AdaptiveConfig(), 4, cost)
    est = pol.new_estimate()
    assert pol.choose([est], [4]) == [1] and est.probing
    assert pol.cut([est], [1], [1]) == [1]
    cost.observe_step(1, 2, 2.9, 0.0)  # it really is dear: the refusal stands from now on
    est2 = pol.new_estimate()
    assert pol.choose([est2], [4]) == [0]
    assert pol.cut([est2], [1], [1]) == [0]


def test_the_price_of_a_deeper_draft_is_its_cost_over_a_steps_worth() -> None:
    """``stop_below``: (draft price + one more verified token) / a step's time per row.
    On ``policy``'s grid one row's step is 1.5 and each token adds 0.5: a free draft
    still costs its verify (1/3), a draft at half a step costs (0.75 + 0.5) / 1.5."""
    p = policy()
    assert p.stop_below(1) == pytest.approx(0.5 / 1.5)
    p.cost.draft_seconds_per_token = 0.75
    assert p.stop_below(1) == pytest.approx(1.25 / 1.5)
    p.cost.draft_seconds_per_token = 10.0
    assert p.stop_below(1) == 1.0  # dearer than any acceptance can pay: capped
