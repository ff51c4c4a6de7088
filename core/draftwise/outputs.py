"""The vLLM-shaped outputs the engine returns: one request's, or an ``n > 1`` parent's."""

from __future__ import annotations

from typing import Any

from draftwise.request import CompletionOutput, ParentRequest, Request, RequestOutput


def completion(req: Request) -> CompletionOutput:
    """One sample's cumulative completion (``index`` is its place among the n)."""
    finished = req.status.finished
    return CompletionOutput(
        index=req.index,
        text=req.text,
        token_ids=req.output_token_ids,
        finish_reason=req.status.value if finished else None,
        stop_reason=req.stop_reason,
        cumulative_logprob=req.cumulative_logprob,
        logprobs=None if req.logprobs is None else list(req.logprobs),
    )


def request_output(req: Request) -> RequestOutput:
    """The cumulative output of a request with one sample."""
    return RequestOutput(
        request_id=req.req_id,
        prompt=req.prompt,
        prompt_token_ids=req.prompt_token_ids,
        outputs=[completion(req)],
        finished=req.status.finished,
        metrics=request_metrics(req),
        new_token_ids=list(req.new_token_ids),
        new_text=req.new_text,
        num_cached_tokens=req.num_cached_tokens,
        error=req.error,
        error_field=req.error_field,
        prompt_logprobs=_prompt_logprobs(req),
    )


def parent_output(parent: ParentRequest, moved: list[Request]) -> RequestOutput:
    """An ``n > 1`` request after a step: every sample's completion, in index order.

    ``new_token_ids`` holds the tokens all samples added this step (for token counts);
    ``new_text`` is empty, since text streams per completion (each is cumulative). The
    metrics are sample 0's, with the output and cached tokens of all samples summed and
    each sample's own under ``samples``.
    """
    first = parent.children[0]
    samples = [request_metrics(c) for c in parent.children]
    metrics = dict(samples[0])
    metrics["num_output_tokens"] = sum(s["num_output_tokens"] for s in samples)
    metrics["num_cached_tokens"] = sum(s["num_cached_tokens"] for s in samples)
    metrics["samples"] = samples
    return RequestOutput(
        request_id=parent.req_id,
        prompt=first.prompt,
        prompt_token_ids=first.prompt_token_ids,
        outputs=[completion(c) for c in parent.children],
        finished=parent.finished,
        metrics=metrics,
        new_token_ids=[t for req in moved for t in req.new_token_ids],
        new_text="",
        num_cached_tokens=metrics["num_cached_tokens"],
        error=parent.error,
        error_field=parent.error_field,
        prompt_logprobs=_prompt_logprobs(first),
    )


def _prompt_logprobs(req: Request) -> list | None:
    """The prompt's entries once every one is recorded (vLLM returns them whole)."""
    lps = req.prompt_logprobs
    if lps is None or len(lps) < req.num_prompt_tokens:
        return None
    return list(lps)


def request_metrics(req: Request) -> dict[str, Any]:
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
        if req.spec.adaptive is not None:  # set when the request ended (its final output)
            sd["adaptive"] = req.spec.adaptive
    if req.provenance is not None:
        out["token_provenance"] = list(req.provenance)
    return out


__all__ = ["completion", "parent_output", "request_metrics", "request_output"]
