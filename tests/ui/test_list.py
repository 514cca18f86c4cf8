from __future__ import annotations

import pytest

from apps.runs.models import Run
from tests.experiments.factories import make_experiment


@pytest.mark.django_db
def test_it_lists_newest_first_with_progress_and_decision(
    client, viewer, author, analysed_experiment
) -> None:  # type: ignore[no-untyped-def]
    newer = make_experiment(owner=author, name="newer")
    Run.objects.filter(pk=newer.runs.first().pk).update(status="done")
    client.force_login(viewer)
    response = client.get("/")
    rows = list(response.context["experiments"])
    assert [e.name for e in rows] == ["newer", "ui-analysed"]
    assert (rows[0].runs_total, rows[0].runs_finished) == (2, 1)
    html = response.content.decode()
    assert "1 / 2" in html
    assert f"outcome-{analysed_experiment.decision.outcome}" in html
    assert "erin" in html


@pytest.mark.django_db
def test_it_filters_by_status(client, viewer, experiment, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    names = [e.name for e in client.get("/?status=analysed").context["experiments"]]
    assert names == ["ui-analysed"]
    assert [e.name for e in client.get("/?status=planned").context["experiments"]] == ["ui-small"]
    empty = client.get("/?status=approved")
    assert b"No experiment is approved" in empty.content
    assert client.get("/?status=bogus").status_code == 400


@pytest.mark.django_db
def test_it_tells_an_empty_list_what_to_do_next(client, author, viewer) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    assert b"Create one with the form" in client.get("/").content
    client.force_login(viewer)
    page = client.get("/").content
    assert b"An experimenter creates them" in page
    assert b"New experiment" not in page
