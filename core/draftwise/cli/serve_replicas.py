"""``draftwise serve --replicas N``: the same server, as N engine replicas on Ray Serve.

Split from ``serve.py`` so the single-process path never imports Ray: this module runs
only when replicas (or a Ray address, or autoscaling bounds) are asked for. The engine
is built by each replica, not here; a replica that cannot load its model exits 2 with
the engine's error, as the single-process server does.
"""

from __future__ import annotations

import os
from typing import Any

import click

from draftwise.server.limits import ServerLimits


def serve_replicas(*, model: str | None, speculative_config: str | None, dtype: str,
                   engine_kwargs: dict[str, Any], served_names: tuple[str, ...],
                   api_key: str | None, return_spec_metrics: bool, draft_index_scope: str,
                   limits: ServerLimits, enable_docs: bool, host: str, port: int,
                   replicas: int, ray_address: str | None, min_replicas: int | None,
                   max_replicas: int | None, routing: str) -> None:
    """Start (or join) Ray, deploy, serve until SIGTERM; refusals exit 2 with the reason."""
    from draftwise.cli.common import fail

    try:
        import ray  # noqa: F401 - the extra's presence, checked before anything starts
    except ImportError:
        raise click.UsageError("--replicas needs Ray Serve: pip install 'draftwise[ray]' "
                               "(or serve without --replicas)") from None
    from draftwise.scale.app import Scaling, run
    from draftwise.scale.replica import ReplicaSpec, ReplicaStartError
    from draftwise.server import ServerConfig

    try:
        scaling = Scaling(replicas=replicas, min_replicas=min_replicas,
                          max_replicas=max_replicas,
                          threads=engine_kwargs.get("num_threads", 1), routing=routing)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    kwargs = {**engine_kwargs, "num_threads": scaling.threads}
    config = ServerConfig(
        served_model_names=served_names or (model or "default",),
        api_key=api_key, return_spec_metrics=return_spec_metrics,
        draft_index_scope=draft_index_scope,  # type: ignore[arg-type]
        limits=limits, enable_docs=enable_docs, model_root=model,
    )
    spec = ReplicaSpec(model=model, speculative_config=speculative_config, dtype=dtype,
                       engine_kwargs=kwargs, config=config)

    def ready(url: str) -> None:
        click.echo(f"draftwise serving {config.served_model_names[0]!r} on {url} with "
                   f"{replicas} replicas x {scaling.threads} threads on Ray (routing: "
                   f"{routing}; pid {os.getpid()})", err=True)

    try:
        run(spec, scaling, host, port, ray_address, on_ready=ready)
    except ReplicaStartError as exc:
        fail(exc)
