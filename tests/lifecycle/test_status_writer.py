"""One writer of ``Experiment.status`` (#33): apps/lifecycle/transition.py, which checks every change
against ``Experiment.TRANSITIONS`` and writes it with its audit event.

The first half reads apps/ and workers/ with ``ast`` and fails on a status written anywhere else;
the second checks the writer itself against the database.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from apps.audit.models import AuditEvent
from apps.experiments.models import Experiment
from apps.lifecycle.transition import IllegalTransition, experiment_transition
from tests.experiments.factories import UserFactory, make_experiment

REPO = Path(__file__).resolve().parents[2]
WRITER = "apps/lifecycle/transition.py"
WRITES = frozenset({"update", "create", "get_or_create", "update_or_create"})


def _mentions_experiment(node: ast.AST) -> bool:
    """An expression naming an experiment (``experiment``, ``run.experiment``, ``Experiment.Status``)."""
    return "experiment" in ast.unparse(node).lower()


def _root(node: ast.AST) -> ast.AST:
    """The start of a chain like ``Experiment.objects.filter(...).update``."""
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _on_experiments(call: ast.Call) -> bool:
    """Whether the call is made on Experiment rows: the model (``Experiment(...)``,
    ``Experiment.objects...``) or a related manager (``user.experiments...``)."""
    root = _root(call.func)
    if isinstance(root, ast.Name) and root.id == "Experiment":
        return True
    chain = call.func
    while isinstance(chain, ast.Attribute | ast.Call | ast.Subscript):
        if isinstance(chain, ast.Attribute) and chain.attr == "experiments":
            return True
        chain = chain.func if isinstance(chain, ast.Call) else chain.value
    return False


def status_writes(source: str) -> list[tuple[int, str]]:
    """(line, code) of every write of an experiment's status in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            for target in targets:
                for leaf in ast.walk(target):
                    if (
                        isinstance(leaf, ast.Attribute)
                        and leaf.attr == "status"
                        and (
                            _mentions_experiment(leaf.value)
                            or (value is not None and _mentions_experiment(value))
                        )
                    ):
                        found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            status_kw = [k for k in node.keywords if k.arg == "status"]
            if status_kw and (
                (name in WRITES or name == "Experiment")
                and _on_experiments(node)
                or name in WRITES
                and any("Experiment.Status" in ast.unparse(k.value) for k in status_kw)
            ):
                found.append((node.lineno, ast.unparse(node)))
            elif (
                name == "setattr"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value == "status"
                and _mentions_experiment(node.args[0])
            ):
                found.append((node.lineno, ast.unparse(node)))
            elif name == "bulk_update" and _on_experiments(node) and "'status'" in ast.unparse(node):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and key.value == "status"
                    and "Experiment.Status" in ast.unparse(value)
                ):
                    found.append((node.lineno, ast.unparse(node)))
    return found


@pytest.mark.parametrize(
    "code",
    [
        "experiment.status = Experiment.Status.RUNNING",
        "locked.status = Experiment.Status.APPROVED",
        "run.experiment.status = 'cancelled'",
        "Experiment.objects.filter(pk=1).update(status='planned', updated_at=now)",
        "Experiment.objects.filter(pk=1).exclude(status__in=['approved']).update(status=s)",
        "Experiment.objects.create(name='x', status=Experiment.Status.DRAFT)",
        "Experiment(name='x', status='draft')",
        "user.experiments.update(status='cancelled')",
        "rows.update(status=Experiment.Status.CANCELLED)",
        "fields = {'status': Experiment.Status.PLANNED}",
        "setattr(experiment, 'status', 'analysed')",
        "Experiment.objects.bulk_update(rows, ['status'])",
    ],
)
def test_the_reader_finds_a_status_written(code: str) -> None:
    assert status_writes(code), code


@pytest.mark.parametrize(
    "code",
    [
        "run.status = Run.Status.FAILED",
        "self.status = status",
        "experiment.runs.filter(status='queued').update(status=Run.Status.CANCELLED)",
        "Experiment.objects.filter(status=Experiment.Status.RUNNING).update(updated_at=now)",
        "Experiment.objects.filter(pk=1, status=Experiment.Status.RUNNING).exists()",
        "Run.objects.filter(experiment=e).update(status=Run.Status.QUEUED)",
        "detail = {'from': experiment.status, 'to': Experiment.Status.RUNNING}",
        "if experiment.status != Experiment.Status.RUNNING: pass",
    ],
)
def test_the_reader_lets_reads_and_run_writes_through(code: str) -> None:
    assert not status_writes(code), code


def test_experiment_status_is_written_in_one_module() -> None:
    elsewhere = []
    for folder in ("apps", "workers"):
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative == WRITER:
                continue
            for line, code in status_writes(path.read_text()):
                elsewhere.append(f"{relative}:{line}: {code}")
    assert not elsewhere, (
        "Experiment.status written outside "
        + WRITER
        + " (use experiment_transition):\n"
        + "\n".join(elsewhere)
    )


# -- the writer ---------------------------------------------------------------------------------


