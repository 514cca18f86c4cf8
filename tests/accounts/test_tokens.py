"""The API tokens page and service: scopes within the user's roles, a default expiry, never cached."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.models import ApiToken

pytestmark = pytest.mark.django_db


def test_it_marks_the_page_that_shows_a_new_token_no_store(client, author) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    created = client.post("/accounts/tokens/", {"name": "laptop", "scopes": ["read"], "expires_days": "7"})
    assert created.status_code == 200 and 'id="new-token"' in created.content.decode()
    assert "no-store" in created.get("Cache-Control", "")
    assert "no-store" in client.get("/accounts/tokens/").get("Cache-Control", "")


def test_it_gives_every_new_token_the_default_expiry_and_no_longer(client, author, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TAILTUNE_TOKEN_DAYS = 90
    client.force_login(author)
    client.post("/accounts/tokens/", {"name": "ci", "scopes": ["read"]})
    token = ApiToken.objects.get(user=author, name="ci")
    assert token.expires_at is not None
    assert abs(token.expires_at - (timezone.now() + timedelta(days=90))) < timedelta(minutes=1)
    longer = client.post("/accounts/tokens/", {"name": "forever", "scopes": ["read"], "expires_days": "91"})
    assert longer.status_code == 400 and not ApiToken.objects.filter(name="forever").exists()
    assert "90" in longer.content.decode()


def test_it_stores_the_chosen_scopes_and_refuses_scopes_the_roles_do_not_grant(
    client, viewer, author
) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    ok = client.post("/accounts/tokens/", {"name": "ci", "scopes": ["read", "run"], "expires_days": "30"})
    assert ok.status_code == 200
    assert sorted(ApiToken.objects.get(user=author, name="ci").scopes) == ["read", "run"]
    assert re.search(r"<td>read run</td>", ok.content.decode())
    refused = client.post("/accounts/tokens/", {"name": "boss", "scopes": ["approve"], "expires_days": "30"})
    assert refused.status_code == 400 and not ApiToken.objects.filter(name="boss").exists()
    client.force_login(viewer)
    refused = client.post("/accounts/tokens/", {"name": "v", "scopes": ["read", "run"], "expires_days": "30"})
    assert refused.status_code == 400 and not ApiToken.objects.filter(user=viewer).exists()
    assert client.post("/accounts/tokens/", {"name": "v", "expires_days": "30"}).status_code == 400


def test_the_command_takes_scopes_and_refuses_those_the_roles_do_not_grant(author, capsys) -> None:  # type: ignore[no-untyped-def]
    from django.core.management import CommandError, call_command

    call_command("token_create", author.username, "--name", "ci", "--scope", "read,run")
    assert sorted(ApiToken.objects.get(user=author, name="ci").scopes) == ["read", "run"]
    with pytest.raises(CommandError, match="approve"):
        call_command("token_create", author.username, "--name", "boss", "--scope", "approve")
