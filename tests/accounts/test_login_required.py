from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from tests.experiments.factories import UserFactory


@pytest.mark.django_db
def test_it_redirects_anonymous_users_to_the_login_page(client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    login = client.get("/accounts/login/")
    assert login.status_code == 200
    assert b"Log in" in login.content


@pytest.mark.django_db
def test_it_shows_the_experiment_list_after_login(client) -> None:
    user = UserFactory(roles=["viewer"])
    client.force_login(user)
    assert client.get("/").status_code == 200


@pytest.mark.django_db
def test_it_creates_the_first_admin_once_and_prints_its_password() -> None:
    out = io.StringIO()
    call_command("ensure_admin", stdout=out)
    assert "Log in as admin / " in out.getvalue()
    again = io.StringIO()
    call_command("ensure_admin", stdout=again)
    assert "exists already" in again.getvalue()


@pytest.mark.django_db
def test_it_has_the_three_roles() -> None:
    from django.contrib.auth.models import Group

    assert set(Group.objects.values_list("name", flat=True)) >= {"viewer", "experimenter", "approver"}
