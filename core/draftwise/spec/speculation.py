"""The engine's side of speculation: the drafter chain, draft-KV frontiers, hidden states.

A config names one speculator, or a ``drafter_chain`` of several in preference order;
per row, the first proposer that produces a draft wins (an n-gram lookup that finds
nothing hands the row to the next drafter). The engine calls the proposers directly
through the :class:`~draftwise.speculator.Proposer` protocol, never through pluggy.

Per request this module keeps what the core owes a model-based proposer:

- its **KV frontier**: how many leading positions of the proposer's own KV (in the
  core's block pool, indexed by the request's target block table) are right. It starts
  on admission at the part of the request's prefix-cache hit whose blocks every frontier
  had passed (``Request.num_drafts_ready_tokens``: the prefix cache marks a block ready
  for drafts once they did, and a draft model catches up from tokens over the rest of the
  hit) and moves to ``min(kv_valid, committed)`` after each verify;
- the **target hidden states** of committed positions from the lowest frontier of a
  hidden-state consumer on, for the layers the loaded drafts asked for.

Proposing reads this state and changes none of it; :meth:`Speculation.commit_row` moves it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from draftwise.errors import DraftwiseError
from draftwise.logits_process import token_history
from draftwise.metrics import SpecDecodingLogging, SpecDecodingStats
from draftwise.speculator import DraftInput, DraftRow, Drafts, Proposer, ReportsStats, VerifyOutcome
from draftwise.spec.step import StepDrafts, StepOutcome

if TYPE_CHECKING:
    from draftwise.spec.adaptive import DepthPolicy
    from draftwise.config import ResolvedSpeculativeConfig
    from draftwise.scheduler import ScheduledRow

#: the largest ``Drafts.evidence`` value a drafter may give (n-gram: its match length)
MAX_EVIDENCE = 65_535


class ProposerOutputError(DraftwiseError, ValueError):
    """A proposer returned drafts that do not fit its batch; names the method."""


@dataclass(frozen=True, slots=True)
class Drafter:
    """One chain member as the engine runs it."""

    method: str
    proposer: Proposer
    #: the core allocated KV for it and tracks its frontier
    own_kv: bool = False
    #: target layers whose hidden states its rows carry (empty: none)
    hidden_layers: tuple[int, ...] = ()
    #: vLLM's draft ``max_model_len``: rows are drafted only while their drafts stay
    #: below it (None: no limit besides the engine's own)
    max_model_len: int | None = None
    #: ``Capabilities.sees_every_row``: handed the rows kept at k = 0 too (max_draft 0)
    sees_every_row: bool = False


@dataclass(slots=True)
class _RequestState:
    """What the core keeps per request for the chain's model-based members."""

    #: chain index -> leading positions of that member's KV that are right (a member
    #: without own KV that reads hidden states: the positions it has been handed)
    frontier: dict[int, int]
    #: position of the first buffered hidden row
    hidden_start: int
    #: layer -> [n, hidden]: target hidden states of positions hidden_start .. +n-1
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    #: chain index -> the end of the hidden rows it was handed this step (members without
    #: own KV; their frontier moves there when the step commits)
    handed: dict[int, int] = field(default_factory=dict)


