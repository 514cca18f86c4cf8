from __future__ import annotations

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.experiments.services import spec_limits
from apps.experiments.spec import SpecError, parse_spec
from apps.lifecycle.creation import experiment_create


class Command(BaseCommand):
    help = "Create an experiment and its run plan from a YAML spec; prints the new experiment's id."

    def add_arguments(self, parser):
        parser.add_argument("file", help="path to the YAML spec (see docs/SPEC.md)")
        parser.add_argument(
            "--owner",
            required=True,
            help="username that owns (authors) the experiment; the file's own owner field is not trusted, "
            "since the author can never approve",
        )

    def handle(self, *args, **options):
        path = Path(options["file"])
        try:
            text = path.read_bytes().decode("utf-8")
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise CommandError(
                f"{path}: byte {exc.start}: the file is not UTF-8 text; nothing saved"
            ) from None
        try:
            owner = get_user_model().objects.get(username=options["owner"])
        except get_user_model().DoesNotExist:
            raise CommandError(f"--owner: no user named {options['owner']!r}") from None
        try:
            spec = parse_spec(text, limits=spec_limits())
            experiment = experiment_create(spec=spec, owner=owner)
        except SpecError as exc:
            raise CommandError(
                f"{path}: invalid spec, nothing saved:\n" + "\n".join(f"  {e}" for e in exc.errors)
            ) from None
        self.stdout.write(str(experiment.pk))
