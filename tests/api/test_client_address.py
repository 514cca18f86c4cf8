"""Failed API authentications: counted per client address in the shared cache, the address taken
through the trusted proxies (TAILTUNE_TRUSTED_PROXIES), never from a header anyone can send."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]


def guess(**meta: str) -> int:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Bearer tt_9_guess")
    return api.get("/api/v1/experiments", **meta).status_code


def test_a_forwarded_address_from_an_untrusted_peer_is_ignored(settings) -> None:  # type: ignore[no-untyped-def]
    settings.API_AUTH_FAILURE_LIMIT = 2
    settings.TAILTUNE_TRUSTED_PROXIES = ["10.0.0.0/8"]
    peer = {"REMOTE_ADDR": "198.51.100.9"}
    # A new X-Forwarded-For at each try does not make a new client: the peer is not a proxy of ours.
    codes = [guess(**peer, HTTP_X_FORWARDED_FOR=f"203.0.113.{n}") for n in range(3)]
    assert codes == [401, 401, 429]


def test_a_forwarded_address_from_a_trusted_proxy_is_the_client(settings) -> None:  # type: ignore[no-untyped-def]
    settings.API_AUTH_FAILURE_LIMIT = 2
    settings.TAILTUNE_TRUSTED_PROXIES = ["10.0.0.0/8"]
    proxy = {"REMOTE_ADDR": "10.1.2.3"}
    assert [guess(**proxy, HTTP_X_FORWARDED_FOR="203.0.113.7") for _ in range(3)] == [401, 401, 429]
    # Another client behind the same proxy is another address, not locked out by the first.
    assert guess(**proxy, HTTP_X_FORWARDED_FOR="203.0.113.8") == 401
    # The client is the right-most address no trusted proxy added: what it put before is its own say.
    assert guess(**proxy, HTTP_X_FORWARDED_FOR="192.0.2.1, 203.0.113.7, 10.9.9.9") == 429


def test_two_processes_share_the_failure_count(settings) -> None:  # type: ignore[no-untyped-def]
    """The count lives in the configured shared cache: another process (a second web worker) reads it."""
    assert [guess(REMOTE_ADDR="192.0.2.44") for _ in range(3)] == [401, 401, 401]
    read = (
        "import django; django.setup(); from django.core.cache import cache; "
        "print(cache.get('tailtune:api-auth-failures:192.0.2.44'))"
    )
    prefix = settings.CACHES["default"]["KEY_PREFIX"]  # this test process's own (tests/api/conftest.py)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "TAILTUNE_CACHE_PREFIX": prefix}
    out = subprocess.run(
        [sys.executable, "-c", read], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "3"
    if os.environ.get("CELERY_BROKER_URL", "").startswith("redis"):
        assert settings.CACHES["default"]["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