class Speculation:
    """Proposers in preference order, plus the per-request state the core owes them."""

    def __init__(
        self, config: ResolvedSpeculativeConfig, drafters: list[Drafter], vocab_size: int
    ) -> None:
        self.config = config
        self.k = max_draft_len(config)
        self.drafters = drafters
        self.vocab_size = vocab_size
        #: every layer some member conditions on (requested from the target forward)
        self.hidden_layers = tuple(sorted({h for d in drafters for h in d.hidden_layers}))
        self._own_kv = [i for i, d in enumerate(drafters) if d.own_kv]
        self._hidden_users = [i for i, d in enumerate(drafters) if d.hidden_layers]
        #: hidden-state readers without own KV: their frontier is what they were handed
        self._handed_only = [i for i in self._hidden_users if not drafters[i].own_kv]
        #: members shown the rows kept at k = 0 too (``Capabilities.sees_every_row``)
        self._watchers = [i for i, d in enumerate(drafters) if d.sees_every_row]
        self._states: dict[str, _RequestState] = {}
        #: cumulative since start; per-step stats are merged in by observe_step
        self.metrics = SpecDecodingStats(num_spec_tokens=self.k)
        self.logging = SpecDecodingLogging()
        #: called with each step's stats (the server's Prometheus counters subscribe here)
        self.observers: list[Callable[[SpecDecodingStats], None]] = []
        #: adaptive depth (``"draftwise": {"adaptive": ...}``), set by bootstrap once the
        #: cost model is measured; None: fixed depth
        self.policy: DepthPolicy | None = None

    @property
    def proposers(self) -> list[Proposer]:
        """The chain's proposers, in preference order."""
        return [d.proposer for d in self.drafters]

    # -- propose ------------------------------------------------------------------------

    def propose(self, rows: list[ScheduledRow], tables: list[list[int]]) -> StepDrafts:
        """Drafts for the step's rows (``tables``: each row's block ids), chain in order."""
        n = len(rows)
        pieces: list[np.ndarray | None] = [None] * n
        probs: list[torch.Tensor | None] = [None] * n
        owner: list[int | None] = [None] * n
        evidence: list[int | None] = [None] * n
        kv_valid: list[dict[int, int]] = [{} for _ in range(n)]
        if self._own_kv or self._hidden_users:  # (state only a model-based member needs)
            for row in rows:  # every step, drafting or not: a frontier starts on admission
                self._state(row)
        pending = [i for i, r in enumerate(rows) if r.max_draft > 0]
        if self._watchers:
            self._show_parked(rows, tables)
        if not pending:
            return StepDrafts.none(n)
        # what a draft costs: the step's proposing time over the drafts made (adaptive
        # depth prices a draft per expected draft made; a draft model stopped early by
        # its confidence runs only the forwards it made drafts with, so dividing by the
        # drafts asked read its cost ~3x low at k = 8). The backlog an own-KV drafter
        # feeds first (positions skipped while the row was at k = 0, or a prompt) is one
        # batched forward whatever its length, not a draft each: counted as one draft's
        # worth, and a step whose backlog outnumbers its drafts (a prompt's catch-up)
        # is not a price at all. (Spreading the catch-up over its tokens priced the
        # 0.5B draft of the 1.5B at 6.5 ms a draft where its drafts took 15: each new
        # request's first probe fed a 30-token prompt and pulled the running price
        # down, and adaptive depth drafted open prose at 0.90x speculation off.)
        clock = self.policy.cost.clock if self.policy is not None else time.perf_counter
        # adaptive depth's price of a deeper draft, for drafters that stop on their own
        # confidence (DraftRow.stop_below); fixed depth drafts what it asked for
        stop = self.policy.stop_below(n) if self.policy is not None else 0.0
        t0, num_made, num_backlog = clock(), 0, 0
        for pid, drafter in enumerate(self.drafters):
            if not pending:
                break
            asked = [i for i in pending
                     if self._room(drafter, rows[i]) > 0 and _may_use(drafter, rows[i])]
            if not asked:
                continue
            batch = DraftInput([self._draft_row(pid, rows[i], tables[i], stop)
                                for i in asked])
            if drafter.own_kv:
                num_backlog += catch_up_tokens(batch.rows)
            out = drafter.proposer.propose(batch)
            self._check(drafter, batch, out)
            cu = out.cu_num_draft_tokens
            num_made += int(sum(out.num_draft_tokens))
            still = [i for i in pending if self._room(drafter, rows[i]) <= 0]
            for j, i in enumerate(asked):
                if out.kv_valid is not None and drafter.own_kv:
                    kv_valid[i][pid] = out.kv_valid[j]
                if out.num_draft_tokens[j] == 0:
                    still.append(i)
                    continue
                pieces[i] = out.token_ids[cu[j] : cu[j + 1]]
                owner[i] = pid
                if out.evidence is not None:
                    evidence[i] = out.evidence[j]
                if out.draft_probs is not None:
                    probs[i] = out.draft_probs[cu[j] : cu[j + 1]]
            pending = sorted(still)
        seconds = 0.0
        if self.policy is not None:  # the drafters' time, passed on with the drafts
            seconds = clock() - t0
            if num_made and num_backlog <= num_made:
                self.policy.cost.observe_draft(seconds, num_made + (1 if num_backlog else 0))
        counts = [0 if p is None else len(p) for p in pieces]
        flat = [p for p in pieces if p is not None]
        if len(flat) == 1:  # (one drafting row, the usual case at concurrency 1: no copy)
            token_ids = flat[0].astype(np.int64, copy=False)
        else:
            token_ids = np.concatenate(flat).astype(np.int64) if flat else np.zeros(0, np.int64)
        drafts = StepDrafts(token_ids, counts, owner, self._draft_probs(pieces, probs),
                            kv_valid, evidence, draft_seconds=seconds)
        evidence = evidence_to_cut_on(evidence, probs)
        if self.policy is not None:
            if any(v is not None for v in evidence):
                # adaptive depth, the drafts and their evidence known: verify what pays
                estimates = self.policy.estimates
                drafts = drafts.cut(self.policy.cut(
                    [estimates.get(r.request.req_id) for r in rows], counts, evidence))
            self.policy.rest.step_verified(any(drafts.num_draft_tokens))
        return drafts

    def _show_parked(self, rows: list[ScheduledRow], tables: list[list[int]]) -> None:
        """Hand the sampling rows that draft nothing this step (kept at k = 0) to the members
        that index every row's tokens, with ``max_draft`` 0: they record, and draft none."""
        parked = [i for i, r in enumerate(rows) if r.max_draft == 0 and r.samples]
        for pid in self._watchers:
            drafter = self.drafters[pid]
            shown = [i for i in parked if _may_use(drafter, rows[i])]
            if not shown:
                continue
            batch = DraftInput([self._draft_row(pid, rows[i], tables[i]) for i in shown])
            for row in batch.rows:
                row.max_draft = 0
            self._check(drafter, batch, drafter.proposer.propose(batch))

    def _state(self, row: ScheduledRow) -> _RequestState:
        """The request's state, made on its first row since admission (or preemption)."""
        req = row.request
        state = self._states.get(req.req_id)
        if state is None:  # frontiers start where the prefix hit's blocks are ready for
            # drafts (a draft model catches up from tokens over the rest; a hit is never
            # past that for a hidden-state consumer: KVCacheManager.hit_needs_drafts_ready)
            start = min(req.num_computed_tokens, req.num_drafts_ready_tokens)
            frontier = {pid: start for pid in self._own_kv}
            # a reader without KV needs no ready blocks: its rows start at what is computed
            frontier.update({pid: req.num_computed_tokens for pid in self._handed_only})
            state = _RequestState(frontier, min(frontier.values(), default=start))
            self._states[req.req_id] = state
        return state

    @staticmethod
    def _room(drafter: Drafter, row: ScheduledRow) -> int:
        """Drafts the member may make for the row: its ``max_draft``, cut so the row with
        its drafts stays within the draft's ``max_model_len``."""
        if drafter.max_model_len is None:
            return row.max_draft
        return min(row.max_draft, drafter.max_model_len - row.request.num_tokens)

    def _draft_row(self, pid: int, row: ScheduledRow, table: list[int],
                   stop_below: float = 0.0) -> DraftRow:
        """What chain member ``pid`` sees of one row."""
        req, drafter = row.request, self.drafters[pid]
        out = DraftRow(
            req_id=req.req_id,
            token_ids=req.all_token_ids,
            max_draft=self._room(drafter, row),
            params=req.params,
            generator=req.generator,
            history=(token_history(req, np.zeros(0, dtype=np.int64))
                     if req.params.needs_history else None),
            num_prompt_tokens=req.num_prompt_tokens,
            isolation_key=req.isolation_key,
            # (only for a row whose depth adaptive depth chooses: a seeded sampled row
            # stays at fixed depth, its draws following its drafts, and this price
            # follows the machine's timing)
            stop_below=stop_below if self._adaptive_row(req.req_id) else 0.0,
        )
        if not (drafter.own_kv or drafter.hidden_layers):
            return out
        state = self._states[req.req_id]
        out.num_kv_computed = state.frontier[pid]
        if drafter.own_kv:
            out.block_table = table
        else:  # no KV: it is handed every committed position with K/V, its frontier next
            state.handed[pid] = req.num_tokens - 1
        if drafter.hidden_layers:
            skip = out.num_kv_computed - state.hidden_start
            out.hidden = {h: state.hidden[h][skip:] for h in drafter.hidden_layers
                          if h in state.hidden}
        return out

    def _adaptive_row(self, req_id: str) -> bool:
        """Whether adaptive depth chose this request's depth (it keeps an estimate)."""
        return self.policy is not None and req_id in self.policy.estimates

    def _check(self, drafter: Drafter, batch: DraftInput, out: Drafts) -> None:
        """Refuse drafts that do not fit the batch, naming the method (a plugin bug)."""
        rows, vocab = len(batch.rows), self.vocab_size
        total = sum(out.num_draft_tokens)
        bad = None
        if len(out.num_draft_tokens) != rows:
            bad = f"{len(out.num_draft_tokens)} draft counts for {rows} rows"
        elif out.token_ids.shape != (total,):
            bad = f"{out.token_ids.shape[0]} draft tokens but the counts sum to {total}"
        elif any(c < 0 or c > r.max_draft for c, r in zip(out.num_draft_tokens, batch.rows)):
            bad = "a row got more drafts than its max_draft (or a negative count)"
        elif total and not _ids_below(out.token_ids, vocab):
            bad = f"a draft token id is outside the target vocabulary [0, {vocab})"
        elif out.draft_probs is not None and tuple(out.draft_probs.shape) != (total, vocab):
            bad = f"draft_probs has shape {tuple(out.draft_probs.shape)}, not ({total}, {vocab})"
        elif out.evidence is not None and len(out.evidence) != rows:
            bad = f"{len(out.evidence)} evidence values for {rows} rows"
        elif out.evidence is not None and any(
            type(v) is not int or not 0 <= v <= MAX_EVIDENCE for v in out.evidence
        ):  # adaptive depth keeps an estimate per value: a float or a huge id grows it for ever
            bad = f"an evidence value that is not an integer in 0..{MAX_EVIDENCE}"
        elif out.kv_valid is not None and len(out.kv_valid) != rows:
            bad = f"{len(out.kv_valid)} kv_valid entries for {rows} rows"
        elif out.kv_valid is not None and any(
            not r.num_kv_computed <= v <= len(r.token_ids) - 1 + r.max_draft
            for v, r in zip(out.kv_valid, batch.rows)
        ):
            bad = "a kv_valid below the row's num_kv_computed or past its block table"
        if bad is not None:
            raise ProposerOutputError(f"the proposer of method '{drafter.method}' returned {bad}")

    def _draft_probs(
        self, pieces: list[np.ndarray | None], probs: list[torch.Tensor | None]
    ) -> torch.Tensor | None:
        """``[total_drafts, vocab]`` q for verify, or None when every row's q is one-hot.

        In a chain only some proposers give probabilities; rows of the others get an
        explicit one-hot q, which verify treats exactly like "no probabilities".
        """
        if all(p is None for p in probs):
            return None
        parts: list[torch.Tensor] = []
        for draft, q in zip(pieces, probs):
            if draft is None:
                continue
            if q is None:
                q = torch.zeros((len(draft), self.vocab_size), dtype=torch.float32)
                q[torch.arange(len(draft)), torch.as_tensor(draft)] = 1.0
            parts.append(q.float())
        return torch.cat(parts)

    # -- commit ---------------------------------------------------------------------------

    def commit_row(
        self,
        req_id: str,
        i: int,
        drafts: StepDrafts,
        start: int,
        computed: int,
        hidden_states: dict[int, torch.Tensor],  # layer -> [T, hidden], the step's forward
        offset: int,
    ) -> None:
        """Row ``i`` kept positions ``start .. computed-1`` (its fed tokens and accepted
        drafts; its hidden rows start at ``offset``): move its frontiers to what verify
        kept and buffer the committed hidden states."""
        state = self._states.get(req_id)
        if state is None:
            return
        for pid in self._own_kv:
            valid = drafts.kv_valid[i].get(pid, state.frontier[pid])
            state.frontier[pid] = min(valid, computed)
        for pid in self._handed_only:
            state.frontier[pid] = state.handed.pop(pid, state.frontier[pid])
        if self._hidden_users:
            self._buffer_hidden(state, start, hidden_states, offset, computed - start)

    def _buffer_hidden(
        self,
        state: _RequestState,
        start: int,
        hidden_states: dict[int, torch.Tensor],
        offset: int,
        kept: int,
    ) -> None:
        """Append positions ``start .. start+kept-1``; drop what every consumer is past."""
        end = state.hidden_start + (
            next(iter(state.hidden.values())).shape[0] if state.hidden else 0
        )
        if end != start:  # cannot happen: every fed position is buffered in order
            raise RuntimeError(f"hidden states buffered to {end}, but the row fed from {start}")
        floor = min(state.frontier[pid] for pid in self._hidden_users)
        drop = floor - state.hidden_start
        for layer in self.hidden_layers:
            new = hidden_states[layer][offset : offset + kept]
            old = state.hidden.get(layer)
            rows = new if old is None else torch.cat((old, new))
            state.hidden[layer] = rows[drop:].clone()
        state.hidden_start = floor

    def drafts_ready(self, req_id: str, num_computed: int) -> int:
        """Leading tokens of the request every own-KV member has written (the prefix cache
        marks their blocks ready for drafts)."""
        state = self._states.get(req_id)
        if state is None or not self._own_kv:
            return num_computed
        return min(num_computed, *(state.frontier[pid] for pid in self._own_kv))

    # -- feedback -------------------------------------------------------------------------

    def feedback(
        self, rows: list[ScheduledRow], drafts: StepDrafts, outcome: StepOutcome
    ) -> SpecDecodingStats:
        """Tell each proposer what happened to its drafts; returns the step's stats."""
        stats = SpecDecodingStats(self.k)
        by_owner: dict[int, VerifyOutcome] = {}
        for i, row in enumerate(rows):
            pid, nd = drafts.owner[i], drafts.num_draft_tokens[i]
            toks = outcome.output_token_ids[i]
            est = (self.policy.estimates.get(row.request.req_id) if self.policy is not None
                   else None)
            if self.policy is not None and est is not None and row.max_draft and toks is not None:
                ev = drafts.evidence[i] if drafts.evidence else None
                made, held, known = drafts.made_outcome(i, outcome.num_accepted[i], toks)
                self.policy.observe(est, row.max_draft, made, held, ev, known)
            if pid is None or nd == 0 or toks is None:
                continue
            acc = outcome.num_accepted[i]
            stats.observe_draft(nd, acc)
            if row.request.spec is not None:
                row.request.spec.observe(nd, acc)
            fb = by_owner.setdefault(pid, VerifyOutcome([], [], [], []))
            fb.req_ids.append(row.request.req_id)
            fb.num_draft_tokens.append(nd)
            fb.num_accepted.append(acc)
            fb.output_token_ids.append(list(toks))
        for pid, fb in by_owner.items():
            self.drafters[pid].proposer.on_verified(fb)
        self.observe_step(stats)
        return stats

    def observe_step(self, stats: SpecDecodingStats) -> None:
        """Fold one step's counts into the totals, the log window and any observers."""
        self.metrics.merge(stats)
        self.logging.observe(stats)
        for observer in self.observers:
            observer(stats)

    def proposer_stats(self) -> list[dict[str, Any]]:
        """What each proposer reports about itself (``ReportsStats``, optional)."""
        out: list[dict[str, Any]] = []
        for drafter in self.drafters:
            p = drafter.proposer
            own = p.stats() if isinstance(p, ReportsStats) else {}
            out.append({"method": drafter.method, **own})
        return out

    def release(self, req_id: str) -> None:
        """A request left the running set: the core's state and every proposer's go."""
        self._states.pop(req_id, None)
        for drafter in self.drafters:
            drafter.proposer.release(req_id)

    @property
    def num_tracked_requests(self) -> int:
        """Requests with draft state (0 once every request left: nothing leaks)."""
        return len(self._states)


