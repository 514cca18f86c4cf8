"""A screening run and its trial's cell (#36): a run of kind ``screen`` is labelled "screen" and
left out of the report's rows, and a cell of role ``trial`` is left out of the experiment's cells
(so of the report's, the pages' and the export's) until it is confirmed."""

from __future__ import annotations

import pytest

from apps.analysis.services import report_rows
from apps.experiments.models import ServerConfig
from apps.experiments.services import experiment_to_spec
from apps.lifecycle.runs import run_build
from apps.runs.models import Run
from tests.experiments.factories import make_experiment

pytestmark = pytest.mark.django_db


def test_a_screening_run_on_a_trial_cell_stays_out_of_the_report_until_confirmed() -> None:
    experiment = make_experiment()
    cell = ServerConfig.with_trials.create(
        experiment=experiment,
        cell_id="T0",
        role=ServerConfig.Role.TRIAL,
        args={"max_num_seqs": 4},
        position=9,
    )
    screen = run_build(
        experiment=experiment, kind=Run.Kind.SCREEN, cell=cell, mixture="80-20", rate_name="low",
        rate_rps=1.0, round_position=0, plan_position=99, repeat=2,
    )  # fmt: skip
    screen.save()
    assert screen.scenario_label == "screen"
    assert [c.cell_id for c in experiment.cells.all()] == ["B0", "C1"]
    assert ServerConfig.with_trials.filter(experiment=experiment).count() == 3
    rows = report_rows(experiment_id=experiment.pk)
    assert [c["cell_id"] for c in rows.inputs["cells"]] == ["B0", "C1"]
    assert screen.pk not in {r.pk for r in rows.runs} and rows.runs
    assert [c["id"] for c in experiment_to_spec(experiment=experiment)["candidates"]] == ["C1"]
    # Confirmed: a candidate like any, in the report's cells (its screening run still is not).
    ServerConfig.with_trials.filter(pk=cell.pk).update(role=ServerConfig.Role.CANDIDATE)
    rows = report_rows(experiment_id=experiment.pk)
    assert [c["cell_id"] for c in rows.inputs["cells"]] == ["B0", "C1", "T0"]
    assert screen.pk not in {r.pk for r in rows.runs}
