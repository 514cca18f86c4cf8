from __future__ import annotations

import pytest

from apps.analysis.server_metrics import MAX_POINTS, counter_delta, server_metrics


def s(t, name, value, epoch=0, kind="counter", labels=None):
    return {
        "t_ns": int(t * 1e9),
        "phase": "during",
        "epoch": epoch,
        "name": name,
        "labels": labels or {},
        "kind": kind,
        "value": value,
        "histogram": None,
    }


def test_it_sums_counter_deltas_within_epochs_across_a_restart():
    samples = [
        s(0, "vllm:num_preemptions_total", 100.0),
        s(5, "vllm:num_preemptions_total", 150.0),
        # The server restarted: the counter went down and a new epoch began.
        s(6, "vllm:num_preemptions_total", 5.0, epoch=1),
        s(9, "vllm:num_preemptions_total", 20.0, epoch=1),
    ]
    m = server_metrics(samples)
    assert m["counters"]["preemptions"] == pytest.approx(65.0)
    assert m["restarts"] == [{"epoch": 1, "t_s": 6.0}]


def test_it_never_reports_a_negative_delta_and_none_without_samples():
    assert counter_delta([s(0, "x", 10.0), s(1, "x", 4.0)]) == 0.0
    assert counter_delta([]) is None
    assert server_metrics([])["counters"]["prompt_tokens"] is None


def test_it_keeps_label_sets_apart_and_accepts_names_without_total():
    samples = [
        s(0, "vllm:prompt_tokens", 10.0, labels={"model": "a"}),
        s(1, "vllm:prompt_tokens", 30.0, labels={"model": "a"}),
        s(0, "vllm:prompt_tokens", 1000.0, labels={"model": "b"}),
        s(1, "vllm:prompt_tokens", 1001.0, labels={"model": "b"}),
    ]
    assert server_metrics(samples)["counters"]["prompt_tokens"] == pytest.approx(21.0)


def test_it_builds_gauge_series_with_their_maximum_kept_when_thinned():
    samples = [s(i * 0.1, "vllm:num_requests_waiting", float(i % 7), kind="gauge") for i in range(1000)]
    samples.append(s(50.05, "vllm:num_requests_waiting", 99.0, kind="gauge"))
    g = server_metrics(samples)["gauges"]["waiting"]
    assert g["max"] == 99.0
    assert len(g["series"]) == MAX_POINTS
    assert max(v for _, v in g["series"]) == 99.0
    kv = server_metrics([s(0, "vllm:gpu_cache_usage_perc", 0.4, kind="gauge")])["gauges"]["kv_usage"]
    assert kv["max"] == 0.4