def _ids_below(token_ids: np.ndarray, vocab: int) -> bool:
    """Every id in ``[0, vocab)`` (non-empty ``token_ids``). A step's few drafts are
    compared as Python ints: two numpy reductions cost ~10 us right after a forward has
    streamed the weights through the caches, a list of a few ints well under one."""
    if token_ids.shape[0] <= 64:
        ids = token_ids.tolist()
        return 0 <= min(ids) and max(ids) < vocab
    return 0 <= int(token_ids.min()) and int(token_ids.max()) < vocab


def evidence_to_cut_on(
    evidence: Sequence[int | None], probs: Sequence[torch.Tensor | None]
) -> list[int | None]:
    """The evidence adaptive depth may cut each row's draft on: None for a sampled row.

    Cutting is lossless only on a value fixed before the draft was drawn. A drafter's
    evidence is documented so (``Drafts.evidence``), but with q not one-hot a value that
    secretly followed the drawn tokens would make the cut depend on the draw; so only
    one-hot rows (greedy drafts, n-gram) are cut on evidence, and a sampled row keeps its
    drafts (they still weigh on the step time).
    """
    return [None if q is not None else v for v, q in zip(evidence, probs)]


def _may_use(drafter: Drafter, row: ScheduledRow) -> bool:
    """Whether the row's request lets this chain member draft (its ``method`` choice)."""
    asked = row.request.speculative
    return asked is None or asked.method is None or asked.method == drafter.method


