"""manage.py token_create USER --scope read,run [--name N] [--expires DAYS]: print a new API token, once."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.accounts.tokens import SCOPES, TokenError, token_create
from apps.audit.services import audit_record


class Command(BaseCommand):
    help = "Create an API token for USER and print it (it is stored only as a digest)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("user")
        parser.add_argument(
            "--scope",
            required=True,
            help=f"what the token may do, a comma list of {', '.join(SCOPES)} (never more than USER's roles)",
        )
        parser.add_argument("--name", default="cli", help="labels the token in the audit log (default: cli)")
        parser.add_argument(
            "--expires", type=int, default=None, metavar="DAYS",
            help="days until it expires (default and longest: TAILTUNE_TOKEN_DAYS)",
        )  # fmt: skip

    def handle(self, *args: Any, **opts: Any) -> None:
        user = get_user_model().objects.filter(username=opts["user"]).first()
        if user is None:
            raise CommandError(f"user: no user named {opts['user']!r}")
        scopes = [s.strip() for s in opts["scope"].split(",") if s.strip()]
        try:
            token, plaintext = token_create(
                user=user, name=opts["name"], scopes=scopes, expires_days=opts["expires"]
            )
        except TokenError as exc:
            raise CommandError(str(exc)) from None
        audit_record(
            action="token.created",
            actor=user,
            target=token.name,
            detail={
                "via": "manage.py token_create",
                "scopes": token.scopes,
                "expires_at": token.expires_at.isoformat(),
            },
        )
        self.stdout.write(plaintext)
