"""Who may see and do what: readers read, mutations are POST + CSRF, everyone else gets 403/404."""

from __future__ import annotations

import pytest
from django.test import Client


def _pages(experiment) -> list[str]:  # type: ignore[no-untyped-def]
    run = experiment.runs.first()
    return [
        "/",
        f"/experiments/{experiment.pk}/",
        f"/experiments/{experiment.pk}/live/",
        f"/experiments/{experiment.pk}/results/",
        f"/experiments/{experiment.pk}/spec.yaml",
        f"/experiments/{experiment.pk}/audit/",
        f"/runs/{run.run_id}/",
        "/audit/",
    ]


@pytest.mark.django_db
def test_readers_read_every_page(client, viewer, approver, other_experimenter, experiment) -> None:  # type: ignore[no-untyped-def]
    for user in (viewer, approver, other_experimenter):
        client.force_login(user)
        for url in _pages(experiment):
            assert client.get(url).status_code == 200, (user, url)


@pytest.mark.django_db
def test_a_user_without_a_role_sees_nothing(client, nobody, experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(nobody)
    for url in _pages(experiment) + ["/experiments/new/", f"/experiments/{experiment.pk}/manifest.json"]:
        response = client.get(url)
        assert response.status_code == 403, url
        assert experiment.name.encode() not in response.content


@pytest.mark.django_db
def test_anonymous_users_are_sent_to_log_in(client, experiment) -> None:  # type: ignore[no-untyped-def]
    for url in _pages(experiment):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url


@pytest.mark.django_db
def test_mutations_refuse_get(client, author, experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    for url in (f"/experiments/{experiment.pk}/start/", f"/experiments/{experiment.pk}/cancel/"):
        assert client.get(url).status_code == 405
    experiment.refresh_from_db()
    assert experiment.status == "planned"


@pytest.mark.django_db
def test_mutations_need_the_csrf_token(author, approver, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    from tests.ui.forms_data import form_data

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(author)
    assert strict.post("/experiments/new/", form_data(create="1")).status_code == 403
    assert strict.post(f"/experiments/{analysed_experiment.pk}/cancel/").status_code == 403
    strict.force_login(approver)
    response = strict.post(
        f"/experiments/{analysed_experiment.pk}/approve/",
        {
            "verdict": "approve",
            "deployment_revision": "rel-1",
            "route_target": "svc/llm",
            "chosen_cell": "B0",
            "reason": "x",
        },
    )
    assert response.status_code == 403
    analysed_experiment.refresh_from_db()
    assert analysed_experiment.status == "analysed"


@pytest.mark.django_db
def test_missing_things_are_404(client, viewer) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    for url in ("/experiments/999/", "/experiments/999/results/", "/experiments/999/audit/"):
        assert client.get(url).status_code == 404
