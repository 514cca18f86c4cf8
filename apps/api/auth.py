"""Bearer-token authentication for /api/v1/ (tokens: apps/accounts/tokens.py).

A missing, wrong, revoked or expired token is a 401 with ``WWW-Authenticate:
Bearer``. Failed attempts are counted per client address in the cache; past
``API_AUTH_FAILURE_LIMIT`` within ``API_AUTH_FAILURE_WINDOW_S`` every further
failed attempt from that address is refused with 429 until the window passes,
so a token cannot be guessed by brute force (the same idea as django-axes for
the login page, which does not see API requests). A valid token is never
refused by the count: behind a proxy every client shares one address. The
count lives in Django's cache (per process unless a shared cache is set).
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.conf import settings
from django.core.cache import cache
from rest_framework import authentication, exceptions

from apps.accounts.models import ApiToken
from apps.accounts.tokens import token_check


def _client(request: Any) -> str:
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def _key(request: Any) -> str:
    return f"tailtune:api-auth-failures:{_client(request)}"


class TokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None  # IsAuthenticated then answers 401 with this class's header
        keyword, _, value = header.partition(" ")
        token = token_check(value.strip()) if keyword.lower() == self.keyword.lower() else None
        if token is not None:
            return token.user, token  # a real token always works: only guessing is slowed down
        self.refuse(request)

    def refuse(self, request: Any) -> NoReturn:
        """Count a failed attempt from the request's address and refuse it (401, or 429 past the limit)."""
        limit = int(getattr(settings, "API_AUTH_FAILURE_LIMIT", 20))
        window = int(getattr(settings, "API_AUTH_FAILURE_WINDOW_S", 300))
        key = _key(request)
        if cache.get(key, 0) >= limit:
            raise exceptions.Throttled(
                wait=window, detail="too many failed authentications from this address"
            )
        try:
            cache.incr(key)
        except ValueError:
            cache.set(key, 1, timeout=window)
        raise exceptions.AuthenticationFailed("invalid, revoked or expired token")

    def authenticate_header(self, request: Any) -> str:
        return f'{self.keyword} realm="tailtune"'
