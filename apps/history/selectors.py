"""Reads across experiments: the filtered list, one side of a comparison, and the history per
route target (or deployment revision). The pure parts are list_filters.py, side_by_side.py
and timeline.py; this module only reads rows into their inputs."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from apps.approvals.models import Approval, Revocation, RollbackManifest
from apps.audit.models import AuditEvent
from apps.experiments.models import Experiment
from apps.history import side_by_side, timeline
from apps.history.list_filters import ListFilters
from apps.lifecycle.selectors import experiment_list_rows

GATE_CREATED = "gate.created"  # apps/gate/services.py writes it (the gate sits beside, not below)
GATE_VERDICT = "gate.verdict"
ROUTE = "content__baseline__deployment__route_target"
REVISION = "content__baseline__deployment__revision"


def _day_start(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time.min, tzinfo=dt.UTC)


def experiments_filtered(filters: ListFilters) -> QuerySet[Experiment]:
    """The list's rows (newest first, annotated as the list shows them) that pass every filter.

    Route target: an approval's manifest names it, or the manifest a gate was given as B0.
    Subqueries, not joins: a join would multiply the rows the run counts are made of."""
    rows = experiment_list_rows(status=filters.status)
    if filters.owner:
        rows = rows.filter(owner__username=filters.owner)
    if filters.q:
        rows = rows.filter(Q(name__icontains=filters.q) | Q(description__icontains=filters.q))
    if filters.since:
        rows = rows.filter(created_at__gte=_day_start(filters.since))
    if filters.until:
        rows = rows.filter(created_at__lt=_day_start(filters.until + dt.timedelta(days=1)))
    if filters.route:
        approved = RollbackManifest.objects.filter(
            experiment=OuterRef("pk"), **{f"{ROUTE}__icontains": filters.route}
        )
        gated = AuditEvent.objects.filter(
            experiment=OuterRef("pk"), action=GATE_CREATED, detail__route_target__icontains=filters.route
        )
        rows = rows.filter(Exists(approved) | Exists(gated))
    return rows


# -- one side of a comparison -------------------------------------------------------------------


def default_cell(experiment: Experiment) -> str:
    """The cell a comparison takes when none is named: the decision's choice, else B0."""
    decision = getattr(experiment, "decision", None) if hasattr(experiment, "decision") else None
    if decision is not None and decision.chosen_cell:
        return str(decision.chosen_cell)
    b0 = experiment.cells.filter(role="baseline").values_list("cell_id", flat=True).first()
    return str(b0 or "")


def side_for(experiment: Experiment, cell: str) -> side_by_side.Side:
    """What a comparison needs of one experiment's cell: from its stored report and its runs.
    Raises side_by_side.NotComparable when there is nothing to compare (no report, no such cell)."""
    decision = getattr(experiment, "decision", None) if hasattr(experiment, "decision") else None
    report = decision.report if decision is not None else None
    if not report:
        raise side_by_side.NotComparable([f"experiment {experiment.pk} has no analysis to compare yet"])
    cells = {c.cell_id: c for c in experiment.cells.all()}
    if cell not in cells:
        raise side_by_side.NotComparable(
            [f"experiment {experiment.pk} has no cell {cell[:40]!r} (its cells: {', '.join(cells)})"]
        )
    runs = [
        r
        for r in report.get("runs") or []
        if r.get("cell_id", r.get("cell")) == cell and r.get("status") == "done"
    ]
    return side_by_side.side_from_report(
        experiment_id=experiment.pk,
        name=experiment.name,
        cell=cell,
        report=report,
        runs=runs,
        model_revision=cells[cell].model_revision or experiment.model_revision,
        tokenizer_revision=experiment.tokenizer_revision,
        hardware_id=experiment.hardware_id,
    )


# -- the history per route target --------------------------------------------------------------


def route_targets() -> list[str]:
    """Every route target an approval named, for the history page's chooser."""
    names = RollbackManifest.objects.values_list(ROUTE, flat=True)
    gates = AuditEvent.objects.filter(action=GATE_VERDICT).values_list("detail__route_target", flat=True)
    return sorted({str(n) for n in [*names, *gates] if n})


def _primary(experiment: Experiment | None, cell: str) -> dict[str, float]:
    if experiment is None:
        return {}
    decision = getattr(experiment, "decision", None) if hasattr(experiment, "decision") else None
    return timeline.primary_by_class(decision.report if decision is not None else None, cell)


def route_history(*, route_target: str = "", deployment: str = "") -> list[timeline.Event]:
    """Every approval, revocation and gate verdict of the route target (or the deployment
    revision), oldest first, each with each class's primary metric of the config live after it."""
    key, value = (ROUTE, route_target) if route_target else (REVISION, deployment)
    manifests = list(
        RollbackManifest.objects.filter(**{key: value})
        .select_related("experiment__decision", "approval__approver")
        .order_by("created_at", "pk")
    )
    approvals: list[tuple[Approval, RollbackManifest]] = [(m.approval, m) for m in manifests]
    revocations = {
        r.approval_id: r
        for r in Revocation.objects.filter(approval__in=[a for a, _ in approvals]).select_related(
            "revoked_by", "approval__experiment"
        )
    }
    detail_key = "detail__route_target" if route_target else "detail__deployment_revision"
    verdicts = list(
        AuditEvent.objects.filter(action=GATE_VERDICT, **{detail_key: value})
        .select_related("experiment__decision")
        .order_by("at", "pk")
    )
    raw: list[tuple[dt.datetime, str, Any]] = [(a.created_at, "approval", (a, m)) for a, m in approvals]
    raw += [(r.created_at, "revocation", r) for r in revocations.values()]
    raw += [(v.at, "gate", v) for v in verdicts]
    raw.sort(key=lambda item: item[0])
    return timeline.live_configs(_steps(raw))


def _steps(raw: Iterable[tuple[dt.datetime, str, Any]]) -> list[timeline.Step]:
    steps: list[timeline.Step] = []
    for at, kind, row in raw:
        if kind == "approval":
            approval, manifest = row
            steps.append(
                timeline.Step(
                    at=at,
                    kind="approval",
                    experiment_id=manifest.experiment_id,
                    experiment_name=manifest.experiment.name,
                    cell=approval.chosen_cell,
                    who=approval.approver.get_username(),
                    text=approval.reason,
                    approval_id=approval.pk,
                    metrics=_primary(manifest.experiment, approval.chosen_cell),
                )
            )
        elif kind == "revocation":
            steps.append(
                timeline.Step(
                    at=at,
                    kind="revocation",
                    experiment_id=row.approval.experiment_id,
                    experiment_name=row.approval.experiment.name,
                    cell=row.approval.chosen_cell,
                    who=row.revoked_by.get_username(),
                    text=row.reason,
                    approval_id=row.approval_id,
                )
            )
        else:
            experiment = row.experiment
            b0 = (
                experiment.cells.filter(role="baseline").values_list("cell_id", flat=True).first()
                if experiment
                else ""
            )
            cand = (
                experiment.cells.filter(role="candidate").values_list("cell_id", flat=True).first()
                if experiment
                else ""
            )
            steps.append(
                timeline.Step(
                    at=at,
                    kind="gate",
                    experiment_id=row.experiment_id or 0,
                    experiment_name=experiment.name if experiment else "",
                    cell=str(cand or ""),
                    who="",
                    text=str((row.detail or {}).get("verdict") or ""),
                    metrics=_primary(experiment, str(b0 or "")),
                    candidate_metrics=_primary(experiment, str(cand or "")),
                )
            )
    return steps
