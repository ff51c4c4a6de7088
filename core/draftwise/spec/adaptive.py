"""Acceptance-driven adaptive depth: per request, the k that pays for itself.

Each request keeps an exponentially weighted acceptance rate per draft position,
conditional on the position being reached (position j is observed only when the drafts
before it were all accepted), and per position how often its drafter actually produced a
draft there when asked to go that deep (an n-gram lookup often finds nothing, or a
shorter match than asked for; a draft never made costs no forward time).
With rates p_1..p_k the expected output of a row verifying k drafts is

    E(k) = 1 + p_1 + p_1 p_2 + ... + p_1 ... p_k

which for equal rates is the standard (1 - a^(k+1)) / (1 - a). Each step,
:func:`~draftwise.spec.depth_rule.choose_depths` picks every row's k in 0..cap to maximise
the batch's expected tokens per second of step time against the measured cost model
(:class:`~draftwise.spec.cost_model.CostModel`: the forward's grid plus the rest of the step,
measured as it runs): a draft token is worth adding while the cumulative acceptance it
buys outweighs the step time it adds, and k = 0 (off) is one of the choices. A row kept
at 0 gets a probe of ``probe_depth`` drafts every ``probe_interval`` steps, so a request
whose text turns repetitive gets speculation back; each probe whose drafts are all
rejected multiplies that interval by ``probe_backoff`` (up to ``max_probe_interval``), and
an accepted draft resets it, so text that never repeats stops paying for probes. A probe
that could not pay even if every draft held (:meth:`DepthPolicy.probe_could_pay`: a
batch whose forward is compute-bound) waits for a step where it could.

A fresh request starts from the engine's population rates, but weakly: they count as
``prior_strength`` observations, so the request's own first outcomes move its estimate
at weight 1 / (n + 1 + prior_strength) until that falls to ``ew_weight``; and while the
engine has seen no evidence (below), until one of its own drafts was verified it drafts
at most ``probe_depth`` (its first decode step is such a probe). A prompt unlike the
ones before it (open text after grounded edits) then wastes one draft token on its first
step, not four, and stops drafting after a rejection or two instead of paying for the
population's optimism for several steps.

A drafter may also say how strong its reason for each draft is (``Drafts.evidence``:
n-gram gives the length of the suffix match it followed). Acceptance depends on it far
more than on the request (teacher-forced on the mixed and smoke workloads: 15% after a
1-token match, about 50% after 2-3, 91% after 4, in edits and open text alike), so each
request also keeps rates per evidence value, started from an engine-wide estimate for
that value, and once the drafts are made :meth:`DepthPolicy.cut` decides again on the
rates of each row's evidence and cuts the draft to what pays. Such a request's depth is
reserved on the best evidence seen (:meth:`DepthPolicy.reserve_rates`), so it keeps
looking up and its strong matches are verified in full while its weak ones are cut. The
evidence rates hold across prompts, so with them a fresh request needs no warm-up: it is
reserved and cut on the engine's rates for its evidence from its first decode step.

What the cut drops is still learned from: the token verify emits after a row's last kept
draft is the target's own pick there, and a one-hot draft is accepted exactly when it
equals it (:meth:`~draftwise.spec.step.StepDrafts.made_outcome`), so the first dropped draft's
outcome is known at no forward cost. A request whose short matches do hold learns it
while the engine's rates for them would cut them for ever.

Lossless by construction: only how many drafts are verified changes, never how.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from draftwise.spec.batch_rest import BatchRest
from draftwise.spec.depth_rule import LOG_MIN_GAIN, MIN_GAIN, choose_depths

if TYPE_CHECKING:
    from draftwise.config.adaptive import AdaptiveConfig
    from draftwise.spec.cost_model import CostModel

@dataclass(slots=True)
class AcceptanceEstimate:
    """One request's running acceptance (what adaptive depth decides from)."""

    #: ``[K]`` conditional acceptance rate at each draft position
    rates: list[float]
    #: ``[K]`` chance a draft comes back at position j when the row may draft that deep
    draft_rates: list[float] = field(default_factory=list)
    #: consecutive steps this request was left at k = 0 while it could have drafted
    steps_off: int = 0
    #: the depth chosen for its last decode step
    last_k: int = 0
    #: probes it was given
    num_probes: int = 0
    #: observations so far of each position's acceptance / of its draft coming back
    seen: list[int] = field(default_factory=list)
    draft_seen: list[int] = field(default_factory=list)
    #: probes in a row whose drafts were all rejected (each one lengthens the interval)
    probe_fails: int = 0
    #: the depth chosen for the last step was a probe (its outcome sets the backoff)
    probing: bool = False
    #: per value of the drafter's evidence (``Drafts.evidence``: n-gram's match length),
    #: this request's acceptance of the drafts made on that evidence
    by_evidence: dict[int, AcceptanceEstimate] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.draft_rates:
            self.draft_rates = [1.0] * len(self.rates)
        self.seen = self.seen or [0] * len(self.rates)
        self.draft_seen = self.draft_seen or [0] * len(self.draft_rates)

    def observe(self, weight: float, num_asked: int, num_drafted: int, num_accepted: int,
                prior_strength: float = float("inf"), num_known: int | None = None) -> None:
        """One step that let the row draft ``num_asked``: ``num_drafted`` came,
        ``num_accepted`` held, of the first ``num_known`` (default: all of them) whose
        outcome is known (a draft cut before verify is known only one position past the
        kept ones: :meth:`~draftwise.spec.step.StepDrafts.made_outcome`).

        Position j's n-th observation weighs ``max(weight, 1 / (n + 1 + prior_strength))``:
        the starting rates count as ``prior_strength`` observations (infinitely many by
        default: a plain exponentially weighted mean), then the running mean becomes
        exponentially weighted.
        """
        known = num_drafted if num_known is None else min(num_known, num_drafted)
        rates, seen = self.draft_rates, self.draft_seen  # (runs every step: plain loops)
        for j in range(min(num_asked, len(rates))):
            w = 1.0 / (seen[j] + 1 + prior_strength)
            w = weight if w < weight else w
            rates[j] += w * ((1.0 if j < num_drafted else 0.0) - rates[j])
            seen[j] += 1
        rates, seen = self.rates, self.seen
        for j in range(min(num_accepted + 1, known)):
            w = 1.0 / (seen[j] + 1 + prior_strength)
            w = weight if w < weight else w
            rates[j] += w * ((1.0 if j < num_accepted else 0.0) - rates[j])
            seen[j] += 1
        if self.probing and known:  # a probe that got no draft (or none known) tells nothing
            self.probe_fails = 0 if num_accepted else self.probe_fails + 1
        elif num_accepted:
            self.probe_fails = 0
        self.probing = False

    def expected_tokens(self, k: int) -> float:
        """E(k) given a draft came: 1 + sum of cumulative acceptance over k positions."""
        total, cum = 1.0, 1.0
        for p in self.rates[:k]:
            cum *= p
            total += cum
        return total

    def as_dict(self) -> dict[str, Any]:
        """For per-request metrics."""
        out: dict[str, Any] = {
            "acceptance_rate_per_pos": [round(p, 4) for p in self.rates],
            "draft_rate_per_pos": [round(d, 4) for d in self.draft_rates],
            "last_k": self.last_k,
            "num_probes": self.num_probes,
            "probe_fails": self.probe_fails,
        }
        if self.by_evidence:
            out["acceptance_rate_per_pos_by_evidence"] = {
                str(v): [round(p, 4) for p in e.rates] for v, e in sorted(self.by_evidence.items())
            }
        return out


