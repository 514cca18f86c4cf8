"""The history of a route target: approvals, revocations and gate verdicts in time order with
the live config's primary metric per class (apps/history/timeline.py), its chart, the page and
the API."""

from __future__ import annotations

import datetime as dt

import pytest

from apps.approvals.services import approval_revoke
from apps.history.timeline import Step, chart, live_configs
from tests.api.test_api import client_for
from tests.experiments.factories import UserFactory
from tests.history.factories import analysed_experiment, approve, gated

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def step(minute: int, kind: str, approval: int | None, **metrics: float) -> Step:
    return Step(
        at=T0 + dt.timedelta(minutes=minute),
        kind=kind,
        experiment_id=approval or 9,
        experiment_name="x",
        cell="C1",
        who="ada",
        text="",
        approval_id=approval,
        metrics=metrics,
    )


def test_a_revocation_makes_the_approval_before_it_live_again_and_a_gate_changes_nothing() -> None:
    events = live_configs(
        [
            step(0, "approval", 1, short=100.0),
            step(1, "approval", 2, short=140.0),  # the regression: a step up
            step(2, "gate", None, short=141.0),
            step(3, "revocation", 2),
        ]
    )
    assert [e.live.get("short") for e in events] == [100.0, 140.0, 140.0, 100.0]
    assert events[3].live_from == "#1 C1 approved by ada"
    fig = chart(events, "route target chat")
    line = fig["data"][0]
    assert line["line"]["shape"] == "hv" and line["y"] == [100.0, 140.0, 140.0, 100.0]
    assert line["marker"]["symbol"] == ["circle", "circle", "square", "triangle-down"]
    assert [t["name"] for t in fig["data"]] == [
        "short: live config",
        "short: live config as the gate measured it",
    ]
    assert fig["data"][1]["y"] == [141.0]


@pytest.mark.django_db
def test_the_page_and_the_api_show_two_approvals_a_gate_and_a_revocation_in_order(client, viewer) -> None:  # type: ignore[no-untyped-def]
    ada = UserFactory(username="ada", roles=["approver"])
    first = approve(analysed_experiment("first", seed=1), route="svc/chat", approver=ada)
    second = approve(analysed_experiment("second", seed=2), route="svc/chat", approver=ada)
    gate = gated(analysed_experiment("gate", seed=3), route="svc/chat")
    approve(analysed_experiment("elsewhere", seed=4), route="svc/batch", approver=ada)
    approval_revoke(experiment=second, actor=ada, reason="p99 regressed in production")

    api = client_for(viewer)
    events = api.get("/api/v1/history?route=svc/chat").json()["events"]
    assert [(e["kind"], e["experiment"]) for e in events] == [
        ("approval", first.pk),
        ("approval", second.pk),
        ("gate", gate.pk),
        ("revocation", second.pk),
    ]
    assert set(events[0]["live"]) == {"short", "long"}
    assert events[3]["live"] == events[0]["live"]  # the first approval is live again
    assert events[2]["text"] in ("pass", "regression", "inconclusive") and events[2]["candidate_metrics"]
    assert api.get("/api/v1/history").status_code == 400

    client.force_login(viewer)
    page = client.get("/history/?route=svc/chat")
    html = page.content.decode()
    assert 'data-chart="route-history"' in html and html.count('class="event-') == 4
    assert "svc/batch" in html  # offered in the chooser
    by_revision = client.get("/history/?deployment=rel-1").context["events"]
    assert len(by_revision) == 5  # every approval and gate here ran against rel-1
