"""Bearer-token authentication for /api/v1/ (tokens: apps/accounts/tokens.py).

A missing, wrong, revoked or expired token is a 401 with ``WWW-Authenticate:
Bearer``. Failed attempts are counted per client address in the cache; past
``API_AUTH_FAILURE_LIMIT`` within ``API_AUTH_FAILURE_WINDOW_S`` every further
attempt from that address is refused with 429 until the window passes, so a
token cannot be guessed by brute force (the same idea as django-axes for the
login page, which does not see API requests).
"""

from __future__ import annotations

from typing import Any

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
        limit = int(getattr(settings, "API_AUTH_FAILURE_LIMIT", 20))
        window = int(getattr(settings, "API_AUTH_FAILURE_WINDOW_S", 300))
        if cache.get(_key(request), 0) >= limit:
            raise exceptions.Throttled(
                wait=window, detail="too many failed authentications from this address"
            )
        if not header:
            return None  # IsAuthenticated then answers 401 with this class's header
        keyword, _, value = header.partition(" ")
        token = token_check(value.strip()) if keyword == self.keyword else None
        if token is None:
            try:
                cache.incr(_key(request))
            except ValueError:
                cache.set(_key(request), 1, timeout=window)
            raise exceptions.AuthenticationFailed("invalid, revoked or expired token")
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return f'{self.keyword} realm="tailtune"'
