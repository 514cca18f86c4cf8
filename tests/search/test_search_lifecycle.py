"""A search experiment through its lifecycle (apps/lifecycle/search_steps.py, issue #36): created
from a spec with B0 only, started, screening one trial at a time through the real pipeline's
after-run hook (workers/pipeline.host_pull with a fake executor that writes records, as
tests/search/test_screening_scored.py finishes runs), a trial whose server does not start
recorded failed with its reason, then the best k confirmed with B0 in fresh rounds; only then
is the analysis sent. No engine: the executor stands in for the server and the replay."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.utils import timezone

from apps.analysis.models import Decision
from apps.analysis.services import report_rows
from apps.audit.models import AuditEvent
from apps.experiments.models import Experiment, ServerConfig
from apps.experiments.plan import expand_plan
from apps.lifecycle import completion
from apps.lifecycle.creation import experiment_create
from apps.lifecycle.running import experiment_freeze_and_enqueue
from apps.lifecycle.search_steps import search_after_run
from apps.runs.models import Host, Run
from apps.runs.models import RequestRecord as RecordRow
from apps.search.models import SearchTrial
from tests.dispatch_support import hold_tasks
from tests.experiments.factories import SMALL_SPEC, UserFactory
from tests.runs.factories import make_host
from tests.search.test_screening_scored import screening_rows
from workers.pipeline import host_pull
from workers.slot import ServerSlot

pytestmark = pytest.mark.django_db

PER_RUN = 40  # 32 short and 8 long requests, 0.2 s apart in the 10 s window
# The fake server's short-class TTFT by max_num_seqs (contract: 2000 ms), so each config's
# margin is known: 16 the best (0.75), then 8 (0.5), 4 (0.25), 32 (0.1); 2 does not start.
SHORT_TTFT_MS = {4: 1500.0, 8: 1000.0, 16: 500.0, 32: 1800.0}
NO_START = 2


def search_spec(**search: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    del spec["candidates"]
    spec["engine"] = {"reuse": False, "early_stop": False}
    spec["workload"].update(
        rates={"low": 1.0, "high": 2.0}, repeats=2, warmup_s=1, observation_s=10, drain_deadline_s=5,
        max_dispatch_lag_ms=5,
    )  # fmt: skip
    spec["search"] = {
        "space": {"max_num_seqs": [NO_START, 4, 8, 16, 32]},
        "budget": {"max_trials": 5},
        "confirm": 2,
        **search,
    }
    return spec


def _records(run: Run, short_ttft_ms: float) -> None:
    RecordRow.objects.bulk_create(screening_rows(run, short_ttft_ms))


def _done(run: Run, short_ttft_ms: float) -> str:
    _records(run, short_ttft_ms)
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.DONE,
        finished_at=timezone.now(),
        hardware_id="cpu-test",
        summary={"engine_time": {"start_s": 30.0, "windows_s": 11.0, "drain_s": 1.0}},
    )
    return Run.Status.DONE


def fake_execute(run: Run, host: Host, slot: ServerSlot) -> str:
    """What a host's server and replay would leave: records and a finished run; a config with
    max_num_seqs 2 fails to start, as an impossible config does."""
    seqs = int(run.cell.args["max_num_seqs"])
    if seqs == NO_START:
        Run.objects.filter(pk=run.pk).update(
            status=Run.Status.FAILED,
            reason="server did not start: vLLM exited with status 1",
            finished_at=timezone.now(),
            summary={"engine_time": {"start_s": 12.0}},
        )
        return Run.Status.FAILED
    return _done(run, SHORT_TTFT_MS.get(seqs, 1200.0))


def always_done(run: Run, host: Host, slot: ServerSlot) -> str:
    return _done(run, 1000.0)


@pytest.fixture
def analyses(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, int]]:
    """Each analysis the lifecycle sends, with how many runs were unfinished and planned then."""
    sent: list[dict[str, int]] = []

    def enqueue(*, experiment_id: int) -> None:
        runs = Run.objects.filter(experiment_id=experiment_id)
        sent.append(
            {
                "unfinished": runs.exclude(status__in=Run.FINISHED).count(),
                "sweep": runs.filter(kind=Run.Kind.SWEEP).count(),
            }
        )

    monkeypatch.setattr(completion, "analysis_enqueue", enqueue)
    return sent


def started(monkeypatch: pytest.MonkeyPatch, **search: Any) -> tuple[Experiment, Host]:
    hold_tasks(monkeypatch)
    host = make_host()
    experiment = experiment_create(spec=search_spec(**search), owner=UserFactory(roles=["experimenter"]))
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    experiment_freeze_and_enqueue(experiment_id=experiment.pk)
    return experiment, host


def test_a_search_spec_creates_b0_alone_and_plans_no_run() -> None:
    experiment = experiment_create(spec=search_spec(), owner=UserFactory(roles=["experimenter"]))
    assert experiment.status == Experiment.Status.PLANNED
    assert [c.cell_id for c in experiment.cells.all()] == ["B0"]
    assert not experiment.runs.exists()


def test_the_start_screens_one_trial_on_the_screening_points_own_draw(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    experiment, _ = started(monkeypatch)
    (trial,) = SearchTrial.objects.filter(experiment=experiment)
    run = trial.run
    assert run is not None and run.kind == Run.Kind.SCREEN and run.dispatched_at is not None
    # The default screening point: the heaviest mixture at the highest rate, repeat past the plan's.
    assert (run.mixture, run.rate_name, run.repeat) == ("80-20", "high", 3)
    assert run.trace_sha256 and run.rate_rps == 2.0
    assert run.scenario_label == "screen"
    assert trial.outcome == SearchTrial.Outcome.RUNNING and run.cell.role == ServerConfig.Role.TRIAL
    assert trial.args == {**experiment.cells.get(cell_id="B0").args, **trial.params}
    # A trial cell is no candidate: the experiment's cells leave it out until it is confirmed.
    assert [c.cell_id for c in experiment.cells.all()] == ["B0"]
    assert ServerConfig.with_trials.filter(experiment=experiment).count() == 2


def test_a_search_screens_then_confirms_the_best_k_in_fresh_rounds(monkeypatch, analyses) -> None:  # type: ignore[no-untyped-def]
    experiment, host = started(monkeypatch)
    done = host_pull(host=host, execute=fake_execute)

    trials = list(SearchTrial.objects.filter(experiment=experiment).order_by("number"))
    assert len(trials) == 5  # the budget's max_trials, one at a time
    screens = list(experiment.runs.filter(kind=Run.Kind.SCREEN).order_by("plan_position"))
    assert [r.pk for r in screens] == [t.run_id for t in trials]
    assert [pk for pk, _ in done][:5] == [r.pk for r in screens]  # every trial before any confirmation
    failed = next(t for t in trials if t.params["max_num_seqs"] == NO_START)
    assert failed.outcome == SearchTrial.Outcome.FAILED and failed.margin is None
    assert failed.reason == "failed: server did not start: vLLM exited with status 1"
    by_seqs = {t.params["max_num_seqs"]: t for t in trials}
    assert by_seqs[16].margin == pytest.approx(0.75, abs=0.01)

    # The best two confirmed: candidate cells named after their trials; the rest stay trials.
    confirmed = sorted(t.number for t in trials if t.confirmed)
    assert confirmed == sorted([by_seqs[16].number, by_seqs[8].number])
    cells = {c.cell_id: c for c in ServerConfig.with_trials.filter(experiment=experiment)}
    ids = [f"T{by_seqs[16].number}", f"T{by_seqs[8].number}"]
    assert all(cells[i].role == ServerConfig.Role.CANDIDATE for i in ids)
    assert sorted(c.cell_id for c in experiment.cells.all()) == sorted(["B0", *ids])
    assert {c.role for i, c in cells.items() if i not in ["B0", *ids]} == {ServerConfig.Role.TRIAL}

    # B0 and the two through the whole design: 3 cells x 1 mixture x 2 rates x 2 repeats, after
    # the screening runs, in rounds of the confirmation's own seed, each run done.
    sweep = list(experiment.runs.filter(kind=Run.Kind.SWEEP).select_related("cell").order_by("plan_position"))
    assert len(sweep) == 12 and {r.status for r in sweep} == {Run.Status.DONE}
    assert min(r.plan_position for r in sweep) > max(r.plan_position for r in screens)
    order = [(r.cell.cell_id, r.mixture, r.rate_name, r.repeat) for r in sweep]
    assert sorted(order) == sorted(
        (c, "80-20", rate, rep) for c in ["B0", *ids] for rate in ("low", "high") for rep in (1, 2)
    )
    grid = expand_plan(cell_ids=["B0", *ids], mixtures=["80-20"], rates=["low", "high"], repeats=2, seed=7)
    assert order != [(p.cell_id, p.mixture, p.rate_name, p.repeat) for p in grid]
    # Confirmed on fresh data: no confirmation run replays the screening draw.
    assert {r.trace_sha256 for r in sweep}.isdisjoint({r.trace_sha256 for r in screens})
    assert all(r.trace_sha256 for r in sweep)
    assert AuditEvent.objects.filter(experiment=experiment, action="experiment.search_confirmed").count() == 1

    # The analysis was sent once, after the confirmation runs had all ended, never between.
    assert analyses == [{"unfinished": 0, "sweep": 12}]
    # The report reads the confirmation only: no screening run, no unconfirmed trial cell.
    rows = report_rows(experiment_id=experiment.pk)
    assert sorted(c["cell_id"] for c in rows.inputs["cells"]) == sorted(["B0", *ids])
    assert {r.kind for r in rows.runs} == {Run.Kind.SWEEP}
    # And the analysis runs on it: the decision ranks the confirmed cells only.
    said = completion.experiment_analysis(experiment_id=experiment.pk)
    assert not said.startswith(("analysis failed", "skipped")), said
    report = Decision.objects.get(experiment=experiment).report
    assert sorted(c["cell_id"] for c in report["cells"]) == sorted(["B0", *ids])
    assert sorted(report["search"]["confirmed"]) == confirmed and len(report["search"]["trials"]) == 5


def test_a_redelivered_after_run_hook_makes_no_second_trial(monkeypatch, analyses) -> None:  # type: ignore[no-untyped-def]
    experiment, host = started(monkeypatch)
    ((first, _),) = host_pull(host=host, execute=fake_execute, limit=1)
    assert SearchTrial.objects.filter(experiment=experiment).count() == 2  # the hook screened the next
    runs = experiment.runs.count()
    said = search_after_run(run_id=first)
    assert "already" in said and "waiting" in said, said
    assert SearchTrial.objects.filter(experiment=experiment).count() == 2
    assert experiment.runs.count() == runs
    assert analyses == []


def test_a_failing_step_leaves_the_experiment_planned_with_why_and_keeps_the_run(
    monkeypatch, analyses
) -> None:  # type: ignore[no-untyped-def]
    experiment, host = started(monkeypatch)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("optimiser exploded")

    monkeypatch.setattr("apps.lifecycle.search_steps.next_step", broken)
    ((first, status),) = host_pull(host=host, execute=always_done, limit=1)
    assert status == Run.Status.DONE
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.PLANNED
    assert "optimiser exploded" in experiment.status_reason
    assert AuditEvent.objects.filter(experiment=experiment, action="experiment.search_failed").exists()
    assert Run.objects.get(pk=first).records.count() == PER_RUN  # the run's data stays
    trial = SearchTrial.objects.get(run_id=first)
    assert trial.outcome == SearchTrial.Outcome.KEPT  # scored before the step failed
    assert analyses == []


def test_a_search_whose_every_trial_failed_is_cancelled_with_why(monkeypatch, analyses) -> None:  # type: ignore[no-untyped-def]
    experiment, host = started(
        monkeypatch, space={"max_num_seqs": [NO_START, 3]}, budget={"max_trials": 2}, confirm=1
    )

    def no_start(run: Run, host: Host, slot: ServerSlot) -> str:
        Run.objects.filter(pk=run.pk).update(
            status=Run.Status.FAILED, reason="server did not start", finished_at=timezone.now()
        )
        return Run.Status.FAILED

    host_pull(host=host, execute=no_start)
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.CANCELLED
    assert "measured no config" in experiment.status_reason
    assert not experiment.runs.filter(kind=Run.Kind.SWEEP).exists()
    assert analyses == []


def test_a_lost_screening_run_hands_its_trial_to_the_retry(monkeypatch, analyses) -> None:  # type: ignore[no-untyped-def]
    from apps.lifecycle.retries import run_requeue_once

    experiment, host = started(monkeypatch)
    (trial,) = SearchTrial.objects.filter(experiment=experiment)
    lost = trial.run
    assert lost is not None
    Run.objects.filter(pk=lost.pk).update(status=Run.Status.MEASURING)
    retry = run_requeue_once(run=lost, reason="host lost: h1 stopped heartbeating")
    assert retry is not None and retry.kind == Run.Kind.SCREEN and retry.trace_sha256 == lost.trace_sha256
    trial.refresh_from_db()
    assert trial.run_id == retry.pk and trial.outcome == SearchTrial.Outcome.RUNNING
    # The retry's end scores the trial, and the search goes on from it.
    ((ran, _),) = host_pull(host=host, execute=always_done, limit=1)
    assert ran == retry.pk
    trial.refresh_from_db()
    assert trial.outcome == SearchTrial.Outcome.KEPT
    assert SearchTrial.objects.filter(experiment=experiment).count() == 2


def test_the_reconciler_takes_a_stuck_searchs_next_step_instead_of_analysing_it(
    monkeypatch, analyses
) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from apps.lifecycle.reconcile import experiments_reconcile

    experiment, _ = started(monkeypatch)
    (trial,) = SearchTrial.objects.filter(experiment=experiment)
    assert trial.run is not None
    _done(trial.run, 1000.0)  # finished, but its hook was lost: the trial still reads running
    from apps.lifecycle.search import search_trial_finished

    search_trial_finished(run_id=trial.run.pk)
    long_ago = timezone.now() - timedelta(hours=1)
    Run.objects.filter(pk=trial.run.pk).update(finished_at=long_ago)
    Experiment.objects.filter(pk=experiment.pk).update(updated_at=long_ago)
    (repair,) = experiments_reconcile()
    assert repair["repair"] == "search step taken again: no trial was running"
    assert SearchTrial.objects.filter(experiment=experiment).count() == 2
    assert analyses == []


def test_the_create_pages_estimate_counts_the_screening_and_the_confirmed_cells() -> None:
    from apps.experiments.spec import validate_spec
    from apps.lifecycle.selectors import plan_estimate

    estimate = plan_estimate(validate_spec(search_spec()))
    # B0 and 2 confirmed cells x 1 mixture x 2 rates x 2 repeats, then 5 screening runs at most.
    assert (estimate.cells, estimate.runs, estimate.starts) == (3, 12 + 5, 12 + 5)


def test_a_searchs_pages_answer_while_it_screens_and_once_it_confirmed(monkeypatch, analyses, client) -> None:  # type: ignore[no-untyped-def]
    experiment, host = started(monkeypatch)
    client.force_login(experiment.owner)
    pages = [f"/experiments/{experiment.pk}/{tail}" for tail in ("", "live/", "spec.yaml", "audit/")]
    for url in pages:
        assert client.get(url).status_code == 200, url
    host_pull(host=host, execute=fake_execute)
    for url in pages:
        assert client.get(url).status_code == 200, url
    exported = client.get(f"/experiments/{experiment.pk}/spec.yaml").content.decode()
    assert "search:" in exported and "candidates: []" in exported
    from apps.experiments.spec import parse_spec

    again = parse_spec(exported)  # imports again as the same search, B0 alone
    assert again["search"] == experiment.spec["search"] and again["candidates"] == []
