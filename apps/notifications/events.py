"""Which audit events need a person, and who: the four kinds a user can subscribe to.

Pure: plain inputs (the audit row's action and detail, and the few facts about its experiment
the caller read), plain outputs. apps/notifications/services.py reads the facts and makes the
rows; the rule lives here so it is tested without a database.

1. ``experiment.analysed`` tells the experiment's author its results are ready (``analysed``).
2. The same event with a proposal (the decision chose a cell) waits for an approver: every
   approver but the author is told (``approval_waiting``; the author may not approve their own).
3. The same event whose check 4 (the rollback rehearsal) failed, or ``rehearsal.not_started``,
   tells the author (``rehearsal_failed``).
4. ``gate.verdict`` other than pass (a regression, or inconclusive) tells the gate's author and
   the approvers (``gate_failed``): the rollout it guards is held.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ANALYSED = "analysed"
APPROVAL_WAITING = "approval_waiting"
GATE_FAILED = "gate_failed"
REHEARSAL_FAILED = "rehearsal_failed"

# Each kind and the words the preferences page and the messages use for it.
KINDS: dict[str, str] = {
    ANALYSED: "an experiment of mine is analysed",
    APPROVAL_WAITING: "an experiment waits for an approver",
    GATE_FAILED: "a gate did not pass (regression or inconclusive)",
    REHEARSAL_FAILED: "a rollback rehearsal of mine failed",
}

AUTHOR = "author"
APPROVERS = "approvers"


@dataclass(frozen=True)
class Wanted:
    """One kind of notification an event makes, and for whom (the author, the approvers)."""

    kind: str
    audience: frozenset[str]
    summary: str


@dataclass(frozen=True)
class Facts:
    """What the caller read about the event's experiment."""

    name: str = ""
    outcome: str = ""  # the decision's outcome, "" without one
    chosen_cell: str = ""  # the proposal (a candidate), "" for none or B0
    recovery_status: str = ""  # check 4's status


def wanted(action: str, detail: Mapping[str, Any], facts: Facts) -> list[Wanted]:
    """The notifications an audit event calls for (none for most events)."""
    out: list[Wanted] = []
    name = facts.name or "an experiment"
    if action == "experiment.analysed":
        outcome = f": {facts.outcome}" if facts.outcome else ""
        out.append(Wanted(ANALYSED, frozenset({AUTHOR}), f"{name} is analysed{outcome}"))
        if facts.chosen_cell:
            out.append(
                Wanted(
                    APPROVAL_WAITING,
                    frozenset({APPROVERS}),
                    f"{name} proposes {facts.chosen_cell} and waits for an approver",
                )
            )
        if facts.recovery_status == "fail":
            out.append(
                Wanted(REHEARSAL_FAILED, frozenset({AUTHOR}), f"{name}: the rollback rehearsal failed")
            )
    elif action == "rehearsal.not_started":
        error = str(detail.get("error") or "")[:200]
        out.append(
            Wanted(
                REHEARSAL_FAILED,
                frozenset({AUTHOR}),
                f"{name}: the rollback rehearsal did not start: {error}",
            )
        )
    elif action == "gate.verdict" and detail.get("verdict") not in (None, "pass", "running"):
        out.append(
            Wanted(
                GATE_FAILED,
                frozenset({AUTHOR, APPROVERS}),
                f"gate {name}: {detail.get('verdict')}",
            )
        )
    return out
