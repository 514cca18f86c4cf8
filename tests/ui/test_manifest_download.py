from __future__ import annotations

import json

import pytest
import yaml

from apps.approvals import manifest as mf
from apps.approvals.services import experiment_approve


@pytest.mark.django_db
def test_it_downloads_the_same_manifest_as_yaml_and_json(
    client, viewer, approver, analysed_experiment
) -> None:  # type: ignore[no-untyped-def]
    stored = experiment_approve(
        experiment=analysed_experiment,
        approver=approver,
        chosen_cell=analysed_experiment.decision.chosen_cell,
        reason="ok",
    )
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
