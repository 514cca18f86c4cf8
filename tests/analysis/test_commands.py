from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from apps.runs.models import MetricSample, Run
from apps.runs.models import RequestRecord as RecordRow
from tests.analysis.factories import done_experiment, isolate_experiment

pytestmark = pytest.mark.django_db


def write_results(tmp_path: Path, records, samples=None) -> Path:
    by_run: dict[str, list[str]] = {}
    for r in records:
        by_run.setdefault(r.run_id, []).append(json.dumps(r.to_json()))
    for run_id, lines in by_run.items():
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "records.jsonl").write_text("\n".join(lines) + "\n")
    for run_id, rows in (samples or {}).items():
        (tmp_path / run_id).mkdir(exist_ok=True)
        (tmp_path / run_id / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in rows))
    return tmp_path


def test_it_imports_records_and_samples_and_is_idempotent_until_the_analysis(tmp_path):
    experiment, records = done_experiment(store=False)
    last = experiment.runs.order_by("plan_position").last()
    Run.objects.filter(pk=last.pk).update(hardware_id="")  # one run not ready: no analysis yet
    run_id = records[0].run_id
    samples = {
        run_id: [
            {
                "t_ns": 0,
                "phase": "before",
                "name": "vllm:num_preemptions_total",
                "kind": "counter",
                "value": 1.0,
            },
            {
                "t_ns": 10**9,
                "phase": "after",
                "epoch": 0,
                "name": "vllm:num_preemptions_total",
                "kind": "counter",
                "value": 4.0,
                "labels": {"model_name": "m"},
                "taken_at": "2026-11-29T10:00:00+00:00",
            },
        ]
    }
    directory = write_results(tmp_path, records, samples)
    out = io.StringIO()
    call_command("results_import", "--experiment", str(experiment.pk), str(directory), stdout=out)
    assert f"imported {len(records)} records and 2 metric samples" in out.getvalue()
    assert "no decision yet" in out.getvalue()
    call_command("results_import", "--experiment", str(experiment.pk), str(directory), stdout=io.StringIO())
    assert RecordRow.objects.filter(run__experiment=experiment).count() == len(records)
    assert MetricSample.objects.filter(run__experiment=experiment).count() == 2
    # Once analysed, the evidence the decision is being made on takes nothing more.
    Run.objects.filter(pk=last.pk).update(hardware_id="cpu-test")
    call_command("results_import", "--experiment", str(experiment.pk), str(directory), stdout=io.StringIO())
    experiment.refresh_from_db()
    assert experiment.status == "analysed"
    with pytest.raises(CommandError, match=f"experiment {experiment.pk} is analysed: .* Nothing imported"):
        call_command(
            "results_import", "--experiment", str(experiment.pk), str(directory), stdout=io.StringIO()
        )
    assert RecordRow.objects.filter(run__experiment=experiment).count() == len(records)
    row = RecordRow.objects.get(run__run_id=run_id, index=0)
    assert row.first_token_ns == records[0].first_token_ns
    assert row.token_gaps == records[0].token_gaps.to_json()


def test_it_refuses_a_bad_line_by_number_and_saves_nothing(tmp_path):
    experiment, records = done_experiment(store=False)
    directory = write_results(tmp_path, records)
    victim = sorted(p for p in directory.iterdir())[-1] / "records.jsonl"
    lines = victim.read_text().splitlines()
    bad = json.loads(lines[2])
    bad["planned_ns"] = "soon"
    lines[2] = json.dumps(bad)
    victim.write_text("\n".join(lines) + "\n")
    with pytest.raises(CommandError, match=r"records\.jsonl:3: field planned_ns must be int"):
        call_command("results_import", "--experiment", str(experiment.pk), str(directory))
    assert RecordRow.objects.filter(run__experiment=experiment).count() == 0


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o.update(surprise=1), "unknown field"),
        (lambda o: o.pop("planned_ns"), "missing field planned_ns"),
        (lambda o: o.update(request_class="huge"), "not a class of the experiment"),
        (lambda o: o.update(run_id="00000000-0000-0000-0000-000000000000"), "does not match"),
        (lambda o: o.update(token_gaps={"x": 1}), "field token_gaps must be histogram object"),
    ],
)
def test_it_names_the_field_of_a_bad_record(tmp_path, mutate, message):
    experiment, records = done_experiment(store=False)
    directory = write_results(tmp_path, records[:1])
    path = directory / records[0].run_id / "records.jsonl"
    obj = json.loads(path.read_text())
    mutate(obj)
    path.write_text(json.dumps(obj) + "\n")
    with pytest.raises(CommandError, match=message):
        call_command("results_import", "--experiment", str(experiment.pk), str(directory))


