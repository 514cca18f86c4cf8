"""The one writer of ``Experiment.status``: every status change goes through
:func:`experiment_transition`, which checks it against ``Experiment.TRANSITIONS`` and writes the
change and its audit event together (tests/lifecycle/test_status_writer.py fails on a status
written anywhere else)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.audit.services import audit_record
from apps.experiments.models import Experiment


class IllegalTransition(ValueError):
    """A status change ``Experiment.TRANSITIONS`` does not list: a bug in the caller, or a race it
    did not expect. Nothing was written."""

    def __init__(self, experiment_pk: int, before: str, to: str) -> None:
        allowed = ", ".join(sorted(Experiment.TRANSITIONS.get(before, ()))) or "none"
        super().__init__(
            f"experiment {experiment_pk} cannot go from {before} to {to} (from {before}: {allowed})"
        )
        self.before = before
        self.to = to


def experiment_transition(
    experiment: Experiment,
    to: str,
    *,
    reason: str | None,
    actor: Any,
    action: str,
    detail: Mapping[str, Any] | None = None,
    target: str = "",
    expect: Collection[str] | None = None,
) -> bool:
    """Move ``experiment`` to status ``to`` and record it as the audit event ``action``.

    The status is read from the database under the row's lock (the caller's copy may be stale);
    the change, ``status_reason`` (``reason``; None keeps the present one) and the audit event,
    whose detail gets ``from`` and ``to``, are written together or not at all. ``expect`` names
    the statuses the caller acts on: found in another (a cancel or an analysis got there first),
    nothing is written and False is returned. A change the table does not list raises
    IllegalTransition. On success ``experiment`` carries the new status and reason.
    """
    with transaction.atomic():
        rows = Experiment.objects.filter(pk=experiment.pk)
        before = rows.select_for_update().values_list("status", flat=True).get()
        if expect is not None and before not in expect:
            return False
        if to not in Experiment.TRANSITIONS.get(before, ()):
            raise IllegalTransition(experiment.pk, before, to)
        fields: dict[str, Any] = {"status": to, "updated_at": timezone.now()}
        if reason is not None:
            fields["status_reason"] = reason
        rows.update(**fields)
        for name, value in fields.items():
            setattr(experiment, name, value)
        audit_record(
            action=action,
            actor=actor,
            experiment=experiment,
            target=target,
            detail={**(detail or {}), "from": before, "to": to},
        )
    return True
