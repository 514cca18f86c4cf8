"""A gate experiment's verdict is audited (``gate.verdict``) when it is analysed, naming the
route its B0 manifest guards; any other experiment's analysis records none."""

from __future__ import annotations

import pytest

from apps.audit.models import AuditEvent
from apps.audit.services import audit_record
from apps.experiments.models import Experiment
from tests.experiments.factories import make_experiment

pytestmark = pytest.mark.django_db


def test_it_records_the_verdict_of_a_gate_and_of_nothing_else() -> None:
    gate, plain = make_experiment(name="gate"), make_experiment(name="plain")
    audit_record(
        action="gate.created",
        experiment=gate,
        detail={
            "baseline_manifest_sha256": "ab" * 32,
            "route_target": "chat-pool",
            "deployment_revision": "r7",
        },
    )
    for e in (gate, plain):
        Experiment.objects.filter(pk=e.pk).update(status=Experiment.Status.ANALYSED)
        audit_record(action="experiment.analysed", experiment=e)
    verdicts = AuditEvent.objects.filter(action="gate.verdict")
    assert [v.experiment_id for v in verdicts] == [gate.pk]
    row = verdicts.get()
    # No decision was stored: the gate cannot say pass.
    assert row.target == "chat-pool" and row.detail["verdict"] == "inconclusive"
    assert row.detail["route_target"] == "chat-pool" and row.detail["deployment_revision"] == "r7"


def test_a_gate_names_the_route_and_revision_its_b0_manifest_guards() -> None:
    from apps.approvals.models import RollbackManifest
    from apps.gate.services import _guards
    from tests.history.factories import analysed_experiment, approve

    approved = approve(analysed_experiment("live"), route="svc/chat", revision="helm-41")
    manifest = RollbackManifest.objects.get(experiment=approved)
    text = manifest.file("yaml")[0].decode()
    assert _guards(text) == {
        "baseline_manifest_sha256": manifest.sha256,
        "baseline_experiment": approved.pk,
        "route_target": "svc/chat",
        "deployment_revision": "helm-41",
    }
    assert _guards(None)["route_target"] == ""
