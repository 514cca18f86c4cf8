from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import httpx

from tests.waiting import wait_for
from workers.engine.scrape import (
    Scraper,
    counter_delta,
    counter_deltas,
    gauge_series,
    parse_created,
    parse_metrics,
)

FIXTURE = (Path(__file__).parent / "fixtures" / "vllm-0.32-metrics.txt").read_text()


def with_values(text: str, **values: float) -> str:
    """The fixture with the given series (name without "vllm:", first label set) set to values."""
    for name, value in values.items():
        text = re.sub(
            rf"^(vllm:{name}\{{[^}}]*\}}) \S+$", rf"\g<1> {value}", text, count=1, flags=re.MULTILINE
        )
    return text


def test_it_parses_vllm_metrics_into_typed_samples():
    samples = parse_metrics(FIXTURE)
    by_name = {}
    for s in samples:
        by_name.setdefault(s["name"], []).append(s)
    pre = by_name["vllm:num_preemptions_total"][0]
    assert pre["kind"] == "counter" and pre["value"] == 0.0
    assert pre["labels"] == {"engine": "0", "model_name": "tiny"}
    assert len(by_name["vllm:request_success_total"]) == 5  # one per finished_reason
    assert by_name["vllm:num_requests_running"][0]["kind"] == "gauge"
    info = by_name["vllm:cache_config_info"][0]
    assert info["kind"] == "info" and info["labels"]["kv_cache_memory_bytes"] == "67108864"
    ttft = by_name["vllm:time_to_first_token_seconds"][0]
    assert ttft["kind"] == "histogram" and ttft["histogram"]["count"] == 0.0
    assert ttft["histogram"]["buckets"][-1][0] == "+Inf"
    assert [b[0] for b in ttft["histogram"]["buckets"][:-1]] == sorted(
        b[0] for b in ttft["histogram"]["buckets"][:-1]
    )
    assert not any(s["name"].endswith("_created") for s in samples)
    assert all(set(s) == {"name", "labels", "kind", "value", "histogram"} for s in samples)


def test_it_keeps_only_the_named_metrics():
    samples = parse_metrics(FIXTURE, names=["vllm:num_preemptions_total", "vllm:kv_cache_usage_perc"])
    assert {s["name"] for s in samples} == {"vllm:num_preemptions_total", "vllm:kv_cache_usage_perc"}


def test_it_reads_counter_creation_times():
    created = parse_created(FIXTURE)
    key = ("vllm:num_preemptions_total", (("engine", "0"), ("model_name", "tiny")))
    assert created[key] > 1.7e9


def test_it_takes_counter_deltas_within_one_epoch():
    scraper = Scraper("http://unused")
    scraper.ingest(
        with_values(FIXTURE, num_preemptions_total=2, generation_tokens_total=100), "before", t_ns=1
    )
    scraper.ingest(
        with_values(FIXTURE, num_preemptions_total=5, generation_tokens_total=400), "during", t_ns=2
    )
    scraper.ingest(
        with_values(FIXTURE, num_preemptions_total=7, generation_tokens_total=900), "after", t_ns=3
    )
    assert scraper.epoch == 0 and scraper.restarts == []
    assert counter_delta(scraper.samples, "vllm:num_preemptions_total") == 5
    assert counter_delta(scraper.samples, "vllm:generation_tokens_total") == 800
    assert (
        counter_delta(scraper.samples, "vllm:request_success_total", labels={"finished_reason": "length"})
        == 0
    )
    assert counter_delta(scraper.samples, "vllm:not_a_metric_total") is None
    assert [s["phase"] for s in scraper.samples if s["name"] == "vllm:num_preemptions_total"] == [
        "before",
        "during",
        "after",
    ]


