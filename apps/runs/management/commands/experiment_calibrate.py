"""Run the capacity probe of an experiment here, inline, and freeze its rates (apps/lifecycle/calibration.py)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from apps.experiments.models import Experiment, RunsRefused
from apps.lifecycle.calibration import CalibrationError, cell_goodput_capacity, experiment_calibrate


class Command(BaseCommand):
    help = (
        "Probe B0's capacity per mixture on this machine's engine and freeze the sweep's rates "
        "(low / near_capacity) before any candidate runs. --cell C --mixture M measures a cell's "
        "goodput capacity instead (reported, never used as a rate); --cell C --class K its capacity for "
        "class K alone (an isolate decision's pool sizing reads it)."
    )

    def add_arguments(self, parser):
        parser.add_argument("id", type=int)
        parser.add_argument("--cell", help="measure this cell's goodput capacity instead of calibrating")
        parser.add_argument("--mixture", help="with --cell: the mixture to probe")
        parser.add_argument(
            "--class",
            dest="request_class",
            help="with --cell, instead of --mixture: the cell's capacity for this class alone "
            "(what an isolate decision sizes the class's pool from)",
        )
        parser.add_argument("--json", action="store_true", help="print the whole derivation as JSON")

    def handle(self, *args, **options):
        from workers.pipeline import inline_executor

        try:
            experiment = Experiment.objects.get(pk=options["id"])
        except Experiment.DoesNotExist:
            raise CommandError(f"no experiment with id {options['id']}") from None
        try:
            with inline_executor() as execute:
                result, summary = self._measure(experiment, options, execute)
        except (CalibrationError, RunsRefused) as exc:  # RunsRefused: analysed or decided
            raise CommandError(str(exc)) from None
        self.stdout.write(json.dumps(result, indent=2, sort_keys=True) if options["json"] else summary)

    def _measure(self, experiment, options, execute):
        """The goodput search of ``--cell`` or the capacity probe: (result, one-line summary)."""
        if options["cell"] and options.get("request_class"):
            if options["mixture"]:
                raise CommandError(
                    "--class and --mixture: give one (a class's capacity alone, or a mixture's)"
                )
            result = cell_goodput_capacity(
                experiment_id=experiment.pk,
                cell_id=options["cell"],
                mixture="",
                execute=execute,
                request_class=options["request_class"],
            )
            return (
                result,
                f"capacity of {options['cell']} for {options['request_class']} alone: {result['capacity_rps']} req/s",
            )
        if options.get("request_class"):
            raise CommandError("--class needs --cell")
        if options["cell"]:
            if not options["mixture"]:
                raise CommandError("--cell needs --mixture (or --class)")
            result = cell_goodput_capacity(
                experiment_id=experiment.pk,
                cell_id=options["cell"],
                mixture=options["mixture"],
                execute=execute,
            )
            return (
                result,
                f"goodput capacity of {options['cell']} on {options['mixture']}: {result['capacity_rps']} req/s",
            )
        result = experiment_calibrate(experiment_id=experiment.pk, execute=execute)
        return result, f"capacities {result['capacities']} -> rates {result['rates']} (source: probe)"
