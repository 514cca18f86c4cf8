from __future__ import annotations

import getpass
import sys

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.roles import ROLES


class Command(BaseCommand):
    help = (
        "Create a user (or update its password) with the given roles. The password is asked for at "
        "the terminal, or read from the first line of standard input with --password-stdin; never "
        "from the command line, where ps and the shell's history would show it."
    )
    # Tests hand a stream in place of the terminal (as Django's createsuperuser does).
    stealth_options = ("stdin",)

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument(
            "--password-stdin",
            action="store_true",
            help="read the password from the first line of standard input (e.g. from a secret store)",
        )
        # Kept only to refuse it by name: a password in argv is readable by every local user.
        parser.add_argument("--password", help="refused: use --password-stdin or the prompt")
        parser.add_argument("--role", action="append", default=[], choices=ROLES)

    def handle(self, *args, **options):
        if options["password"] is not None:
            raise CommandError(
                "--password: a password on the command line is visible to every local user (ps, "
                "/proc) and stays in the shell's history; pipe it with --password-stdin or type it "
                "at the prompt"
            )
        if not options["role"]:
            raise CommandError("--role: give at least one of " + ", ".join(ROLES))
        password = self._password(options)
        User = get_user_model()
        existing = User.objects.filter(username=options["username"]).first()
        candidate = existing or User(username=options["username"])
        try:
            validate_password(password, user=candidate)
        except ValidationError as exc:
            raise CommandError("password: " + " ".join(exc.messages)) from None
        user, _ = User.objects.get_or_create(username=options["username"])
        user.set_password(password)
        user.save()
        user.groups.set(Group.objects.filter(name__in=options["role"]))
        self.stdout.write(f"{user.username}: {', '.join(options['role'])}")

    def _password(self, options) -> str:
        stdin = options.get("stdin") or sys.stdin
        if options["password_stdin"]:
            # The first line, without its line ending; spaces inside a passphrase are kept.
            password = stdin.readline().rstrip("\r\n")
            if not password:
                raise CommandError("--password-stdin: standard input held no password on its first line")
            return password
        if not stdin.isatty():
            raise CommandError("no terminal to ask the password at: pipe it with --password-stdin")
        password = getpass.getpass("Password: ")
        if password != getpass.getpass("Password (again): "):
            raise CommandError("password: the two entries differ")
        return password
