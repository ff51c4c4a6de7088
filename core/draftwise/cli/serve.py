"""``draftwise serve``: the OpenAI-compatible HTTP server.

The engine is built before any socket opens, so a refused speculative config or an
unreadable checkpoint exits 2 with the message (as every engine-driving command does)
instead of a server that half-starts.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import click

from draftwise.server.limits import ServerLimits

#: the environment variable --api-key falls back to
API_KEY_ENV = "DRAFTWISE_API_KEY"
#: the limits' defaults, shown by --help
_LIMITS = ServerLimits()


def default_served_name(model: str | None, engine: Any) -> str:
    """The ``--model`` string as given (vLLM's default), else the checkpoint's name."""
    if model:
        return model
    loaded = getattr(engine, "loaded", None)
    path = getattr(loaded, "path", None)
    return Path(str(path)).name if path else "default"


@click.command("serve")
@click.option("--model", default=None, help="Checkpoint: a .gguf file or an HF safetensors dir "
              "(default: the embedded SmolLM2-135M-Instruct).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--speculative-config", "-sc", default=None,
              help="vLLM-style JSON, e.g. '{\"method\":\"ngram\",\"num_speculative_tokens\":4}'.")
@click.option("--max-num-seqs", default=32, show_default=True, type=click.IntRange(1),
              help="Requests batched together per step.")
@click.option("--max-model-len", default=None, type=click.IntRange(2),
              help="Context length (default: the model's, capped at 8192).")
@click.option("--max-num-batched-tokens", default=None, type=click.IntRange(1),
              help="Tokens one step feeds, prefill chunks included (default: 2048).")
@click.option("--long-prefill-token-threshold", default=None, type=click.IntRange(0),
              help="While a stream decodes, a step's prefill does at most this many "
              "prompt tokens' work at context 0; chunks of a long prompt shrink as its "
              "prefix grows (default: 256; 0: off, prefill takes the whole step).")
@click.option("--num-kv-blocks", default=None, type=click.IntRange(2),
              help="KV cache blocks (of 16 tokens; per replica with --replicas). Default: "
              "enough for --max-num-seqs full contexts, capped at 2 GiB.")
@click.option("--threads", "num_threads", default=None, type=click.IntRange(1),
              help="compute threads (default: every core with the native "
              "GEMMs, else cores - 1).")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]),
              help="cpu: the C kernels; cuda: the same engine on the Triton kernels, "
              "where torch sees a CUDA device and triton is installed (docs/gpu.md).")
@click.option("--tensor-parallel-size", "tensor_parallel_size", default=1, show_default=True,
              type=int, help="Ranks the target is split over (HF safetensors llama-family "
              "targets; local processes over gloo; --threads is then per rank).")
@click.option("--dtype", default="auto", show_default=True,
              type=click.Choice(["auto", "bfloat16", "float32", "float16"]))
@click.option("--served-model-name", "served_names", multiple=True,
              help="Name(s) clients use as `model` (repeatable; default: --model as given).")
@click.option("--api-key", default=None,
              help="Require 'Authorization: Bearer KEY' on /v1 (env: DRAFTWISE_API_KEY); "
                   "an empty key is an error, not 'no auth'.")
@click.option("--return-spec-metrics", is_flag=True,
              help="Add per-request spec-decode metrics to every response (a request can "
                   "also ask with \"return_spec_metrics\": true).")
@click.option("--draft-index-scope", default="user", show_default=True,
              type=click.Choice(["user", "server", "off"]),
              help="Who may be drafted from whose earlier outputs (suffix decoding's global "
                   "index): requests with the same `user` field; every request of the "
                   "server; nobody (each request drafts from its own tokens only).")
@click.option("--shutdown-timeout", default=30.0, show_default=True,
              type=click.FloatRange(0.0),
              help="Seconds in-flight requests get to finish after SIGTERM/SIGINT.")
@click.option("--max-request-bytes", default=_LIMITS.max_request_bytes, show_default=True,
              type=click.IntRange(1024),
              help="Largest request body; a bigger one is a 413 before it is read.")
@click.option("--header-timeout", default=_LIMITS.header_timeout, show_default=True,
              type=click.FloatRange(0.0, min_open=True),
              help="Seconds a client has to send a request's headers (then 408 and close).")
@click.option("--first-byte-timeout", default=_LIMITS.first_byte_timeout, show_default=True,
              type=click.FloatRange(0.0, min_open=True),
              help="Seconds a new connection has to send its first byte (then closed).")
@click.option("--body-timeout", default=_LIMITS.body_timeout, show_default=True,
              type=click.FloatRange(0.0, min_open=True),
              help="Seconds a client has to send a request's body (then 408 and close).")
@click.option("--keep-alive-timeout", default=_LIMITS.keep_alive_timeout,
              show_default=True, type=click.FloatRange(0.0, min_open=True),
              help="Seconds an idle keep-alive connection stays open.")
@click.option("--max-connections", default=_LIMITS.max_connections, show_default=True,
              type=click.IntRange(1),
              help="Open connections at once; at the cap a new one closes the longest-idle "
                   "one, and only when all are busy gets 503.")
@click.option("--enable-docs", is_flag=True,
              help="Serve /docs, /redoc and /openapi.json (behind --api-key when set).")
@click.option("--logprobs-mode", default=None,
              type=click.Choice(["raw_logprobs", "processed_logprobs"]),
              help="What logprobs report: the model's raw distribution (raw_logprobs, the "
              "default, as vLLM's) or the processed one tokens are drawn from.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(1),
              help="Engine replicas on Ray Serve behind this one endpoint (needs the "
              "`ray` extra); 1: this process serves alone.")
@click.option("--ray-address", default=None,
              help="Join this Ray cluster instead of starting one on 127.0.0.1. Ray's "
              "traffic is unauthenticated: see docs/scaling.md.")
@click.option("--min-replicas", default=None, type=click.IntRange(1),
              help="Autoscaling lower bound (with --max-replicas; --replicas starts).")
@click.option("--max-replicas", default=None, type=click.IntRange(1),
              help="Autoscaling upper bound (with --min-replicas).")
@click.option("--routing", default="prefix", show_default=True,
              type=click.Choice(["prefix", "round-robin", "power-of-two"]),
              help="How replicas are picked: the one holding the longest prefix of the "
              "prompt (load-bounded), or blind to prefixes.")
def serve(
    model: str | None,
    host: str,
    port: int,
    speculative_config: str | None,
    max_num_seqs: int,
    max_model_len: int | None,
    max_num_batched_tokens: int | None,
    long_prefill_token_threshold: int | None,
    num_kv_blocks: int | None,
    dtype: str,
    device: str,
    served_names: tuple[str, ...],
    api_key: str | None,
    return_spec_metrics: bool,
    draft_index_scope: str,
    shutdown_timeout: float,
    max_request_bytes: int,
    header_timeout: float,
    first_byte_timeout: float,
    body_timeout: float,
    keep_alive_timeout: float,
    max_connections: int,
    enable_docs: bool,
    log_level: str,
    num_threads: int | None,
    logprobs_mode: str | None,
    tensor_parallel_size: int = 1,
    replicas: int = 1,
    ray_address: str | None = None,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    routing: str = "prefix",
) -> None:
    """Serve /v1/completions and /v1/chat/completions (OpenAI API) until SIGTERM."""
    from draftwise.cli.common import (
        announce_backend,
        build_engine,
        check_text_option,
        claim_prefault,
        fail,
    )

    # first: the weights' memory faults in on another core while the imports below run
    # (started by cli.main, before the plugins' imports, where it read the same options)
    reserved = claim_prefault(model, dtype) if device == "cpu" else None
    from draftwise.server.serving import check_api_key

    if api_key is None:
        api_key = os.environ.get(API_KEY_ENV)  # set but empty is refused below, not "off"
    try:
        check_api_key(api_key)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=f"--api-key / {API_KEY_ENV}") from None
    for name in served_names:
        check_text_option("--served-model-name", name)
    limits = ServerLimits(
        max_request_bytes=max_request_bytes, header_timeout=header_timeout,
        first_byte_timeout=first_byte_timeout, body_timeout=body_timeout,
        keep_alive_timeout=keep_alive_timeout, max_connections=max_connections,
    )

    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    kwargs: dict[str, Any] = {"max_num_seqs": max_num_seqs}
    if device != "cpu":
        kwargs["device"] = device
    if logprobs_mode is not None:
        kwargs["logprobs_mode"] = logprobs_mode
    if num_threads is not None:
        kwargs["num_threads"] = num_threads
    if tensor_parallel_size != 1:
        kwargs["tensor_parallel_size"] = tensor_parallel_size
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    if max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = max_num_batched_tokens
    if long_prefill_token_threshold is not None:
        kwargs["long_prefill_token_threshold"] = long_prefill_token_threshold
    if num_kv_blocks is not None:
        kwargs["num_kv_blocks"] = num_kv_blocks
    if replicas > 1 or ray_address or min_replicas is not None or max_replicas is not None:
        if tensor_parallel_size != 1 or device != "cpu":
            # each replica would start its own rank processes / a device engine: neither
            # is wired through Ray Serve's replica placement, so refuse rather than guess
            raise click.UsageError(
                "--replicas (or --ray-address / autoscaling bounds) runs CPU engines of "
                "one process each: drop --tensor-parallel-size/--device, or serve one "
                "split engine without --replicas.")
        if reserved is not None:  # the replicas load the weights, not this process
            reserved.finish()
        from draftwise.cli.serve_replicas import serve_replicas

        serve_replicas(model=model, speculative_config=speculative_config, dtype=dtype,
                       engine_kwargs=kwargs, served_names=served_names, api_key=api_key,
                       return_spec_metrics=return_spec_metrics,
                       draft_index_scope=draft_index_scope, limits=limits,
                       enable_docs=enable_docs, host=host, port=port, replicas=replicas,
                       ray_address=ray_address, min_replicas=min_replicas,
                       max_replicas=max_replicas, routing=routing)
        return
    try:
        engine = build_engine(model, speculative_config, dtype, reserved=reserved, **kwargs)
    except Exception as exc:  # noqa: BLE001 - refusals exit 2 with the message
        fail(exc)

    from draftwise.server import ServerConfig, create_app
    from draftwise.server.runner import serve as run_server

    names = served_names or (default_served_name(model, engine),)
    config = ServerConfig(
        served_model_names=tuple(names),
        api_key=api_key,
        return_spec_metrics=return_spec_metrics,
        draft_index_scope=draft_index_scope,  # type: ignore[arg-type]
        limits=limits,
        enable_docs=enable_docs,
        model_root=str(getattr(getattr(engine, "loaded", None), "path", model or "")) or None,
    )
    app = create_app(engine, config)
    spec = engine.spec_config.to_json() if engine.spec_config is not None else None

    def ready(url: str) -> None:
        click.echo(f"draftwise serving {names[0]!r} on {url} (speculation: "
                   f"{spec if spec else 'off'}; pid {os.getpid()})", err=True)
        announce_backend(engine)  # after the ready line, which scripts read for the port

    run_server(app, host, port, log_level=log_level, shutdown_timeout=shutdown_timeout,
               on_ready=ready)


if __name__ == "__main__":  # `python -m draftwise.cli.serve` before the group registers it
    serve()
