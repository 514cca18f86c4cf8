from __future__ import annotations

import pytest

from apps.experiments.models import Experiment
from apps.lifecycle.retries import hosts_reap_lost
from apps.lifecycle.running import experiment_cancel
from apps.runs.dispatch import HOST_PULL
from apps.runs.models import Host, Run
from apps.runs.services import host_lease, host_release, run_claim
from tests.dispatch_support import hold_tasks
from tests.experiments.factories import make_experiment
from tests.runs.factories import make_host


@pytest.mark.django_db
def test_it_lets_only_one_claim_win() -> None:
    run = make_experiment().runs.first()
    host = make_host()
    assert run_claim(run_pk=run.pk, host=host) is not None
    assert run_claim(run_pk=run.pk, host=host) is None  # the redelivered task returns early
    run.refresh_from_db()
    assert run.status == Run.Status.STARTING and run.attempts == 1


@pytest.mark.django_db
def test_it_leases_a_host_to_one_run_at_a_time() -> None:
    first, second = make_experiment().runs.all()[:2]
    host = make_host()
    assert host_lease(host=host, run=first)
    assert not host_lease(host=host, run=second)
    host_release(host=host, run=first)
    assert host_lease(host=host, run=second)


@pytest.mark.django_db
def test_it_dequeues_the_rest_when_cancelled() -> None:
    experiment = make_experiment()
    Experiment.objects.filter(pk=experiment.pk).update(status="running")
    experiment.refresh_from_db()
    active = experiment.runs.first()
    Run.objects.filter(pk=active.pk).update(status=Run.Status.MEASURING)
    n = experiment_cancel(experiment=experiment)
    assert n == experiment.runs.count() - 1
    assert experiment.runs.get(pk=active.pk).status == Run.Status.MEASURING  # its worker stops it
    assert set(experiment.runs.exclude(pk=active.pk).values_list("status", flat=True)) == {"cancelled"}
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.CANCELLED
    assert experiment.audit_events.filter(action="experiment.cancelled").exists()


@pytest.mark.django_db(transaction=True)
def test_it_fails_and_requeues_the_run_of_a_lost_host_up_to_three_attempts(monkeypatch) -> None:
    experiment = make_experiment()
    Experiment.objects.filter(pk=experiment.pk).update(status="running")
    run = experiment.runs.first()
    dead = make_host("dead", alive=False)
    make_host("alive")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.MEASURING, host=dead)
    Host.objects.filter(pk=dead.pk).update(current_run=run)
    sent = hold_tasks(monkeypatch, HOST_PULL)
    retried = hosts_reap_lost()
    assert len(retried) == 1
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and "host lost" in run.reason
    retry = retried[0]
    assert retry.retry_of_id == run.pk and retry.status == Run.Status.QUEUED
    assert (retry.cell_id, retry.mixture, retry.rate_name, retry.repeat) == (
        run.cell_id,
        run.mixture,
        run.rate_name,
        run.repeat,
    )
    # Runnable by any live host of the hardware: the live one is woken, the dead one is not.
    retry.refresh_from_db()
    assert retry.dispatched_at is not None and retry.host is None
    assert {queue for _, _, queue in sent} == {"host.alive"}
    # A retry that is lost too is retried again, up to three attempts in all, then not.
    Run.objects.filter(pk=retry.pk).update(status=Run.Status.MEASURING, host=dead)
    Host.objects.filter(pk=dead.pk).update(current_run=retry)
    (third,) = hosts_reap_lost()
    assert third.retry_of_id == retry.pk and Run.objects.get(pk=retry.pk).status == Run.Status.FAILED
    Run.objects.filter(pk=third.pk).update(status=Run.Status.MEASURING, host=dead)
    Host.objects.filter(pk=dead.pk).update(current_run=third)
    assert hosts_reap_lost() == []
    assert Run.objects.get(pk=third.pk).status == Run.Status.FAILED
    assert experiment.runs.filter(repeat=run.repeat, cell=run.cell, mixture=run.mixture).count() == 3


@pytest.mark.django_db
def test_only_a_scenario_run_names_a_scenario() -> None:
    from django.db import IntegrityError, transaction

    experiment = make_experiment()
    run = experiment.runs.first()
    assert run.kind == Run.Kind.SWEEP and run.scenario == ""
    for kind, scenario in (
        ("sweep", "burst"),
        ("scenario", ""),
        ("uniform", "uniform"),
        ("pace", "calibration"),
        ("rehearsal", "rehearsal"),
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            Run.objects.filter(pk=run.pk).update(kind=kind, scenario=scenario)
    for kind, scenario in (
        ("scenario", "burst"),
        ("pace", ""),
        ("rehearsal", ""),
        ("uniform", ""),
        ("sweep", ""),
    ):
        Run.objects.filter(pk=run.pk).update(kind=kind, scenario=scenario)
