"""Pull scheduling (apps/runs/scheduling.py) through the worker's own loop
(``workers.pipeline.host_pull``) with a fake executor: the claims, the reservations of a
cell's round, a host that dies mid-experiment, and the hardware pin."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from apps.experiments.models import Experiment
from apps.lifecycle.retries import hosts_reap_lost
from apps.lifecycle.running import experiment_start
from apps.runs.dispatch import HOST_PULL
from apps.runs.models import Host, Run
from apps.runs.scheduling import hosts_by_qualification, run_claim_next, runs_dispatch
from tests.dispatch_support import hold_tasks
from tests.experiments.factories import make_experiment, small_spec
from tests.runs.factories import make_host
from workers.pipeline import host_pull
from workers.slot import ServerSlot, slot_key

pytestmark = pytest.mark.django_db(transaction=True)

CPU = "1x test CPU"


def sweep(**engine: Any) -> Experiment:
    """B0 and C1, one mixture, three rates, two repeats: 12 sweep runs, dispatched and runnable."""
    workload = {**small_spec()["workload"], "rates": {"low": 1.0, "mid": 1.5, "high": 2.0}, "repeats": 2}
    experiment = make_experiment(workload=workload, engine=engine)
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING, hardware_id=CPU)
    experiment.refresh_from_db()
    experiment.runs.update(trace_sha256="a" * 64)
    runs_dispatch(list(experiment.runs.all()), experiment)
    return experiment


class Executor:
    """Marks each run done, remembering who ran what; ``hang`` makes one host stop mid-run."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def __call__(self, run: Run, host: Host, slot: ServerSlot) -> str:
        with self.lock:
            self.ran.append((host.name, run.pk))
        Run.objects.filter(pk=run.pk).update(status=Run.Status.DONE, finished_at=timezone.now())
        return Run.Status.DONE


class Killed(BaseException):
    """The worker process is gone: nothing after this point runs in it."""


def test_a_host_reserves_its_cells_round_and_another_host_takes_the_next_cell(monkeypatch) -> None:
    hold_tasks(monkeypatch, HOST_PULL)
    experiment = sweep()
    a, b = make_host("a", hardware_id=CPU), make_host("b", hardware_id=CPU)
    first = run_claim_next(host=a)
    assert first is not None and first.plan_position == 0
    mates = experiment.runs.filter(cell=first.cell, repeat=first.repeat).exclude(pk=first.pk)
    # The rest of the cell's round waits for a's server; b starts the next cell.
    assert mates.count() == 2 and set(mates.values_list("host__name", flat=True)) == {"a"}
    second = run_claim_next(host=b)
    assert second is not None and second.cell_id != first.cell_id
    assert run_claim_next(host=a).pk == mates.order_by("plan_position").first().pk  # a continues its cell


def test_without_reuse_nothing_is_reserved(monkeypatch) -> None:
    hold_tasks(monkeypatch, HOST_PULL)
    experiment = sweep(reuse=False)
    run_claim_next(host=make_host("a", hardware_id=CPU))
    assert not experiment.runs.filter(status="queued", host__isnull=False).exists()


def companions_and_scenarios(**engine: Any) -> Experiment:
    """B0 and C1 with two mixtures' uniform companions and two failure scenarios each (no sweep
    runs queued): 4 uniform and 4 scenario runs, dispatched and runnable."""
    base = small_spec()["workload"]
    workload = {
        **base,
        "mixtures": {"a": base["mixtures"][next(iter(base["mixtures"]))]},
        "uniform_companion": True,
    }
    workload["mixtures"]["b"] = workload["mixtures"]["a"]
    experiment = make_experiment(
        workload=workload, engine=engine, scenarios={"long_burst": {}, "cancellation": {}}
    )
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING, hardware_id=CPU)
    experiment.runs.filter(kind=Run.Kind.SWEEP).delete()
    experiment.runs.update(trace_sha256="a" * 64)
    runs_dispatch(list(experiment.runs.all()), experiment)
    return experiment


def test_a_cells_uniform_companions_are_planned_together_and_reserved_as_a_series(
    monkeypatch,
) -> None:
    hold_tasks(monkeypatch, HOST_PULL)
    experiment = companions_and_scenarios()
    order = [r.cell.cell_id for r in experiment.runs.filter(kind=Run.Kind.UNIFORM).order_by("plan_position")]
    assert order == ["B0", "B0", "C1", "C1"]  # a cell's companions back to back
    scenarios = [
        r.cell.cell_id for r in experiment.runs.filter(kind=Run.Kind.SCENARIO).order_by("plan_position")
    ]
    assert scenarios == ["B0", "C1", "B0", "C1"]  # each scenario starts its own server
    a = make_host("a", hardware_id=CPU)
    taken = []
    while (run := run_claim_next(host=a)) is not None:
        # Each claim reserves the rest of its cell's series and nothing else.
        reserved = experiment.runs.filter(status=Run.Status.QUEUED, host=a)
        assert {(r.kind, r.cell_id) for r in reserved} <= {(run.kind, run.cell_id)}
        if run.kind == Run.Kind.SCENARIO:
            assert not reserved.exists()
        taken.append((run.kind, run.cell.cell_id, slot_key(run)))
        Run.objects.filter(pk=run.pk).update(status=Run.Status.DONE, finished_at=timezone.now())
    assert [(kind, cell) for kind, cell, _ in taken] == [  # the plan: scenarios, then companions
        (Run.Kind.SCENARIO, "B0"), (Run.Kind.SCENARIO, "C1"), (Run.Kind.SCENARIO, "B0"), (Run.Kind.SCENARIO, "C1"),
        (Run.Kind.UNIFORM, "B0"), (Run.Kind.UNIFORM, "B0"), (Run.Kind.UNIFORM, "C1"), (Run.Kind.UNIFORM, "C1"),
    ]  # fmt: skip
    # One kept server per cell for its companions: two keys for four runs, none a sweep round's.
    keys = [key for kind, _, key in taken if kind == Run.Kind.UNIFORM]
    assert len(set(keys)) == 2 and {key[2] for key in keys} == {"uniform"}


