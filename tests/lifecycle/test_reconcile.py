"""The reconciler repairs experiments a lost message or a failed task left stuck, and says so."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.experiments.models import Experiment
from apps.lifecycle.reconcile import MAX_ANALYSIS_FAILURES, experiments_reconcile
from apps.runs.dispatch import ANALYSE_EXPERIMENT, HOST_PULL
from apps.runs.models import Run
from tests.dispatch_support import hold_tasks
from tests.experiments.factories import make_experiment
from tests.runs.factories import make_host

pytestmark = pytest.mark.django_db
LATER = timedelta(minutes=10)


def running(experiment: Experiment, *, reason: str = "", **run_fields: object) -> Experiment:
    Experiment.objects.filter(pk=experiment.pk).update(
        status="running", status_reason=reason, updated_at=timezone.now() - LATER
    )
    if run_fields:
        experiment.runs.update(**run_fields)
    experiment.refresh_from_db()
    return experiment


def repairs(experiment: Experiment) -> list[str]:
    return [
        e.detail["repair"]
        for e in AuditEvent.objects.filter(experiment=experiment, action="experiment.reconciled")
    ]


def test_finished_runs_with_no_analysis_get_it_sent_again_then_cancelled_if_it_keeps_failing(
    django_capture_on_commit_callbacks, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    experiment = running(make_experiment(), status="done", finished_at=timezone.now() - LATER)
    sent = hold_tasks(monkeypatch, ANALYSE_EXPERIMENT)
    with django_capture_on_commit_callbacks(execute=True):
        done = experiments_reconcile()
    assert [r["repair"] for r in done] == ["analysis sent again: every run had finished"]
    assert sent[-1][1] == {"experiment_pk": experiment.pk}
    # Nothing twice within the window: it touched the experiment.
    assert experiments_reconcile() == []
    for _ in range(MAX_ANALYSIS_FAILURES):
        AuditEvent.objects.create(
            action="experiment.analysis_failed", experiment=experiment, detail={"error": "boom"}
        )
    Experiment.objects.filter(pk=experiment.pk).update(updated_at=timezone.now() - LATER)
    experiments_reconcile()
    experiment.refresh_from_db()
    assert experiment.status == "cancelled" and "boom" in experiment.status_reason
    event = AuditEvent.objects.filter(action="experiment.reconciled").latest("at")
    assert (event.detail["from"], event.detail["to"]) == ("running", "cancelled")


def test_a_run_that_just_finished_is_left_to_its_own_analysis() -> None:
    running(make_experiment(), status="done", finished_at=timezone.now())
    assert experiments_reconcile() == []


def test_a_lost_freeze_goes_back_to_planned() -> None:
    experiment = running(make_experiment(), reason="freezing the workload")
    experiments_reconcile()
    experiment.refresh_from_db()
    assert experiment.status == "planned" and "never frozen" in experiment.status_reason
    assert repairs(experiment) == ["back to planned: the freeze never ran"]


def test_lost_run_messages_are_sent_again_and_claimed_once(
    django_capture_on_commit_callbacks, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    host = make_host()
    experiment = running(make_experiment(), trace_sha256="a" * 64, host=host)
    sent = hold_tasks(monkeypatch, HOST_PULL)
    with django_capture_on_commit_callbacks(execute=True):
        experiments_reconcile()
    # Every queued run is runnable again, and the live host is woken to pull them.
    assert (
        experiment.runs.filter(dispatched_at__isnull=False, host=None).count() == experiment.runs.count() > 0
    )
    assert sent == [(HOST_PULL, {}, host.queue)]
    assert repairs(experiment) == ["queued runs sent again: none was running"]
    # A run that is going is never second-guessed.
    other = running(make_experiment(name="busy"), trace_sha256="b" * 64, host=host)
    Run.objects.filter(pk=other.runs.first().pk).update(status="measuring")
    assert [r for r in experiments_reconcile() if r["experiment"] == other.pk] == []


def test_a_goodput_search_that_never_started_is_marked_lost() -> None:
    experiment = make_experiment()
    w = experiment.workload
    old = (timezone.now() - LATER).isoformat()
    w.rates_derivation = {"goodput_capacity": {"C1": {"80-20": {"status": "queued", "requested_at": old}}}}
    w.save()
    experiments_reconcile()
    w.refresh_from_db()
    entry = w.rates_derivation["goodput_capacity"]["C1"]["80-20"]
    assert entry["status"] == "lost" and "never started" in entry["reason"]
    assert repairs(experiment) == ["goodput search marked lost: it never started"]


def test_a_class_capacity_search_that_never_started_is_marked_lost_beside_a_fresh_one() -> None:
    experiment = make_experiment()
    w = experiment.workload
    old, fresh = (timezone.now() - LATER).isoformat(), timezone.now().isoformat()
    w.rates_derivation = {
        "class_capacity": {
            "C1": {"short": {"status": "queued", "requested_at": old}},
            "B0": {"long": {"status": "queued", "requested_at": fresh}},
        }
    }
    w.save()
    experiments_reconcile()
    w.refresh_from_db()
    lost = w.rates_derivation["class_capacity"]["C1"]["short"]
    assert lost["status"] == "lost" and "never started" in lost["reason"]
    assert w.rates_derivation["class_capacity"]["B0"]["long"]["status"] == "queued"
    assert repairs(experiment) == ["class capacity search marked lost: it never started"]


def test_a_failed_analysis_is_recorded_not_lost() -> None:
    from workers.tasks import analyse_experiment

    experiment = running(make_experiment(), status="done", finished_at=timezone.now())
    with mock.patch("apps.lifecycle.completion.experiment_analyse", side_effect=RuntimeError("disk full")):
        result = analyse_experiment.run(experiment_pk=experiment.pk)
    assert "disk full" in result
    event = AuditEvent.objects.get(action="experiment.analysis_failed")
    assert event.experiment == experiment and event.detail["error"] == "RuntimeError: disk full"
    experiment.refresh_from_db()
    assert experiment.status == "running"  # the reconciler takes it from here


def test_a_trace_upload_whose_import_was_lost_is_sent_again_once(
    author, tmp_path, django_capture_on_commit_callbacks, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from apps.experiments.models import TraceUpload
    from apps.lifecycle.trace_upload import IMPORT_LOST_AFTER
    from apps.runs.dispatch import IMPORT_TRACE

    sent = hold_tasks(monkeypatch, IMPORT_TRACE)
    fields = {"owner": author, "file_name": "t.csv", "path": str(tmp_path / "t"), "size_bytes": 1}
    lost = TraceUpload.objects.create(kind="trace", trace_format="azure", thresholds=[], **fields)
    dead = TraceUpload.objects.create(kind="trace", trace_format="azure", thresholds=[], **fields)
    fresh = TraceUpload.objects.create(kind="trace", trace_format="azure", thresholds=[], **fields)
    TraceUpload.objects.filter(pk=lost.pk).update(updated_at=timezone.now() - LATER)
    TraceUpload.objects.filter(pk=dead.pk).update(
        status="importing", updated_at=timezone.now() - IMPORT_LOST_AFTER - LATER
    )
    TraceUpload.objects.filter(pk=fresh.pk).update(status="importing", updated_at=timezone.now() - LATER)
    with django_capture_on_commit_callbacks(execute=True):
        done = experiments_reconcile()
    assert sorted(r["upload"] for r in done) == [lost.pk, dead.pk]
    assert sorted(s[1]["upload_pk"] for s in sent) == [lost.pk, dead.pk]
    assert set(TraceUpload.objects.filter(pk__in=[lost.pk, dead.pk]).values_list("status", flat=True)) == {
        "queued"
    }
    assert AuditEvent.objects.filter(action="upload.reconciled").count() == 2
    assert experiments_reconcile() == []  # touched: not again within the window
