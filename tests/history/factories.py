"""Experiments across time for the history tests: analysed (a real analysis of seeded records),
approved for a route target, gated, or with their runs on other traces."""

from __future__ import annotations

from typing import Any

from apps.analysis.models import Decision
from apps.approvals.services import experiment_approve
from apps.audit.services import audit_record
from apps.experiments.models import Experiment
from tests.experiments.factories import UserFactory, make_experiment
from tests.ui.factories import analysed


def analysed_experiment(name: str, *, owner: Any = None, seed: int = 1) -> Experiment:
    owner = owner or UserFactory(username="erin", roles=["experimenter"])
    return analysed(make_experiment(owner=owner, name=name), seed=seed)


def approve(
    experiment: Experiment, *, route: str, approver: Any = None, revision: str = "rel-1"
) -> Experiment:
    """Approve C1 for ``route`` (proposed as a retune would; the statistics are not the subject)."""
    Decision.objects.filter(experiment=experiment).update(outcome="retune", chosen_cell="C1")
    experiment_approve(
        experiment=experiment,
        approver=approver or UserFactory(username="ada", roles=["approver"]),
        chosen_cell="C1",
        reason=f"{experiment.name} is faster",
        deployment_revision=revision,
        route_target=route,
        recovery_override="not rehearsed in this test",
        scenarios_override="not run in this test",
    )
    experiment.refresh_from_db()
    return experiment


def gated(experiment: Experiment, *, route: str, revision: str = "rel-1") -> Experiment:
    """Mark the analysed experiment a gate on ``route`` and announce its analysis: the gate's
    receiver audits its verdict (``gate.verdict``)."""
    audit_record(
        action="gate.created",
        experiment=experiment,
        detail={
            "baseline_manifest_sha256": "ab" * 32,
            "route_target": route,
            "deployment_revision": revision,
        },
    )
    audit_record(action="experiment.analysed", experiment=experiment)
    return experiment


def on_other_traces(experiment: Experiment) -> Experiment:
    """As if its runs had replayed other traces: the stored report's run hashes changed."""
    decision = experiment.decision
    for run in decision.report["runs"]:
        run["trace_sha256"] = "ff" * 32
    decision.save(update_fields=["report"])
    return experiment