def _lifted(rates: list[float], seen: list[int], pool_seen: list[int]) -> list[float]:
    """``rates`` with each position that neither count reached reading at least the
    position before it (:meth:`DepthPolicy.rates` says why)."""
    out = list(rates)
    for j in range(1, len(out)):
        if out[j] < out[j - 1] and not seen[j] and not pool_seen[j]:
            out[j] = out[j - 1]
    return out


@dataclass(slots=True)
class DepthPolicy:
    """Adaptive depth for one engine: the settings, the cost model, population rates."""

    config: AdaptiveConfig
    max_k: int
    cost: CostModel
    #: engine-wide running rates: where a new request's estimate starts
    population: AcceptanceEstimate = field(init=False)
    #: engine-wide running rates per value of the drafters' evidence: where a request's
    #: estimate for that value starts (a 4-token n-gram match is accepted about as often
    #: in open text as in an edit, a 1-token match about as rarely, so pooling them is
    #: fair where pooling whole requests is not)
    pooled: dict[int, AcceptanceEstimate] = field(init=False, default_factory=dict)
    #: per batch size R, the step time at R + t tokens for t = 0..R*max_k (the grid is
    #: fixed once measured, so each is interpolated once, not on every step)
    _step_tables: dict[int, list[float]] = field(init=False, default_factory=dict)
    #: the cost model's version the tables were built from
    _tables_version: int = field(init=False, default=0)
    #: a draft rate of 1 at every position (shared, never written)
    _ones: tuple[float, ...] = field(init=False)
    #: whether this step's batch weighs each row's rate alike (``choose_depths``'s
    #: ``fair``), set by the scheduler each step through :meth:`set_waiting`
    fair: bool = field(init=False, default=False)
    #: the batch's back-off when its drafts are never verified (``draftwise.spec.batch_rest``)
    rest: BatchRest = field(init=False)
    #: each request's running acceptance, by request id: the policy's own state, so that
    #: ``Request`` stays plain data. Made on the request's first adaptive decode step
    #: (:meth:`estimate`), kept through preemption, dropped when it ends (:meth:`forget`)
    estimates: dict[str, AcceptanceEstimate] = field(init=False, default_factory=dict)

    def set_waiting(self, num_waiting: int) -> None:
        """This step's objective from the settings and whether requests wait for a
        slot (the scheduler calls this before :meth:`choose`; :meth:`cut` of the same
        step reads it too)."""
        objective = self.config.objective
        self.fair = objective == "fair" or (objective == "auto" and num_waiting == 0)

    def __post_init__(self) -> None:
        self.population = AcceptanceEstimate([self.config.prior] * self.max_k)
        self._ones = (1.0,) * self.max_k
        cfg = self.config
        self.rest = BatchRest(cfg.probe_interval, cfg.probe_backoff,
                              max(cfg.probe_interval, cfg.max_probe_interval), cfg.batch_rest)

    def new_estimate(self) -> AcceptanceEstimate:
        """A fresh request's estimate, starting from what the population showed so far
        (a new request also ends the batch's rest: it may draft where the others do not)."""
        self.rest.reset()
        pop = self.population
        return AcceptanceEstimate(list(pop.rates), list(pop.draft_rates))

    def estimate(self, req_id: str) -> AcceptanceEstimate:
        """The request's estimate, started from the population on its first use."""
        est = self.estimates.get(req_id)
        if est is None:
            est = self.estimates[req_id] = self.new_estimate()
        return est

    def forget(self, req_id: str) -> dict[str, Any] | None:
        """The request ended: drop its estimate and return what it learned, for the
        request's final metrics (None: it never used adaptive depth)."""
        est = self.estimates.pop(req_id, None)
        return None if est is None else est.as_dict()

    def observe(
        self, est: AcceptanceEstimate, num_asked: int, num_drafted: int, num_accepted: int,
        evidence: int | None = None, num_known: int | None = None,
    ) -> None:
        """A step that let the row draft: update its estimate and the population's, and
        when its draft came with ``evidence``, both estimates for that value.

        ``num_drafted`` counts the drafts made, before any cut, and ``num_known`` the
        leading ones whose outcome is known (None: all): a draft the cut dropped is still
        learned from where verify's output tells (:meth:`~draftwise.spec.step.StepDrafts.made_outcome`),
        so a request whose short matches hold finds out although they are cut.
        """
        w, strength = self.config.ew_weight, self.config.prior_strength
        est.observe(w, num_asked, num_drafted, num_accepted, strength, num_known)
        # the population moves slower: it summarises many requests
        self.population.observe(w / 4, num_asked, num_drafted, num_accepted, strength,
                                num_known)
        if evidence is not None and num_drafted:
            # (only their acceptance is read: a reservation on evidence takes every slot
            # as drafted, reserve_draft_rates, so their draft rates are not kept)
            own = self.evidence_estimate(est, evidence)
            own.observe(w, 0, num_drafted, num_accepted, strength, num_known)
            self._pool(evidence).observe(w / 4, 0, num_drafted, num_accepted, strength,
                                         num_known)

    def _pool(self, value: int) -> AcceptanceEstimate:
        """The engine-wide estimate for one evidence value (the prior until observed)."""
        pool = self.pooled.get(value)
        if pool is None:
            pool = self.pooled[value] = AcceptanceEstimate([self.config.prior] * self.max_k)
        return pool

    def evidence_estimate(self, est: AcceptanceEstimate, value: int) -> AcceptanceEstimate:
        """The request's estimate for drafts on ``value``: it starts from the engine's
        rates for that value as a weak prior (``prior_strength`` observations), exactly
        as the request's overall estimate starts from the population's."""
        own = est.by_evidence.get(value)
        if own is None:
            pool = self._pool(value)
            own = est.by_evidence[value] = AcceptanceEstimate(list(pool.rates))
        return own

    def evidence_rates(self, est: AcceptanceEstimate, value: int) -> list[float]:
        """What the rule reads for a draft on ``value``: the request's estimate, a
        position that neither it nor the engine reached on that value reading at least
        the position before it (see :meth:`rates`)."""
        pool = self._pool(value)
        own = est.by_evidence.get(value, pool)  # not seen by the request: the pool's
        return _lifted(own.rates, own.seen, pool.seen)

    def cut(
        self,
        estimates: Sequence[AcceptanceEstimate | None],
        counts: Sequence[int],
        evidence: Sequence[int | None],
    ) -> list[int]:
        """After proposing: how many of each row's drafts to verify.

        A row whose drafter gave evidence is decided again on its acceptance for that
        evidence, the drafts known (so every position is there: its draft rate is 1),
        and cut to the best length; the others (no evidence, or fixed depth) keep their
        drafts, which still count in the step time. The drafts are already made, so
        their proposing cost is not charged. Cutting is lossless: fewer drafts verified.

        A probe is cut like any row: what the cut drops is still learned from one position
        past the kept drafts (:meth:`~draftwise.spec.step.StepDrafts.made_outcome`: verify's next
        token is the target's own pick there), so a request, and the engine's pool for its
        evidence, keep measuring the drafts the cut drops. (Before that, a cut probe
        observed nothing: at 8 rows on one thread, with a draft token at ~9% of the step
        and the prior below the break-even, every probe was cut and the rates stayed at
        the prior for ever, so probes were never cut; and a request whose 1-token matches
        did hold never learned it while the pool's 15% cut them.)
        """
        decided = [e is not None and v is not None and n > 0
                   for e, v, n in zip(estimates, evidence, counts)]
        if not any(decided):
            return list(counts)
        rates: list[list[float]] = []
        for e, v, ok in zip(estimates, evidence, decided):
            if ok and e is not None and v is not None:
                rates.append(self.evidence_rates(e, v))
            else:
                rates.append(self.rates(e) if e is not None else list(self.population.rates))
        floors = [0 if ok else n for ok, n in zip(decided, counts)]
        if len(counts) == 1 and counts[0] and self.cost.untimed_by_steps(1, 2):
            floors[0] = max(floors[0], 1)  # a lone row's never-timed price: time it once
        return choose_depths(rates, [self._ones] * len(counts), list(counts),
                             self.step_seconds(len(counts)), floors=floors, fair=self.fair)

    def probe_interval(self, est: AcceptanceEstimate) -> int:
        """Steps at k = 0 before this request's next probe: backed off per failed probe."""
        cfg = self.config
        grown = cfg.probe_interval * cfg.probe_backoff ** min(est.probe_fails, 64)
        return int(max(cfg.probe_interval, min(cfg.max_probe_interval, grown)))

    def step_seconds(self, num_rows: int) -> Callable[[float], float]:
        """Step seconds of ``num_rows`` rows as a function of their total tokens: the
        forward (a table interpolated once per batch size and grid version: the engine's
        steps recalibrate the grid now and then) plus the step's measured rest (which
        moves every step, so it is read per call)."""
        if self._tables_version != self.cost.version:  # the engine's steps recalibrated it
            self._step_tables.clear()
            self._tables_version = self.cost.version
        table = self._step_tables.get(num_rows)
        if table is None:
            table = [self.cost.forward_seconds(num_rows, num_rows + t)
                     for t in range(num_rows * self.max_k + 1)]
            self._step_tables[num_rows] = table
        last = len(table) - 1
        rest = self.cost.overhead_seconds(num_rows)

        def seconds(tokens: float) -> float:
            x = min(max(tokens - num_rows, 0.0), float(last))
            lo = int(x)
            if lo >= last:
                return rest + table[last]
            return rest + table[lo] + (x - lo) * (table[lo + 1] - table[lo])

        return seconds

    def stop_below(self, num_rows: int) -> float:
        """The acceptance one more draft must reach to pay for itself this step, handed to
        drafters that know their confidence (``DraftRow.stop_below``).

        A draft past the first costs the drafter's measured price per draft plus what one
        more token adds to the verify forward (read off the grid at two drafts a row), and
        earns, if accepted, a step of the row's time (the step at one token a row, over
        its rows). A draft model that drafts on while the product of its confidences
        stays above that ratio stops early in open text, where the reservation, made
        before any draft is seen, had to guess: on the 1.5B with the 0.5B (a draft at
        ~0.45 of a step) adaptive depth at cap 8 read 0.85x speculation off on a short
        poem, drafting 23-36 tokens for 12 accepted.
        """
        seconds = self.step_seconds(num_rows)
        per_token = seconds(num_rows) / num_rows
        if per_token <= 0.0:
            return 0.0
        verify = max(0.0, seconds(3.0 * num_rows) - seconds(2.0 * num_rows)) / num_rows
        return min(1.0, (self.cost.draft_seconds_per_token + verify) / per_token)

    def rates(self, est: AcceptanceEstimate) -> list[float]:
        """The rates the rule uses: a position this request has not reached yet reads at
        least the rate of the position before it.

        Position j is observed only when the row drafts that deep, so a starting rate
        there (the prior, or the population's from a few early, unlike requests) would
        decide for ever whether it is worth reaching: below the break-even it keeps a
        request at depth 2 whose drafts all hold. Conditional acceptance rarely drops
        once a draft is on track (an n-gram match goes on, a draft model agrees), so the
        previous position's rate is the better guess; reaching the position once
        replaces it with the request's own measurement (optimism that pays for itself:
        one deeper step, then the truth).
        """
        return _lifted(est.rates, est.seen, est.seen)

    def reserve_rates(self, est: AcceptanceEstimate) -> list[float]:
        """The rates a row's depth is reserved on before its drafter runs: per position
        the best of its overall rates and of its rates for each evidence value it has
        seen, or the engine has seen for a request that has not. A drafter that gives
        evidence is cut to what its evidence earns once the draft is made (:meth:`cut`),
        so the reservation is what the best evidence would earn, not the average: a
        request whose 1-token matches fail still looks its drafts up, and its 4-token
        matches are verified to the full depth (an edit prompt whose first short matches
        failed was otherwise off for 30 steps while its 4-token matches all held)."""
        out = self.rates(est)
        own = est.by_evidence
        for value, pool in self.pooled.items():  # (every value a request saw is pooled)
            e = own.get(value, pool)  # its evidence_rates, folded in without a list each
            rates, seen, pool_seen = e.rates, e.seen, pool.seen
            prev = rates[0]
            if prev > out[0]:
                out[0] = prev
            for j in range(1, len(out)):
                r = rates[j]
                if r < prev and not seen[j] and not pool_seen[j]:
                    r = prev
                if r > out[j]:
                    out[j] = r
                prev = r
        return out

    def reserve_draft_rates(self, est: AcceptanceEstimate) -> Sequence[float]:
        """The chance per position that a reserved slot gets a draft, as the reservation
        reads it: for a drafter that gives evidence, 1 (the cut decides on the drafts
        made, so the question here is only whether a draft there would pay; a position
        last asked for long ago keeps a stale low rate, which kept a request whose
        4-token matches all held at depth 3), else the measured rate."""
        return self._ones if est.by_evidence or self.pooled else est.draft_rates

    def choose(self, estimates: Sequence[AcceptanceEstimate], caps: Sequence[int]) -> list[int]:
        """This step's depth per decode row (``caps``: each row's most), probes included;
        none while the batch rests (``draftwise.spec.batch_rest``)."""
        if self.rest.resting(len(caps)):
            for est in estimates:
                est.probing, est.last_k = False, 0
            return [0] * len(caps)
        rates = [self.reserve_rates(e) for e in estimates]
        draft_rates = [self.reserve_draft_rates(e) for e in estimates]
        seconds = self.step_seconds(len(caps))
        ks = choose_depths(rates, draft_rates, caps, seconds, self.cost.draft_seconds_per_token,
                           fair=self.fair)
        # a fresh request warms up at probe depth (below) only while the engine has seen
        # no evidence: with evidence its drafts are cut on the engine's rates for theirs
        # (:meth:`cut`), which hold across prompts where whole-request rates do not
        warm_up = not self.pooled

        # (the answer depends on the batch's ks and the depth only, not on which parked row
        # asks: once per depth a step, again whenever a row's k moved; a compute-bound
        # batch asks for every parked row on every step)
        paying: dict[int, bool] = {}

        def could_pay(depth: int) -> bool:
            got = paying.get(depth)
            if got is None:
                got = paying[depth] = self.probe_could_pay(ks, rates, draft_rates, seconds,
                                                           depth) or (
                    # a lone row whose probe the engine never timed: the refusal rests on
                    # the start-up grid alone, which a busy machine (and its file cache)
                    # can price far too high (the default model's cached 2-token forward
                    # at 2.3x a 1-token one: nothing ever drafted); one probe times it
                    len(ks) == 1 and self.cost.untimed_by_steps(1, 1 + depth))
            return got

        for i, (est, cap) in enumerate(zip(estimates, caps)):
            est.probing = False
            fresh = warm_up and not est.seen[0]  # nothing of its own verified yet
            first, chosen = min(cap, self.config.probe_depth), ks[i]
            if fresh and cap > 0 and not est.num_probes and (ks[i] or could_pay(first)):
                # nothing of its own verified yet: its first decode step is a probe, at
                # probe depth whatever the population says (a draft model also catches
                # up on the prompt there, so its blocks become ready for drafts on a
                # prefix hit), unless no acceptance could pay for it in this batch: then
                # it waits, as a periodic probe does
                ks[i] = first
                est.num_probes += 1
                est.probing = True
            elif fresh:  # still nothing verified: no deeper than a probe
                ks[i] = min(ks[i], self.config.probe_depth)
            if ks[i] != chosen:
                paying.clear()
            if ks[i] == 0 and cap > 0:
                est.steps_off += 1
                # (a probe that would not pay even if all its drafts held waits, its count
                # kept, for a step where it could: a smaller batch, a cheaper forward)
                # (past the longest interval it probes whatever the check says: the check
                # reads the drafter's measured price, and a price set by one cold call, or
                # by a drafter since made cheaper, is re-measured only by drafting; without
                # this a request, and the engine with it, could stay at k = 0 for good)
                due = est.steps_off >= self.probe_interval(est)
                overdue = est.steps_off >= self.config.max_probe_interval
                if due and (overdue or could_pay(first)):
                    ks[i] = first
                    est.steps_off = 0
                    est.num_probes += 1
                    est.probing = True
                    paying.clear()
            else:
                est.steps_off = 0
            est.last_k = ks[i]
        if any(ks):
            self.rest.asked_rows = len(caps)
        return ks

    def probe_could_pay(
        self,
        ks: Sequence[int],
        rates: Sequence[Sequence[float]],
        draft_rates: Sequence[Sequence[float]],
        seconds: Callable[[float], float],
        depth: int,
    ) -> bool:
        """Whether probing one more row at ``depth`` drafts (the row at k = 0 now) could
        raise this step's objective if every probed draft held.

        A probe buys knowledge, and knowledge is worth something only if some acceptance
        would make drafting pay. Where the forward is compute-bound at the batch's size (the
        1.5B target at 6-8 rows on 2 cores: two tokens a row cost ~1.8x one), even drafts
        that all hold lose to the step time they add, so a probe there is pure cost, and a
        draft model's probe costs more still (its catch-up pass over the positions it
        skipped: 18% of the step time at concurrency 8 before this check). The catch-up is
        left out of the price, so a probe that pays on its own drafts is never refused for
        it (one row of the same pair on the same machine: a draft token adds ~8% to the
        step and, held, doubles its output, so probes go on). Same objective as
        :func:`choose_depths`. A draft that comes with evidence is cut on it before the
        forward (:meth:`cut`), so its probe may cost only a lookup, but what it would learn
        is worth nothing where no acceptance pays, so it is priced alike (on the default
        model at concurrency 8 this changed nothing measurable: n-gram rows are reserved
        on their best evidence and rarely parked).
        """
        num_rows = len(ks)
        gain, tokens, drafted = 0.0, float(num_rows), 0.0
        for k, row_rates, row_drafts in zip(ks, rates, draft_rates):
            expected, cum = 1.0, 1.0
            for j in range(k):
                p, d = row_rates[j], row_drafts[j]
                cum *= 1.0 if p > 1.0 else (p if p > 0.0 else 0.0)
                d = 1.0 if d > 1.0 else (d if d > 0.0 else 0.0)
                expected += d * cum
                tokens += d
                drafted += d
            gain += expected
        per_draft = self.cost.draft_seconds_per_token
        before = max(seconds(tokens) + per_draft * drafted, 1e-12)
        after = max(seconds(tokens + depth) + per_draft * (drafted + depth), 1e-12)
        if self.fair and num_rows > 1:  # the probed row's E goes from 1 to 1 + depth
            return math.log1p(depth) - num_rows * math.log(after / before) > LOG_MIN_GAIN
        return (gain + depth) / after > gain / before * (1.0 + MIN_GAIN)

    def summary(self) -> dict[str, Any]:
        """JSON for bench reports and ``/metrics``: settings, cost model, population."""
        return {
            "settings": self.config.model_dump(mode="json"),
            "cost_model": self.cost.summary(),
            "batch_rest": self.rest.summary(),
            "population": self.population.as_dict(),
        }


__all__ = ["AcceptanceEstimate", "DepthPolicy"]
