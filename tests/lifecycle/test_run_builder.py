"""The one run builder (apps/lifecycle/runs.py): what every kind of run copies, and from where."""

from __future__ import annotations

from typing import Any

import pytest

from apps.experiments.models import Experiment
from apps.lifecycle.runs import RETRY_FRESH, run_build, run_retry_build
from apps.runs.models import Run
from apps.workloads.models import Trace
from tests.experiments.factories import make_experiment

# What run_build's caller says about a run: everything else is copied.
IDENTITY = (
    "cell",
    "kind",
    "scenario",
    "mixture",
    "rate_name",
    "rate_rps",
    "repeat",
    "round_position",
    "plan_position",
)

LABELS = {
    "sweep": "",
    "uniform": "uniform",
    "scenario": "long_burst",
    "rehearsal": "rehearsal",
    "calibration": "calibration",
    "pace": "calibration",
}


@pytest.fixture
def experiment() -> Experiment:
    e = make_experiment()
    revisions = {"model_revision": "model-rev-1", "tokenizer_revision": "tok-rev-2"}
    Experiment.objects.filter(pk=e.pk).update(**revisions)
    e.runs.update(**revisions)  # a planned run's revisions are always its experiment's
    e.refresh_from_db()
    w = e.workload
    w.warmup_s, w.observation_s, w.drain_deadline_s = 7.0, 33.0, 44.0
    w.save()
    return e


def _trace() -> Trace:
    return Trace.objects.create(
        sha256="a" * 64, corpus_sha256="c" * 64, requests=321, duration_s=9.0, content_gz=b""
    )


def _point(experiment: Experiment, kind: str, **extra: Any) -> dict[str, Any]:
    return {
        "experiment": experiment,
        "kind": kind,
        "cell": experiment.cells.get(cell_id="C1"),
        "mixture": "80-20",
        "rate_name": "near",
        "rate_rps": 2.5,
        "repeat": 2,
        "round_position": 3,
        "plan_position": 17,
        **extra,
    }


def _windows(run: Run) -> tuple[float, float, float]:
    return run.warmup_seconds, run.observation_seconds, run.drain_deadline_seconds


@pytest.mark.django_db
@pytest.mark.parametrize(
    "kind, scenario",
    [
        ("sweep", ""),
        ("uniform", ""),
        ("scenario", "long_burst"),
        ("rehearsal", ""),
        ("calibration", ""),
        ("pace", ""),
    ],
)
def test_every_kind_gets_its_identity_the_experiments_revisions_and_the_workloads_windows(
    experiment: Experiment, kind: str, scenario: str
) -> None:
    run = run_build(**_point(experiment, kind, scenario=scenario))
    assert run.pk is None  # unsaved: the caller saves
    assert (run.kind, run.scenario) == (kind, scenario)
    assert (run.cell.cell_id, run.mixture, run.rate_name, run.rate_rps) == ("C1", "80-20", "near", 2.5)
    assert (run.repeat, run.round_position, run.plan_position) == (2, 3, 17)
    assert (run.model_revision, run.tokenizer_revision) == ("model-rev-1", "tok-rev-2")
    assert _windows(run) == (7.0, 33.0, 44.0)
    assert run.trace is None and run.trace_sha256 == "" and run.requests_planned is None
    assert run.status == Run.Status.QUEUED and run.retry_of is None
    # What the pages, the export and the report call it: the wording from before Run.kind.
    assert run.scenario_label == LABELS[kind]
    run.save()  # the row satisfies the model's constraints
    assert Run.objects.get(pk=run.pk).kind == kind


@pytest.mark.django_db
def test_given_windows_and_a_trace_replace_the_workloads(experiment: Experiment) -> None:
    trace = _trace()
    windows = {"warmup_s": 1, "observation_s": 2.5, "drain_deadline_s": 30}
    run = run_build(**_point(experiment, "calibration", windows=windows, trace=trace))
    assert _windows(run) == (1.0, 2.5, 30.0)
    assert (run.trace, run.trace_sha256, run.corpus_sha256, run.requests_planned) == (
        trace, "a" * 64, "c" * 64, 321,
    )  # fmt: skip


@pytest.mark.django_db
def test_a_run_replaying_another_copies_its_frozen_trace_and_windows(experiment: Experiment) -> None:
    source = run_build(
        **_point(experiment, "sweep", windows={"warmup_s": 2, "observation_s": 3, "drain_deadline_s": 4})
    )
    source.trace, source.trace_sha256, source.corpus_sha256, source.requests_planned = (
        _trace(),
        "f" * 64,
        "e" * 64,
        99,
    )
    source.save()
    rehearsal = run_build(**_point(experiment, "rehearsal", replays=source))
    assert (rehearsal.trace_id, rehearsal.trace_sha256, rehearsal.corpus_sha256, rehearsal.requests_planned) == (
        source.trace_id, "f" * 64, "e" * 64, 99,
    )  # fmt: skip
    assert _windows(rehearsal) == (2.0, 3.0, 4.0)


@pytest.mark.django_db
def test_a_retry_copies_every_field_but_how_the_failed_attempt_went(experiment: Experiment) -> None:
    run = experiment.runs.filter(kind=Run.Kind.SCENARIO).first() or experiment.runs.first()
    assert run is not None
    run.trace, run.trace_sha256, run.corpus_sha256, run.requests_planned = _trace(), "b" * 64, "d" * 64, 12
    run.status, run.reason, run.attempts, run.requests_sent = Run.Status.FAILED, "host lost", 1, 5
    run.observation_seconds = 99.0
    run.save()
    retry = run_retry_build(run=run)
    assert retry.retry_of == run and retry.status == Run.Status.QUEUED and retry.reason == ""
    copied = [f.name for f in Run._meta.concrete_fields if f.name not in RETRY_FRESH]
    assert {"trace", "observation_seconds", "model_revision", *IDENTITY} <= set(copied)
    # A field added to Run is either copied by the builder or named in RETRY_FRESH.
    assert {f: getattr(retry, f) for f in copied} == {f: getattr(run, f) for f in copied}
    assert (retry.requests_sent, retry.attempts) == (0, 0)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "changes, field",
    [
        ({"kind": "scenario", "scenario": ""}, "scenario"),
        ({"kind": "uniform", "scenario": "uniform"}, "scenario"),
        ({"kind": "warmup"}, "kind"),
        ({"replays": "source", "trace": "trace"}, "replays"),
        (
            {"replays": "source", "windows": {"warmup_s": 1, "observation_s": 1, "drain_deadline_s": 1}},
            "replays",
        ),
    ],
)
def test_a_run_that_does_not_fit_is_refused_naming_the_argument(
    experiment: Experiment, changes: dict[str, Any], field: str
) -> None:
    source = experiment.runs.first()
    changes = {k: source if v == "source" else _trace() if v == "trace" else v for k, v in changes.items()}
    with pytest.raises(ValueError, match=f"^{field}: "):
        run_build(**{**_point(experiment, "sweep"), **changes})