def test_it_starts_a_new_epoch_when_a_counter_goes_down_and_never_merges_deltas():
    scraper = Scraper("http://unused")
    scraper.ingest(with_values(FIXTURE, generation_tokens_total=100), "before", t_ns=1)
    scraper.ingest(with_values(FIXTURE, generation_tokens_total=500), "during", t_ns=2)
    scraper.ingest(with_values(FIXTURE, generation_tokens_total=30), "during", t_ns=3)  # restarted
    scraper.ingest(with_values(FIXTURE, generation_tokens_total=80), "after", t_ns=4)
    assert scraper.epoch == 1 and scraper.restarts == [3]
    assert counter_delta(scraper.samples, "vllm:generation_tokens_total") is None
    spans = [s for s in counter_deltas(scraper.samples) if s["name"] == "vllm:generation_tokens_total"]
    assert sorted((s["epoch"], s["delta"]) for s in spans) == [(0, 400.0), (1, 50.0)]
    assert all(s["delta"] >= 0 for s in counter_deltas(scraper.samples))
    assert {s["epoch"] for s in scraper.samples if s["t_ns"] >= 3} == {1}


def test_it_starts_a_new_epoch_when_counters_are_recreated_without_going_down():
    scraper = Scraper("http://unused")
    scraper.ingest(FIXTURE, "before", t_ns=1)
    recreated = re.sub(
        r"^(vllm:num_preemptions_created\{[^}]*\}) \S+$", r"\g<1> 1.9e9", FIXTURE, count=1, flags=re.MULTILINE
    )
    scraper.ingest(recreated, "after", t_ns=2)
    assert scraper.epoch == 1


def test_it_keeps_configuration_info_once_per_epoch():
    scraper = Scraper("http://unused")
    for t, phase in enumerate(["before", "during", "during", "after"]):
        scraper.ingest(FIXTURE, phase, t_ns=t)
    assert len([s for s in scraper.samples if s["name"] == "vllm:cache_config_info"]) == 1


def test_it_builds_gauge_series_in_time_order():
    scraper = Scraper("http://unused")
    scraper.ingest(with_values(FIXTURE, num_requests_running=3), "during", t_ns=20)
    scraper.ingest(with_values(FIXTURE, num_requests_running=1), "during", t_ns=10)
    assert gauge_series(scraper.samples, "vllm:num_requests_running") == [
        (10, "during", 0, 1.0),
        (20, "during", 0, 3.0),
    ]


def test_it_scrapes_over_http_in_a_background_thread_and_records_errors():
    values = iter([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        calls["n"] += 1
        if calls["n"] == 3:
            return httpx.Response(503)
        return httpx.Response(200, text=with_values(FIXTURE, num_preemptions_total=next(values, 10)))

    client = httpx.Client(transport=httpx.MockTransport(handler))
    scraper = Scraper("http://engine:8000/", interval_s=0.05, client=client)
    scraper.scrape("before")
    scraper.start_during()
    wait_for(lambda: calls["n"] >= 5, 30, interval_s=0.01, what="five scrapes")
    scraper.stop_during()
    scraper.scrape("after")
    phases = [s["phase"] for s in scraper.samples if s["name"] == "vllm:num_preemptions_total"]
    assert phases[0] == "before" and phases[-1] == "after" and "during" in phases
    assert len(scraper.errors) == 1 and "503" in scraper.errors[0]
    assert counter_delta(scraper.samples, "vllm:num_preemptions_total") > 0
    assert all(s["t_ns"] > 0 and s["taken_at"].tzinfo is not None for s in scraper.samples)


def test_two_scrapes_in_flight_at_once_are_ingested_in_the_order_they_were_read():
    # The timed thread's scrape is slow to answer while the caller scrapes too: the counter read
    # first (1) must not be ingested after the one read second (2), or it looks like a restart.
    calls = {"n": 0}
    lock = threading.Lock()

    def handler(request: httpx.Request) -> httpx.Response:
        with lock:
            calls["n"] += 1
            n = calls["n"]
        if n == 1:
            time.sleep(0.3)
        return httpx.Response(200, text=with_values(FIXTURE, num_preemptions_total=n))

    scraper = Scraper(
        "http://engine:8000/", interval_s=60, client=httpx.Client(transport=httpx.MockTransport(handler))
    )
    slow = threading.Thread(target=scraper.scrape, args=("during",))
    slow.start()
    time.sleep(0.05)
    scraper.scrape("during")
    slow.join()
    assert {s["epoch"] for s in scraper.samples} == {0} and scraper.restarts == []
    values = [s["value"] for s in scraper.samples if s["name"] == "vllm:num_preemptions_total"]
    assert values == [1, 2]
