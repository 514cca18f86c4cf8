"""The worker joins the server's spans to the run's records (workers/server_timings.py), through
the real pipeline on the fake vLLM, which exports a span per request as vLLM's exporter does."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import override_settings

from apps.runs.models import RequestRecord, Run
from tests.runs.fake_engine import fake_sweep_run
from workers import pipeline
from workers.engine import spans as spans_module
from workers.engine.server import SPANS_OFF_BY_ENGINE, SPANS_OFF_BY_HOST
from workers.engine.spans import MIN_SHARE
from workers.replay.records import SERVER_TIMING_FIELDS

pytestmark = pytest.mark.django_db(transaction=True)


def _rows(run: Run) -> list[RequestRecord]:
    return list(RequestRecord.objects.filter(run=run).order_by("index"))


def test_a_runs_records_carry_the_servers_timings_of_each_request(monkeypatch, tmp_path: Path) -> None:
    run = fake_sweep_run(monkeypatch, tmp_path)
    assert pipeline.run_execute(run_pk=run.pk) == Run.Status.DONE
    run.refresh_from_db()
    spans = run.summary["server_spans"]
    rows = _rows(run)
    answered = [r for r in rows if r.http_status == 200 and r.error_kind is None]
    assert len(answered) >= 4
    assert spans == {
        "source": "otlp",
        "received": len(rows),
        "joined": len(answered),
        "answered": len(answered),
        "share": 1.0,
        "min_share": MIN_SHARE,
        "used": True,
        "reason": f"the server's spans cover {len(answered)} of {len(answered)} answered requests (100.0%)",
    }
    for row in answered:
        assert all(getattr(row, name) is not None for name in SERVER_TIMING_FIELDS), row.index
        # The fake server's own clock: queue 0.5 ms; its TTFT within its E2E, both within the client's.
        assert row.server_queue_ns == 500_000
        assert row.server_ttft_ns <= row.server_e2e_ns <= row.end_ns - row.sent_ns
        # Its arrival on the replay's clock: at or after the send, and its first token after that.
        assert row.sent_ns <= row.server_arrival_ns < row.server_first_token_ns <= row.end_ns


def test_a_join_under_the_minimum_share_is_kept_but_not_used(monkeypatch, tmp_path: Path) -> None:
    # The fake server exports no span for every second request (trace index 0, 2, 4, ...).
    run = fake_sweep_run(monkeypatch, tmp_path, FAKE_SERVER_SPAN_SKIP="2")
    monkeypatch.setattr(spans_module, "SPAN_WAIT_S", 1.0)  # the missing spans never come
    assert pipeline.run_execute(run_pk=run.pk) == Run.Status.DONE
    run.refresh_from_db()
    spans = run.summary["server_spans"]
    assert spans["source"] == "otlp" and spans["used"] is False
    assert spans["joined"] < MIN_SHARE * spans["answered"] and "under the 95%" in spans["reason"]
    rows = _rows(run)
    assert {r.index for r in rows if r.server_e2e_ns is not None} == {r.index for r in rows if r.index % 2}


@override_settings(TAILTUNE_SERVER_SPANS=False)
def test_a_host_that_turned_spans_off_says_so_and_its_records_have_none(monkeypatch, tmp_path: Path) -> None:
    run = fake_sweep_run(monkeypatch, tmp_path)
    assert pipeline.run_execute(run_pk=run.pk) == Run.Status.DONE
    run.refresh_from_db()
    spans = run.summary["server_spans"]
    assert (spans["source"], spans["used"]) == ("none", False)
    assert spans["reason"].startswith(SPANS_OFF_BY_HOST)
    assert not RequestRecord.objects.filter(run=run, server_e2e_ns__isnull=False).exists()
    assert "otlp_traces_endpoint" not in (run.effective_args or {}).get("vllm_non_default_args", {})


def test_an_engine_without_opentelemetry_runs_untraced_and_says_why(monkeypatch, tmp_path: Path) -> None:
    run = fake_sweep_run(monkeypatch, tmp_path, FAKE_SERVER_MODE="no-otel")
    assert pipeline.run_execute(run_pk=run.pk) == Run.Status.DONE
    run.refresh_from_db()
    spans = run.summary["server_spans"]
    assert (spans["source"], spans["used"]) == ("none", False)
    assert spans["reason"].startswith(SPANS_OFF_BY_ENGINE)
