"""Server-side Prometheus metrics on a per-app ``CollectorRegistry``.

Names follow vLLM's (``vllm:time_to_first_token_seconds`` -> ``draftwise:…``) so existing
dashboards port by a prefix swap. The spec-decode counters are not defined here: they
come from :mod:`draftwise.metrics` (``SpecDecodingProm``), registered on the same
registry and fed from the engine's running totals after every step. A registry per app (not the global one) lets tests and
embedders run several apps in one process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from draftwise.request import RequestOutput

logger = logging.getLogger("draftwise.server")

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
               0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
               40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)

#: the route templates counted by path; anything else is counted as "other"
KNOWN_PATHS = frozenset({
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics",
    "/version", "/kv_events",
})


class ServerMetrics:
    """Request counts and latency histograms; also the engine loop's observer."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None,
                 engine: Any = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        spec = getattr(engine, "spec", None)
        #: the spec-decode counters exist only when the engine speculates
        self.spec_feed = SpecCounterFeed(self.registry, spec, model_name) if spec else None
        if spec is not None and getattr(spec, "policy", None) is not None:
            cost_model_gauges(self.registry, spec.policy.cost, model_name)
            if getattr(spec.policy, "rest", None) is not None:
                batch_rest_gauges(self.registry, spec.policy.rest, model_name)
        labels = ["model_name"]
        reg = self.registry
        self.http_requests = Counter(
            "draftwise:http_requests", "HTTP requests by path and status code.",
            ["path", "method", "status"], registry=reg,
        )
        self.request_success = Counter(
            "draftwise:request_success", "Finished requests by finish reason.",
            [*labels, "finished_reason"], registry=reg,
        )
        self.request_failure = Counter(
            "draftwise:request_failure", "Requests that failed after they were admitted.",
            [*labels, "reason"], registry=reg,
        )
        self.prompt_tokens = Counter(
            "draftwise:prompt_tokens", "Prompt tokens of finished requests.", labels,
            registry=reg,
        )
        self.generation_tokens = Counter(
            "draftwise:generation_tokens", "Generated tokens of finished requests.", labels,
            registry=reg,
        )
        self.ttft = Histogram(
            "draftwise:time_to_first_token_seconds",
            "Seconds from arrival at the engine loop to the first token.", labels,
            buckets=TTFT_BUCKETS, registry=reg,
        )
        self.itl = Histogram(
            "draftwise:inter_token_latency_seconds",
            "Seconds between a request's outputs divided by the tokens the later one added.",
            labels, buckets=ITL_BUCKETS, registry=reg,
        )
        self.e2e = Histogram(
            "draftwise:e2e_request_latency_seconds",
            "Seconds from arrival at the engine loop to the last token.", labels,
            buckets=E2E_BUCKETS, registry=reg,
        )
        self._running = Gauge(
            "draftwise:num_requests_running", "Requests the engine loop is serving.", labels,
            registry=reg,
        )
        self._kv_used = Gauge(
            "draftwise:kv_cache_used_blocks", "KV-cache blocks with at least one user.",
            labels, registry=reg,
        )

        # what routers read (vLLM's names, which SGLang's gateway and llm-d's EPP scrape)
        self._router_gauges = {
            key: Gauge(f"draftwise:{name}", doc, labels, registry=reg)
            for key, name, doc in (
                ("num_waiting", "num_requests_waiting",
                 "Requests queued in the scheduler, not yet in the batch."),
                ("num_running", "num_requests_in_batch",
                 "Requests in the scheduler's running batch."),
                ("kv_usage", "kv_cache_usage_perc",
                 "Fraction of the KV-cache blocks held by requests (1 = full)."),
                ("prefix_cache_queries", "prefix_cache_queries",
                 "Prompt tokens looked up in the prefix cache (cumulative)."),
                ("prefix_cache_hits", "prefix_cache_hits",
                 "Prompt tokens served from the prefix cache (cumulative)."),
            )
        }

    def watch(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        """Gauges read the engine loop's published snapshot at scrape time."""
        self._running.labels(self.model_name).set_function(
            lambda: float(snapshot().get("num_requests") or 0))
        self._kv_used.labels(self.model_name).set_function(
            lambda: float(snapshot().get("kv_used_blocks") or 0))
        for key, gauge in self._router_gauges.items():
            gauge.labels(self.model_name).set_function(
                lambda key=key: float(snapshot().get(key) or 0))

    # -- the engine loop's observer (called on the engine thread; prometheus is thread-safe)

    def on_first_token(self, ttft: float) -> None:
        """Record a time to first token."""
        self.ttft.labels(self.model_name).observe(ttft)

    def on_tokens(self, seconds_per_token: float) -> None:
        """Record one inter-token latency sample."""
        self.itl.labels(self.model_name).observe(seconds_per_token)

    def on_finished(self, out: RequestOutput, e2e: float) -> None:
        """Count a finished request and its tokens (every one of its ``n`` completions')."""
        reason = out.outputs[0].finish_reason or "unknown"
        self.request_success.labels(self.model_name, reason).inc()
        self.prompt_tokens.labels(self.model_name).inc(len(out.prompt_token_ids))
        self.generation_tokens.labels(self.model_name).inc(
            sum(len(c.token_ids) for c in out.outputs))
        self.e2e.labels(self.model_name).observe(e2e)

    def on_step(self) -> None:
        """After every engine step: bring the spec-decode counters up to date."""
        if self.spec_feed is not None:
            self.spec_feed.update()

    def on_failed(self, reason: str) -> None:
        """Count a request that failed or was aborted after admission."""
        self.request_failure.labels(self.model_name, reason).inc()

    def on_http(self, path: str, method: str, status: int) -> None:
        """Count one HTTP request (path collapsed to a known route)."""
        self.http_requests.labels(path if path in KNOWN_PATHS else "other", method,
                                  str(status)).inc()


class SpecCounterFeed:
    """Feeds :class:`draftwise.metrics.SpecDecodingProm` from the engine's running totals.

    The engine keeps cumulative ``SpecDecodingStats`` (``engine.spec.metrics``);
    ``SpecDecodingProm.observe`` takes per-step stats. After each step the loop calls
    :meth:`update`, which observes the difference since the previous call.
    """

    def __init__(self, registry: CollectorRegistry, spec: Any, model_name: str) -> None:
        from draftwise.metrics import SpecDecodingProm

        self.spec = spec
        self.k = int(spec.metrics.num_spec_tokens)
        self.prom = SpecDecodingProm(registry, self.k, model_name)
        self._last = self._totals()

    def _totals(self) -> tuple[int, int, int, list[int], list[int]]:
        m = self.spec.metrics
        return (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens,
                list(m.num_accepted_tokens_per_pos), list(m.num_draft_tokens_per_pos))

    def update(self) -> None:
        """Observe what was drafted and accepted since the last call."""
        from draftwise.metrics import SpecDecodingStats

        now = self._totals()
        last = self._last
        if now[0] == last[0]:
            return
        if now[0] < last[0]:  # the totals were reset: start over
            last = (0, 0, 0, [0] * self.k, [0] * self.k)
        self._last = now
        self.prom.observe(SpecDecodingStats(
            num_spec_tokens=self.k,
            num_drafts=now[0] - last[0],
            num_draft_tokens=now[1] - last[1],
            num_accepted_tokens=now[2] - last[2],
            num_accepted_tokens_per_pos=[a - b for a, b in zip(now[3], last[3])],
            num_draft_tokens_per_pos=[a - b for a, b in zip(now[4], last[4])],
        ))


def cost_model_gauges(registry: CollectorRegistry, cost: Any, model_name: str) -> None:
    """Adaptive depth's measured cost model: forward seconds per (rows, tokens per row),
    and the drafters' running seconds per draft token (read at scrape time: the engine's
    steps recalibrate the grid as they run)."""
    forward = Gauge(
        "draftwise:spec_decode_cost_forward_seconds",
        "Measured seconds of one target forward of `rows` rows x `tokens_per_row` tokens.",
        ["model_name", "rows", "tokens_per_row"], registry=registry,
    )
    for i, r in enumerate(cost.rows):
        for j, t in enumerate(cost.tokens_per_row):
            forward.labels(model_name, str(r), str(t)).set_function(
                lambda i=i, j=j: float(cost.seconds[i][j]))
    draft = Gauge(
        "draftwise:spec_decode_cost_draft_seconds_per_token",
        "Running mean seconds the drafters spend per draft token asked for.",
        ["model_name"], registry=registry,
    )
    draft.labels(model_name).set_function(lambda: float(cost.draft_seconds_per_token))


def batch_rest_gauges(registry: CollectorRegistry, rest: Any, model_name: str) -> None:
    """How often adaptive depth's batch rested (``draftwise.spec.batch_rest``), read at scrape
    time: rests taken, and steps rested (no row drafted)."""
    for name, doc, attr in (
        ("spec_decode_batch_rests", "Times the batch rested: its drafts were not verified "
         "for probe_interval steps in a row.", "num_rests"),
        ("spec_decode_batch_rested_steps", "Steps in which the batch rested.",
         "num_rested_steps"),
    ):
        gauge = Gauge(f"draftwise:{name}", doc, ["model_name"], registry=registry)
        gauge.labels(model_name).set_function(lambda attr=attr: float(getattr(rest, attr)))
