"""Adaptive depth's cost model on /metrics: forward seconds per (rows, tokens), draft cost."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import generate_latest

from draftwise.spec.batch_rest import BatchRest
from draftwise.spec.cost_model import CostModel
from draftwise.metrics import SpecDecodingStats
from draftwise.server.metrics import ServerMetrics


def test_cost_model_gauges() -> None:
    cost = CostModel([1, 2], [1, 2], [[0.01, 0.02], [0.03, 0.04]])
    cost.observe_draft(0.002, 4)
    spec = SimpleNamespace(metrics=SpecDecodingStats(1), policy=SimpleNamespace(cost=cost))
    metrics = ServerMetrics("m", engine=SimpleNamespace(spec=spec))
    text = generate_latest(metrics.registry).decode()
    assert ('draftwise:spec_decode_cost_forward_seconds{model_name="m",rows="2",'
            'tokens_per_row="1"} 0.03') in text
    assert 'draftwise:spec_decode_cost_draft_seconds_per_token{model_name="m"} 0.0005' in text


def test_cost_gauges_follow_the_recalibrated_grid() -> None:
    cost = CostModel([1], [1, 2], [[0.01, 0.02]])
    spec = SimpleNamespace(metrics=SpecDecodingStats(1), policy=SimpleNamespace(cost=cost))
    metrics = ServerMetrics("m", engine=SimpleNamespace(spec=spec))
    for _ in range(8):  # the engine's own steps at 1 row x 2 tokens: an anchor
        cost.observe_step(1, 2, 0.05, 0.0)
    text = generate_latest(metrics.registry).decode()
    assert ('draftwise:spec_decode_cost_forward_seconds{model_name="m",rows="1",'
            'tokens_per_row="2"} 0.05') in text


def test_batch_rest_gauges() -> None:
    rest = BatchRest(base=2, backoff=2.0, longest=8)
    cost = CostModel([1], [1], [[0.01]])
    spec = SimpleNamespace(metrics=SpecDecodingStats(1),
                           policy=SimpleNamespace(cost=cost, rest=rest))
    metrics = ServerMetrics("m", engine=SimpleNamespace(spec=spec))
    rest.observe(8, False)
    rest.observe(8, False)
    rest.resting(8)
    text = generate_latest(metrics.registry).decode()
    assert 'draftwise:spec_decode_batch_rests{model_name="m"} 1.0' in text
    assert 'draftwise:spec_decode_batch_rested_steps{model_name="m"} 1.0' in text


def test_no_gauges_at_fixed_depth() -> None:
    spec = SimpleNamespace(metrics=SpecDecodingStats(1), policy=None)
    metrics = ServerMetrics("m", engine=SimpleNamespace(spec=spec))
    assert "spec_decode_cost" not in generate_latest(metrics.registry).decode()
