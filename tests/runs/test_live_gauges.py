"""What the live page shows while a run goes: gauges and log tail the worker publishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.lifecycle import selectors
from apps.runs.models import Run
from tests.experiments.factories import make_experiment
from workers.engine.gauges import latest_gauges
from workers.watch import RunWatcher


def test_the_newest_value_of_each_gauge_wins() -> None:
    samples = [
        {"name": "vllm:num_requests_waiting", "value": 3.0},
        {"name": "vllm:kv_cache_usage_perc", "value": 0.2},
        {"name": "vllm:num_requests_waiting", "value": 5.0},
        {"name": "vllm:num_requests_running", "value": None},
    ]
    assert latest_gauges(samples) == {"waiting": 5.0, "running": None, "kv_usage": 0.2, "preemptions": None}


@pytest.mark.django_db
def test_the_watcher_publishes_gauges_and_the_log_tail_while_the_run_goes(tmp_path: Path) -> None:
    run = make_experiment().runs.first()
    Run.objects.filter(pk=run.pk).update(status="measuring")
    run.refresh_from_db()
    log = tmp_path / "server.log"
    log.write_text("\n".join(f"INFO line {i}" for i in range(300)) + "\n")

    class Scraper:
        samples = [
            {"name": "vllm:num_requests_running", "value": 4.0},
            {"name": "vllm:kv_cache_usage_perc", "value": 0.37},
        ]

    import threading

    watcher = RunWatcher(run, threading.Event(), None)
    watcher.scraper, watcher.log_path = Scraper(), log
    watcher.publish_live()
    run.refresh_from_db()
    assert run.live["gauges"]["running"] == 4.0 and "INFO line 299" in run.log_tail
    gauges = selectors.latest_gauges(run=run)
    assert (gauges["running"], gauges["kv_usage"]) == (4.0, 0.37)
    # Once the run has ended its stored samples are the record; nothing is published any more.
    Run.objects.filter(pk=run.pk).update(status="done")
    Scraper.samples = [{"name": "vllm:num_requests_running", "value": 9.0}]
    watcher.publish_live()
    run.refresh_from_db()
    assert run.live["gauges"]["running"] == 4.0
    assert selectors.latest_gauges(run=run)["running"] is None  # no stored sample in this test


@pytest.mark.django_db
def test_a_dropped_database_connection_does_not_end_the_watch_for_a_cancel(monkeypatch) -> None:
    """The cancel check failed once with the connection gone (seen in CI); the watcher kept
    watching and saw the cancel at its next tick."""
    import threading

    from django.db import OperationalError

    from workers import watch

    run = make_experiment().runs.first()
    answers: list[object] = [OperationalError("server closed the connection unexpectedly"), True]

    def is_cancelled(run_pk: int) -> bool:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return bool(answer)

    monkeypatch.setattr(watch, "is_cancelled", is_cancelled)
    monkeypatch.setattr(watch, "WATCH_INTERVAL_S", 0.01)
    stop = threading.Event()
    watcher = RunWatcher(run, stop, None)
    watcher.start()
    watcher.join(timeout=10)
    assert not watcher.is_alive() and watcher.cancelled and stop.is_set() and answers == []
