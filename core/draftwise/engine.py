"""LLMEngine: add_request / step / abort_request, the step-level API servers embed.

One step, as in ``shared/design.md``, reads top to bottom in :meth:`LLMEngine.step`:
schedule -> propose -> ONE target forward -> verify -> commit/rollback -> feedback, each
phase handing the next a typed record (``draftwise.step``). With no speculative config
there is no proposer and every row verifies zero drafts, which is plain sampling: the
same code path, the same tokens.
"""

from __future__ import annotations

import gc
import itertools
import logging
import operator
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from draftwise.engine_args import EngineArgs
from draftwise.errors import RequestError
from draftwise.formats.tokenizer import IncrementalDetokenizer
from draftwise.metrics import RequestSpecDecodeMetrics
from draftwise.models.batch import ForwardBatch
from draftwise.request import CompletionOutput, Request, RequestOutput, RequestStatus
from draftwise.sampling import SamplingParams
from draftwise.scheduler import ScheduledRow
from draftwise.spec_params import SpeculativeParams, check_against
from draftwise.speculation import Speculation
from draftwise.text import check_text
from draftwise.step import StepDrafts, StepOutcome

logger = logging.getLogger("draftwise.engine")

PromptType = str | dict[str, Any] | list[int]


@dataclass(slots=True)
class StepTimings:
    """Where one step's time went (seconds), for profiling and bench reports."""

    schedule: float = 0.0
    propose: float = 0.0
    forward: float = 0.0
    verify: float = 0.0
    commit: float = 0.0


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

    def __init__(self, args: EngineArgs, progress: Any = None) -> None:
        from draftwise.bootstrap import build_engine_parts

        self.args = args
        start = time.monotonic()
        parts = build_engine_parts(args, progress=progress)
        #: seconds spent building the engine (weights, tokenizer, cache): reported apart
        #: from a request's time_to_first_token, which starts when the request arrives
        self.load_seconds = time.monotonic() - start
        self.loaded = parts.loaded
        self.tokenizer = parts.loaded.tokenizer
        self.runner = parts.runner
        self.kv = parts.kv
        self.scheduler = parts.scheduler
        self.max_model_len = parts.max_model_len
        #: the longest text prompt that could fit the context (see ``prompt_char_limit``)
        self.max_prompt_chars = prompt_char_limit(self.tokenizer, self.max_model_len)
        self.spec: Speculation | None = parts.speculation
        self.spec_config = parts.spec_config
        self.eos_token_ids = frozenset(parts.loaded.eos_token_ids)
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._seed_gen = torch.Generator().manual_seed(args.seed)
        self._last_log = time.monotonic()
        # Everything built so far (weights' modules, the tokenizer's vocab, plugins) lives
        # as long as the engine: keep it out of the cyclic collector's full passes, which
        # otherwise walk it every few hundred steps (~5% of a decode step's time here).
        gc.collect()
        gc.freeze()

    # -- requests -----------------------------------------------------------------------

    def tokenize_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """A string is tokenized; ``{"prompt_token_ids": [...]}`` or a list is taken as is.

        Safe to call from any thread (the server tokenizes off the engine thread): it
        reads only the tokenizer, whose encode releases the GIL. Text is checked for
        validity and length before it is tokenized, so a huge prompt costs nothing.
        """
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("prompt", "this checkpoint has no tokenizer: pass token ids")
            self._check_prompt_text("prompt", prompt, len(prompt))
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), self._prompt_ids(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return self.tokenize_prompt(str(prompt["prompt"]))
            raise RequestError("prompt", "a dict prompt needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, list | tuple):
            return None, self._prompt_ids(prompt)
        raise RequestError("prompt", f"unsupported prompt type {type(prompt).__name__}")

    def _prompt_ids(self, values: Any) -> list[int]:
        """Given token ids as ints, refused by length before anything scans them."""
        if hasattr(values, "__len__"):
            self._check_prompt_tokens(len(values))
        return _token_ids(values)

    def _check_prompt_tokens(self, num_tokens: int) -> None:
        """The prompt must leave room for at least one generated token."""
        if num_tokens >= self.max_model_len:
            raise RequestError(
                "prompt",
                f"the prompt has {num_tokens} tokens; the context is {self.max_model_len} "
                "and at least one token must be generated",
            )

    def _check_prompt_text(self, field: str, text: str, num_chars: int) -> None:
        """Refuse invalid text, and text too long to fit the context, before tokenizing."""
        check_text(field, text)
        limit = self.max_prompt_chars
        if limit is not None and num_chars > limit:
            raise RequestError(
                field,
                f"the prompt has {num_chars} characters; no more than {limit} can fit the "
                f"context of {self.max_model_len} tokens (a token of this vocabulary covers "
                f"at most {limit // self.max_model_len} characters)",
            )

    def add_request(
        self,
        prompt: PromptType,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        speculative: SpeculativeParams | None = None,
    ) -> str:
        """Validate and queue a request; returns its id. Bad input raises RequestError.

        ``speculative`` narrows speculation for this request only (off, fewer drafts, one
        chain member, fixed depth, token provenance): ``draftwise.spec_params``.
        """
        params = params or SamplingParams()
        if speculative is not None:
            check_against(speculative, self.spec)
        req_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if req_id in self.scheduler.requests:
            raise RequestError("request_id", f"request id {req_id!r} is already running")
        text, ids = self.tokenize_prompt(prompt)
        if not ids:
            raise RequestError("prompt", "the prompt is empty")
        self._check_prompt_tokens(len(ids))  # before the per-token scan below
        vocab = self.loaded.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise RequestError("prompt_token_ids", f"token id {bad[0]} outside [0, {vocab})")
        bad = [t for t in params.stop_token_ids if t >= vocab]
        if bad:
            raise RequestError("stop_token_ids", f"token id {bad[0]} outside [0, {vocab}): it "
                               "can never be generated")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise RequestError(
                "max_tokens",
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                f"context length {self.max_model_len}; ask for at most "
                f"{self.max_model_len - len(ids)} tokens",
            )
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
        )
        if self.tokenizer is not None:
            req.detok_state = IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens)
        elif params.stop_strings:
            raise RequestError("stop", "this checkpoint has no tokenizer, so stop strings cannot match")
        if self.spec is not None:
            req.spec = RequestSpecDecodeMetrics(self.spec.k)
        if speculative is not None:
            req.speculative = speculative
            if speculative.return_provenance:
                req.provenance = []
        self.scheduler.add(req)
        self.stats.num_prompt_tokens += len(ids)
        return req_id

    def abort_request(self, request_id: str) -> bool:
        """Abort a request wherever it is; its KV blocks are returned at once."""
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

        A failure inside the step that escapes it (propose, forward, verify) cannot be
        pinned on a row by looking at it, so the rows are re-run one by one
        (:meth:`_isolate`): the one that fails alone is failed alone, the others go on.
        """
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        for victim in sched.preempted:
            self.stats.num_preemptions += 1
            self._release_state(victim.req_id)
        if not sched.rows:
            return []
        try:
            outputs = self._run_rows(sched.rows, t0)
        except Exception as exc:  # noqa: BLE001 - attributed to a row, or to all of them
            outputs = self._isolate(sched.rows, exc)
        self.stats.num_steps += 1
        self._maybe_log_stats()
        return outputs

    def _run_rows(self, rows: list[ScheduledRow], t0: float) -> list[RequestOutput]:
        """propose -> forward -> verify -> commit -> feedback for scheduled rows.

        Nothing outside this step's own records changes before :meth:`_commit` (K/V past a
        row's computed tokens is rewritten, proposals keep no state the core cannot take
        back), so a step that raises earlier can be run again for any subset of ``rows``.
        """
        tm = self.stats.timings
        t_sched = time.perf_counter()
        tm.schedule += t_sched - t0
        t0 = t_sched
        tables = [self.kv.block_table(row.request.req_id) for row in rows]
        drafts = (
            self.spec.propose(rows, tables) if self.spec is not None
            else StepDrafts.none(len(rows))
        )
        t1 = time.perf_counter()
        starts = [row.request.num_computed_tokens for row in rows]
        output = self.runner.forward(self._batch(rows, drafts, tables, starts))
        t2 = time.perf_counter()
        outcome = self._verify(rows, drafts, output.logits)
        t3 = time.perf_counter()
        outputs = self._commit(rows, drafts, outcome, output.hidden_states, starts)
        tm.propose += t1 - t0
        tm.forward += t2 - t1
        tm.verify += t3 - t2
        tm.commit += time.perf_counter() - t3
        return outputs

    def _batch(
        self,
        rows: list[ScheduledRow],
        drafts: StepDrafts,
        tables: list[list[int]],
        starts: list[int],
    ) -> ForwardBatch:
        """ONE target forward: each row's new tokens then its drafts; logits where it samples."""
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
            logits_rows.append(list(range(n - 1, n + nd)) if row.samples else [])
        hidden_layers = self.spec.hidden_layers if self.spec is not None else ()
        req_ids = [row.request.req_id for row in rows]
        return self.runner.build(token_ids, starts, tables, logits_rows, hidden_layers, req_ids)

    def _verify(
        self, rows: list[ScheduledRow], drafts: StepDrafts, logits: torch.Tensor
    ) -> StepOutcome:
        """Verify every sampling row (rows without drafts simply sample) in one call."""
        from draftwise.verify import verify

        sampling = [i for i, row in enumerate(rows) if row.samples]
        outcome = StepOutcome([0] * len(rows), [None] * len(rows))
        if not sampling:
            return outcome
        reqs = [rows[i].request for i in sampling]
        # rows that do not sample never draft, so the flat drafts are the sampling rows'
        result = verify(
            logits,
            drafts.token_ids,
            [drafts.num_draft_tokens[i] for i in sampling],
            [r.params for r in reqs],
            [r.generator for r in reqs],
            draft_probs=drafts.draft_probs,
            method=self.spec_config.rejection_sample_method if self.spec_config else "standard",
        )
        for i, toks, n_acc in zip(sampling, result.output_token_ids, result.num_accepted):
            outcome.output_token_ids[i] = toks
            outcome.num_accepted[i] = n_acc
        return outcome

    def _commit(
        self,
        rows: list[ScheduledRow],
        drafts: StepDrafts,
        outcome: StepOutcome,
        hidden_states: dict[int, torch.Tensor],
        starts: list[int],
    ) -> list[RequestOutput]:
        """Commit row by row (:meth:`_commit_row`), then feed back, then build outputs."""
        offsets = [0]
        for i, row in enumerate(rows):
            offsets.append(offsets[-1] + row.num_new_tokens + drafts.num_draft_tokens[i])
        now = time.monotonic()
        progressed: list[Request] = []
        failed: list[RequestOutput] = []
        for i, row in enumerate(rows):
            try:  # detokenizing, stop strings, a row's draft state: its failure is its own
                self._commit_row(i, row, drafts, outcome, hidden_states, starts[i], offsets[i], now)
            except Exception as exc:  # noqa: BLE001 - this row fails alone
                failed.append(self._fail(row.request, exc))
                continue
            if outcome.output_token_ids[i] is not None:
                progressed.append(row.request)
        if self.spec is not None:
            try:
                self.spec.feedback(rows, drafts, outcome)
            except Exception as exc:  # noqa: BLE001 - tokens are committed: no retry is right
                logger.exception("proposer feedback failed; failing the rows it drafted for")
                drafted = {rows[i].request.req_id for i, n in enumerate(drafts.num_draft_tokens)
                           if n}
                hit = {req.req_id for req in progressed
                       if req.req_id in drafted and not req.status.finished}
                failed += [self._fail(req, exc) for req in progressed if req.req_id in hit]
                progressed = [req for req in progressed if req.req_id not in hit]
        return [self._make_output(req) for req in progressed] + failed

    def _commit_row(
        self,
        i: int,
        row: ScheduledRow,
        drafts: StepDrafts,
        outcome: StepOutcome,
        hidden_states: dict[int, torch.Tensor],  # layer -> [T, hidden], the whole step's
        start: int,
        offset: int,  # row i's first token in the step's flat batch
        now: float,
    ) -> None:
        """One row: append its verified tokens, move its draft state, keep the K/V of its
        accepted drafts and roll back the rest (``cache/rollback.py``), or finish it."""
        from draftwise.cache.rollback import rollback

        req, toks = row.request, outcome.output_token_ids[i]
        if toks is not None:  # None: a prefill chunk that does not reach the end yet
            if req.first_token_time is None:
                req.first_token_time = now
            self._append_tokens(req, toks)
            if req.provenance is not None:
                req.provenance += self._provenance(i, drafts, outcome)[: len(req.new_token_ids)]
        if req.status.finished:  # tokens past a stop are dropped with all the blocks
            req.finished_time = now
            self.scheduler.finish(req, req.status)
            self._release_state(req.req_id)
            return
        n_acc, nd = outcome.num_accepted[i], drafts.num_draft_tokens[i]
        computed = start + row.num_new_tokens + n_acc
        if self.spec is not None:
            self.spec.commit_row(req.req_id, i, drafts, start, computed, hidden_states, offset)
        rollback(self.kv, [req.req_id], [computed], [nd], [n_acc], self.runner.states)
        cacheable = self.spec.cacheable(req.req_id, computed) if self.spec is not None else computed
        self.scheduler.commit(req, computed, cacheable)

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

    def _isolate(self, rows: list[ScheduledRow], exc: Exception) -> list[RequestOutput]:
        """After a failed step: run each row alone; fail only the rows that fail alone.

        A row's retry starts from its committed tokens with its cache state discarded and
        recomputed (prefix-cache hits make that cheap): the failed forward may already have
        advanced a recurrent state in place, and recomputing is the one retry that is
        right for every model. Recomputation is what preemption does, so it is lossless.
        """
        if len(rows) == 1:
            return [self._fail(rows[0].request, exc)]
        logger.warning(
            "engine step over %d rows failed (%s: %s); re-running each row alone",
            len(rows), type(exc).__name__, exc,
        )
        outputs: list[RequestOutput] = []
        for row in rows:
            req = row.request
            if req.status.finished:
                continue
            self._release_state(req.req_id)
            retry = self.scheduler.restart(req)
            if retry is None:  # no blocks for it alone now: back to the queue, recomputed later
                continue
            try:
                outputs.extend(self._run_rows([retry], time.perf_counter()))
            except Exception as row_exc:  # noqa: BLE001 - this row fails alone
                outputs.append(self._fail(req, row_exc))
        return outputs

    def _fail(self, req: Request, exc: BaseException) -> RequestOutput:
        """Finish one request as failed, return its blocks, and say why in its output."""
        logger.error("request %s failed inside a step: %s: %s", req.req_id,
                     type(exc).__name__, exc, exc_info=exc)
        req.error = f"{type(exc).__name__}: {exc}"
        req.new_token_ids, req.new_text = [], ""
        req.finished_time = time.monotonic()
        self.scheduler.finish(req, RequestStatus.FINISHED_ERROR)
        self._release_state(req.req_id)
        return self._make_output(req)

    def _maybe_log_stats(self) -> None:
        """vLLM's periodic ``SpecDecoding metrics`` line, every ``log_stats_interval`` s."""
        interval = self.args.log_stats_interval
        if interval is None or self.spec is None:
            return
        if time.monotonic() - self._last_log >= interval:
            self.spec.logging.log(logger.info)
            self._last_log = time.monotonic()

    def _append_tokens(self, req: Request, toks: list[int]) -> None:
        """Append tokens one by one, stopping at EOS, stop ids, stop strings or length."""
        params = req.params
        new: list[int] = []
        for tok in toks:
            req.append(tok)
            new.append(tok)
            self.stats.num_generated_tokens += 1
            if not params.ignore_eos and tok in req.eos_token_ids:
                req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, None
                break
            if tok in params.stop_token_ids_set:
                req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, tok
                break
            if req.num_output_tokens >= params.max_tokens:
                req.status = RequestStatus.FINISHED_LENGTH
                break
        req.new_token_ids = new
        if req.detok_state is None:
            req.new_text = ""
            return
        delta = req.detok_state.step(new)
        if req.status.finished:
            delta += req.detok_state.flush()
        old_len = len(req.text)
        req.text += delta
        if params.stop_strings and not req.status.finished:
            self._check_stop_strings(req, old_len)
        req.new_text = req.text[old_len:]

    def _check_stop_strings(self, req: Request, old_len: int) -> None:
        """Cut the text at the first stop string that the new text completes."""
        params = req.params
        for stop in params.stop_strings:
            begin = max(0, old_len - len(stop) + 1)
            idx = req.text.find(stop, begin)
            if idx != -1:
                end = idx + len(stop) if params.include_stop_str_in_output else idx
                req.text = req.text[:end]
                req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, stop
                return

    def _make_output(self, req: Request) -> RequestOutput:
        """The vLLM-shaped cumulative output for a request."""
        finished = req.status.finished
        completion = CompletionOutput(
            index=0,
            text=req.text,
            token_ids=req.output_token_ids,
            finish_reason=req.status.value if finished else None,
            stop_reason=req.stop_reason,
        )
        return RequestOutput(
            request_id=req.req_id,
            prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids,
            outputs=[completion],
            finished=finished,
            metrics=self.request_metrics(req),
            new_token_ids=list(req.new_token_ids),
            new_text=req.new_text,
            num_cached_tokens=req.num_cached_tokens,
            error=req.error,
        )

    def request_metrics(self, req: Request) -> dict[str, Any]:
        """Timing and speculation metrics of one request."""
        out: dict[str, Any] = {
            "arrival_time": req.arrival_time,
            "first_token_time": req.first_token_time,
            "finished_time": req.finished_time,
            "time_to_first_token": (
                req.first_token_time - req.arrival_time if req.first_token_time else None
            ),
            "num_prompt_tokens": req.num_prompt_tokens,
            "num_output_tokens": req.num_output_tokens,
            "num_cached_tokens": req.num_cached_tokens,
            "num_preemptions": req.num_preemptions,
        }
        if req.spec is not None:
            out["speculative_decoding"] = sd = req.spec.as_dict()
            if req.speculative is not None:
                sd["request_settings"] = req.speculative.model_dump(exclude_defaults=True)
            if req.acceptance is not None:
                sd["adaptive"] = req.acceptance.as_dict()
        if req.provenance is not None:
            out["token_provenance"] = list(req.provenance)
        return out

    # -- chat -----------------------------------------------------------------------------

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Render a conversation with the checkpoint's chat template and tokenize it.

        Thread-safe like :meth:`tokenize_prompt`; message text is checked (valid Unicode,
        not longer than the context could hold) before the template runs.
        """
        total = 0
        for i, msg in enumerate(messages):
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, str):
                check_text(f"messages[{i}].content", content)
                total += len(content)
        if self.tokenizer is not None:
            self._check_prompt_text("messages", "", total)
        return self.loaded.encode_chat(messages, add_generation_prompt=add_generation_prompt)


def prompt_char_limit(tokenizer: Any, max_model_len: int) -> int | None:
    """Characters beyond which a text prompt cannot fit ``max_model_len`` tokens.

    Each token of a byte-level or SentencePiece vocabulary covers at most as many input
    characters as its longest vocabulary entry has (a byte-level entry spells one
    character per byte, and a character is at least one byte), so a prompt of more than
    ``max_model_len * longest`` characters needs more tokens than the context holds. The
    check is a length comparison, run before the tokenizer ever sees the text.
    """
    if tokenizer is None:
        return None
    return max_model_len * max(1, int(tokenizer.max_token_chars))


def _token_ids(values: Any) -> list[int]:
    """Prompt token ids as ints; anything else is a named refusal."""
    try:
        return [operator.index(t) for t in values]
    except TypeError:
        raise RequestError("prompt_token_ids", "token ids must be integers") from None
