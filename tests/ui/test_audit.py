from __future__ import annotations

import pytest

from apps.audit.services import audit_record
from tests.experiments.factories import make_experiment


@pytest.mark.django_db
def test_it_lists_every_event_newest_first_and_filters(client, viewer, author, approver, experiment) -> None:  # type: ignore[no-untyped-def]
    other = make_experiment(owner=author, name="other")
    audit_record(action="experiment.approved", actor=approver, experiment=other, target="C1")
    client.force_login(viewer)
    events = list(client.get("/audit/").context["page"].object_list)
    assert events[0].action == "experiment.approved"
    assert {e.action for e in events} >= {"experiment.created", "experiment.planned"}
    by_actor = client.get("/audit/?actor=ada").context["page"].object_list
    assert [e.action for e in by_actor] == ["experiment.approved"]
    by_action = client.get("/audit/?action=experiment.created").context["page"].object_list
    assert {e.experiment.name for e in by_action} == {"ui-small", "other"}
    by_experiment = client.get(f"/audit/?experiment={experiment.pk}").context["page"].object_list
    assert {e.experiment_id for e in by_experiment} == {experiment.pk}
    assert client.get("/audit/?experiment=abc").status_code == 400
    assert b"No audit events match" in client.get("/audit/?actor=nobody-here").content


@pytest.mark.django_db
def test_it_shows_one_experiments_events_only(client, viewer, author, experiment) -> None:  # type: ignore[no-untyped-def]
    make_experiment(owner=author, name="other")
    client.force_login(viewer)
    events = client.get(f"/experiments/{experiment.pk}/audit/").context["page"].object_list
    assert events and {e.experiment_id for e in events} == {experiment.pk}


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["²", "١٢", "99999999999999999999999", "-1", "1\x00", "9" * 10_000])
def test_it_refuses_an_experiment_filter_that_is_not_an_id(client, viewer, value) -> None:  # type: ignore[no-untyped-def]
    # "²".isdigit() is true and int() of it raises; a 23-digit number overflows the database's bigint.
    client.raise_request_exception = False
    client.force_login(viewer)
    response = client.get("/audit/", {"experiment": value})
    assert response.status_code == 400, (value[:30], response.status_code)
    assert b'<p class="refusal">experiment: ' in response.content  # the field, named
