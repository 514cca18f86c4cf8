"""Which audit events need a person (apps/notifications/events.py): pure, no database."""

from __future__ import annotations

from apps.notifications import events
from apps.notifications.events import Facts, wanted


def kinds(action: str, detail: dict | None = None, **facts: str) -> list[str]:  # type: ignore[type-arg]
    return [w.kind for w in wanted(action, detail or {}, Facts(**facts))]


def test_it_tells_the_author_an_experiment_is_analysed_and_the_approvers_a_proposal_waits() -> None:
    assert kinds("experiment.analysed", name="x", outcome="retain") == [events.ANALYSED]
    found = wanted("experiment.analysed", {}, Facts(name="x", outcome="retune", chosen_cell="C1"))
    assert [w.kind for w in found] == [events.ANALYSED, events.APPROVAL_WAITING]
    assert found[1].audience == {events.APPROVERS} and "C1" in found[1].summary


def test_it_tells_the_author_a_rehearsal_failed_whichever_way_it_failed() -> None:
    assert events.REHEARSAL_FAILED in kinds("experiment.analysed", recovery_status="fail")
    assert events.REHEARSAL_FAILED not in kinds("experiment.analysed", recovery_status="pass")
    assert kinds("rehearsal.not_started", {"error": "no host"}) == [events.REHEARSAL_FAILED]


def test_it_tells_people_of_a_gate_that_did_not_pass_and_of_no_other_event() -> None:
    assert kinds("gate.verdict", {"verdict": "regression"}) == [events.GATE_FAILED]
    assert kinds("gate.verdict", {"verdict": "inconclusive"}) == [events.GATE_FAILED]
    assert kinds("gate.verdict", {"verdict": "pass"}) == []
    assert kinds("experiment.created") == [] and kinds("token.created") == []
