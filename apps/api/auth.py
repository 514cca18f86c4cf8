"""Bearer-token authentication and token scopes for /api/v1/ (tokens: apps/accounts/tokens.py).

A missing, wrong, revoked or expired token is a 401 with ``WWW-Authenticate:
Bearer``; the body says "invalid token", or to the holder of the secret that it
expired or was revoked, and when. Failed attempts are counted per client address
(config/clientip.py: the peer, or X-Forwarded-For through the trusted proxies) in
the shared cache (Redis when configured, settings ``CACHES``), so every web
process sees one count; past ``API_AUTH_FAILURE_LIMIT`` within
``API_AUTH_FAILURE_WINDOW_S`` every further failed attempt from that address is
refused with 429 until the window passes, so a token cannot be guessed by brute
force (django-axes does the same for the login page, which does not see API
requests). A valid token is never refused by the count.

``TokenScope`` then lets a request through only if its token has the scope the
view names for the method (``ApiView.scopes``) and its user's roles grant it.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from django.conf import settings
from django.core.cache import cache
from rest_framework import authentication, exceptions, permissions

from apps.accounts.models import ApiToken
from apps.accounts.tokens import SCOPES, TokenRefused, role_scopes, token_authenticate
from config.clientip import client_ip

log = logging.getLogger(__name__)
FAILURES = "tailtune:api-auth-failures:"


def failure_key(address: str) -> str:
    return f"{FAILURES}{address}"


class TokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None  # IsAuthenticated then answers 401 with this class's header
        keyword, _, value = header.partition(" ")
        if keyword.lower() != self.keyword.lower():
            self.refuse(request, "invalid token: send Authorization: Bearer <token>")
        return self.check(request, value.strip())

    def check(self, request: Any, plaintext: str) -> tuple[Any, ApiToken]:
        try:
            token = token_authenticate(plaintext)
        except TokenRefused as exc:
            self.refuse(request, str(exc))
        return token.user, token  # a real token always works: only guessing is slowed down

    def refuse(self, request: Any, reason: str) -> NoReturn:
        """Count a failed attempt from the client's address and refuse it (401, or 429 past the limit)."""
        limit = int(getattr(settings, "API_AUTH_FAILURE_LIMIT", 20))
        window = int(getattr(settings, "API_AUTH_FAILURE_WINDOW_S", 300))
        key = failure_key(client_ip(request) or "unknown")
        try:
            if cache.get(key, 0) >= limit:
                raise exceptions.Throttled(
                    wait=window, detail="too many failed authentications from this address"
                )
            cache.add(key, 0, timeout=window)  # the window starts at the first failure
            cache.incr(key)
        except exceptions.Throttled:
            raise
        except Exception:  # the cache is down: the request is refused all the same
            log.exception("could not count a failed API authentication")
        raise exceptions.AuthenticationFailed(reason)

    def authenticate_header(self, request: Any) -> str:
        return f'{self.keyword} realm="tailtune"'


class TokenScope(permissions.BasePermission):
    """The request's token has the scope its view names for the method, and its user's roles grant it.

    A view names its scopes per method (``scopes = {"POST": "run"}``); a method it does not
    name is refused, so a new endpoint is closed until it says what it needs."""

    def has_permission(self, request: Any, view: Any) -> bool:
        token = request.auth
        if not isinstance(token, ApiToken):
            return False
        scope = (getattr(view, "scopes", None) or {}).get(request.method)
        if scope not in SCOPES:
            raise exceptions.PermissionDenied(f"{request.method} {request.path} names no token scope")
        if scope not in token.scopes:
            have = ", ".join(token.scopes) or "none"
            raise exceptions.PermissionDenied(
                f"this token's scopes ({have}) do not include {scope}, which this needs; "
                f"create a token with the {scope} scope on /accounts/tokens/"
            )
        if scope not in role_scopes(token.user):
            raise exceptions.PermissionDenied(
                f"a token cannot do more than its user: {token.user.get_username()}'s roles do not "
                f"grant the {scope} scope (it needs the {SCOPES[scope][1]} role)"
            )
        return True
