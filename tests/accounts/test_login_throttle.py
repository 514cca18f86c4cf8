"""django-axes counts failed logins per address, the address taken through the trusted proxies
(TAILTUNE_TRUSTED_PROXIES) by the same function as the API's throttle."""

from __future__ import annotations

import pytest
from axes.models import AccessAttempt

from tests.experiments.factories import UserFactory

pytestmark = pytest.mark.django_db


def fail_login(client, **meta: str) -> None:  # type: ignore[no-untyped-def]
    client.post("/accounts/login/", {"username": "erin", "password": "wrong"}, **meta)


def test_a_forwarded_address_from_an_untrusted_peer_is_ignored(client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TAILTUNE_TRUSTED_PROXIES = ["10.0.0.0/8"]
    UserFactory(username="erin")
    fail_login(client, REMOTE_ADDR="198.51.100.9", HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == ["198.51.100.9"]


def test_a_forwarded_address_from_a_trusted_proxy_is_the_client(client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TAILTUNE_TRUSTED_PROXIES = ["10.0.0.0/8"]
    UserFactory(username="erin")
    fail_login(client, REMOTE_ADDR="10.1.2.3", HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == ["203.0.113.7"]
