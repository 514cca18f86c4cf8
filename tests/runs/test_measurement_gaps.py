"""A run whose load generator's loop or /metrics scraper stalled past tolerance ends ``invalid``
with that reason (apps/analysis/validity.py ``measurement_gaps``), never as a contract breach."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.analysis import early_stop
from apps.analysis.validity import MAX_LOOP_STALL_MS, MAX_SCRAPE_GAP_S, gaps_summary, measurement_gaps
from apps.runs.models import Run
from tests.analysis.builders import Plan, build_inputs
from tests.analysis.test_decision_table import stalls_everywhere
from tests.analysis.test_early_stop import cohort_bounds, report_of
from tests.runs.fake_engine import fake_sweep_run
from workers import pipeline
from workers.engine.scrape import Scraper

METRICS = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n"


# --- the rule -------------------------------------------------------------------------------------


def test_a_gap_within_tolerance_or_not_measured_is_none() -> None:
    assert measurement_gaps(loop_stall_max_ms=MAX_LOOP_STALL_MS, scrape_gap_max_s=MAX_SCRAPE_GAP_S) == []
    assert measurement_gaps(loop_stall_max_ms=None, scrape_gap_max_s=None) == []


def test_each_gap_over_tolerance_is_named_with_its_size() -> None:
    [stall] = measurement_gaps(loop_stall_max_ms=812.4, scrape_gap_max_s=2.0)
    assert stall.startswith("the load generator's event loop stalled for 812 ms, over the 250 ms tolerance")
    [gap] = measurement_gaps(loop_stall_max_ms=3.0, scrape_gap_max_s=31.25)
    assert gap.startswith("the /metrics scrape had a gap of 31.2 s, over the 10 s tolerance")
    summary = gaps_summary(loop_stall_max_ms=812.4, scrape_gap_max_s=31.25)
    assert summary["problems"] == [stall, gap]
    assert (summary["loop_stall_tolerance_ms"], summary["scrape_gap_tolerance_s"]) == (250.0, 10.0)


def test_the_loop_tolerance_widens_to_a_dispatch_lag_tolerance_that_is_larger_and_never_narrows() -> None:
    # A spec whose client shares CPUs with the engine accepts sends 30 s late: a 256 ms stall
    # (which failed a gate run in CI) is within that; a 31 s one is not.
    assert measurement_gaps(loop_stall_max_ms=256.0, scrape_gap_max_s=None, max_dispatch_lag_ms=30000) == []
    [stall] = measurement_gaps(loop_stall_max_ms=31000.0, scrape_gap_max_s=None, max_dispatch_lag_ms=30000)
    assert "over the 30000 ms tolerance" in stall
    # A tight dispatch-lag tolerance (5 ms, the default) leaves the loop's own 250 ms.
    [stall] = measurement_gaps(loop_stall_max_ms=256.0, scrape_gap_max_s=None, max_dispatch_lag_ms=5)
    assert "over the 250 ms tolerance" in stall
    summary = gaps_summary(loop_stall_max_ms=256.0, scrape_gap_max_s=1.0, max_dispatch_lag_ms=30000)
    assert (summary["loop_stall_tolerance_ms"], summary["problems"]) == (30000.0, [])


# --- the scraper's longest gap --------------------------------------------------------------------


class SteppedClock:
    """A clock the test moves: every read returns the current time (ns)."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _scraper(clock: SteppedClock, answers: list[int]) -> Scraper:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(answers.pop(0), text=METRICS)

    return Scraper("http://server", client=httpx.Client(transport=httpx.MockTransport(handler)), clock=clock)


def test_the_scrapers_longest_gap_spans_failed_scrapes() -> None:
    clock = SteppedClock()
    scraper = _scraper(clock, [200, 200, 500, 500, 200])
    for at_s, phase in [(0, "before"), (2, "during"), (4, "during"), (6, "during"), (13, "after")]:
        clock.now = at_s * 10**9
        try:
            scraper.scrape(phase)
        except httpx.HTTPError:
            pass  # the thread counts it in errors; the gap is what it leaves
    assert scraper.gap_max_s() == 11.0  # from the scrape at 2 s to the next that answered, at 13 s


def test_scrapes_that_all_failed_are_one_gap_as_long_as_the_attempts() -> None:
    clock = SteppedClock()
    scraper = _scraper(clock, [500, 500])
    for at_s in (1, 41):
        clock.now = at_s * 10**9
        with pytest.raises(httpx.HTTPError):
            scraper.scrape("during")
    assert scraper.gap_max_s() == 40.0
    assert Scraper("http://server").gap_max_s() is None  # nothing tried: nothing measured


