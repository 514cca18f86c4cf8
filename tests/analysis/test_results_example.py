"""examples/results/ imports and reports a decision with no other step."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.experiments.models import Experiment
from apps.runs.models import RequestRecord

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "results"
pytestmark = pytest.mark.django_db


def _import_spec(admin_user) -> Experiment:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    call_command("experiment_import", str(EXAMPLE / "spec.yaml"), "--owner", admin_user.username, stdout=out)
    return Experiment.objects.get(name="imported-results-example")


def test_the_example_results_import_and_reach_a_decision(admin_user) -> None:  # type: ignore[no-untyped-def]
    experiment = _import_spec(admin_user)
    out = io.StringIO()
    call_command("results_import", "--experiment", str(experiment.pk), str(EXAMPLE), stdout=out)
    text = out.getvalue()
    assert "for 6 runs" in text and "decision: " in text, text
    experiment.refresh_from_db()
    assert experiment.status == "analysed"
    decision = experiment.decision
    # Three repeats of 180 s: enough for the run-level test (df 2) to prove C1's gain on the short
    # class and its non-inferiority on the long one (the browser approval test builds on this).
    assert (decision.outcome, decision.chosen_cell) == ("retune", "C1") and "retune C1" in text
    assert decision.checks["validity"]["invalid_cells"] == []
    assert RequestRecord.objects.filter(run__experiment=experiment).count() > 400


def test_a_run_without_its_run_json_is_named_with_what_it_lacks(admin_user, tmp_path) -> None:  # type: ignore[no-untyped-def]
    experiment = _import_spec(admin_user)
    for name in ("B0~80-20~near~1", "B0~80-20~near~2"):
        shutil.copytree(EXAMPLE / name, tmp_path / name)
    out = io.StringIO()
    call_command("results_import", "--experiment", str(experiment.pk), str(tmp_path), stdout=out)
    text = out.getvalue()
    assert "no decision yet: 4 runs cannot be analysed" in text
    assert "run C1~80-20~near~1" in text and "run.json needs status, trace_sha256, hardware_id" in text
    experiment.refresh_from_db()
    assert experiment.status == "planned"


def test_a_bad_run_json_names_its_field_and_saves_nothing(admin_user, tmp_path) -> None:  # type: ignore[no-untyped-def]
    experiment = _import_spec(admin_user)
    shutil.copytree(EXAMPLE / "B0~80-20~near~1", tmp_path / "B0~80-20~near~1")
    (tmp_path / "B0~80-20~near~1" / "run.json").write_text('{"status": "done", "hardware_id": "x"}')
    with pytest.raises(CommandError, match="missing field trace_sha256"):
        call_command(
            "results_import", "--experiment", str(experiment.pk), str(tmp_path), stdout=io.StringIO()
        )
    assert not RequestRecord.objects.filter(run__experiment=experiment).exists()


def test_an_approved_experiments_evidence_cannot_be_replaced(admin_user) -> None:  # type: ignore[no-untyped-def]
    experiment = _import_spec(admin_user)
    Experiment.objects.filter(pk=experiment.pk).update(status="approved")
    with pytest.raises(CommandError, match="evidence behind a verdict never changes"):
        call_command("results_import", "--experiment", str(experiment.pk), str(EXAMPLE), stdout=io.StringIO())


def test_an_approved_experiments_decision_is_never_recomputed(admin_user) -> None:  # type: ignore[no-untyped-def]
    experiment = _import_spec(admin_user)
    call_command("results_import", "--experiment", str(experiment.pk), str(EXAMPLE), stdout=io.StringIO())
    experiment.refresh_from_db()
    before = (experiment.decision.pk, experiment.decision.updated_at, experiment.decision.report)
    Experiment.objects.filter(pk=experiment.pk).update(status="approved")
    with pytest.raises(CommandError, match="never recomputed"):
        call_command("experiment_report", str(experiment.pk), "--save", stdout=io.StringIO())
    out = io.StringIO()
    call_command("experiment_report", str(experiment.pk), "--format", "summary", stdout=out)
    assert "decision:" in out.getvalue()  # reading is fine
    experiment.decision.refresh_from_db()
    assert (experiment.decision.pk, experiment.decision.updated_at, experiment.decision.report) == before
