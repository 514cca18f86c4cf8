from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from apps.experiments.models import Experiment
from apps.experiments.services import experiment_to_spec
from apps.experiments.spec import dump_spec


class Command(BaseCommand):
    help = "Print an experiment as a YAML spec that experiment_import accepts."

    def add_arguments(self, parser):
        parser.add_argument("id", type=int)

    def handle(self, *args, **options):
        try:
            experiment = Experiment.objects.get(pk=options["id"])
        except Experiment.DoesNotExist:
            raise CommandError(f"no experiment with id {options['id']}") from None
        self.stdout.write(dump_spec(experiment_to_spec(experiment=experiment)), ending="")
