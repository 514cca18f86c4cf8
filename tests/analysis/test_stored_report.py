"""The stored report as the results page and the API read it (apps/analysis/stored_report.py):
the same report the decision row holds, and never one the row no longer holds."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.urls import reverse

from apps.analysis import stored_report
from apps.analysis.models import Decision
from tests.api.test_api import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh() -> None:
    stored_report.forget()


def test_it_reads_the_report_the_row_holds_and_each_caller_gets_its_own(analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    row = Decision.objects.get(experiment=analysed_experiment)
    decision = stored_report.decision_of(analysed_experiment.pk)
    first = stored_report.report_of(decision)
    assert first == row.report and first["decision"]["outcome"] == row.outcome
    first["decision"]["outcome"] = "tampered"
    assert stored_report.report_of(stored_report.decision_of(analysed_experiment.pk)) == row.report


def test_a_rewritten_row_is_never_served_from_the_kept_text(analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    """Every way the row can change: a save (a new analysis), and a bare UPDATE that leaves
    updated_at alone, both inside this test's one transaction (xmin alone would not tell)."""
    before = stored_report.report_of(stored_report.decision_of(analysed_experiment.pk))
    row = Decision.objects.get(experiment=analysed_experiment)
    row.report = {**row.report, "marker": 1}
    row.save()
    assert stored_report.report_of(stored_report.decision_of(analysed_experiment.pk))["marker"] == 1
    Decision.objects.filter(pk=row.pk).update(report={**before, "marker": 2})
    assert stored_report.report_of(stored_report.decision_of(analysed_experiment.pk))["marker"] == 2
    if connection.vendor == "postgresql":
        assert len(stored_report._texts) >= 1  # kept, by row version


def test_the_page_and_the_api_show_the_new_report_after_a_rewrite(
    client, analysed_experiment, viewer
) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    page = reverse("experiments:results", args=[analysed_experiment.pk])
    url = f"/api/v1/experiments/{analysed_experiment.pk}/report"
    api = client_for(viewer)
    assert client.get(page).status_code == 200
    first = api.get(url)
    assert first.status_code == 200 and first["Content-Type"] == "application/json"
    row = Decision.objects.get(experiment=analysed_experiment)
    assert json.loads(first.content) == row.report
    Decision.objects.filter(pk=row.pk).update(report={**row.report, "rule": "rewritten"})
    assert json.loads(api.get(url).content)["rule"] == "rewritten"
    Decision.objects.filter(pk=row.pk).update(report={})
    gone = api.get(url)
    assert gone.status_code == 409 and "no report yet" in gone.json()["detail"]
    assert client.get(page).status_code == 200  # the partial results, not a 500
