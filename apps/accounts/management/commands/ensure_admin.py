from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from apps.accounts.roles import EXPERIMENTER, VIEWER


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
        # Created 0600 before the secret is written, so it is never readable by others.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(password + "\n")
        os.chmod(path, 0o600)
        user = User.objects.create_superuser(options["username"], email="", password=password)
        user.groups.add(*Group.objects.filter(name__in=(VIEWER, EXPERIMENTER)))
        self.stdout.write(
            f"Created the first admin {options['username']!r}; its password is in {path} (readable only by "
            "its owner). Approvers are added with manage.py user_add NAME --role approver."
        )
