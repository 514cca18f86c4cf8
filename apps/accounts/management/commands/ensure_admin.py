from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from apps.accounts.roles import ROLES


class Command(BaseCommand):
    help = "Create the first admin (all roles) if no superuser exists, printing its credentials once."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, **options):
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("An admin exists already; its password was printed when it was created.")
            return
        password = secrets.token_urlsafe(12)
        user = User.objects.create_superuser(options["username"], email="", password=password)
        user.groups.add(*Group.objects.filter(name__in=ROLES))
        self.stdout.write(
            f"Created the first admin. Log in as {options['username']} / {password} (shown only once)."
        )
