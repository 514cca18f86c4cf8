"""API tokens: created for a user, shown once, stored only as a digest, scoped, expiring, revoked.

A token reads ``tt_<id>_<secret>``: the id finds the row, the secret is checked
against its SHA-256 (a 256-bit random secret needs no slow hash: nothing short
of the secret itself can be tried against the digest).

A token carries scopes, some of ``read``, ``run`` and ``approve``, and never does
more than its user: what a request may do is its token's scopes AND what its user's
roles grant at that moment (``role_scopes``), so a CI token made with ``read`` and
``run`` cannot approve even when its user is an approver. Every token expires,
at most ``TAILTUNE_TOKEN_DAYS`` (90 unless set) after it was made.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.accounts.models import ApiToken
from apps.accounts.roles import APPROVER, EXPERIMENTER, ROLES, has_role

PREFIX = "tt_"
READ = "read"
RUN = "run"
APPROVE = "approve"
# Each scope, what it lets a token do, and the role its user needs for it.
SCOPES: dict[str, tuple[str, str]] = {
    READ: ("read experiments, reports, runs, records, manifests and gate verdicts", "any role"),
    RUN: ("create, start and cancel experiments, upload traces, start gates", EXPERIMENTER),
    APPROVE: ("approve and revoke approvals", APPROVER),
}


class TokenError(ValueError):
    """A token cannot be created as asked (the field is named in the message)."""


class TokenRefused(Exception):
    """A request's token does not authenticate; the message says why, as far as its holder may learn."""


def token_days() -> int:
    """The longest life of a token, and the life of one made without an expiry."""
    return int(getattr(settings, "TAILTUNE_TOKEN_DAYS", 90))


def role_scopes(user: Any) -> set[str]:
    """The scopes this user's roles grant now."""
    granted = set()
    if any(has_role(user, role) for role in ROLES):
        granted.add(READ)
    if has_role(user, EXPERIMENTER):
        granted.add(RUN)
    if has_role(user, APPROVER):
        granted.add(APPROVE)
    return granted


def token_allows(token: ApiToken, scope: str) -> bool:
    """Whether the token may act in this scope: the token has it AND its user's roles grant it."""
    return scope in token.scopes and scope in role_scopes(token.user)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def token_create(
    *, user: Any, name: str, scopes: Iterable[str] | None = None, expires_days: int | None = None
) -> tuple[ApiToken, str]:
    """A new token for ``user``; returns the row and the plaintext, which is never stored.

    ``scopes`` None gives every scope the user's roles grant now; ``expires_days`` None gives
    the longest life, ``TAILTUNE_TOKEN_DAYS``."""
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise TokenError("name: give a name of 1 to 100 characters (it labels the token in the audit log)")
    if ApiToken.objects.filter(user=user, name=name, revoked_at__isnull=True).exists():
        raise TokenError(f"name: {user.get_username()} already has a live token named {name!r}")
    granted = role_scopes(user)
    if scopes is None:
        chosen = sorted(granted)
    else:
        chosen = sorted(set(scopes))
        if not chosen:
            raise TokenError(f"scopes: choose at least one of {', '.join(SCOPES)}")
        unknown = [s for s in chosen if s not in SCOPES]
        if unknown:
            raise TokenError(f"scopes: {', '.join(unknown)} is not a scope (the scopes: {', '.join(SCOPES)})")
        beyond = [s for s in chosen if s not in granted]
        if beyond:
            needs = "; ".join(f"{s} needs the {SCOPES[s][1]} role" for s in beyond)
            raise TokenError(
                f"scopes: a token cannot do more than its user, and {user.get_username()}'s roles "
                f"do not grant {', '.join(beyond)} ({needs})"
            )
    days = token_days()
    if expires_days is None:
        expires_days = days
    if not 1 <= int(expires_days) <= days:
        raise TokenError(f"expires: give 1 to {days} days (the longest a token lives: TAILTUNE_TOKEN_DAYS)")
    secret = secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        name=name,
        digest=_digest(secret),
        scopes=chosen,
        expires_at=timezone.now() + timedelta(days=int(expires_days)),
    )
    return token, f"{PREFIX}{token.pk}_{secret}"


def token_authenticate(plaintext: str) -> ApiToken:
    """The live token this plaintext names, or TokenRefused. Only a caller who holds the token's
    secret learns that it was revoked or expired; any other miss is just an invalid token."""
    invalid = TokenRefused("invalid token")
    if not plaintext.startswith(PREFIX):
        raise invalid
    pk, _, secret = plaintext[len(PREFIX) :].partition("_")
    if not re.fullmatch(r"[0-9]{1,18}", pk) or not secret:
        raise invalid
    token = ApiToken.objects.select_related("user").filter(pk=int(pk)).first()
    if token is None or not hmac.compare_digest(token.digest, _digest(secret)):
        raise invalid
    if token.revoked_at is not None:
        raise TokenRefused(f"this token was revoked at {_when(token.revoked_at)}")
    if token.expires_at <= timezone.now():
        raise TokenRefused(
            f"this token expired at {_when(token.expires_at)}; create a new one on /accounts/tokens/"
        )
    if not token.user.is_active:
        raise TokenRefused("this token's user is deactivated")
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token


def token_check(plaintext: str) -> ApiToken | None:
    """The live token this plaintext names, or None (unknown, wrong, revoked, expired, inactive user)."""
    try:
        return token_authenticate(plaintext)
    except TokenRefused:
        return None


def token_revoke(*, token: ApiToken, actor: Any) -> None:
    """Revoke a token (its owner or a superuser); idempotent."""
    if actor.pk != token.user_id and not actor.is_superuser:
        raise PermissionError("only the token's owner (or an administrator) can revoke it")
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
