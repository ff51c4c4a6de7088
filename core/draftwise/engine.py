"""LLMEngine: add_request / step / abort_request, the step-level API servers embed.

One step, as in ``shared/design.md``, reads top to bottom in :meth:`LLMEngine.step`:
schedule -> propose -> ONE target forward -> verify -> commit/rollback -> feedback, each
phase handing the next a typed record (``draftwise.spec.step``). With no speculative config
there is no proposer and every row verifies zero drafts, which is plain sampling: the
same code path, the same tokens.
"""

from __future__ import annotations

import gc
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from draftwise import prompt_logprobs as prompt_lp
from draftwise.admission import check_params
from draftwise.engine_args import EngineArgs
from draftwise.errors import EngineConfigError, RequestError
from draftwise.formats.tokenizer import IncrementalDetokenizer
from draftwise.logits_process import bad_words_token_ids
from draftwise.logprobs import LogprobsMode
from draftwise.metrics import RequestSpecDecodeMetrics
from draftwise.outputs import parent_output, request_metrics, request_output
from draftwise.parallel import child_params
from draftwise.prompts import PromptReader, PromptType
from draftwise.request import ParentRequest, Request, RequestOutput, RequestStatus
from draftwise.sampling_params import SamplingParams
from draftwise.scheduler import ScheduledRow
from draftwise.spec.grammar_trim import trim_to_grammar
from draftwise.spec.params import SpeculativeParams, check_against
from draftwise.spec.speculation import Speculation
from draftwise.spec.step import StepDrafts, StepForward, StepOutcome
from draftwise.spec.verify_step import verify_rows
from draftwise.speculator import prefix_sums
from draftwise.step_clock import StepClock, StepTimings
from draftwise.step_guard import StepGuard
from draftwise.stopping import append_tokens
from draftwise.structured.compiler import GrammarCompiler
from draftwise.structured.matcher import GrammarMatcher, consume_committed

if TYPE_CHECKING:
    from draftwise.models.prefault import Ahead
    from draftwise.spec.cost_model import CostModel

logger = logging.getLogger("draftwise.engine")


@dataclass(slots=True)
class Committed:
    """What commit hands feedback: the requests that moved, and the outputs of the rows
    that failed on their own."""

    progressed: list[Request] = field(default_factory=list)
    failed: list[RequestOutput] = field(default_factory=list)


@dataclass(slots=True)
class EngineStats:
    """Cumulative counters since start."""

    num_steps: int = 0
    num_preemptions: int = 0
    num_generated_tokens: int = 0
    num_prompt_tokens: int = 0
    timings: StepTimings = field(default_factory=StepTimings)


