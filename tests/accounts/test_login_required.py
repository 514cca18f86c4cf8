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
def test_it_creates_the_first_admin_once_with_its_password_in_a_private_file(tmp_path) -> None:
    from django.contrib.auth import get_user_model

    from apps.accounts.roles import APPROVER, EXPERIMENTER, has_role

    secret = tmp_path / "pw"
    out = io.StringIO()
    call_command("ensure_admin", "--password-file", str(secret), stdout=out)
    password = secret.read_text().strip()
    assert str(secret) in out.getvalue() and password not in out.getvalue()
    assert secret.stat().st_mode & 0o777 == 0o600
    admin = get_user_model().objects.get(username="admin")
    assert admin.check_password(password) and admin.is_superuser
    # An administrator, not an approver of everything: four eyes hold for admins too.
    assert has_role(admin, EXPERIMENTER) and not has_role(admin, APPROVER)
    again = io.StringIO()
    call_command("ensure_admin", "--password-file", str(secret), stdout=again)
    assert "exists already" in again.getvalue()
    assert secret.read_text().strip() == password


@pytest.mark.django_db
def test_it_has_the_three_roles() -> None:
    from django.contrib.auth.models import Group

    assert set(Group.objects.values_list("name", flat=True)) >= {"viewer", "experimenter", "approver"}
