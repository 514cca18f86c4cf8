from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.roles import ROLES


class Command(BaseCommand):
    help = "Create a user (or update its password) with the given roles."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--password", required=True)
        parser.add_argument("--role", action="append", default=[], choices=ROLES)

    def handle(self, *args, **options):
        if not options["role"]:
            raise CommandError("--role: give at least one of " + ", ".join(ROLES))
        User = get_user_model()
        existing = User.objects.filter(username=options["username"]).first()
        candidate = existing or User(username=options["username"])
        try:
            validate_password(options["password"], user=candidate)
        except ValidationError as exc:
            raise CommandError("--password: " + " ".join(exc.messages)) from None
        user, _ = User.objects.get_or_create(username=options["username"])
        user.set_password(options["password"])
        user.save()
        user.groups.set(Group.objects.filter(name__in=options["role"]))
        self.stdout.write(f"{user.username}: {', '.join(options['role'])}")