def test_the_table_names_every_status_and_leads_only_to_statuses() -> None:
    statuses = set(Experiment.Status.values)
    assert set(Experiment.TRANSITIONS) == statuses
    for before, targets in Experiment.TRANSITIONS.items():
        assert targets <= statuses, before
        assert Experiment.Status.DRAFT not in targets  # an experiment is created a draft, never made one
    assert not Experiment.TRANSITIONS["rejected"] and not Experiment.TRANSITIONS["revoked"]
    assert Experiment.TRANSITIONS["approved"] == {"revoked"}


def test_results_import_analyses_from_every_undecided_status_only() -> None:
    assert Experiment.ANALYSED_BY_IMPORT == set(Experiment.Status.values) - Experiment.DECIDED
    for before in Experiment.ANALYSED_BY_IMPORT:
        assert "analysed" in Experiment.TRANSITIONS[before], before
    assert not any("analysed" in Experiment.TRANSITIONS[s] for s in Experiment.DECIDED)


# (from, to) of every path the code takes, by the step that takes it.
PATHS = [
    ("draft", "planned"),  # experiment_plan
    ("planned", "planned"),  # experiment_plan, replacing a plan not started
    ("planned", "running"),  # experiment_start
    ("cancelled", "running"),  # experiment_start after a cancel
    ("running", "planned"),  # the freeze or the probe failed; the reconciler found the freeze lost
    ("running", "cancelled"),  # experiment_cancel; the reconciler, after repeated failed analyses
    ("running", "analysed"),  # every run finished and the analysis ran
    ("running", "running"),  # the analysis queues the proposed cell's rollback rehearsal
    ("analysed", "running"),  # a rehearsal started from the results page
    ("analysed", "approved"),
    ("analysed", "rejected"),
    ("approved", "revoked"),
    ("planned", "analysed"),  # results_import
    ("analysed", "analysed"),  # results_import again
]
ILLEGAL = [
    ("planned", "approved"),
    ("running", "approved"),
    ("approved", "running"),
    ("approved", "analysed"),
    ("rejected", "planned"),
    ("revoked", "approved"),
    ("analysed", "planned"),
    ("planned", "draft"),
]


def _at(status: str, reason: str = "before") -> Experiment:
    experiment = make_experiment()
    Experiment.objects.filter(pk=experiment.pk).update(status=status, status_reason=reason)
    experiment.refresh_from_db()
    return experiment  # type: ignore[no-any-return]


@pytest.mark.django_db
@pytest.mark.parametrize(("before", "to"), PATHS)
def test_a_listed_transition_is_written_with_its_audit_event(before: str, to: str) -> None:
    actor = UserFactory(username="ann", roles=["experimenter"])
    experiment = _at(before)
    events = AuditEvent.objects.count()
    assert experiment_transition(
        experiment, to, reason="why", actor=actor, action="experiment.moved", detail={"runs": 3}, target="C1"
    )
    stored = Experiment.objects.get(pk=experiment.pk)
    assert (stored.status, stored.status_reason) == (to, "why")
    assert (experiment.status, experiment.status_reason) == (to, "why")
    assert AuditEvent.objects.count() == events + 1
    event = AuditEvent.objects.latest("id")
    assert (event.action, event.experiment_id, event.actor, event.target) == (
        "experiment.moved",
        experiment.pk,
        actor,
        "C1",
    )
    assert event.detail == {"runs": 3, "from": before, "to": to}


@pytest.mark.django_db
@pytest.mark.parametrize(("before", "to"), ILLEGAL)
def test_an_unlisted_transition_raises_and_writes_nothing(before: str, to: str) -> None:
    experiment = _at(before)
    events = AuditEvent.objects.count()
    with pytest.raises(IllegalTransition) as raised:
        experiment_transition(experiment, to, reason="why", actor=None, action="experiment.moved")
    assert isinstance(raised.value, ValueError)  # callers that answer ValueError (409, a message) catch it
    assert f"from {before} to {to}" in str(raised.value)
    stored = Experiment.objects.get(pk=experiment.pk)
    assert (stored.status, stored.status_reason) == (before, "before")
    assert AuditEvent.objects.count() == events


@pytest.mark.django_db
def test_the_status_is_read_from_the_database_not_the_callers_copy() -> None:
    experiment = _at("analysed")
    experiment.status = "planned"  # a stale copy: the row says analysed
    assert experiment_transition(
        experiment, "approved", reason="ok", actor=None, action="experiment.approved"
    )
    assert AuditEvent.objects.latest("id").detail == {"from": "analysed", "to": "approved"}
    with pytest.raises(IllegalTransition):  # planned -> running would pass on the copy
        experiment_transition(_at("approved"), "running", reason="", actor=None, action="x")


@pytest.mark.django_db
def test_a_status_the_caller_does_not_expect_writes_nothing_and_says_so() -> None:
    experiment = _at("cancelled")
    events = AuditEvent.objects.count()
    moved = experiment_transition(
        experiment, "analysed", reason="", actor=None, action="experiment.analysed", expect={"running"}
    )
    assert moved is False
    assert Experiment.objects.get(pk=experiment.pk).status == "cancelled"
    assert AuditEvent.objects.count() == events


@pytest.mark.django_db
def test_no_reason_keeps_the_status_reason() -> None:
    experiment = _at("draft", reason="kept")
    experiment_transition(experiment, "planned", reason=None, actor=None, action="experiment.planned")
    assert Experiment.objects.get(pk=experiment.pk).status_reason == "kept"
