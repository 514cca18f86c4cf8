"""Every state change of an experiment is in the audit log with its actor and before/after."""

from __future__ import annotations

import pytest

from apps.approvals.services import approval_revoke, experiment_approve
from apps.audit.models import AuditEvent
from apps.lifecycle.completion import experiment_mark_analysed
from apps.lifecycle.running import experiment_cancel, experiment_start
from tests.experiments.factories import UserFactory, make_experiment
from tests.runs.factories import make_host

pytestmark = pytest.mark.django_db


def transitions(experiment) -> list[tuple[str, str | None, str, str | None]]:  # type: ignore[no-untyped-def]
    return [
        (e.action, e.detail.get("from"), e.detail.get("to"), e.actor.username if e.actor else None)
        for e in AuditEvent.objects.filter(experiment=experiment).order_by("at", "id")
        if "to" in e.detail
    ]


def test_the_life_of_an_experiment_is_audited_with_before_and_after(
    django_capture_on_commit_callbacks,
) -> None:  # type: ignore[no-untyped-def]
    author = UserFactory(username="ann", roles=["experimenter"])
    approver = UserFactory(username="bob", roles=["approver"])
    oncall = UserFactory(username="cid", roles=["approver"])
    make_host()
    experiment = make_experiment(owner=author)
    experiment_start(experiment=experiment, actor=author)  # the freeze task is sent on commit: not here
    experiment_cancel(experiment=experiment, actor=author)
    experiment.refresh_from_db()
    experiment_start(experiment=experiment, actor=author)
    from apps.analysis.services import experiment_analyse
    from tests.ui.factories import finish_runs  # the runs as a worker would leave them

    finish_runs(experiment)
    experiment_analyse(experiment_id=experiment.pk)
    experiment_mark_analysed(experiment_id=experiment.pk)
    experiment_mark_analysed(experiment_id=experiment.pk)  # nothing changes: nothing recorded
    experiment.refresh_from_db()
    experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=experiment,
        approver=approver,
        chosen_cell="B0",
        reason="keep",
    )
    approval_revoke(experiment=experiment, actor=oncall, reason="incident")
    assert transitions(experiment) == [
        ("experiment.created", None, "draft", "ann"),
        ("experiment.planned", "draft", "planned", "ann"),
        ("experiment.started", "planned", "running", "ann"),
        ("experiment.cancelled", "running", "cancelled", "ann"),
        ("experiment.started", "cancelled", "running", "ann"),
        ("experiment.analysed", "running", "analysed", None),
        ("experiment.approved", "analysed", "approved", "bob"),
        ("experiment.revoked", "approved", "revoked", "cid"),
    ]