# --- the pipeline ends such a run invalid ---------------------------------------------------------

pipeline_db = pytest.mark.django_db(transaction=True)


@pipeline_db
def test_a_run_whose_load_generator_stalled_is_invalid_with_that_reason(monkeypatch, tmp_path: Path) -> None:
    run = fake_sweep_run(monkeypatch, tmp_path)
    real = pipeline.run_replay

    def stalled(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        result.loop_stall_max_ms = 900.0  # its event loop could not run for 0.9 s
        return result

    monkeypatch.setattr(pipeline, "run_replay", stalled)
    assert pipeline.run_execute(run_pk=run.pk) == Run.Status.INVALID
    run.refresh_from_db()
    assert run.reason.startswith("the load generator's event loop stalled for 900 ms, over the 250 ms")
    gaps = run.summary["measurement_gaps"]
    assert gaps["loop_stall_max_ms"] == 900.0 and gaps["problems"] == [run.reason]
    assert run.records.exists()  # the records are kept, for the record; the analysis passes them over


@pipeline_db
def test_a_run_whose_scraper_stalled_is_invalid_with_that_reason(monkeypatch, tmp_path: Path) -> None:
    run = fake_sweep_run(monkeypatch, tmp_path)

    class StalledScraper(Scraper):
        """Its first scrape, then 30 s in which it could not run (a clock that jumps)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.lost_ns = 0
            super().__init__(*args, clock=lambda: time.perf_counter_ns() + self.lost_ns, **kwargs)

        def scrape(self, phase: str) -> list[dict[str, Any]]:
            rows = super().scrape(phase)
            if phase == "before":
                self.lost_ns = 30 * 10**9
            return rows

    monkeypatch.setattr(pipeline, "Scraper", StalledScraper)
    assert pipeline.run_execute(run_pk=run.pk) == Run.Status.INVALID
    run.refresh_from_db()
    # The 30 s it lost and the interval it waits anyway: the gap is what the server went unobserved.
    assert 30.0 <= run.summary["scrape_gap_max_s"] < 40.0
    gap = run.summary["scrape_gap_max_s"]
    assert run.reason.startswith(f"the /metrics scrape had a gap of {gap:.1f} s, over the 10 s tolerance")
    assert run.summary["measurement_gaps"]["loop_stall_max_ms"] < MAX_LOOP_STALL_MS


@pipeline_db
def test_a_run_without_gaps_is_done_and_says_what_it_measured(monkeypatch, tmp_path: Path) -> None:
    run = fake_sweep_run(monkeypatch, tmp_path)
    assert pipeline.run_execute(run_pk=run.pk) == Run.Status.DONE
    run.refresh_from_db()
    gaps = run.summary["measurement_gaps"]
    assert gaps["problems"] == [] and gaps["scrape_gap_max_s"] is not None
    assert 0 < gaps["scrape_gap_max_s"] <= MAX_SCRAPE_GAP_S


# --- never a contract breach ----------------------------------------------------------------------


def test_early_stopping_passes_over_a_run_made_invalid_by_a_gap() -> None:
    inputs = build_inputs(Plan(), stalls_everywhere)
    full = report_of(inputs, inputs["records"])
    common = {
        "cells": ["B0", "C1", "C2"],
        "baseline": "B0",
        "over": {r["key"]: {n: m["over_limit"] for n, m in r["classes"].items()} for r in full["runs"]},
        "agreed": [tuple(a) for a in full["checks"]["acceptance"]["agreed"]],
        "classes": inputs["classes"],
        "bounds": cohort_bounds(full),
    }
    done = [{**r, "status": "done" if r["repeat"] == 0 else "queued"} for r in inputs["runs"]]
    assert set(early_stop.doomed(**common, runs=done)) == {"C1", "C2"}
    # The same first runs of C1, ended invalid by a stall: their breaches are no evidence.
    reason = measurement_gaps(loop_stall_max_ms=900.0, scrape_gap_max_s=None)[0]
    stalled = [{**r, "status": "invalid"} if r["cell"] == "C1" and r["repeat"] == 0 else r for r in done]
    assert set(early_stop.doomed(**common, runs=stalled)) == {"C2"}
    # A gate stops at it as unusable, with the reason, not as a regression.
    assert early_stop.unusable(status="invalid", reason=reason, lag_p99_ms=1.0, max_lag_ms=5.0) == (
        f"invalid: {reason}"
    )
