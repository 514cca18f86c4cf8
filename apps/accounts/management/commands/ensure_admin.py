from __future__ import annotations

import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from apps.accounts.roles import EXPERIMENTER, VIEWER
from config.secretfiles import create_secret_file


class Command(BaseCommand):
    help = (
        "Create the first admin (an administrator and experimenter, not an approver) if no superuser "
        "exists; its password goes to a file only its owner can read, never to the output."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument(
            "--password-file",
            default="",
            help="where to write the password (default: <TAILTUNE_DATA>/first-admin-password)",
        )

    def handle(self, *args, **options):
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("An admin exists already; its password was written when it was created.")
            return
        path = Path(options["password_file"] or Path(settings.DATA_DIR) / "first-admin-password")
        path.parent.mkdir(parents=True, exist_ok=True)
        password = secrets.token_urlsafe(12)
        # A new file, born 0600 with the password in it; whatever is at the path already (an old
        # password, a link to another file) is neither followed nor replaced (config/secretfiles.py).
        try:
            create_secret_file(path, password + "\n")
        except FileExistsError:
            raise CommandError(
                f"{path} exists already: move it away (it may hold an earlier password) or give "
                "--password-file a new path; no admin was created"
            ) from None
        try:
            with transaction.atomic():
                user = User.objects.create_superuser(options["username"], email="", password=password)
                user.groups.add(*Group.objects.filter(name__in=(VIEWER, EXPERIMENTER)))
        except BaseException:
            path.unlink()  # no admin, so no password file that names one
            raise
        self.stdout.write(
            f"Created the first admin {options['username']!r}; its password is in {path} (readable only by "
            "its owner). Approvers are added with manage.py user_add NAME --role approver."
        )
