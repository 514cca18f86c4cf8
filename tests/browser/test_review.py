"""An approver's minute: the decision and its reasons on the first screen, a finding read as a
table, and the review bundle downloaded and opened offline with its charts drawn."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from tests.browser.conftest import artifacts_dir, login, shot
from tests.experiments.factories import UserFactory, make_experiment
from tests.ui.factories import analysed

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FINDING_COLUMNS = [
    "cell",
    "class",
    "metric",
    "B0",
    "candidate",
    "change and interval",
    "threshold",
    "why it matters",
]


def test_an_approver_reads_the_decision_and_takes_the_bundle_offline(
    new_page, browser, roles, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    author = UserFactory(username="erin", roles=["experimenter"])
    UserFactory(username="ada", roles=["approver"])
    experiment = analysed(make_experiment(owner=author, name="review-minute"))

    ada = new_page()  # 1360 x 900
    login(ada, "ada")
    ada.goto(f"/experiments/{experiment.pk}/results/")

    # The decision, its reasons and the per-class chart are on the first screen, unscrolled.
    assert ada.evaluate("window.scrollY") == 0
    for selector in ("#decision h2", "#decision-reasons", "#decision-chart svg"):
        box = ada.locator(selector).bounding_box()
        assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 900, (selector, box)
    assert experiment.decision.outcome in ada.inner_text("#decision h2")
    reasons = ada.locator("#decision-reasons li").all_inner_texts()
    assert 1 <= len(reasons) <= 2 and all(r.strip() for r in reasons)
    # Evidence waits collapsed below, and plotly.js with it.
    assert ada.evaluate("typeof Plotly") == "undefined"
    assert not ada.locator("#by-cell").evaluate("d => d.open")

    # A finding is a table with named columns, never a repr of its evidence.
    finding = ada.locator("table.finding").first
    assert finding.locator("thead th").all_inner_texts() == FINDING_COLUMNS
    assert finding.locator("tbody tr").count() >= 1
    text = ada.inner_text("#findings")
    assert "ci=" not in text and "diff_over_threshold" not in text
    # The "not enough requests" notes are one table, one row per point and class.
    assert ada.locator("#thin-table tbody tr").count() == len(experiment.decision.report["classes"])
    shot(ada, "r1-results-top")

    # A link to an anchor opens its part of the evidence.
    ada.goto(f"/experiments/{experiment.pk}/results/#goodput")
    ada.wait_for_selector("div[data-chart='heat-goodput'] .main-svg")

    # The review bundle: downloaded from the page, its digest the one audited.
    ada.goto(f"/experiments/{experiment.pk}/results/")
    with ada.expect_download() as info:
        ada.click("#bundle-link")
    path = Path(info.value.path())
    body = path.read_bytes()
    event = AuditEvent.objects.get(action="review_bundle.downloaded")
    assert event.detail["sha256"] == hashlib.sha256(body).hexdigest()
    saved = tmp_path / info.value.suggested_filename
    saved.write_bytes(body)

    # Opened with the network off: nothing is fetched, and its charts are drawn.
    offline = browser.new_context(viewport={"width": 1360, "height": 900}, offline=True)
    fetched: list[str] = []
    offline.route("http*://**/*", lambda route: (fetched.append(route.request.url), route.abort()))
    try:
        page: Any = offline.new_page()
        page.goto(saved.as_uri())
        assert experiment.decision.outcome in page.inner_text("#decision")
        images = page.locator("#charts img")
        assert images.count() == 2
        for i in range(images.count()):
            assert images.nth(i).is_visible()
            assert images.nth(i).evaluate("img => img.complete && img.naturalWidth > 0")
        assert page.locator("#runs tbody tr").count() == experiment.runs.count()
        page.screenshot(path=str(artifacts_dir() / "r2-bundle-offline.png"))
        assert fetched == []
    finally:
        offline.close()
