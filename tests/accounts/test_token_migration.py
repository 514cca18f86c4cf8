"""Migration accounts/0003: tokens made before scopes get their user's role scopes and an expiry."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("accounts", "0002_api_tokens")]
AFTER = [("accounts", "0003_token_scopes_and_expiry")]


@pytest.mark.django_db(transaction=True)
def test_it_scopes_old_tokens_by_their_users_roles_and_gives_them_an_expiry(roles, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TAILTUNE_TOKEN_DAYS = 90
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps
        User, Group, Token = (
            old.get_model(*m) for m in (("auth", "User"), ("auth", "Group"), ("accounts", "ApiToken"))
        )
        approver = User.objects.create(username="ada")
        approver.groups.add(Group.objects.get(name="approver"))
        author = User.objects.create(username="erin")
        author.groups.add(Group.objects.get(name="experimenter"))
        decade = timezone.now() + timedelta(days=3650)
        Token.objects.create(user=approver, name="never", digest="a" * 64)
        Token.objects.create(user=author, name="decade", digest="b" * 64, expires_at=decade)
        soon = timezone.now() + timedelta(days=3)
        Token.objects.create(user=author, name="soon", digest="c" * 64, expires_at=soon)
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
    finally:
        MigrationExecutor(connection).migrate(executor.loader.graph.leaf_nodes())
    from apps.accounts.models import ApiToken

    tokens = {t.name: t for t in ApiToken.objects.all()}
    latest = timezone.now() + timedelta(days=90)
    assert tokens["never"].scopes == ["approve", "read"]
    assert tokens["decade"].scopes == ["read", "run"]
    assert abs(tokens["never"].expires_at - latest) < timedelta(minutes=1)
    assert abs(tokens["decade"].expires_at - latest) < timedelta(minutes=1)
    assert tokens["soon"].expires_at == soon