def test_it_refuses_a_directory_of_a_run_outside_the_experiment(tmp_path):
    experiment, _ = done_experiment(store=False)
    (tmp_path / "00000000-0000-0000-0000-000000000000").mkdir()
    with pytest.raises(CommandError, match="is not a run of experiment"):
        call_command("results_import", "--experiment", str(experiment.pk), str(tmp_path))


def test_it_prints_the_report_as_json():
    experiment, _ = done_experiment()
    out = io.StringIO()
    call_command("experiment_report", str(experiment.pk), "--format", "json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["format"] == "tailtune-report"
    assert report["decision"]["outcome"] == "retain"
    assert {(a["cell"], a["class"]) for a in report["aggregates"]} == {
        ("B0", "short"),
        ("B0", "long"),
        ("C1", "short"),
        ("C1", "long"),
    }
    summary = io.StringIO()
    call_command("experiment_report", str(experiment.pk), "--format", "summary", stdout=summary)
    assert "decision: retain B0" in summary.getvalue()
    # The summary says how far the decision can be trusted: the family, the draws, and the power
    # (here too few requests in a run to judge a tail at all).
    text = summary.getvalue()
    assert "gain family: " in text and " draws" in text
    assert "power: " in text and "not enough requests to judge" in text
    with pytest.raises(CommandError, match="does not exist"):
        call_command("experiment_report", "999999")


def test_it_takes_analysis_options_and_refuses_bad_ones():
    experiment, _ = done_experiment()
    out = io.StringIO()
    opts = '{"agreed_rates": ["low"], "compare": {"resamples": 3000, "seed": 3}}'
    call_command("experiment_report", str(experiment.pk), "--options", opts, stdout=out)
    report = json.loads(out.getvalue())
    assert report["options"]["compare"]["resamples"] == 3000
    assert report["options"]["agreed_rates"] == ["low"]
    with pytest.raises(CommandError, match="unknown analysis options: nope"):
        call_command("experiment_report", str(experiment.pk), "--options", '{"nope": 1}')
    with pytest.raises(CommandError, match="not valid JSON"):
        call_command("experiment_report", str(experiment.pk), "--options", "{")


def test_the_summary_says_how_an_isolate_decision_sizes_its_pools():
    search = {"status": "done", "capacity_rps": 0.5, "bracketed": True, "steps": []}
    experiment = isolate_experiment({"C1": {"short": search}})
    out = io.StringIO()
    call_command("experiment_report", str(experiment.pk), "--format", "summary", stdout=out)
    text = out.getvalue()
    assert "decision: isolate B0" in text
    assert "pools (20% headroom): replicas = ceil(" in text
    assert (
        "pool short: C1, capacity alone 0.5 req/s (capacity search of C1 on short alone); "
        "80-20 @ low: 80% of the requests, 0.8 req/s -> 2 replicas at 80% of capacity"
    ) in text
    assert (
        f"long's capacity alone not measured: run `python manage.py experiment_calibrate {experiment.pk} "
        in text
    )
    assert "pools in all: unknown until long can be sized" in text
