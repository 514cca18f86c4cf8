"""API tokens: created for a user, shown once, stored only as a digest, listed and revoked.

A token reads ``tt_<id>_<secret>``: the id finds the row, the secret is checked
against its SHA-256 (a 256-bit random secret needs no slow hash: nothing short
of the secret itself can be tried against the digest). A request with a valid
token acts as the token's user, with that user's roles.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import timedelta
from typing import Any

from django.utils import timezone

from apps.accounts.models import ApiToken

PREFIX = "tt_"
MAX_EXPIRES_DAYS = 3650


class TokenError(ValueError):
    """A token cannot be created as asked (the field is named in the message)."""


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def token_create(*, user: Any, name: str, expires_days: int | None = None) -> tuple[ApiToken, str]:
    """A new token for ``user``; returns the row and the plaintext, which is never stored."""
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise TokenError("name: give a name of 1 to 100 characters (it labels the token in the audit log)")
    if ApiToken.objects.filter(user=user, name=name, revoked_at__isnull=True).exists():
        raise TokenError(f"name: {user.get_username()} already has a live token named {name!r}")
    expires_at = None
    if expires_days is not None:
        if not 1 <= int(expires_days) <= MAX_EXPIRES_DAYS:
            raise TokenError(f"expires: give 1 to {MAX_EXPIRES_DAYS} days")
        expires_at = timezone.now() + timedelta(days=int(expires_days))
    secret = secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, digest=_digest(secret), expires_at=expires_at)
    return token, f"{PREFIX}{token.pk}_{secret}"


def token_check(plaintext: str) -> ApiToken | None:
    """The live token this plaintext names, or None (unknown, wrong, revoked, expired, inactive user)."""
    if not plaintext.startswith(PREFIX):
        return None
    pk, _, secret = plaintext[len(PREFIX) :].partition("_")
    if not re.fullmatch(r"[0-9]{1,18}", pk) or not secret:
        return None
    token = ApiToken.objects.select_related("user").filter(pk=int(pk)).first()
    if token is None or not hmac.compare_digest(token.digest, _digest(secret)):
        return None
    if not token.live or not token.user.is_active:
        return None
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token


def token_revoke(*, token: ApiToken, actor: Any) -> None:
    """Revoke a token (its owner or a superuser); idempotent."""
    if actor.pk != token.user_id and not actor.is_superuser:
        raise PermissionError("only the token's owner (or an administrator) can revoke it")
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
