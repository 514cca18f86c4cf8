from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from apps.experiments.models import Experiment
from apps.lifecycle.running import StartError, experiment_start
from apps.runs.models import Run

_DONE = {
    Experiment.Status.ANALYSED,
    Experiment.Status.APPROVED,
    Experiment.Status.REJECTED,
    Experiment.Status.CANCELLED,
}


class Command(BaseCommand):
    help = "Start an experiment's plan on the registered hosts; --wait follows it to the decision."

    def add_arguments(self, parser):
        parser.add_argument("id", type=int)
        parser.add_argument(
            "--wait", action="store_true", help="print progress until the experiment is analysed"
        )
        parser.add_argument(
            "--timeout", type=float, default=0, help="give up waiting after this many seconds (0: never)"
        )

    def handle(self, *args, **options):
        try:
            experiment = Experiment.objects.get(pk=options["id"])
        except Experiment.DoesNotExist:
            raise CommandError(f"no experiment with id {options['id']}") from None
        try:
            n = experiment_start(experiment=experiment)
        except StartError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"experiment {experiment.pk}: {n} runs enqueued")
        if not options["wait"]:
            return
        started = time.monotonic()
        last = ""
        while True:
            experiment.refresh_from_db()
            runs = list(experiment.runs.values_list("status", flat=True))
            finished = sum(1 for s in runs if s in Run.FINISHED)
            line = f"{experiment.status}: {finished}/{len(runs)} runs finished"
            current = experiment.runs.filter(status__in=Run.ACTIVE).select_related("cell").first()
            if current:
                line += f"; {current} {current.status} {current.requests_sent}/{current.requests_planned or '?'} sent"
            if line != last:
                self.stdout.write(line)
                last = line
            if experiment.status in _DONE:
                break
            if options["timeout"] and time.monotonic() - started > options["timeout"]:
                raise CommandError(f"still {experiment.status} after {options['timeout']} s")
            time.sleep(1.0)
        counts: dict[str, int] = {}
        for s in experiment.runs.values_list("status", flat=True):
            counts[s] = counts.get(s, 0) + 1
        self.stdout.write(f"runs: {counts}")
        decision = getattr(experiment, "decision", None)
        if decision is not None:
            self.stdout.write(f"decision: {decision.outcome} {decision.chosen_cell} ({decision.rule})")
        if experiment.status == Experiment.Status.CANCELLED:
            raise CommandError("the experiment was cancelled")
