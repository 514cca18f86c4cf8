"""Migration runs/0013: ``scenario`` keeps only a failure scenario's name, and gets its labels back
when the migration is reversed."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from apps.lifecycle.runs import run_build
from apps.runs.models import Run
from tests.experiments.factories import make_experiment

BEFORE = [("runs", "0012_host_operator_names")]
AFTER = [("runs", "0013_run_scenario_only_failure")]
# (kind, scenario) as migration 0011's constraint had them, and what 0013 leaves in scenario.
OLD = [
    ("sweep", "", ""),
    ("uniform", "uniform", ""),
    ("calibration", "calibration", ""),
    ("pace", "calibration", ""),
    ("rehearsal", "rehearsal", ""),
    ("scenario", "long_burst", "long_burst"),
]


def _rows(
    executor: MigrationExecutor, target: list[tuple[str, str]], pks: list[int]
) -> list[tuple[str, str]]:
    model = executor.loader.project_state(target).apps.get_model("runs", "Run")
    by_pk = {r.pk: (r.kind, r.scenario) for r in model.objects.filter(pk__in=pks)}
    return [by_pk[pk] for pk in pks]


@pytest.mark.django_db(transaction=True)
def test_it_clears_the_labels_of_runs_that_are_not_failure_scenarios_and_restores_them_backwards() -> None:
    experiment = make_experiment()
    cell = experiment.cells.first()
    point = {"cell": cell, "mixture": "m", "rate_name": "r", "rate_rps": 1.0, "round_position": 0}
    runs = [
        run_build(experiment=experiment, kind="sweep", plan_position=100 + i, **point)
        for i in range(len(OLD))
    ]
    pks = [r.pk for r in Run.objects.bulk_create(runs)]
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        Old = executor.loader.project_state(BEFORE).apps.get_model("runs", "Run")
        for pk, (kind, scenario, _) in zip(pks, OLD, strict=True):
            Old.objects.filter(pk=pk).update(kind=kind, scenario=scenario)
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        assert _rows(executor, AFTER, pks) == [(kind, after) for kind, _, after in OLD]
        executor = MigrationExecutor(connection)
        executor.migrate(BEFORE)
        assert _rows(executor, BEFORE, pks) == [(kind, before) for kind, before, _ in OLD]
    finally:
        MigrationExecutor(connection).migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
