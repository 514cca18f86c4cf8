"""The create page's "Capture B0": production's B0 put into the form for review, its record kept
through Create into the spec, the results page and the manifest; a server only by name; every
error beside its field, nothing saved."""

from __future__ import annotations

from typing import Any

import pytest

from apps.experiments.models import Experiment
from apps.experiments.services import experiment_to_spec
from apps.experiments.spec import validate_spec
from apps.experiments.spec_capture import TYPED_BY_HAND
from tests.approvals.test_capture_sources import _approve
from tests.ui.forms_data import form_data

pytestmark = pytest.mark.django_db


def _capture(**fields: Any) -> dict[str, Any]:
    data = form_data(capture="1", **fields)
    data.pop("preview")
    # B0 as captured schedules fcfs, under which vLLM refuses a class priority.
    data["classes-1-priority"] = "0"
    return data


def _resubmit(response, **extra: Any) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """What the browser sends back: the form as the page shows it."""
    data = {k: v for k, v in response.context["form"].data.lists()}
    data = {k: v[0] if len(v) == 1 else v for k, v in data.items()}
    data.pop("capture", None)
    data.update(extra)
    return data


def test_it_captures_b0_from_an_approved_manifest_into_the_form_and_creates_with_its_record(
    client, author, analysed_experiment, approver
) -> None:  # type: ignore[no-untyped-def]
    row = _approve(analysed_experiment, approver)
    client.force_login(author)
    typed = form_data()
    response = client.post(
        "/experiments/new/",
        _capture(
            capture_source="manifest",
            capture_experiment=str(analysed_experiment.pk),
            baseline_max_num_seqs="99",  # typed by hand, replaced by the capture
            baseline_scheduling_policy="priority",
        ),
    )
    assert response.status_code == 200, response.content.decode()[-2000:]
    data = response.context["form"].data
    b0 = analysed_experiment.cells.get(role="baseline")
    assert data["baseline_max_num_batched_tokens"] == str(b0.args["max_num_batched_tokens"])
    assert data["baseline_max_num_seqs"] == str(b0.args["max_num_seqs"])
    assert data["baseline_scheduling_policy"] == ""
    assert data["max_model_len"] == str(analysed_experiment.max_model_len)
    assert data["model_path"] == typed["model_path"]
    assert data["baseline_captured_from"].startswith(f"manifest: experiment {analysed_experiment.pk}")
    assert b'id="b0-captured"' in response.content
    assert Experiment.objects.count() == 1  # only the earlier one: nothing saved

    created = client.post("/experiments/new/", _resubmit(response, create="1"))
    assert created.status_code == 302, (created.context["form"].errors, created.context["classes"].errors)
    experiment = Experiment.objects.exclude(pk=analysed_experiment.pk).get()
    capture = experiment.spec["baseline"]["capture"]
    assert capture["source"] == "manifest" and capture["sha256"] == row.json_sha256
    assert experiment.cells.get(role="baseline").args == b0.args
    # The export carries the record, and imports again to the same B0.
    exported = experiment_to_spec(experiment=experiment)
    assert exported["baseline"]["capture"] == capture
    assert validate_spec(exported)["baseline"] == experiment.spec["baseline"]
    page = client.get(f"/experiments/{experiment.pk}/results/")
    assert f"B0 captured from manifest experiment {analysed_experiment.pk}".encode() in page.content
    assert TYPED_BY_HAND.encode() not in page.content


def test_a_b0_typed_by_hand_says_so_on_the_results_page_and_in_the_manifest(
    client, analysed_experiment, approver, viewer
) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    page = client.get(f"/experiments/{analysed_experiment.pk}/results/")
    assert b'id="b0-origin"' in page.content and TYPED_BY_HAND.encode() in page.content
    row = _approve(analysed_experiment, approver)
    assert row.content["baseline"]["b0_origin"] == TYPED_BY_HAND
    assert "capture" not in row.content["baseline"]


def test_a_server_is_chosen_by_name_only_and_errors_sit_beside_their_field(client, author, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TAILTUNE_CAPTURE_SOURCES = {"prod": "http://127.0.0.1:9"}
    client.force_login(author)
    page = client.get("/experiments/new/")
    assert b'<option value="prod">prod</option>' in page.content and b"127.0.0.1:9" not in page.content
    cases = [
        ({"capture_source": ""}, "capture_source", "choose where to capture B0 from"),
        (
            {"capture_source": "server", "capture_server": "http://169.254.169.254"},
            "capture_server",
            "valid choice",
        ),
        (
            {"capture_source": "server", "capture_server": "prod"},
            "capture_server",
            "did not answer /v1/models",
        ),
        (
            {"capture_source": "kubernetes", "capture_text": "kind: Pod\nspec: {containers: []}"},
            "capture_text",
            "no container in the manifest starts vLLM",
        ),
        (
            {"capture_source": "manifest", "capture_experiment": "²"},
            "capture_experiment",
            "must be an experiment's id",
        ),
        ({"capture_source": "manifest"}, "capture_experiment", "no approved manifest yet"),
    ]
    for fields, field, message in cases:
        response = client.post("/experiments/new/", _capture(**fields))
        assert response.status_code == 400, fields
        errors = response.context["form"].errors
        assert field in errors and message in " ".join(errors[field]), (fields, errors.get(field))
    assert Experiment.objects.count() == 0


def test_a_b0_changed_by_hand_after_its_capture_says_so_in_its_record(
    client, author, analysed_experiment, approver
) -> None:  # type: ignore[no-untyped-def]
    _approve(analysed_experiment, approver)
    client.force_login(author)
    response = client.post(
        "/experiments/new/",
        _capture(capture_source="manifest", capture_experiment=str(analysed_experiment.pk)),
    )
    assert response.status_code == 200
    edited = _resubmit(response, create="1", baseline_max_num_seqs="3", max_model_len="1536")
    assert client.post("/experiments/new/", edited).status_code == 302
    experiment = Experiment.objects.exclude(pk=analysed_experiment.pk).get()
    notes = experiment.spec["baseline"]["capture"]["notes"]
    assert notes[-1] == "changed by hand after the capture: max_num_seqs, controls.max_model_len"
