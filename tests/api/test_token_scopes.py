"""Token scopes: a token does no more than its scopes allow, nor than its user's roles allow."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken
from apps.experiments.models import Experiment
from tests.experiments.factories import SMALL_SPEC

pytestmark = pytest.mark.django_db

APPROVAL = {
    "chosen_cell": "B0",
    "reason": "keep B0",
    "deployment_revision": "rel-7",
    "route_target": "svc/llm",
}


def page_token(client, user, *, name: str, scopes: list[str]) -> APIClient:  # type: ignore[no-untyped-def]
    """A token made on the tokens page, as a person would, and an API client that sends it."""
    client.force_login(user)
    page = client.post("/accounts/tokens/", {"name": name, "scopes": scopes, "expires_days": "30"})
    plaintext = re.search(r'id="token-value">(tt_[^<]+)<', page.content.decode()).group(1)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return api


def test_a_read_scoped_token_of_an_approver_cannot_approve(client, approver, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    api = page_token(client, approver, name="ci", scopes=["read"])
    url = f"/api/v1/experiments/{analysed_experiment.pk}"
    assert api.get(url).status_code == 200
    refused = api.post(f"{url}/approve", APPROVAL, format="json")
    assert refused.status_code == 403
    assert "approve" in refused.json()["detail"] and "scope" in refused.json()["detail"]
    from apps.approvals.models import RollbackManifest

    assert not RollbackManifest.objects.filter(experiment=analysed_experiment).exists()


def test_a_ci_token_with_read_and_run_cannot_approve_nor_revoke(
    client, approver, analysed_experiment
) -> None:  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import Group

    approver.groups.add(Group.objects.get(name="experimenter"))
    api = page_token(client, approver, name="gate", scopes=["read", "run"])
    url = f"/api/v1/experiments/{analysed_experiment.pk}"
    assert api.post(f"{url}/approve", APPROVAL, format="json").status_code == 403
    assert api.post(f"{url}/revoke", {"reason": "x"}, format="json").status_code == 403


def test_a_read_scoped_token_of_an_experimenter_cannot_create_or_start(client, author, experiment) -> None:  # type: ignore[no-untyped-def]
    api = page_token(client, author, name="ci", scopes=["read"])
    before = Experiment.objects.count()
    refused = api.post("/api/v1/experiments", SMALL_SPEC, format="json")
    assert refused.status_code == 403 and "run" in refused.json()["detail"]
    assert Experiment.objects.count() == before
    assert api.post(f"/api/v1/experiments/{experiment.pk}/start").status_code == 403
    assert api.post("/api/v1/gates", {}, format="multipart").status_code == 403
    assert api.post("/api/v1/traces", {}, format="multipart").status_code == 403


def test_the_flagger_webhook_reads_the_verdict_with_a_read_scope(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    api = page_token(client, viewer, name="flagger", scopes=["read"])
    answer = api.post(f"/api/v1/gates/{experiment.pk}", {}, format="json")
    assert answer.status_code in (200, 412), answer.content


def test_a_scope_beyond_the_users_roles_today_grants_nothing(author, experiment) -> None:  # type: ignore[no-untyped-def]
    """Roles change after a token is made: the token's rights are its scopes AND its user's roles."""
    from django.contrib.auth.models import Group

    from apps.accounts.tokens import token_create

    _, plaintext = token_create(user=author, name="ci", scopes=["read", "run"])
    author.groups.remove(Group.objects.get(name="experimenter"))
    author.groups.add(Group.objects.get(name="viewer"))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert api.get("/api/v1/experiments").status_code == 200
    assert api.post("/api/v1/experiments", SMALL_SPEC, format="json").status_code == 403


def test_an_expired_token_gets_a_401_that_says_it_expired_and_when(author) -> None:  # type: ignore[no-untyped-def]
    from apps.accounts.tokens import token_create

    token, plaintext = token_create(user=author, name="old", expires_days=1)
    when = timezone.now() - timedelta(hours=2)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=when)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    response = api.get("/api/v1/experiments")
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
    detail = response.json()["detail"]
    assert "expired" in detail and when.strftime("%Y-%m-%d %H:%M") in detail
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION=f"Bearer tt_{token.pk}_not-the-secret")
    # Only the holder of the secret learns that the token expired: a guess learns nothing.
    assert "expired" not in wrong.get("/api/v1/experiments").json()["detail"]
