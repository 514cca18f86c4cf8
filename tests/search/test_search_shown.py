"""A search experiment's page and report (#36 item 4): the trials as points (margin against
throughput, the Pareto front marked, colour by outcome, each linked to its run), the knobs that
mattered, engine-hours against the budget and the grid; the report carries the same trials.

The trials are SearchTrial rows made directly, on a grid experiment whose stored spec gains a
``search`` section, so its report has candidates and runs to show beside them (a search made
from a spec and run through its lifecycle: tests/search/test_search_lifecycle.py).
"""

from __future__ import annotations

import copy
import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from apps.analysis.services import experiment_analyse, experiment_report_build
from apps.experiments.models import Experiment
from apps.runs.models import Run
from apps.search.charts import trials_figure
from apps.search.models import SearchTrial
from apps.search.selectors import run_engine_estimate, search_report
from tests.experiments.factories import SMALL_SPEC, UserFactory, make_experiment

pytestmark = pytest.mark.django_db

SPACE = {
    "max_num_seqs": {"values": [4, 8, 16]},
    "max_num_batched_tokens": {"min": 512, "max": 4096, "log": True},
}


def _search_experiment() -> tuple[Experiment, list[SearchTrial]]:
    experiment: Experiment = make_experiment()
    spec = copy.deepcopy(experiment.spec)
    spec["search"] = {"space": SPACE, "budget": {"max_trials": 10, "max_engine_hours": 2.0}}
    Experiment.objects.filter(pk=experiment.pk).update(spec=spec)
    experiment.refresh_from_db()
    runs = list(experiment.runs.order_by("plan_position"))
    rows = []
    shapes = [(4, 512), (8, 1024), (16, 4096), (8, 2048), (16, 512)]
    for n, (seqs, budget) in enumerate(shapes):
        params = {"max_num_seqs": seqs, "max_num_batched_tokens": budget}
        rows.append(
            SearchTrial.objects.create(
                experiment=experiment, number=n, params=params, args=params, run=runs[n] if n < 2 else None
            )
        )
    rows[0].mark_measured(margin=0.2, worst_class="long", throughput_rps=3.0, engine_s=100.0)
    rows[1].mark_measured(margin=0.3, worst_class="short", throughput_rps=2.0, engine_s=120.0)
    rows[2].mark_failed(reason="server did not start: KV cache too small", engine_s=60.0)
    rows[3].mark_measured(margin=-0.1, worst_class="long", throughput_rps=1.0, engine_s=110.0)
    SearchTrial.objects.filter(pk=rows[1].pk).update(confirmed=True)
    return experiment, rows


def test_the_report_section_counts_outcomes_confirmed_trials_and_the_grid_cost() -> None:
    experiment, rows = _search_experiment()
    section = search_report(experiment_id=experiment.pk, spec=experiment.spec)
    assert section is not None
    assert section["outcomes"] == {"kept": 2, "failed": 1, "broke": 1, "running": 1}
    assert section["confirmed"] == [1]
    assert section["pareto"] == [0, 1]
    assert section["engine_hours"] == round(390 / 3600, 3)
    # The grid's runs cost what a measured screening run did on average: (100 + 120 + 110) / 3.
    assert section["grid_engine_hours"] == round(13 * 110.0 / 3600, 1)
    assert section["trials"][0]["run_id"] == str(rows[0].run.run_id)  # type: ignore[union-attr]
    assert search_report(experiment_id=experiment.pk, spec=SMALL_SPEC) is None


def test_before_any_measurement_a_run_costs_its_windows_and_a_start() -> None:
    w = SMALL_SPEC["workload"]
    planned = w["warmup_s"] + w["observation_s"] + w["drain_deadline_s"] + 60.0
    assert run_engine_estimate(spec=SMALL_SPEC, trials=[]) == planned


def test_the_chart_plots_measured_trials_by_outcome_links_runs_and_joins_the_front() -> None:
    experiment, rows = _search_experiment()
    section = search_report(experiment_id=experiment.pk, spec=experiment.spec)
    assert section is not None
    fig = trials_figure(section, lambda run_id: f"/runs/{run_id}/")
    by_name = {t["name"]: t for t in fig["data"]}
    kept, broke, front = by_name["kept every contract"], by_name["broke a contract"], by_name["Pareto front"]
    assert (kept["x"], kept["y"]) == ([3.0, 2.0], [0.2, 0.3])
    assert kept["customdata"] == [f"/runs/{rows[0].run.run_id}/", f"/runs/{rows[1].run.run_id}/"]  # type: ignore[union-attr]
    assert kept["marker"]["symbol"] == ["circle", "star"]  # trial 1 was confirmed
    assert (broke["y"], broke["customdata"]) == ([-0.1], [""])  # no run to open
    assert (front["x"], front["y"]) == ([2.0, 3.0], [0.3, 0.2])  # by throughput
    # The failed and the running trials have no point: the table lists them.
    assert sum(len(t["x"]) for t in fig["data"] if t["mode"] == "markers") == 3
    assert kept["marker"]["color"] != broke["marker"]["color"]


def test_the_page_shows_the_search_with_failed_reasons_and_run_links(client: Any) -> None:
    experiment, rows = _search_experiment()
    client.force_login(UserFactory(roles=["viewer"]))
    html = client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert 'id="search"' in html and 'id="search-trials-table"' in html
    assert "server did not start: KV cache too small" in html
    assert f'href="/runs/{rows[0].run.run_id}/"' in html  # type: ignore[union-attr]
    assert 'data-chart="search-trials"' in html and "charts.js" in html
    assert "of a budget of 2.0" in html and 'id="search-confirmed"' in html
    # The live partial (polled while it runs) carries the section too.
    assert 'id="search"' in client.get(f"/experiments/{experiment.pk}/live/").content.decode()
    # A grid experiment's page has none of it.
    grid = make_experiment()
    assert 'id="search"' not in client.get(f"/experiments/{grid.pk}/").content.decode()


def test_the_report_and_the_stored_decision_carry_the_trials() -> None:
    experiment, _ = _search_experiment()
    section = search_report(experiment_id=experiment.pk, spec=experiment.spec)
    assert experiment_report_build(experiment_id=experiment.pk, search=section)["search"] == section
    assert "search" not in experiment_report_build(experiment_id=experiment.pk)
    out = StringIO()
    call_command("experiment_report", str(experiment.pk), stdout=out)
    assert [t["number"] for t in json.loads(out.getvalue())["search"]["trials"]] == [0, 1, 2, 3, 4]
    stored = experiment_analyse(experiment_id=experiment.pk, search=section).report
    assert stored["search"]["confirmed"] == [1]
    assert Run.objects.filter(experiment=experiment).exists()
