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
