"""A finished screening run scored onto its trial (apps/lifecycle/search.py, #36 item 3): a done
run by the report's path (each class's primary p99 against its contract, the worst class's
margin, throughput); a run that ended any other way recorded failed with its reason, so the
search goes on. Runs are finished the way the pipeline's writer does, with records built directly
(tests/runs/test_early_stop.py), no engine."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.lifecycle.search import search_trial_finished
from apps.runs.models import RequestRecord as RecordRow
from apps.runs.models import Run
from apps.search.models import SearchTrial
from tests.analysis.builders import request
from tests.analysis.factories import analysis_spec, record_row
from tests.experiments.factories import make_experiment

pytestmark = pytest.mark.django_db

PER_RUN = 40  # 32 short and 8 long requests, 0.2 s apart in the 10 s window


def _trial_on_a_run() -> tuple[Run, SearchTrial]:
    experiment = make_experiment(**analysis_spec(1))
    run = experiment.runs.filter(kind=Run.Kind.SWEEP).order_by("plan_position").first()
    assert run is not None
    params = {"max_num_seqs": 8}
    trial = SearchTrial.objects.create(experiment=experiment, number=0, params=params, args=params, run=run)
    return run, trial


def screening_rows(run: Run, short_ttft_ms: float) -> list[RecordRow]:
    """A screening run's records: every fifth request long (600 ms TTFT), the rest short."""
    key = str(run.run_id)
    return [
        record_row(
            run,
            request(
                key,
                i,
                "long" if i % 5 == 4 else "short",
                int(1e9 + i * 0.2e9),
                ttft_ms=600.0 if i % 5 == 4 else short_ttft_ms,
                itl_ms=10.0,
                tokens=8,
                expected=8,
            ),
        )
        for i in range(PER_RUN)
    ]


def _finish(run: Run, *, short_ttft_ms: float, status: str = Run.Status.DONE, reason: str = "") -> None:
    rows = screening_rows(run, short_ttft_ms)
    RecordRow.objects.bulk_create(rows)
    Run.objects.filter(pk=run.pk).update(
        status=status,
        reason=reason,
        finished_at=timezone.now(),
        hardware_id="cpu-test",
        summary={"engine_time": {"start_s": 30.0, "windows_s": 11.0, "drain_s": 1.0}},
    )


def test_a_done_screening_run_gives_its_trial_the_worst_class_margin_and_throughput() -> None:
    run, trial = _trial_on_a_run()
    # short: TTFT p99 1500 ms against 2000 (margin 0.25); long: end-to-end ~670 ms against 12000.
    _finish(run, short_ttft_ms=1500.0)
    said = search_trial_finished(run_id=run.pk)
    trial.refresh_from_db()
    assert trial.outcome == SearchTrial.Outcome.KEPT, said
    assert trial.worst_class == "short"
    assert trial.margin == pytest.approx(0.25, abs=0.01)
    assert trial.throughput_rps == pytest.approx(PER_RUN / 10.0)
    assert trial.engine_s == pytest.approx(42.0)
    # Recorded once: a redelivered message changes nothing.
    assert "already" in search_trial_finished(run_id=run.pk)


def test_a_broken_contract_is_a_negative_margin_kept_as_broke() -> None:
    run, trial = _trial_on_a_run()
    _finish(run, short_ttft_ms=3000.0)
    search_trial_finished(run_id=run.pk)
    trial.refresh_from_db()
    assert trial.outcome == SearchTrial.Outcome.BROKE
    assert trial.margin == pytest.approx(-0.5, abs=0.01)


def test_a_server_that_did_not_start_is_recorded_failed_with_its_reason() -> None:
    run, trial = _trial_on_a_run()
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.FAILED,
        reason="server did not start: max_num_batched_tokens below max_model_len",
        finished_at=timezone.now(),
        summary={"engine_time": {"start_s": 12.0}},
    )
    search_trial_finished(run_id=run.pk)
    trial.refresh_from_db()
    assert trial.outcome == SearchTrial.Outcome.FAILED and trial.margin is None
    assert trial.reason == "failed: server did not start: max_num_batched_tokens below max_model_len"
    assert trial.engine_s == pytest.approx(12.0)
    assert trial.as_trial().score == -1.0  # the optimiser avoids the region; the search goes on


def test_a_run_not_finished_or_not_a_trials_is_left_alone() -> None:
    run, trial = _trial_on_a_run()
    assert "queued" in search_trial_finished(run_id=run.pk)
    other = run.experiment.runs.exclude(pk=run.pk).first()
    assert other is not None
    assert "not a screening run" in search_trial_finished(run_id=other.pk)
    trial.refresh_from_db()
    assert trial.outcome == SearchTrial.Outcome.RUNNING
