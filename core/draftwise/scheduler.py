"""Continuous batching: which requests run this step, with how many tokens.

Every step mixes decode rows (one token, plus up to k reserved draft slots) and prefill
chunks under one token budget, as vLLM v1 does: a row feeds
``num_tokens - num_computed_tokens`` tokens (capped by the budget), so a fresh prompt,
a chunk of a long one and a request resumed after preemption are the same case.
Running requests are served first, in arrival order; when blocks run out the most
recently admitted running request is preempted (its blocks freed, recomputed later).
While any running request decodes, the step's prefill rows together are held to
:class:`~draftwise.prefill_budget.PrefillBudget`'s work, so a long prompt is computed in
chunks small enough that the decoding streams keep their pace.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from draftwise.prefill_budget import PrefillBudget
from draftwise.prompt_logprobs import cache_lookup_ids
from draftwise.request import Request, RequestStatus

if TYPE_CHECKING:
    from draftwise.cache.manager import KVCacheManager


class DepthChooser(Protocol):
    """What the scheduler asks of adaptive depth (``draftwise.spec.adaptive.DepthPolicy``
    is the one implementation): one decision per step for the batch's decode rows.

    Why a protocol here and not that class: ``spec/`` sits above the scheduler (the step
    drives both), so naming its class, even under ``TYPE_CHECKING``, made the dependency
    run both ways."""

    def set_waiting(self, num_waiting: int) -> None:
        """Requests wait for a slot (this step's objective)."""

    def estimate(self, req_id: str) -> Any:
        """The request's acceptance estimate, handed back to :meth:`choose`."""

    def choose(self, estimates: Sequence[Any], caps: Sequence[int]) -> list[int]:
        """This step's depth per decode row, each within its cap."""

    def forget(self, req_id: str) -> dict[str, Any] | None:
        """The request ended: what adaptive depth learned of it (None: nothing)."""


@dataclass(slots=True)
class ScheduledRow:
    """One request's share of a step."""

    request: Request
    #: tokens fed this step, drafts excluded (a prefill chunk, or 1 when decoding)
    num_new_tokens: int
    #: draft slots reserved for this row (0 when not decoding or not speculating)
    max_draft: int

    @property
    def samples(self) -> bool:
        """This step reaches the end of the request's known tokens, so it samples."""
        req = self.request
        return req.num_computed_tokens + self.num_new_tokens == req.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    """The rows of one step and what was preempted to fit them."""

    rows: list[ScheduledRow] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens fed to the target, draft slots included."""
        return sum(r.num_new_tokens + r.max_draft for r in self.rows)


class Scheduler:
    """Waiting/running queues under ``max_num_seqs`` and a token budget."""

    def __init__(
        self,
        kv: KVCacheManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        num_spec_tokens: int = 0,
        k_for_batch: Callable[[int], int] | None = None,
        enable_chunked_prefill: bool = True,
        depth_policy: DepthChooser | None = None,
        prefill_budget: PrefillBudget | None = None,
    ) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.num_spec_tokens = num_spec_tokens
        #: ``num_speculative_tokens_per_batch_size``: draft slots per row for a step whose
        #: batch holds n running requests (None: always ``num_spec_tokens``)
        self.k_for_batch = k_for_batch
        self.enable_chunked_prefill = enable_chunked_prefill
        #: adaptive depth: picks each decode row's k within its cap (None: the cap)
        self.depth_policy = depth_policy
        #: bounds prefill while rows decode (None or threshold 0: only the token budget)
        self.prefill_budget = prefill_budget
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}

    # -- queue management ---------------------------------------------------------------

    def add(self, req: Request) -> None:
        """Queue a new request."""
        self.requests[req.req_id] = req
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        """Anything left to run."""
        return bool(self.waiting or self.running)

    def finish(self, req: Request, status: RequestStatus,
               num_cacheable: int | None = None, num_drafts_ready: int = 0) -> None:
        """Take a request out of the queues and return all its blocks.

        ``num_cacheable``: a request finishing normally first registers its full blocks of
        verified K/V up to there, so a request that ends in the step its prefill completes
        (``max_tokens`` 1, an early stop) still leaves its prompt in the prefix cache;
        the first ``num_drafts_ready`` of them have their drafters' KV written too.
        """
        if num_cacheable is not None:
            self.kv.cache_blocks(req.req_id, req.all_token_ids, num_cacheable)
            self.kv.mark_drafts_ready(req.req_id, min(num_drafts_ready, num_cacheable))
        req.status = status
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req.req_id)
        self.requests.pop(req.req_id, None)
        if self.depth_policy is not None:  # its estimate ends with it (every end is here)
            learned = self.depth_policy.forget(req.req_id)
            if learned is not None and req.spec is not None:
                req.spec.adaptive = learned

    def abort(self, req_id: str) -> Request | None:
        """Abort at any point: queued, mid-prefill or decoding. Blocks are returned."""
        req = self.requests.get(req_id)
        if req is None:
            return None
        self.finish(req, RequestStatus.FINISHED_ABORTED)
        return req

    # -- the step -------------------------------------------------------------------------

    def step_k(self) -> int:
        """This step's k: the schedule's entry for the running batch size, or the fixed k."""
        if self.k_for_batch is None or self.num_spec_tokens == 0:
            return self.num_spec_tokens
        return max(0, min(self.num_spec_tokens, self.k_for_batch(len(self.running))))

    def _cap(self, req: Request, k: int) -> int:
        """The most drafts a decode row may verify this step: the step's k, narrowed by
        the request's own settings, its remaining output and the context."""
        if req.speculative is not None:
            k = req.speculative.cap(k)
        remaining_output = req.params.max_tokens - req.num_output_tokens
        room = self.max_model_len - req.num_tokens
        return max(0, min(k, remaining_output - 1, room - 1))

    def _depths(self, k: int) -> dict[str, int]:
        """Each decoding request's k for this step: its cap, then adaptive depth's choice
        for the rows that use it (one decision for the whole batch, made here only)."""
        if k == 0:
            return {}
        reqs = [r for r in self.running if r.is_decoding]
        depths = {r.req_id: self._cap(r, k) for r in reqs}
        policy = self.depth_policy
        if policy is None:
            return depths
        # a seeded sampled request stays at fixed depth: its draws follow its drafts, and
        # adaptive depth's choices follow this machine's timing, so the same seed would not
        # give the same text twice (the distribution is right either way)
        adaptive = [r for r in reqs if not _seeded(r) and (
            r.speculative is None
            or (r.speculative.drafts and r.speculative.adaptive is not False))]
        estimates = [policy.estimate(r.req_id) for r in adaptive]
        policy.set_waiting(len(self.waiting))
        chosen = policy.choose(estimates, [depths[r.req_id] for r in adaptive])
        depths.update((r.req_id, n) for r, n in zip(adaptive, chosen))
        return depths

    def _draft_slots(self, req: Request, budget_left: int, k: int) -> int:
        """How many draft tokens this decode row may get: k, cut by budget and lengths."""
        if k == 0:
            return 0
        remaining_output = req.params.max_tokens - req.num_output_tokens
        room = self.max_model_len - req.num_tokens
        return max(0, min(k, budget_left, remaining_output - 1, room - 1))

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        """Free the victim's blocks; it is recomputed from scratch when readmitted."""
        self.running.remove(victim)
        self.kv.free(victim.req_id)
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        victim.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(victim)
        out.preempted.append(victim)

    def schedule(self) -> SchedulerOutput:
        """Pick this step's rows; reserve KV slots for every token fed, drafts included."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled: set[str] = set()
        depths = self._depths(self.step_k())
        bound = self._prefill_bound()
        # While a newcomer could start now, prompts already running are held to the bound
        # (also when nothing decodes) and leave it half of it, so its prompt starts this
        # step instead of after a long one's last chunk.
        newcomer = bool(self.waiting) and len(self.running) < self.max_num_seqs
        running_bound = bound or (self._prefill_bound(any_row=True) if newcomer else None)
        reserve = running_bound.limit // 2 if running_bound is not None and newcomer else 0
        spent = reserve  # the bound's work done by this step's prefill rows (+ reserve)

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if running_bound is not None and not req.is_decoding:
                lp = req.params.prompt_logprobs is not None
                num_new = running_bound.tokens(req.num_computed_tokens, num_new, spent, lp)
                if num_new == 0:  # the bound is spent: it waits for the next step
                    i += 1
                    continue
                spent += running_bound.work(req.num_computed_tokens, num_new, lp)
            drafts = (
                self._draft_slots(req, budget - 1, depths.get(req.req_id, 0))
                if req.is_decoding else 0
            )
            while not self.kv.allocate_slots(req.req_id, req.num_computed_tokens + num_new + drafts):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is req:
                    break
            if req.status is RequestStatus.PREEMPTED:
                break  # it preempted itself: nothing else fits either
            out.rows.append(ScheduledRow(req, num_new, drafts))
            scheduled.add(req.req_id)
            budget -= num_new + drafts
            i += 1

        spent -= reserve  # the newcomers' (decode rows bound them: the rest of it)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.num_computed_tokens == 0:
                cached = self._attach_cached_prefix(req)
                req.num_cached_tokens = max(req.num_cached_tokens, cached)
            need = req.num_tokens - req.num_computed_tokens
            num_new = min(need, budget)
            lp = req.params.prompt_logprobs is not None
            if bound is not None:
                num_new = bound.tokens(req.num_computed_tokens, num_new, spent, lp)
                if num_new == 0:  # the bound is spent: give back the prefix blocks it took
                    self.kv.free(req.req_id)
                    req.num_computed_tokens = 0
                    break
            if num_new < need and not self.enable_chunked_prefill:
                break
            if not self.kv.allocate_slots(req.req_id, req.num_computed_tokens + num_new):
                # never preempt running work for a newcomer; release the prefix blocks the
                # lookup took (else waiting requests can hold every block) and retry later
                self.kv.free(req.req_id)
                req.num_computed_tokens = 0
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.rows.append(ScheduledRow(req, num_new, 0))
            budget -= num_new
            if bound is not None:
                spent += bound.work(req.num_computed_tokens, num_new, lp)
        return out

    def _prefill_bound(self, any_row: bool = False) -> PrefillBudget | None:
        """This step's bound on prefill: the budget's while any running request decodes
        (or ``any_row``) and chunking is on, else none (prefill takes the token budget)."""
        pb = self.prefill_budget
        if pb is None or not pb.enabled or not self.enable_chunked_prefill:
            return None
        return pb if any_row or any(r.is_decoding for r in self.running) else None

    def restart(self, req: Request) -> ScheduledRow | None:
        """A running request's cache state dropped and its first chunk scheduled alone.

        For re-running a row of a failed step from what it has committed: its blocks are
        freed (their prefix hashes kept, so full blocks come back as cache hits), then one
        row recomputes from the longest cached prefix, within the token budget and without
        drafts. When the pool cannot hold it alone now, it is preempted instead.
        """
        self.kv.free(req.req_id)
        req.num_computed_tokens = 0
        cached = self._attach_cached_prefix(req)
        num_new = min(req.num_tokens - cached, self.max_num_batched_tokens)
        if not self.kv.allocate_slots(req.req_id, cached + num_new):
            self._preempt(req, SchedulerOutput())
            return None
        return ScheduledRow(req, num_new, 0)

    def _attach_cached_prefix(self, req: Request) -> int:
        """(Re)admission: the request starts from its longest cached prefix (returned, in
        tokens), and its drafts from the part of it ready for them."""
        cached = self.kv.get_computed_blocks(req.req_id, cache_lookup_ids(req))
        req.num_computed_tokens = cached
        req.num_drafts_ready_tokens = self.kv.num_drafts_ready_tokens(req.req_id)
        return cached

    def commit(self, req: Request, num_computed_tokens: int, num_drafts_ready: int) -> None:
        """After a step (and its rollback): record the request's new computed length,
        register its blocks of verified tokens for reuse, and mark those of the first
        ``num_drafts_ready`` tokens (every own-KV drafter's frontier: at most the
        computed length) ready for drafts (``KVCacheManager.mark_drafts_ready``)."""
        req.num_computed_tokens = num_computed_tokens
        self.kv.cache_blocks(req.req_id, req.all_token_ids, num_computed_tokens)
        self.kv.mark_drafts_ready(req.req_id, min(num_drafts_ready, num_computed_tokens))


def _seeded(req: Request) -> bool:
    """A sampled request with a seed: it is promised the same tokens on every run."""
    return req.params.seed is not None and req.params.temperature > 0
