"""``draftwise generate``: one prompt, streamed to the terminal (or JSON with metrics).

Text streams to stdout as it is produced; speed and, with speculation, acceptance (mean
acceptance length, rate per draft position) follow on stderr, so piped text stays clean.
``--json`` prints ONE document when the request finishes instead of streaming: it holds
totals only known at the end (speed, acceptance per position, proposer stats) and
benchmark scripts parse it whole; stream with plain output, or the server's SSE.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click


@click.command("generate")
@click.option("--model", default=None, help="Checkpoint: a .gguf file or an HF safetensors dir "
              "(default: the embedded SmolLM2-135M-Instruct).")
@click.option("--prompt", default=None, help="The prompt text.")
@click.option("--prompt-token-ids", default=None,
              help="Comma-separated prompt token ids instead of text (implies --no-chat).")
@click.option("--chat/--no-chat", default=True, show_default=True,
              help="Wrap the prompt as a user turn with the model's chat template.")
@click.option("--system", default=None, help="A system message (with --chat).")
@click.option("--max-tokens", default=256, show_default=True, type=click.IntRange(1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0.0))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0.0, 1.0))
@click.option("--top-k", default=0, show_default=True, type=int, help="0 = off.")
@click.option("--min-p", default=0.0, show_default=True, type=click.FloatRange(0.0, 1.0))
@click.option("--seed", default=None, type=int)
@click.option("--presence-penalty", default=0.0, show_default=True, type=float)
@click.option("--frequency-penalty", default=0.0, show_default=True, type=float)
@click.option("--repetition-penalty", default=1.0, show_default=True, type=float)
@click.option("--logit-bias", default=None,
              help='JSON object of token id -> bias, e.g. \'{"42": -100}\'.')
@click.option("--min-tokens", default=0, show_default=True, type=int)
@click.option("--stop", multiple=True, help="A stop string (repeatable).")
@click.option("--bad-words", multiple=True, help="A word never to generate (repeatable).")
@click.option("--logprobs", default=None, type=int,
              help="Top log-probabilities per token, in the --json output.")
@click.option("--speculative-config", "-sc", default=None,
              help="vLLM-style JSON, e.g. '{\"method\":\"ngram\",\"num_speculative_tokens\":4}'.")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]),
              help="cpu: the C kernels; cuda: the same engine on the Triton kernels, "
              "where torch sees a CUDA device and triton is installed (docs/gpu.md).")
@click.option("--dtype", default="auto", show_default=True,
              type=click.Choice(["auto", "bfloat16", "float32", "float16"]))
@click.option("--json", "as_json", is_flag=True,
              help="Print text, token_ids and metrics as one JSON document at the end.")
@click.option("--threads", "num_threads", default=None, type=click.IntRange(1),
              help="compute threads (default: every core with the native "
              "GEMMs, else cores - 1).")
@click.option("--tensor-parallel-size", "tensor_parallel_size", default=1, show_default=True,
              type=int, help="Ranks the target is split over (HF safetensors llama-family "
              "targets; local processes over gloo; --threads is then per rank).")
def generate(
    model: str | None,
    prompt: str | None,
    prompt_token_ids: str | None,
    chat: bool,
    system: str | None,
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float,
    seed: int | None,
    presence_penalty: float,
    frequency_penalty: float,
    repetition_penalty: float,
    logit_bias: str | None,
    min_tokens: int,
    stop: tuple[str, ...],
    bad_words: tuple[str, ...],
    logprobs: int | None,
    speculative_config: str | None,
    dtype: str,
    device: str,
    as_json: bool,
    num_threads: int | None,
    tensor_parallel_size: int,
) -> None:
    """Generate a completion for PROMPT, streaming text as it is produced."""
    from draftwise.cli.common import (
        announce_backend,
        build_engine,
        check_text_option,
        claim_prefault,
        fail,
        peak_rss_bytes,
        process_started,
        sampling_params,
    )

    # first: the weights' memory faults in on another core while the imports below run
    # (started by cli.main, before the plugins' imports, where it read the same options)
    # (a CPU engine's memory: --device cuda places its weights on the device)
    reserved = claim_prefault(model, dtype) if device == "cpu" else None

    if (prompt is None) == (prompt_token_ids is None):
        raise click.UsageError("give exactly one of --prompt and --prompt-token-ids")
    check_text_option("--prompt", prompt)
    check_text_option("--system", system)
    for value in (*stop, *bad_words):
        check_text_option("--stop / --bad-words", value)
    bias = None
    if logit_bias is not None:
        try:
            bias = json.loads(logit_bias)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--logit-bias") from None
    params = sampling_params(
        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        seed=seed, max_tokens=max_tokens, presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty, repetition_penalty=repetition_penalty,
        logit_bias=bias, min_tokens=min_tokens, stop=stop, bad_words=bad_words,
        logprobs=logprobs,
    )
    ids: list[int] | None = None
    if prompt_token_ids is not None:
        try:
            ids = [int(t) for t in prompt_token_ids.replace(" ", "").split(",") if t]
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--prompt-token-ids") from exc

    from draftwise.spec.params import SpeculativeParams

    # --json reports where each token came from (accepted draft / recovered / bonus / plain)
    spec_params = SpeculativeParams(return_provenance=True) if as_json else None
    building = time.monotonic()  # start-up before this: interpreter, imports, options
    try:
        engine = build_engine(
            model, speculative_config, dtype, reserved=reserved, max_num_seqs=1,
            num_threads=num_threads, device=device,
            tensor_parallel_size=tensor_parallel_size,
        )
        announce_backend(engine)
        if ids is not None:
            engine.add_request({"prompt_token_ids": ids}, params, request_id="cli",
                               speculative=spec_params)
        elif chat:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}
            ]
            request = {"prompt_token_ids": engine.apply_chat_template(messages)}
            engine.add_request(request, params, request_id="cli", speculative=spec_params)
        else:
            engine.add_request(prompt, params, request_id="cli", speculative=spec_params)
    except Exception as exc:  # noqa: BLE001 - refusals exit 2 with the message
        fail(exc)
    t0 = time.perf_counter()
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if not as_json and out.new_text:
                click.echo(out.new_text, nl=False)
            if out.finished:
                final = out
    seconds = time.perf_counter() - t0
    if final is None:  # pragma: no cover - the engine always finishes a request
        raise SystemExit(1)
    if final.error is not None:  # failed inside a step (logged); no traceback for the user
        click.echo(f"\nerror: the request failed: {final.error}", err=True)
        raise SystemExit(1)
    completion = final.outputs[0]
    n = len(completion.token_ids)
    speed = n / seconds if seconds else 0.0
    speculation = engine.spec.metrics.summary() if engine.spec is not None else None
    if as_json:
        started = process_started()
        metrics = dict(final.metrics)
        metrics["seconds"] = seconds
        metrics["tok_per_s"] = speed
        # time_to_first_token counts from the request's arrival; a user also waits for
        # the start-up (interpreter and imports) and the load, so each is reported, and
        # the wall time from the process's start to the first token
        metrics["startup_seconds"] = building - started
        metrics["load_seconds"] = engine.load_seconds
        if final.metrics.get("first_token_time") is not None:
            metrics["first_token_after_start_seconds"] = final.metrics["first_token_time"] - started
        metrics["peak_rss_bytes"] = peak_rss_bytes()
        click.echo(json.dumps({
            "text": completion.text,
            "token_ids": completion.token_ids,
            "finish_reason": completion.finish_reason,
            "logprobs": None if completion.logprobs is None else [
                {str(t): {"logprob": lp.logprob, "rank": lp.rank, "token": lp.decoded_token}
                 for t, lp in pos.items()} for pos in completion.logprobs],
            "prompt_token_ids": final.prompt_token_ids,
            "speculative_config": engine.spec_config.to_json() if engine.spec_config else None,
            "metrics": metrics,
            "backend": engine.loaded.model.backend.as_dict(),
            "speculation": speculation,
            "proposers": engine.spec.proposer_stats() if engine.spec is not None else None,
            "token_provenance": metrics.pop("token_provenance", None),
        }, indent=2))
        return
    click.echo()
    click.echo(summary_line(n, seconds, speculation), err=True)


def summary_line(num_tokens: int, seconds: float, speculation: dict[str, Any] | None) -> str:
    """``32 tokens in 1.10 s (29.1 tok/s); acceptance ...`` for the terminal."""
    speed = num_tokens / seconds if seconds else 0.0
    line = f"{num_tokens} tokens in {seconds:.2f} s ({speed:.1f} tok/s)"
    if speculation is None:
        return line
    if not speculation["num_drafts"]:
        return line + "; speculation on, nothing was drafted"
    per_pos = ", ".join(f"{r:.2f}" for r in speculation["acceptance_rate_per_pos"])
    return (
        f"{line}; {speculation['num_accepted_tokens']}/{speculation['num_draft_tokens']} drafts "
        f"accepted ({100 * speculation['draft_acceptance_rate']:.0f}%), mean acceptance length "
        f"{speculation['mean_acceptance_length']:.2f}, per position {per_pos}"
    )
