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


def h(t, buckets, epoch=0, labels=None, total=1.0):
    sample = s(
        t, "vllm:request_queue_time_seconds", buckets[-1][1], epoch=epoch, kind="histogram", labels=labels
    )
    sample["histogram"] = {"buckets": buckets, "sum": total, "count": buckets[-1][1]}
    return sample


def test_it_takes_histogram_deltas_bucket_by_bucket_within_epochs():
    from apps.analysis.server_metrics import histogram_delta

    samples = [
        h(0, [[0.1, 10], [1.0, 20], ["+Inf", 20]], total=5.0),
        h(5, [[0.1, 15], [1.0, 40], ["+Inf", 41]], total=15.0),
        # A restart: the new process counts from zero in epoch 1.
        h(6, [[0.1, 0], [1.0, 1], ["+Inf", 1]], epoch=1, total=0.5),
        h(9, [[0.1, 4], [1.0, 6], ["+Inf", 6]], epoch=1, total=2.5),
    ]
    delta = histogram_delta(samples)
    assert delta == {"buckets": [[0.1, 9.0], [1.0, 25.0], ["+Inf", 26.0]], "count": 26.0, "sum": 12.0}
    assert histogram_delta([s(0, "x", 1.0)]) is None
    assert server_metrics(samples)["histograms"]["queue_time"] == delta
    assert server_metrics(samples)["histograms"]["ttft"] is None


@pytest.mark.parametrize(
    ("q", "ms", "above"),
    [
        (0.5, 100 * 50 / 90, False),  # rank 50 of 100, 50 of the first bucket's 90 (0-100 ms)
        (0.95, 600.0, False),  # rank 95: 5 of the 9 in 100 ms-1 s
        (0.995, 1000.0, True),  # in the +Inf bucket: the last finite bound, a lower bound
    ],
)
def test_it_reads_a_quantile_off_cumulative_buckets(q, ms, above):
    from apps.analysis.server_metrics import histogram_quantile, merge_histograms

    half = {"buckets": [[0.1, 45], [1.0, 49.5], ["+Inf", 50]], "count": 50, "sum": 1.0}
    both = merge_histograms([half, None, half])
    assert both["count"] == 100.0
    assert histogram_quantile(both, q) == {"ms": pytest.approx(ms, abs=1e-3), "above": above}
    assert histogram_quantile(None, q) is None
    assert histogram_quantile({"buckets": [[0.1, 0], ["+Inf", 0]]}, q) is None