def catch_up_tokens(rows: Sequence[DraftRow]) -> int:
    """Tokens an own-KV drafter feeds before the ones every drafting step feeds anyway.

    Each step's first draft forward feeds a row its last token and, after a step whose
    drafts were all accepted, the last draft (drafted, never fed): one forward of one or
    two tokens, about the cost of one (a small forward streams the same weights). Only
    what lies before those (positions skipped at k = 0, a prompt) is a catch-up pass
    (priced as one draft's worth, or not at all when it outnumbers the drafts: see
    :meth:`Speculation.propose`); counting the ridealong draft too would call every step
    of a deep-accepting row a catch-up.
    """
    return sum(max(0, len(r.token_ids) - 2 - r.num_kv_computed) for r in rows)


def max_draft_len(config: ResolvedSpeculativeConfig) -> int:
    """k the scheduler reserves per row: the largest of the chain's members."""
    return max(m.num_speculative_tokens or 0 for m in config.drafters)


def describe(spec: Speculation | None) -> dict[str, Any]:
    """A short JSON-able summary for CLI and bench output."""
    if spec is None:
        return {"enabled": False}
    out: dict[str, Any] = {"enabled": True, "method": spec.config.method, "k": spec.k}
    if spec.policy is not None:
        out["adaptive"] = spec.policy.summary()
    return out
