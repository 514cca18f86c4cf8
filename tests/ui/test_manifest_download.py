from __future__ import annotations

import json

import pytest
import yaml

from apps.approvals import manifest as mf
from apps.approvals.services import experiment_approve


def _approve(experiment, approver):  # type: ignore[no-untyped-def]
    """Approve the analysed experiment's proposal; returns its rollback manifest."""
    return experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=experiment,
        approver=approver,
        chosen_cell=experiment.decision.chosen_cell,
        reason="ok",
    )


@pytest.mark.django_db
def test_it_downloads_the_same_manifest_as_yaml_and_json(
    client, viewer, approver, analysed_experiment
) -> None:  # type: ignore[no-untyped-def]
    stored = _approve(analysed_experiment, approver)
    client.force_login(viewer)
    as_json = client.get(f"/experiments/{analysed_experiment.pk}/manifest.json")
    as_yaml = client.get(f"/experiments/{analysed_experiment.pk}/manifest.yaml")
    assert as_json["Content-Type"] == "application/json"
    assert "attachment" in as_yaml["Content-Disposition"]
    doc = json.loads(as_json.content)
    assert yaml.safe_load(as_yaml.content) == doc
    assert doc["sha256"] == stored.sha256 == as_json["X-Manifest-Sha256"]
    assert mf.verify(doc)
    assert doc["evidence"]["experiment"]["id"] == analysed_experiment.pk
    load = doc["evidence"]["offered_load"]
    assert load["source"] == "manual" and load["frozen"] and "typed by hand" in load["said"]
    assert load["values"] == analysed_experiment.workload.rates


@pytest.mark.django_db
def test_it_has_no_manifest_before_approval(client, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    assert client.get(f"/experiments/{analysed_experiment.pk}/manifest.json").status_code == 404
    assert client.get(f"/experiments/{analysed_experiment.pk}/manifest.xml").status_code == 404


@pytest.mark.django_db
def test_it_serves_the_bytes_whose_sha256_the_page_shows(
    client, viewer, approver, analysed_experiment
) -> None:  # type: ignore[no-untyped-def]
    import hashlib

    from apps.approvals.models import RollbackManifest

    stored = _approve(analysed_experiment, approver)
    client.force_login(viewer)
    page = client.get(f"/experiments/{analysed_experiment.pk}/results/").content.decode()
    fresh = RollbackManifest.objects.get(pk=stored.pk)  # read back from the database
    for fmt in ("yaml", "json"):
        response = client.get(f"/experiments/{analysed_experiment.pk}/manifest.{fmt}")
        digest = hashlib.sha256(response.content).hexdigest()  # what `sha256sum` prints
        assert digest == response["X-Manifest-File-Sha256"] == getattr(fresh, f"{fmt}_sha256")
        assert f'data-fmt="{fmt}">{digest}</code>' in page
        assert bytes(getattr(fresh, f"{fmt}_bytes")) == response.content
    # The floats of the evidence come back from Postgres as they went in.
    doc = json.loads(client.get(f"/experiments/{analysed_experiment.pk}/manifest.json").content)
    assert mf.verify(doc) and doc == mf.document(stored.content, stored.sha256)


@pytest.mark.django_db
def test_it_keeps_a_float_that_a_json_column_would_round(analysed_experiment, approver) -> None:  # type: ignore[no-untyped-def]
    from apps.approvals.models import RollbackManifest

    stored = _approve(analysed_experiment, approver)
    before = bytes(RollbackManifest.objects.get(pk=stored.pk).json_bytes)
    # Whatever the JSON column returns for the content, the served file is the stored bytes.
    RollbackManifest.objects.filter(pk=stored.pk).update(content={"tampered": 0.30000000000000004})
    body, _ = RollbackManifest.objects.get(pk=stored.pk).file("json")
    assert body == before
