"""Across experiments in the browser (#37 item 3): a route target's history chart with two
approvals and a gate verdict, two experiments compared, and a refusal to compare experiments
replayed on different traces. The data is built through the ORM (tests/history/factories.py)."""

from __future__ import annotations

import pytest

from tests.browser.conftest import login, shot
from tests.experiments.factories import UserFactory
from tests.history.factories import analysed_experiment, approve, gated, on_other_traces

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_route_history_chart_and_two_experiments_compared_or_refused(new_page, roles) -> None:  # type: ignore[no-untyped-def]
    ada = UserFactory(username="ada", roles=["approver"])
    UserFactory(username="vera", roles=["viewer"])
    first = approve(analysed_experiment("first", seed=1), route="svc/chat", approver=ada)
    second = approve(analysed_experiment("second", seed=2), route="svc/chat", approver=ada)
    gated(analysed_experiment("gate", seed=3), route="svc/chat")
    elsewhere = on_other_traces(analysed_experiment("elsewhere", seed=4))

    page = new_page()
    login(page, "vera")
    page.click("nav >> text=History")
    page.fill("input[name=route]", "svc/chat")
    page.click("#history-form button[type=submit]")
    chart = page.locator('div[data-chart="route-history"]')
    chart.locator(".main-svg").first.wait_for()  # plotly drew it (served from here, no network)
    assert (
        chart.locator(".scatterlayer .trace").count() >= 2
    )  # a step line per class, and the gate's candidate
    assert page.locator("tr.event-approval").count() == 2 and page.locator("tr.event-gate").count() == 1
    shot(page, "history-route")

    page.click("nav >> text=Compare")
    page.fill("input[name=a]", str(first.pk))
    page.fill("input[name=b]", str(elsewhere.pk))
    page.fill("input[name=a_cell]", "B0")
    page.fill("input[name=b_cell]", "B0")
    page.click("#compare-form button[type=submit]")
    refusal = page.locator("#compare-refusal")
    assert "different traces" in refusal.inner_text()
    assert page.locator("#compare-table").count() == 0

    page.fill("input[name=b]", str(second.pk))
    page.click("#compare-form button[type=submit]")
    table = page.locator("#compare-table")
    table.wait_for()
    assert "ttft_p99_ms" in table.inner_text() and page.locator("#compare-refusal").count() == 0
    shot(page, "history-compare")
