"""The experiment list's filters (in the URL) and pages, on the page and the API."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from apps.experiments.models import Experiment
from apps.history.list_filters import FilterError, ListFilters, parse_list_filters, parse_page
from tests.api.test_api import client_for
from tests.experiments.factories import UserFactory, make_experiment


def test_it_reads_the_filters_from_the_query_and_names_a_bad_one() -> None:
    f = parse_list_filters({"status": "approved", "owner": "erin", "since": "2026-01-02", "q": " batch "})
    assert f == ListFilters(status="approved", owner="erin", q="batch", since=dt.date(2026, 1, 2))
    assert f.query() == {"status": "approved", "owner": "erin", "q": "batch", "since": "2026-01-02"}
    for query, field in (
        ({"status": "done"}, "status"),
        ({"since": "yesterday"}, "since"),
        ({"since": "2026-02-01", "until": "2026-01-01"}, "until"),
        ({"q": "x" * 201}, "q"),
    ):
        with pytest.raises(FilterError) as err:
            parse_list_filters(query)
        assert err.value.field == field
    assert parse_page("") == 1 and parse_page("3") == 3
    for bad in ("0", "-1", "x", "9999999"):
        with pytest.raises(FilterError):
            parse_page(bad)


@pytest.mark.django_db
def test_the_page_filters_by_owner_text_and_date_and_keeps_them_in_the_pager(client, viewer) -> None:  # type: ignore[no-untyped-def]
    erin, oscar = UserFactory(username="erin", roles=["experimenter"]), UserFactory(username="oscar")
    for i in range(27):
        make_experiment(owner=erin, name=f"batching {i}")
    make_experiment(owner=oscar, name="prefix cache", description="a batching idea too")
    old = make_experiment(owner=oscar, name="old one")
    Experiment.objects.filter(pk=old.pk).update(created_at=timezone.now() - dt.timedelta(days=40))
    client.force_login(viewer)

    page = client.get("/?owner=erin&q=batching")
    assert len(page.context["experiments"]) == 25 and page.context["page"].paginator.count == 27
    html = page.content.decode()
    assert "owner=erin&amp;q=batching&amp;page=2" in html and 'value="erin"' in html
    assert len(client.get("/?owner=erin&q=batching&page=2").context["experiments"]) == 2
    assert [e.name for e in client.get("/?owner=oscar&q=BATCHING").context["experiments"]] == ["prefix cache"]
    since = (timezone.now() - dt.timedelta(days=10)).date().isoformat()
    names = {e.name for e in client.get(f"/?owner=oscar&since={since}").context["experiments"]}
    assert names == {"prefix cache"}
    until = (timezone.now() - dt.timedelta(days=30)).date().isoformat()
    assert [e.name for e in client.get(f"/?until={until}").context["experiments"]] == ["old one"]
    bad = client.get("/?since=soon")
    assert bad.status_code == 400 and b"since" in bad.content


@pytest.mark.django_db
def test_the_route_filter_finds_approvals_and_gates_on_that_route(client, viewer) -> None:  # type: ignore[no-untyped-def]
    from tests.history.factories import analysed_experiment, approve, gated

    approved = approve(analysed_experiment("approved one"), route="svc/chat")
    gate = gated(analysed_experiment("gate one", seed=2), route="svc/chat")
    approve(analysed_experiment("elsewhere", seed=3), route="svc/batch")
    client.force_login(viewer)
    rows = client.get("/?route=chat").context["experiments"]
    assert {e.pk for e in rows} == {approved.pk, gate.pk}
    assert all(e.runs_total == 2 for e in rows)  # the filter's subqueries leave the counts alone


@pytest.mark.django_db
def test_the_api_list_is_unchanged_without_a_page_and_paged_with_one(viewer) -> None:  # type: ignore[no-untyped-def]
    erin = UserFactory(username="erin", roles=["experimenter"])
    for i in range(30):
        make_experiment(owner=erin, name=f"e{i}")
    api = client_for(viewer)
    whole = api.get("/api/v1/experiments").json()
    assert len(whole["experiments"]) == 30 and whole["count"] == 30 and whole["page"] is None
    first = api.get("/api/v1/experiments?owner=erin&page=1").json()
    assert (len(first["experiments"]), first["pages"], first["count"]) == (25, 2, 30)
    assert first["next"].endswith("?owner=erin&page=2")
    assert len(api.get(first["next"]).json()["experiments"]) == 5
    bad = api.get("/api/v1/experiments?status=done")
    assert bad.status_code == 400 and "status" in bad.json()