def test_without_reuse_companions_and_scenarios_are_not_reserved_or_grouped(monkeypatch) -> None:
    hold_tasks(monkeypatch, HOST_PULL)
    experiment = companions_and_scenarios(reuse=False)
    order = [r.cell.cell_id for r in experiment.runs.filter(kind=Run.Kind.UNIFORM).order_by("plan_position")]
    assert order == ["B0", "C1", "B0", "C1"]
    run_claim_next(host=make_host("a", hardware_id=CPU))
    assert not experiment.runs.filter(status="queued", host__isnull=False).exists()


def test_killing_one_host_mid_experiment_leaves_the_other_to_finish_every_run_once(monkeypatch) -> None:
    wakes = hold_tasks(monkeypatch, HOST_PULL)
    experiment = sweep()
    planned = Counter((r.cell_id, r.mixture, r.rate_name, r.repeat) for r in experiment.runs.all())
    a, b = make_host("a", hardware_id=CPU), make_host("b", hardware_id=CPU)
    executor = Executor()
    mid_run, kill = threading.Event(), threading.Event()

    def a_executes(run: Run, host: Host, slot: ServerSlot) -> str:
        if len([1 for name, _ in executor.ran if name == "a"]) == 1:  # a's second run: it dies in it
            Run.objects.filter(pk=run.pk).update(status=Run.Status.MEASURING)
            mid_run.set()
            kill.wait(30)
            raise Killed
        return executor(run, host, slot)

    def a_worker() -> None:
        try:
            host_pull(host=a, execute=a_executes)
        except Killed:
            pass
        finally:
            connection.close()

    thread = threading.Thread(target=a_worker)
    thread.start()
    try:
        assert mid_run.wait(30)
        hung = Run.objects.get(status=Run.Status.MEASURING)
        # b works meanwhile: everything a has not reserved.
        host_pull(host=b, execute=executor)
        assert experiment.runs.filter(status="queued").exclude(host=a).count() == 0
        assert experiment.runs.filter(status="queued", host=a).count() == 1  # the rest of a's round
        # a stops heartbeating: its run fails and is queued again, its reservations are
        # released, and b is woken to take them.
        Host.objects.filter(pk=a.pk).update(last_heartbeat=timezone.now() - timedelta(hours=1))
        wakes.clear()
        (retry,) = hosts_reap_lost()
        assert not experiment.runs.filter(status="queued", host=a).exists()
        assert ("b" in {q.split(".")[-1] for _, _, q in wakes}) and "host.a" not in {q for _, _, q in wakes}
        host_pull(host=b, execute=executor)
    finally:
        kill.set()
        thread.join(30)
    hung.refresh_from_db()
    assert hung.status == Run.Status.FAILED and "host lost: a" in hung.reason
    done = Counter(
        (r.cell_id, r.mixture, r.rate_name, r.repeat) for r in experiment.runs.filter(status=Run.Status.DONE)
    )
    assert done == planned  # every planned run done exactly once
    assert len({pk for _, pk in executor.ran}) == len(executor.ran)  # none run twice
    assert Run.objects.get(pk=retry.pk).status == Run.Status.DONE and (("b", retry.pk) in executor.ran)
    assert not experiment.runs.exclude(status__in=Run.FINISHED).exists()


def test_a_host_with_other_hardware_takes_no_run_and_the_start_pins_the_first_hosts(monkeypatch) -> None:
    hold_tasks(monkeypatch, HOST_PULL)
    experiment = make_experiment()
    make_host("a-cpu", hardware_id=CPU)
    other = make_host("z-gpu", hardware_id="8x NVIDIA H100 80GB HBM3 (driver 550)")
    experiment_start(experiment=experiment)
    experiment.refresh_from_db()
    assert experiment.hardware_id == CPU  # the first live host, by name
    qualify, not_qualify = hosts_by_qualification(experiment)
    assert [h.name for h in qualify] == ["a-cpu"]
    assert [(h.name, why.split(":")[0]) for h, why in not_qualify] == [("z-gpu", "other hardware")]
    experiment.runs.update(trace_sha256="a" * 64)
    runs_dispatch(list(experiment.runs.all()), experiment)
    assert run_claim_next(host=other) is None
    assert experiment.runs.filter(status="queued", host__isnull=True).count() == experiment.runs.count()
    executor = Executor()
    host_pull(host=other, execute=executor)
    assert executor.ran == []