class LLMEngine:
    """The step-level engine: one target model, one scheduler, optional speculation."""

    def __init__(
        self, args: EngineArgs, progress: Any = None, reserved: Ahead | None = None
    ) -> None:
        """``progress``: called as weights load; ``reserved``: memory for the target's
        quantized weights that a caller started faulting in before its imports
        (``models.arena``; the CLI does)."""
        from draftwise.bootstrap import build_engine_parts

        self.args = args
        try:
            self.logprobs_mode = LogprobsMode(args.logprobs_mode)
        except ValueError:
            raise EngineConfigError(
                f"logprobs_mode {args.logprobs_mode!r} is not one of "
                f"{', '.join(repr(m.value) for m in LogprobsMode)}"
            ) from None
        start = time.monotonic()
        parts = build_engine_parts(args, progress=progress, reserved=reserved)
        #: seconds spent building the engine (weights, tokenizer, cache): reported apart
        #: from a request's time_to_first_token, which starts when the request arrives
        self.load_seconds = time.monotonic() - start
        self.loaded = parts.loaded
        self.tokenizer = parts.loaded.tokenizer
        self.runner = parts.runner
        self.kv = parts.kv
        self.scheduler = parts.scheduler
        #: one driver at a time; a failed step's rows re-run alone (``draftwise.step_guard``)
        self._guard = StepGuard(self.scheduler, self._release_state, self._fail)
        self.max_model_len = parts.max_model_len
        #: turns prompts into checked token ids (``draftwise.prompts``)
        self.prompts = PromptReader(self.tokenizer, self.max_model_len)
        self.spec: Speculation | None = parts.speculation
        self.spec_config = parts.spec_config
        #: verify (and sampling) through ``draftwise.gpu.verify`` where the backend decided
        #: the Triton kernels (``models.backend``)
        self._verify_on_device = self.runner.model.backend.kernels == "triton"
        self.eos_token_ids = frozenset(parts.loaded.eos_token_ids)
        #: structured output's matchers (the grammar library loads on first use)
        self.grammars = GrammarCompiler(
            self.tokenizer, self.loaded.config.vocab_size, self.eos_token_ids
        )
        self.stats = EngineStats()
        self._ids = itertools.count()
        #: ``n > 1`` requests by the user's id, while any sample runs
        self._parents: dict[str, ParentRequest] = {}
        self._seed_gen = torch.Generator().manual_seed(args.seed)
        self._last_log = time.monotonic()
        # Everything built so far (weights' modules, the tokenizer's vocab, plugins) lives
        # as long as the engine: keep it out of the cyclic collector's full passes, which
        # otherwise walk it every few hundred steps (~5% of a decode step's time here).
        # No full collection first: it found ~20 unreachable objects after a 1.5B load
        # (freed cycles are rare: refcounting frees the loader's temporaries) and cost
        # 0.14 s of start-up walking ~190k live ones.
        gc.freeze()

    # -- requests -----------------------------------------------------------------------

    def tokenize_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """A string is tokenized; ``{"prompt_token_ids": [...]}`` or a list is taken as is.

        Safe to call from any thread (the server tokenizes off the engine thread): it
        reads only the tokenizer, whose encode releases the GIL. Text is checked for
        validity and length before it is tokenized, so a huge prompt costs nothing.
        """
        return self.prompts.tokenize(prompt)

    def add_request(
        self,
        prompt: PromptType,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        speculative: SpeculativeParams | None = None,
        isolation_key: str | None = None,
    ) -> str:
        """Validate and queue a request; returns its id. Bad input raises RequestError.

        ``speculative`` narrows speculation for this request only (off, fewer drafts, one
        chain member, fixed depth, token provenance): ``draftwise.spec.params``.
        ``isolation_key``: requests with the same key may draft from each other's outputs
        (suffix decoding's global index); None (the default) drafts from the request's
        own tokens only.
        """
        params = params or SamplingParams()
        if speculative is not None:
            check_against(speculative, self.spec)
            if speculative.return_provenance and params.n > 1:
                raise RequestError("speculative.return_provenance", "token provenance is "
                                   "per completion and n > 1 returns several; ask with n=1")
        req_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if req_id in self.scheduler.requests or req_id in self._parents:
            raise RequestError("request_id", f"request id {req_id!r} is already running")
        text, ids = self.tokenize_prompt(prompt)
        if not ids:
            raise RequestError("prompt", "the prompt is empty")
        self.prompts.check_tokens(len(ids))  # before the per-token scan below
        check_params(params, ids, self.loaded.config.vocab_size, self.max_model_len,
                     self.tokenizer is not None)
        bad_words: tuple[tuple[int, ...], ...] = ()
        if params.bad_words:
            bad_words = bad_words_token_ids(
                params.bad_words, lambda t: self.tokenizer.encode(t, add_special_tokens=False)
            )
        self.stats.num_prompt_tokens += len(ids)
        if params.n == 1:
            self.scheduler.add(
                self._new_request(req_id, text, ids, params, bad_words, speculative,
                                  isolation_key))
            return req_id
        parent = ParentRequest(req_id)
        for i, child in enumerate(child_params(params)):
            req = self._new_request(f"{i}_{req_id}", text, ids, child, bad_words, speculative,
                                    isolation_key)
            req.parent, req.index = parent, i
            parent.children.append(req)
        self._parents[req_id] = parent
        first, *rest = parent.children
        self.scheduler.add(first)
        if self.args.enable_prefix_caching:  # the rest reuse its prompt blocks
            parent.pending = rest
        else:
            for req in rest:
                self.scheduler.add(req)
        return req_id

    def _new_request(
        self, req_id: str, text: str | None, ids: list[int], params: SamplingParams,
        bad_words: tuple[tuple[int, ...], ...], speculative: SpeculativeParams | None,
        isolation_key: str | None = None,
    ) -> Request:
        """A checked request's state: its generator, detokenizer and records."""
        if req_id in self.scheduler.requests or req_id in self._parents:
            raise RequestError("request_id", f"request id {req_id!r} is already running")
        generator = None
        if not params.is_greedy:
            seed = params.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_gen).item())
            generator = torch.Generator().manual_seed(seed)
        req = Request(
            req_id=req_id,
            prompt=text,
            prompt_token_ids=ids,
            params=params,
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
            generator=generator,
            grammar=self._grammar(params),
            bad_words_token_ids=bad_words,
            isolation_key=isolation_key,
        )
        if params.logprobs is not None:
            req.logprobs, req.cumulative_logprob = [], 0.0
        if self.tokenizer is not None:
            req.detok_state = IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens)
        if self.spec is not None:
            req.spec = RequestSpecDecodeMetrics(self.spec.k)
        if speculative is not None:
            req.speculative = speculative
            if speculative.return_provenance:
                req.provenance = []
        return req

    def _release_pending(self, parent: ParentRequest) -> None:
        """Child 0's prompt K/V is cached: schedule the other children."""
        for req in parent.pending:
            self.scheduler.add(req)
        parent.pending = []

    def _grammar(self, params: SamplingParams) -> GrammarMatcher | None:
        """The request's own grammar matcher (structured output; checked in admission)."""
        if params.structured_outputs is None:
            return None
        return self.grammars.matcher(params.structured_outputs)

    def abort_request(self, request_id: str) -> bool:
        """Abort a request wherever it is; its KV blocks are returned at once."""
        parent = self._parents.pop(request_id, None)
        if parent is not None:  # every sample of it
            parent.pending = []
            for child in parent.children:
                if not child.status.finished:
                    self.abort_request(child.req_id)
            return True
        req = self.scheduler.abort(request_id)
        if req is None:
            return False
        req.finished_time = time.monotonic()
        self._release_state(request_id)
        return True

    def has_unfinished_requests(self) -> bool:
        """Whether another step has work."""
        return self.scheduler.has_unfinished()

    @property
    def num_unfinished_requests(self) -> int:
        """Requests waiting or running."""
        return len(self.scheduler.requests)

    # -- the step -----------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns outputs of requests that progressed.

        One thread drives an engine, and a failure inside the step that escapes it
        (propose, forward, verify) fails only the row that fails alone: both are the step
        guard's (``draftwise.step_guard``).
        """
        with self._guard.one_driver():
            return self._step()

    @property
    def _depth_cost(self) -> CostModel | None:
        """Adaptive depth's cost model, which prices the step (None: fixed depth)."""
        policy = self.spec.policy if self.spec is not None else None
        return policy.cost if policy is not None else None

    def _step(self) -> list[RequestOutput]:
        """schedule, then propose -> forward -> verify -> commit -> feedback for the
        scheduled rows (:meth:`_run_rows`), inside the step guard."""
        clock = StepClock.for_cost(self.stats.timings, self._depth_cost)
        rows = self._schedule()
        if not rows:
            return []
        outputs = self._guard.run(rows, clock, self._run_rows)
        self.stats.num_steps += 1
        self._maybe_log_stats()
        return outputs

    def _run_rows(self, rows: list[ScheduledRow], clock: StepClock) -> list[RequestOutput]:
        """propose -> forward -> verify -> commit -> feedback for scheduled rows, each
        phase handing the next a typed record (``draftwise.spec.step``).

        Nothing outside this step's own records changes before :meth:`_commit` (K/V past a
        row's computed tokens is rewritten, proposals keep no state the core cannot take
        back), so a step that raises earlier can be run again for any subset of ``rows``.
        """
        clock.lap("schedule")
        drafts = self._propose(rows)
        clock.lap("propose")
        forward = self._forward(rows, drafts)
        clock.lap("forward")
        outcome = self._verify(rows, drafts, forward)
        clock.lap("verify")
        committed = self._commit(rows, drafts, outcome, forward)
        outputs = self._feedback(rows, drafts, outcome, committed)
        clock.done(rows, forward.num_tokens, drafts.draft_seconds)
        return outputs

    # -- the step's phases, in order ----------------------------------------------------

    def _schedule(self) -> list[ScheduledRow]:
        """This step's rows; a request preempted for them drops its runner and draft state."""
        sched = self.scheduler.schedule()
        for victim in sched.preempted:
            self.stats.num_preemptions += 1
            self._release_state(victim.req_id)
        return sched.rows

    def _propose(self, rows: list[ScheduledRow]) -> StepDrafts:
        """Every row's drafts, cut where a grammar refuses a token.

        A step where no row may draft (adaptive depth chose k = 0 everywhere, prefill,
        requests with speculation off) is the plain step: no proposer runs, no feedback.
        """
        if self.spec is None:
            return StepDrafts.none(len(rows))
        tables = [self.kv.block_table(row.request.req_id) for row in rows]
        drafts = self.spec.propose(rows, tables)  # returns at once when no row may draft
        if any(row.max_draft for row in rows):
            # structured output: drafts past a token the grammar refuses are dead
            drafts = trim_to_grammar([row.request.grammar for row in rows], drafts)
        return drafts

    def _forward(self, rows: list[ScheduledRow], drafts: StepDrafts) -> StepForward:
        """ONE target forward: each row's new tokens then its drafts; logits where it
        samples, after those of its prompt positions whose ``prompt_logprobs`` it records."""
        starts = [row.request.num_computed_tokens for row in rows]
        prompt_rows = [prompt_lp.logit_rows(row.request, s, row.num_new_tokens)
                       for row, s in zip(rows, starts)]
        token_ids: list[list[int]] = []
        logits_rows: list[list[int]] = []
        draft_rows = drafts.rows()
        for i, (row, start) in enumerate(zip(rows, starts)):
            ids = row.request.token_buf[start : start + row.num_new_tokens].tolist()
            nd = drafts.num_draft_tokens[i]
            if nd:
                ids.extend(draft_rows[i].tolist())
            token_ids.append(ids)
            n = row.num_new_tokens
            logits_rows.append(prompt_rows[i] + (list(range(n - 1, n + nd)) if row.samples else []))
        tables = [self.kv.block_table(row.request.req_id) for row in rows]
        hidden_layers = self.spec.hidden_layers if self.spec is not None else ()
        req_ids = [row.request.req_id for row in rows]
        batch = self.runner.build(token_ids, starts, tables, logits_rows, hidden_layers, req_ids)
        output = self.runner.forward(batch)
        return StepForward(starts, prompt_rows, output.logits, output.hidden_states,
                           prefix_sums([len(ids) for ids in token_ids]))

    def _verify(
        self, rows: list[ScheduledRow], drafts: StepDrafts, forward: StepForward
    ) -> StepOutcome:
        """Record the prompt logprobs rows asked for, then verify every sampling row
        (``spec/verify_step.py``)."""
        prompt_logits, logits = prompt_lp.split_logits(
            forward.logits, [len(r) for r in forward.prompt_rows],
            [drafts.num_draft_tokens[i] + 1 if row.samples else 0 for i, row in enumerate(rows)])
        for row, s, pr, lg in zip(rows, forward.starts, forward.prompt_rows, prompt_logits):
            prompt_lp.record(row.request, s, pr, lg, self._decode_token)
        method = self.spec_config.rejection_sample_method if self.spec_config else "standard"
        return verify_rows(rows, drafts, logits, self.grammars, method, self.logprobs_mode,
                           self._decode_token, on_device=self._verify_on_device)

    def _commit(
        self, rows: list[ScheduledRow], drafts: StepDrafts, outcome: StepOutcome,
        forward: StepForward,
    ) -> Committed:
        """Row by row: emit its verified tokens (:meth:`_emit`), then commit its cache
        state (:meth:`_commit_cache`). A row's failure here is its own."""
        now = time.monotonic()
        committed = Committed()
        for i, row in enumerate(rows):
            if row.request.status.finished:  # a sibling sample failed earlier in this loop
                outcome.output_token_ids[i] = None
                continue
            try:  # detokenizing, stop strings, a row's draft state: its failure is its own
                self._emit(i, row, drafts, outcome, now)
                self._commit_cache(i, row, drafts, outcome, forward, now)
            except Exception as exc:  # noqa: BLE001 - this row fails alone
                committed.failed.append(self._fail(row.request, exc))
                continue
            if outcome.output_token_ids[i] is not None:
                committed.progressed.append(row.request)
        return committed

    def _feedback(
        self, rows: list[ScheduledRow], drafts: StepDrafts, outcome: StepOutcome,
        committed: Committed,
    ) -> list[RequestOutput]:
        """The proposers and adaptive depth learn from the verdict (when a row could
        draft), then one output per request the user sent."""
        progressed, failed = committed.progressed, committed.failed
        if self.spec is not None and any(row.max_draft for row in rows):
            try:
                self.spec.feedback(rows, drafts, outcome)
            except Exception as exc:  # noqa: BLE001 - tokens are committed: no retry is right
                logger.exception("proposer feedback failed; failing the rows it drafted for")
                drafted = {rows[i].request.req_id for i, n in enumerate(drafts.num_draft_tokens)
                           if n}
                hit = {req.req_id for req in progressed
                       if req.req_id in drafted and not req.status.finished}
                failed = failed + [self._fail(req, exc) for req in progressed
                                   if req.req_id in hit]
                progressed = [req for req in progressed if req.req_id not in hit]
        return self._outputs(progressed) + failed

    # -- commit, per row: tokens out, then cache state ----------------------------------

    def _emit(
        self, i: int, row: ScheduledRow, drafts: StepDrafts, outcome: StepOutcome, now: float
    ) -> None:
        """Row ``i``'s verified tokens become output: appended up to a stop, the grammar
        moved through them, their provenance and logprobs kept. A stop inside the block
        cuts ``outcome``'s row there, so nothing past it counts anywhere."""
        req, toks = row.request, outcome.output_token_ids[i]
        if toks is None:  # a prefill chunk that does not reach the end yet
            return
        if req.first_token_time is None:
            req.first_token_time = now
        kept = append_tokens(req, toks)
        if req.parent is not None and req.parent.pending:
            self._release_pending(req.parent)
        self.stats.num_generated_tokens += kept
        if req.grammar is not None:  # the grammar moves through committed tokens only
            consume_committed(req.grammar, req.new_token_ids, req.params,
                              req.num_output_tokens - len(req.new_token_ids))
        if kept < len(toks):  # a stop inside the block: nothing past it counts anywhere
            outcome.output_token_ids[i] = toks[:kept]
            outcome.num_accepted[i] = min(outcome.num_accepted[i], kept)
        if req.provenance is not None:
            req.provenance += self._provenance(i, drafts, outcome)[:kept]
        lps = outcome.logprobs[i] if outcome.logprobs else None
        if lps is not None:
            kept_lps = lps[:kept]
            req.logprobs = (req.logprobs or []) + kept_lps
            req.cumulative_logprob = (req.cumulative_logprob or 0.0) + sum(
                lp[t].logprob for lp, t in zip(kept_lps, toks))

    def _commit_cache(
        self, i: int, row: ScheduledRow, drafts: StepDrafts, outcome: StepOutcome,
        forward: StepForward, now: float,
    ) -> None:
        """Row ``i``'s cache state: finished, it returns its blocks (its full verified ones
        stay in the prefix cache); else the drafters' frontiers move, the K/V of its
        rejected drafts is rolled back (``cache/rollback.py``) and the scheduler commits."""
        from draftwise.cache.rollback import rollback

        req, start = row.request, forward.starts[i]
        n_acc, nd = outcome.num_accepted[i], drafts.num_draft_tokens[i]
        computed = start + row.num_new_tokens + n_acc
        if req.status.finished:  # tokens past a stop are dropped with all the blocks
            req.finished_time = now
            # its full blocks of verified K/V stay reusable (the draft owners' frontier is
            # the one before this step: smaller, so safe to mark ready for drafts)
            verified = min(computed, len(req.all_token_ids))
            unsampled = outcome.output_token_ids[i] is None
            self.scheduler.finish(req, req.status, None if unsampled else verified,
                                  self._drafts_ready(req.req_id, verified))
            self._release_state(req.req_id)
            return
        if self.spec is not None:
            self.spec.commit_row(req.req_id, i, drafts, start, computed,
                                 forward.hidden_states, forward.offsets[i])
        rollback(self.kv, [req.req_id], [computed], [nd], [n_acc], self.runner.states)
        self.scheduler.commit(req, computed, self._drafts_ready(req.req_id, computed))

    def _outputs(self, progressed: list[Request]) -> list[RequestOutput]:
        """One output per request the user sent, however many of its samples moved."""
        moved: dict[int, list[Request]] = {}
        for req in progressed:
            if req.parent is not None:
                moved.setdefault(id(req.parent), []).append(req)
        out: list[RequestOutput] = []
        for req in progressed:
            if req.parent is None:
                out.append(self._make_output(req))
            elif moved.get(id(req.parent), [None])[0] is req:
                out.append(self._make_output(req, moved[id(req.parent)]))
        return out

    def _decode_token(self, tok: int) -> str | None:
        """One token's text for a logprobs entry (None without a tokenizer)."""
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode([tok], skip_special_tokens=False)

    def _drafts_ready(self, req_id: str, computed: int) -> int:
        """Leading tokens every own-KV drafter has written (their blocks are ready for
        drafts on a prefix hit)."""
        return self.spec.drafts_ready(req_id, computed) if self.spec is not None else computed

    def _provenance(self, i: int, drafts: StepDrafts, outcome: StepOutcome) -> list[str]:
        """Where row ``i``'s output tokens came from: accepted drafts (by proposer), then
        the target's recovered token (a draft was rejected) or bonus (all held), or
        ``plain`` when the row verified no drafts."""
        nd, acc, pid = drafts.num_draft_tokens[i], outcome.num_accepted[i], drafts.owner[i]
        toks = outcome.output_token_ids[i] or []
        if nd == 0 or pid is None or self.spec is None:
            return ["plain"] * len(toks)
        method = self.spec.drafters[pid].method
        return [f"accepted:{method}"] * acc + ["bonus" if acc == nd else "recovered"]

    def _release_state(self, req_id: str) -> None:
        """A request left the running set (finish, abort, preemption): drop its
        runner-side (recurrent) and speculation-side state."""
        self.runner.release(req_id)
        if self.spec is not None:
            self.spec.release(req_id)

    def _fail(self, req: Request, exc: BaseException) -> RequestOutput:
        """Finish one request as failed, return its blocks, and say why in its output."""
        if isinstance(exc, RequestError):  # the request's own input: its message, its field
            logger.warning("request %s failed inside a step: %s", req.req_id, exc)
            req.error, req.error_field = str(exc), exc.field
        else:
            logger.error("request %s failed inside a step: %s: %s", req.req_id,
                         type(exc).__name__, exc, exc_info=exc)
            req.error = f"{type(exc).__name__}: {exc}"
        req.new_token_ids, req.new_text = [], ""
        req.finished_time = time.monotonic()
        self.scheduler.finish(req, RequestStatus.FINISHED_ERROR)
        self._release_state(req.req_id)
        if req.parent is not None:  # a failed sample fails the request: stop the others
            req.parent.pending = []
            for sib in req.parent.children:
                if not sib.status.finished:
                    self.abort_request(sib.req_id)
        return self._make_output(req)

    def _maybe_log_stats(self) -> None:
        """vLLM's periodic ``SpecDecoding metrics`` line, every ``log_stats_interval`` s."""
        interval = self.args.log_stats_interval
        if interval is None or self.spec is None:
            return
        if time.monotonic() - self._last_log >= interval:
            self.spec.logging.log(logger.info)
            self._last_log = time.monotonic()

    def _make_output(self, req: Request, moved: list[Request] | None = None) -> RequestOutput:
        """The cumulative output of the request the user sent (a sample reports its parent)."""
        if req.parent is None:
            return request_output(req)
        parent = req.parent
        if parent.finished:
            self._parents.pop(parent.req_id, None)
        return parent_output(parent, moved or [req])

    def request_metrics(self, req: Request) -> dict[str, Any]:
        """Timing and speculation metrics of one request."""
        return request_metrics(req)

    # -- chat -----------------------------------------------------------------------------

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Render a conversation (and OpenAI function ``tools``) with the checkpoint's chat
        template and tokenize it.

        Thread-safe like :meth:`tokenize_prompt`; message text is checked (valid Unicode,
        not longer than the context could hold) before the template runs.
        """
        self.prompts.check_messages(messages)
        return self.loaded.encode_chat(messages, add_generation_prompt=add_generation_prompt,
                                       tools=tools)
