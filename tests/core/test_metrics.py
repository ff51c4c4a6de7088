"""Spec-decode metrics: counts, vLLM's exact log line, Prometheus text, per-request keys."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from draftwise.metrics import (
    MetricsError,
    RequestSpecDecodeMetrics,
    SpecDecodingLogging,
    SpecDecodingProm,
    SpecDecodingStats,
)


class FakeClock:
    """An injectable monotonic clock."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def step_stats() -> SpecDecodingStats:
    """k=3: drafts of 3 (2 accepted), 3 (3 accepted), none, 2 (0 accepted)."""
    stats = SpecDecodingStats(num_spec_tokens=3)
    for n_draft, n_acc in [(3, 2), (3, 3), (0, 0), (2, 0)]:
        stats.observe_draft(n_draft, n_acc)
    return stats


def test_observe_draft_counts_prefixes_and_skips_empty_drafts():
    s = step_stats()
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (3, 8, 5)
    assert s.num_accepted_tokens_per_pos == [2, 2, 1]
    assert s.num_draft_tokens_per_pos == [3, 3, 2]


def test_bad_observations_raise():
    s = SpecDecodingStats(num_spec_tokens=2)
    for n_draft, n_acc in [(2, 3), (3, 1), (1, -1)]:
        with pytest.raises(MetricsError):
            s.observe_draft(n_draft, n_acc)


def test_merge_is_cumulative_and_summary_is_json_ready():
    total = SpecDecodingStats(num_spec_tokens=3)
    total.merge(step_stats())
    total.merge(step_stats())
    assert (total.num_drafts, total.num_draft_tokens, total.num_accepted_tokens) == (6, 16, 10)
    assert total.num_accepted_tokens_per_pos == [4, 4, 2]
    summary = total.summary()
    assert summary["mean_acceptance_length"] == pytest.approx(1 + 10 / 6)
    assert summary["draft_acceptance_rate"] == pytest.approx(10 / 16)
    assert summary["acceptance_rate_per_pos"] == pytest.approx([4 / 6, 4 / 6, 2 / 6])
    assert SpecDecodingStats(num_spec_tokens=2).summary()["mean_acceptance_length"] is None
    with pytest.raises(MetricsError):
        total.merge(SpecDecodingStats(num_spec_tokens=2))


def test_log_line_is_exactly_vllms():
    clock = FakeClock(100.0)
    log = SpecDecodingLogging(clock=clock)
    assert log.log() is None  # nothing observed: no line
    log.observe(step_stats())
    clock.now = 102.5
    lines: list[str] = []
    line = log.log(lines.append)
    assert line == (
        "SpecDecoding metrics: Mean acceptance length: 2.67, "
        "Accepted throughput: 2.00 tokens/s, Drafted throughput: 3.20 tokens/s, "
        "Accepted: 5 tokens, Drafted: 8 tokens, "
        "Per-position acceptance rate: 0.667, 0.667, 0.333, "
        "Avg Draft acceptance rate: 62.5%"
    )
    assert lines == [line]
    # the next interval starts at the last log: two steps over 4 seconds
    log.observe(step_stats())
    log.observe(step_stats())
    clock.now = 106.5
    assert log.log(lines.append) == (
        "SpecDecoding metrics: Mean acceptance length: 2.67, "
        "Accepted throughput: 2.50 tokens/s, Drafted throughput: 4.00 tokens/s, "
        "Accepted: 10 tokens, Drafted: 16 tokens, "
        "Per-position acceptance rate: 0.667, 0.667, 0.333, "
        "Avg Draft acceptance rate: 62.5%"
    )


def test_log_line_when_nothing_was_drafted_is_nan():
    clock = FakeClock()
    log = SpecDecodingLogging(clock=clock)
    log.observe(SpecDecodingStats(num_spec_tokens=2))
    clock.now += 1
    assert log.format() == (
        "SpecDecoding metrics: Mean acceptance length: nan, "
        "Accepted throughput: 0.00 tokens/s, Drafted throughput: 0.00 tokens/s, "
        "Accepted: 0 tokens, Drafted: 0 tokens, "
        "Per-position acceptance rate: nan, nan, "
        "Avg Draft acceptance rate: nan%"
    )


def test_log_goes_to_the_logger_at_info(caplog):
    log = SpecDecodingLogging(clock=FakeClock())
    log.observe(step_stats())
    with caplog.at_level("INFO", logger="draftwise.metrics"):
        line = log.log()
    assert caplog.records[-1].getMessage() == line


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text exposition parsed back: (sample name, sorted labels) -> value."""
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_prometheus_counters_round_trip():
    registry = CollectorRegistry()
    prom = SpecDecodingProm(registry, num_spec_tokens=3, model_name="smollm2", engine=0)
    prom.observe(step_stats())
    prom.observe(SpecDecodingStats(num_spec_tokens=3))  # an idle step changes nothing
    prom.observe(step_stats())
    got = scrape(registry)
    labels = (("engine", "0"), ("model_name", "smollm2"))
    assert got[("draftwise:spec_decode_num_drafts_total", labels)] == 6
    assert got[("draftwise:spec_decode_num_draft_tokens_total", labels)] == 16
    assert got[("draftwise:spec_decode_num_accepted_tokens_total", labels)] == 10
    per_pos = {
        dict(lbl)["position"]: v
        for (name, lbl), v in got.items()
        if name == "draftwise:spec_decode_num_accepted_tokens_per_pos_total"
    }
    assert per_pos == {"0": 4, "1": 4, "2": 2}


def test_prometheus_uses_only_the_given_registry():
    a, b = CollectorRegistry(), CollectorRegistry()
    SpecDecodingProm(a, 2, "m")
    SpecDecodingProm(b, 2, "m")  # no "Duplicated timeseries" error: nothing global
    assert not any("draftwise" in k[0] for k in scrape(CollectorRegistry()))


def test_request_metrics_keys_and_values():
    m = RequestSpecDecodeMetrics(num_spec_tokens=3)
    assert m.as_dict()["mean_acceptance_length"] == 1.0
    for n_draft, n_acc in [(3, 2), (3, 3), (0, 0), (2, 0)]:
        m.observe(n_draft, n_acc)
    assert m.as_dict() == {
        "mean_acceptance_length": pytest.approx(1 + 5 / 3),
        "draft_acceptance_rate": pytest.approx(5 / 8),
        "acceptance_histogram": [1, 0, 1, 1],
        "num_spec_steps": 3,
        "num_accepted_draft_tokens": 5,
        "num_draft_tokens": 8,
        "num_spec_tokens": 3,
    }
    detailed = RequestSpecDecodeMetrics(num_spec_tokens=3, detailed=True)
    detailed.observe(3, 1)
    d = detailed.as_dict()
    assert d["per_step_accepted"] == [1] and d["per_step_drafted"] == [3]
