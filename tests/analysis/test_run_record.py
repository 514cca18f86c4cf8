"""The run record (docs/SPEC.md "The run record"): the same fields, under the method's names, for
every run in the report JSON, the API and the per-run export, with the older names as aliases;
image digests compared across cells, and absent values (never 0) for a run that produced no
records."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.core.management import call_command
from rest_framework.test import APIClient

from apps.accounts.tokens import token_create
from apps.analysis.services import experiment_report_build
from apps.runs.models import RequestRecord, Run
from apps.runs.record_names import ALIASES, RUN_RECORD_FIELDS
from tests.experiments.factories import UserFactory

pytestmark = pytest.mark.django_db


def documented_fields(subsection: str | None = None) -> set[str]:
    """The backticked names in the first column of docs/SPEC.md's run-record table (or of the
    table under its ``### subsection``)."""
    text = (Path(settings.BASE_DIR) / "docs" / "SPEC.md").read_text()
    section = text.split("## The run record", 1)[1].split("\n## ", 1)[0]
    if subsection is None:
        section = section.split("\n### ", 1)[0]
    else:
        section = section.split(f"\n### {subsection}", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([a-z_0-9]+)`", row.split("|")[1])}


def test_the_documented_fields_are_the_run_records() -> None:
    assert documented_fields() == set(RUN_RECORD_FIELDS)
    assert documented_fields("Older names") == set(ALIASES)


def _aliases_agree(record) -> None:  # type: ignore[no-untyped-def]
    assert record["cell"] == record["cell_id"]
    assert record["window"] == {
        "warmup_s": record["warmup_seconds"],
        "observation_s": record["observation_seconds"],
        "drain_deadline_s": record["drain_deadline_seconds"],
    }


def test_every_run_carries_the_record_in_the_report_the_api_and_the_export(
    analysed_experiment, viewer, client, capsys
) -> None:  # type: ignore[no-untyped-def]
    call_command("experiment_report", str(analysed_experiment.pk), "--format", "json")
    report = json.loads(capsys.readouterr().out)
    rows = report["runs"]
    assert rows and len(rows) == analysed_experiment.runs.count()
    _, plaintext = token_create(user=viewer, name="t")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    client.force_login(viewer)
    for row in rows:
        assert set(RUN_RECORD_FIELDS) <= set(row), set(RUN_RECORD_FIELDS) - set(row)
        run = Run.objects.get(run_id=row["run_id"])
        assert row["key"] == row["run_id"] and row["image_digest"] == run.image_digest != ""
        assert row["effective_args"] == run.effective_args and row["vllm_version"] == run.vllm_version
        assert (row["cell_id"], row["position"]) == (run.cell.cell_id, run.round_position)
        assert (row["warmup_seconds"], row["observation_seconds"], row["drain_deadline_seconds"]) == (
            run.warmup_seconds,
            run.observation_seconds,
            run.drain_deadline_seconds,
        )
        _aliases_agree(row)
        exported = api.get(f"/api/v1/runs/{row['run_id']}")
        assert exported.status_code == 200
        record = exported.json()
        assert {k: record[k] for k in RUN_RECORD_FIELDS} == {k: row[k] for k in RUN_RECORD_FIELDS}
        _aliases_agree(record)
        assert record["host"] == (run.host.name if run.host_id else None)
        assert record["created_at"] == run.created_at.isoformat()
        assert record["records_url"] == f"/api/v1/runs/{row['run_id']}/records"
        records = api.get(record["records_url"]).json()
        assert records["run_id"] == records["run"] == row["run_id"]
        download = client.get(f"/runs/{row['run_id']}/run.json")
        assert download.status_code == 200 and "attachment" in download["Content-Disposition"]
        assert {k: download.json()[k] for k in RUN_RECORD_FIELDS} == {k: row[k] for k in RUN_RECORD_FIELDS}
        _aliases_agree(download.json())
    assert api.get("/api/v1/runs/not-a-uuid").status_code == 404
    assert APIClient().get(f"/api/v1/runs/{rows[0]['run_id']}").status_code == 401
    assert client.get(f"/runs/{rows[0]['run_id']}/run.json").status_code == 200
    client.force_login(UserFactory(username="no-role"))
    assert client.get(f"/runs/{rows[0]['run_id']}/run.json").status_code == 403


def test_a_run_without_records_reports_absent_values_never_zero(analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    run = analysed_experiment.runs.filter(cell__cell_id="C1").first()
    RequestRecord.objects.filter(run=run).delete()
    report = experiment_report_build(experiment_id=analysed_experiment.pk)
    row = next(r for r in report["runs"] if r["run_id"] == str(run.run_id))
    assert row["tokens_per_s"] is None
    assert all(m["goodput_rps"] is None and m["counts"]["offered"] == 0 for m in row["classes"].values())
    # The cell is invalid for it, and said why.
    validity = report["checks"]["validity"]
    assert "C1" in validity["invalid_cells"]
    assert any(
        p["cell"] == "C1" and p["problem"] == "no records in the observation window"
        for p in validity["problems"]
    )
    # A run with records keeps numbers.
    other = next(r for r in report["runs"] if r["cell"] == "B0")
    assert other["tokens_per_s"] > 0


def test_a_cell_on_another_image_is_invalid_unless_its_spec_names_one(analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    Run.objects.filter(experiment=analysed_experiment, cell__cell_id="C1").update(
        image_digest="sha256:" + "cd" * 32
    )
    validity = experiment_report_build(experiment_id=analysed_experiment.pk)["checks"]["validity"]
    assert validity["invalid_cells"] == ["C1"]
    assert any(p["problem"] == "image_digest differs" and p["cell"] == "C1" for p in validity["problems"])
    analysed_experiment.cells.filter(cell_id="C1").update(engine_image="vllm:next")
    validity = experiment_report_build(experiment_id=analysed_experiment.pk)["checks"]["validity"]
    assert validity["invalid_cells"] == [], validity["problems"]


@pytest.mark.django_db
def test_a_digest_only_the_own_image_cell_recorded_invalidates_nobody(analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    Run.objects.filter(experiment=analysed_experiment).update(image_digest="")
    Run.objects.filter(experiment=analysed_experiment, cell__cell_id="C1").update(
        image_digest="sha256:" + "cd" * 32
    )
    analysed_experiment.cells.filter(cell_id="C1").update(engine_image="vllm:next")
    validity = experiment_report_build(experiment_id=analysed_experiment.pk)["checks"]["validity"]
    assert validity["invalid_cells"] == [], validity["problems"]
    assert "no run recorded image_digest: cells cannot be checked for it" in validity["warnings"]


def test_the_openapi_document_describes_the_record_the_api_answers(
    analysed_experiment, viewer, client
) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    doc = yaml.safe_load(client.get("/api/v1/openapi.json").content)  # JSON, which YAML parses too
    response = doc["paths"]["/api/v1/runs/{run_id}"]["get"]["responses"]["200"]
    assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/RunRecord"}
    schema = doc["components"]["schemas"]["RunRecord"]
    run = analysed_experiment.runs.first()
    _, plaintext = token_create(user=viewer, name="t")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    record = api.get(f"/api/v1/runs/{run.run_id}").json()
    # Every field the API answers is described, and nothing else; the older names are deprecated.
    assert set(schema["properties"]) == set(record)
    assert set(RUN_RECORD_FIELDS) <= set(schema["required"])
    assert {k for k, v in schema["properties"].items() if v.get("deprecated")} == set(ALIASES)
