"""Spec keys, scenario runs in the plan, frozen scenario traces, and the probe's freeze (no engine)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from apps.experiments.models import Experiment
from apps.experiments.services import experiment_to_spec
from apps.experiments.spec import SpecError, validate_spec
from apps.lifecycle.calibration import CalibrationError, experiment_calibrate
from apps.lifecycle.running import experiment_freeze_and_enqueue
from apps.runs.ingest import records_ingest
from apps.runs.models import Run
from apps.runs.scenario_reports import scenario_reports
from apps.workloads.services import trace_load
from tests.experiments.factories import make_experiment, small_spec
from tests.runs.factories import make_host
from workers.engine.tinymodel import build_tokenizer
from workers.replay.records import RequestRecord

MS = 1_000_000


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("scenario-model"))


def spec_with(model_dir: Path | None = None, **extra: Any) -> dict[str, Any]:
    spec = small_spec(**extra)
    if model_dir is not None:
        spec["model"] = {**spec["model"], "path": str(model_dir)}
    return spec


def errors_of(spec: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    return {e.path: e.message for e in info.value.errors}


def test_it_validates_scenarios_with_field_paths() -> None:
    errors = errors_of(
        spec_with(
            scenarios={
                "kv_pressure": {"cells": ["B0", "C9"], "requests": 0},
                "long_burst": {"burst_sise": 3},
                "meteor": {},
            }
        )
    )
    assert errors["scenarios.kv_pressure.cells[1]"] == "names unknown cell 'C9'"
    assert "requests must be positive" in errors["scenarios.kv_pressure"]
    assert errors["scenarios.long_burst.burst_sise"] == "unknown field"
    assert errors["scenarios.meteor"].startswith("unknown scenario")


def test_it_validates_calibration_and_fills_provisional_rates() -> None:
    errors = errors_of(
        spec_with(calibration={"tolerance": 2, "fractions": {"low": 1.5}, "mixtures": ["nope"], "speed": 1})
    )
    assert errors["calibration.tolerance"].startswith("must be at most")
    assert errors["calibration.fractions.low"].startswith("must be at most 1")
    assert errors["calibration.mixtures[0]"] == "names unknown mixture 'nope'"
    assert errors["calibration.speed"] == "unknown field"
    spec = spec_with(calibration={"start_rps": 2.0})
    del spec["workload"]["rates"]
    clean = validate_spec(spec)
    assert clean["workload"]["rates"] == {"low": 0.6, "near_capacity": 1.8}
    assert clean["workload"]["rates_source"] == "probe"
    assert clean["calibration"]["fractions"] == {"low": 0.3, "near_capacity": 0.9}
    named = errors_of(spec_with(calibration={}))  # the small spec types a rate named "low" only
    assert "named like calibration.fractions" in named["workload.rates"]


def test_it_leaves_a_spec_without_the_new_keys_as_it_was() -> None:
    clean = validate_spec(small_spec())
    assert "scenarios" not in clean and "calibration" not in clean
    assert clean["workload"]["rates_source"] == "manual"


@pytest.mark.django_db
def test_it_plans_scenario_runs_after_the_sweep_against_b0_and_the_listed_cells() -> None:
    candidates = [
        {"id": "C1", "args": {"max_num_batched_tokens": 512, "max_num_seqs": 8}},
        {"id": "C2", "args": {"max_num_seqs": 8, "scheduling_policy": "priority"}},
    ]
    experiment = make_experiment(
        candidates=candidates,
        scenarios={"cancellation": {"cells": ["C1"]}, "context_boundary": None},
    )
    runs = list(experiment.runs.order_by("plan_position"))
    sweep = [r for r in runs if r.kind == Run.Kind.SWEEP]
    scen = [r for r in runs if r.kind == Run.Kind.SCENARIO]
    assert len(sweep) == 3 and all(r.plan_position < s.plan_position for r in sweep for s in scen)
    got = sorted((r.scenario, r.cell.cell_id) for r in scen)
    assert got == [
        ("cancellation", "B0"),
        ("cancellation", "C1"),
        ("context_boundary", "B0"),
        ("context_boundary", "C1"),
        ("context_boundary", "C2"),
        ("priority_check", "C2"),
    ]
    boundary = next(r for r in scen if r.scenario == "context_boundary")
    assert (boundary.warmup_seconds, boundary.observation_seconds, boundary.drain_deadline_seconds) == (
        0.0,
        4.0,
        30.0,
    )
    exported = experiment_to_spec(experiment=experiment)
    assert exported["scenarios"]["cancellation"] == {"cells": ["C1"], "params": {}}


def _start(experiment: Experiment) -> None:
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)


@pytest.mark.django_db
def test_it_freezes_one_trace_per_scenario_shared_by_every_cell(model_dir: Path) -> None:
    make_host()
    experiment = make_experiment(
        model=spec_with(model_dir)["model"],
        scenarios={"cancellation": {"observation_s": 4}, "kv_pressure": {"kv_capacity_tokens": 1024}},
    )
    _start(experiment)
    assert experiment_freeze_and_enqueue(experiment_id=experiment.pk) == 6
    for name in ("cancellation", "kv_pressure"):
        runs = list(experiment.runs.filter(scenario=name))
        assert len(runs) == 2 and len({r.trace_sha256 for r in runs}) == 1
        trace = trace_load(sha256=runs[0].trace_sha256)
        assert trace.meta["scenario"] == name
        assert runs[0].requests_planned == len(trace.requests)
        assert runs[0].rate_rps == pytest.approx(len(trace.requests) / trace.meta["observation_s"])
    sweep = experiment.runs.filter(kind=Run.Kind.SWEEP)
    assert all(r.trace_sha256 and r.trace.meta["kind"] == "generated" for r in sweep)


def _fake_execute(capacity_rps: float | dict[str, float]):  # type: ignore[no-untyped-def]
    """Stands in for the pipeline: every request answered, fast up to ``capacity_rps``, slow above it.

    ``capacity_rps`` may be a mapping mixture -> capacity.
    """
    executed: list[int] = []

    def execute(*, run_pk: int) -> str:
        run = Run.objects.get(pk=run_pk)
        cap = capacity_rps[run.mixture] if isinstance(capacity_rps, dict) else capacity_rps
        ttft_ms = 50.0 if run.rate_rps <= cap else 5000.0
        trace = trace_load(sha256=run.trace_sha256)
        records = []
        for r in trace.requests:
            planned = round(r.t_offset_s * 1e9)
            first = planned + int(ttft_ms * MS)
            # A decode pace of rate x 10 ms per token: the lowest rate streams fastest.
            last = first + int(run.rate_rps * 10 * MS) * (r.output_tokens - 1)
            records.append(
                RequestRecord(
                    run_id=str(run.run_id), index=r.index, request_class=r.klass, warmup=r.warmup,
                    input_tokens=r.input_tokens, expected_output_tokens=r.output_tokens, planned_ns=planned,
                    sent_ns=planned, first_token_ns=first, last_token_ns=last, end_ns=last,
                    output_tokens=r.output_tokens, chunks=r.output_tokens, max_gap_ns=5 * MS, http_status=200,
                )
            )  # fmt: skip
        records_ingest(run_pk=run.pk, records=records)
        Run.objects.filter(pk=run_pk).update(status=Run.Status.DONE)
        executed.append(run_pk)
        return "done"

    execute.executed = executed  # type: ignore[attr-defined]
    return execute


def _calibrated_experiment(
    model_dir: Path, *, calibration: dict[str, Any] | None = None, **extra: Any
) -> Experiment:
    spec = spec_with(model_dir, **extra)
    spec["workload"] = {**spec["workload"], "rates": {}}
    del spec["workload"]["rates"]
    spec["calibration"] = {
        **(calibration or {}),
        "start_rps": 1.0,
        "tolerance": 0.1,
        "warmup_s": 1,
        # Long enough that the 80/20 mixture's exact count quotas give every class
        # requests at the lowest probed rate (a class with none fails its step).
        "observation_s": 20,
        "drain_deadline_s": 5,
    }
    from apps.lifecycle.creation import experiment_create
    from tests.experiments.factories import UserFactory

    return experiment_create(spec=spec, owner=UserFactory(roles=["experimenter"]))


@pytest.mark.django_db
def test_it_probes_b0_freezes_the_rates_and_every_cell_then_replays_the_same_traces(model_dir: Path) -> None:
    make_host()
    experiment = _calibrated_experiment(model_dir)
    assert experiment.workload.rates_source == "probe"
    execute = _fake_execute(capacity_rps=3.0)
    _start(experiment)
    assert experiment_freeze_and_enqueue(experiment_id=experiment.pk, execute=execute) == 4
    workload = experiment.workload.__class__.objects.get(pk=experiment.workload.pk)
    d = workload.rates_derivation
    assert d["capacities"] == {"80-20": 3.0}
    assert workload.rates == {"low": 0.9, "near_capacity": 2.7} == d["rates"]
    assert workload.rates_source == "probe"
    steps = d["probes"][0]["steps"]
    assert [s["rate_rps"] for s in steps] == [1.0, 2.0, 4.0, 3.0, 3.5, 3.25]
    assert [s["passed"] for s in steps] == [True, True, False, True, False, False]
    probes = Run.objects.filter(experiment=experiment, kind__in=sorted(Run.PROBES))
    assert probes.count() == 6 and {r.cell.cell_id for r in probes} == {"B0"}
    assert sorted(execute.executed) == sorted(probes.values_list("pk", flat=True))
    sweep = list(experiment.runs.filter(kind=Run.Kind.SWEEP))
    assert {(r.rate_name, r.rate_rps) for r in sweep} == {("low", 0.9), ("near_capacity", 2.7)}
    for rate in ("low", "near_capacity"):
        runs = [r for r in sweep if r.rate_name == rate]
        assert {r.cell.cell_id for r in runs} == {"B0", "C1"}
        assert len({r.trace_sha256 for r in runs}) == 1
        assert trace_load(sha256=runs[0].trace_sha256).meta["rate_rps"] == workload.rates[rate]
    report = scenario_reports(experiment_id=experiment.pk)
    assert report["rates"]["source"] == "probe" and report["summary"]["status"] == "none"


@pytest.mark.django_db
def test_it_sizes_the_scenarios_from_b0s_pace_measured_by_the_probe(model_dir: Path) -> None:
    make_host()
    burst = {"long_output_tokens": 100, "observation_s": 4, "burst_at_s": 1, "drain_deadline_s": 1}
    experiment = _calibrated_experiment(model_dir, scenarios={"long_burst": burst})
    _start(experiment)
    assert experiment_freeze_and_enqueue(experiment_id=experiment.pk, execute=_fake_execute(3.0)) == 6
    slowest_first = Run.objects.filter(experiment=experiment, kind__in=sorted(Run.PROBES)).order_by(
        "rate_rps"
    )
    lowest = slowest_first.first()
    assert lowest.rate_rps == 1.0
    trace = trace_load(sha256=experiment.runs.get(scenario="long_burst", cell__cell_id="B0").trace_sha256)
    sizing = trace.meta["sizing"]
    assert sizing["measured"] and sizing["decode_step_ms"] == pytest.approx(10.0)
    assert str(lowest.run_id) in sizing["pace_source"]
    # 8 sequence slots (B0's max_num_seqs), 100 tokens at 10 ms: 1 s a wave; 3 x 4 s needs 12 waves.
    assert sizing["derived"]["burst_size"]["inputs"]["running"] == 8
    assert len(trace.meta["roles"]["burst"]) == 96


@pytest.mark.django_db
def test_it_keeps_the_rates_and_sends_the_experiment_back_when_no_rate_passes(model_dir: Path) -> None:
    make_host()
    experiment = _calibrated_experiment(model_dir)
    spec = experiment.spec
    spec["calibration"]["max_steps"] = 2
    Experiment.objects.filter(pk=experiment.pk).update(spec=spec)
    _start(experiment)
    assert experiment_freeze_and_enqueue(experiment_id=experiment.pk, execute=_fake_execute(0.1)) == 0
    experiment.refresh_from_db()
    assert experiment.status == "planned" and "no probed rate passed" in experiment.status_reason
    assert experiment.workload.__class__.objects.get(pk=experiment.workload.pk).rates_derivation == {}
    with pytest.raises(CalibrationError, match="no enabled calibration"):
        experiment_calibrate(experiment_id=make_experiment().pk, execute=_fake_execute(1.0))


@pytest.mark.django_db
def test_it_cancels_a_probe_step_left_queued_by_a_restart(model_dir: Path) -> None:
    make_host()
    experiment = _calibrated_experiment(model_dir)
    b0 = experiment.cells.get(cell_id="B0")
    stale = Run.objects.create(
        experiment=experiment, cell=b0, mixture="80-20", rate_name="probe0", rate_rps=1.0, repeat=1,
        round_position=0, plan_position=0, kind="calibration", warmup_seconds=1,
        observation_seconds=4,
        drain_deadline_seconds=5,
    )  # fmt: skip
    _start(experiment)
    experiment_freeze_and_enqueue(experiment_id=experiment.pk, execute=_fake_execute(capacity_rps=3.0))
    stale.refresh_from_db()
    assert (
        stale.status == "cancelled"
        and not experiment.runs.filter(status="queued", trace__isnull=True).exists()
    )


def test_it_validates_a_normalised_spec_to_itself() -> None:
    spec = spec_with(
        scenarios={"kv_pressure": {"cells": ["C1"], "requests": 4}, "cancellation": None},
        calibration={"start_rps": 2.0, "mixtures": ["80-20"]},
    )
    del spec["workload"]["rates"]
    once = validate_spec(spec)
    assert once["scenarios"]["kv_pressure"] == {"cells": ["C1"], "params": {"requests": 4}}
    assert validate_spec(once) == once


@pytest.mark.django_db
def test_it_calibrates_from_the_command_and_refuses_an_experiment_without_calibration(
    model_dir: Path, monkeypatch
) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    fake = _fake_execute(capacity_rps=3.0)
    monkeypatch.setattr("workers.pipeline.inline_executor", lambda: contextlib.nullcontext(fake))
    experiment = _calibrated_experiment(model_dir)
    out = StringIO()
    call_command("experiment_calibrate", str(experiment.pk), stdout=out)
    assert "'low': 0.9" in out.getvalue() and "source: probe" in out.getvalue()
    assert (
        experiment.runs.get(kind=Run.Kind.SWEEP, rate_name="near_capacity", cell__cell_id="C1").rate_rps
        == 2.7
    )
    with pytest.raises(CommandError, match="sweep runs have started"):
        experiment.runs.filter(kind=Run.Kind.SWEEP).update(status="done")
        call_command("experiment_calibrate", str(experiment.pk))
    with pytest.raises(CommandError, match="no enabled calibration"):
        call_command("experiment_calibrate", str(make_experiment().pk))


@pytest.mark.django_db
def test_it_measures_a_cells_capacity_for_one_class_alone_from_the_command(
    model_dir: Path, monkeypatch
) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    from apps.analysis.pool_capacity import class_capacities

    # The search replays a mixture of the short class alone: its runs carry that label.
    fake = _fake_execute(capacity_rps={"short alone": 3.0})
    monkeypatch.setattr("workers.pipeline.inline_executor", lambda: contextlib.nullcontext(fake))
    experiment = make_experiment(model=spec_with(model_dir)["model"])
    out = StringIO()
    call_command("experiment_calibrate", str(experiment.pk), "--cell", "C1", "--class", "short", stdout=out)
    assert "capacity of C1 for short alone: 3.0 req/s" in out.getvalue()
    probes = list(experiment.runs.filter(kind=Run.Kind.CALIBRATION).order_by("id"))
    assert [r.rate_rps for r in probes] == [1.0, 2.0, 4.0, 3.0, 3.5, 3.25]
    assert {(r.cell.cell_id, r.mixture) for r in probes} == {("C1", "short alone")}
    for run in probes:
        assert {r.klass for r in trace_load(sha256=run.trace_sha256).requests} == {"short"}
    workload = experiment.workload.__class__.objects.get(pk=experiment.workload.pk)
    search = workload.rates_derivation["class_capacity"]["C1"]["short"]
    assert (search["status"], search["capacity_rps"], search["bracketed"]) == ("done", 3.0, True)
    assert "goodput_capacity" not in workload.rates_derivation and workload.rates_source == "manual"
    # What an isolate decision's pools read.
    found = class_capacities(workload.rates_derivation, mixtures=workload.mixtures, baseline="B0")
    assert found["C1"]["short"]["capacity_rps"] == 3.0
    with pytest.raises(CommandError, match="class: no class 'tiny'"):
        call_command("experiment_calibrate", str(experiment.pk), "--cell", "C1", "--class", "tiny")
    with pytest.raises(CommandError, match="--class needs --cell"):
        call_command("experiment_calibrate", str(experiment.pk), "--class", "short")
    with pytest.raises(CommandError, match="give one"):
        call_command(
            "experiment_calibrate",
            str(experiment.pk),
            "--cell",
            "C1",
            "--class",
            "short",
            "--mixture",
            "80-20",
        )


@pytest.mark.django_db
def test_it_plans_and_freezes_uniform_companions_apart_from_the_sweep(model_dir: Path) -> None:
    make_host()
    spec = spec_with(model_dir)
    experiment = make_experiment(
        model=spec["model"], workload={**spec["workload"], "uniform_companion": True}
    )
    uniform = list(experiment.runs.filter(kind=Run.Kind.UNIFORM))
    assert sorted(r.cell.cell_id for r in uniform) == ["B0", "C1"]
    assert experiment_to_spec(experiment=experiment)["workload"]["uniform_companion"] is True
    _start(experiment)
    assert experiment_freeze_and_enqueue(experiment_id=experiment.pk) == 4
    bursty = experiment.runs.get(kind=Run.Kind.SWEEP, cell__cell_id="B0", repeat=1)
    companions = [Run.objects.get(pk=r.pk) for r in uniform]
    assert len({r.trace_sha256 for r in companions}) == 1  # every cell replays the same bytes
    companion = companions[0]
    assert companion.trace_sha256 != bursty.trace_sha256
    same, spaced = trace_load(sha256=bursty.trace_sha256), trace_load(sha256=companion.trace_sha256)
    # The same requests at the same mean rate, on constant spacing.
    assert [(r.klass, r.input_tokens) for r in same.requests] == [
        (r.klass, r.input_tokens) for r in spaced.requests
    ]
    gaps = {
        round(b.t_offset_s - a.t_offset_s, 5)
        for a, b in zip(spaced.requests, spaced.requests[1:], strict=False)
    }
    assert len(gaps) == 1
    assert companion.requests_planned == len(spaced.requests)
    # They are not failure scenarios: nothing to judge there.
    assert scenario_reports(experiment_id=experiment.pk)["runs"] == []


@pytest.mark.django_db
def test_it_measures_b0s_pace_with_one_short_run_when_no_probe_did(model_dir: Path) -> None:
    make_host()
    burst = {"long_output_tokens": 100, "observation_s": 4, "burst_at_s": 1, "drain_deadline_s": 1}
    experiment = make_experiment(model=spec_with(model_dir)["model"], scenarios={"long_burst": burst})
    _start(experiment)
    execute = _fake_execute(capacity_rps=10.0)
    assert experiment_freeze_and_enqueue(experiment_id=experiment.pk, execute=execute) == 4
    pace_run = Run.objects.get(experiment=experiment, kind__in=sorted(Run.PROBES))
    assert (pace_run.mixture, pace_run.cell.cell_id, pace_run.status) == ("pace", "B0", "done")
    assert execute.executed == [pace_run.pk]
    trace = trace_load(sha256=experiment.runs.get(scenario="long_burst", cell__cell_id="B0").trace_sha256)
    sizing = trace.meta["sizing"]
    # The fake streams at rate x 10 ms a token; the pace run offers 4 streams in 2.5 s.
    assert sizing["measured"] and sizing["decode_step_ms"] == pytest.approx(16.0)
    assert str(pace_run.run_id) in sizing["pace_source"]


@pytest.mark.django_db
def test_it_keeps_fixed_scenario_sizes_when_the_pace_run_fails(model_dir: Path) -> None:
    make_host()
    experiment = make_experiment(model=spec_with(model_dir)["model"], scenarios={"long_burst": {}})
    _start(experiment)

    def crash(*, run_pk: int) -> str:
        raise RuntimeError("no engine here")

    assert experiment_freeze_and_enqueue(experiment_id=experiment.pk, execute=crash) == 4
    failed = Run.objects.get(experiment=experiment, kind__in=sorted(Run.PROBES))
    assert failed.status == "failed" and "no engine here" in failed.reason
    trace = trace_load(sha256=experiment.runs.get(scenario="long_burst", cell__cell_id="B0").trace_sha256)
    assert not trace.meta["sizing"]["measured"]
    assert trace.meta["sizing"]["derived"]["burst_size"]["rule"].startswith("fixed fallback")
