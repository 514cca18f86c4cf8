"""A search experiment's screened trials (#36): one row per config the optimiser proposed.

The rows are the study: apps/search/study.py rebuilds Optuna's in-memory study from them for every
proposal, so nothing of the search lives outside the database, and a trial that could not be
measured (its server did not start, its run failed or was invalid) stays a row with its reason.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from apps.search.objective import BROKE, FAILED, KEPT, Trial, outcome_of


class SearchTrial(models.Model):
    class Outcome(models.TextChoices):
        RUNNING = "running"  # proposed, its screening run not finished: the sampler's pending trial
        KEPT = KEPT  # every class kept its contract at the screening point
        BROKE = BROKE  # measured, and some class broke its contract there
        FAILED = FAILED  # no measurement: the reason says why

    experiment = models.ForeignKey(
        "experiments.Experiment", on_delete=models.CASCADE, related_name="search_trials"
    )
    number = models.PositiveIntegerField()  # 0, 1, ... in the order proposed
    params = models.JSONField()  # the optimiser's params: the searched knobs
    args = models.JSONField()  # the server's cell args they give (study.server_args: vLLM's rules)
    # The screening run at the search's screening point; None once the run is deleted.
    run = models.OneToOneField(
        "runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="search_trial"
    )
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.RUNNING)
    margin = models.FloatField(null=True, blank=True)  # the worst class's margin to its contract
    worst_class = models.CharField(max_length=64, blank=True)
    throughput_rps = models.FloatField(null=True, blank=True)  # completed requests per second
    engine_s = models.FloatField(default=0.0)  # engine time the trial cost, a failed start included
    reason = models.TextField(blank=True)
    # Among the best k confirmed with the full paired design (a cell of the experiment).
    confirmed = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["experiment", "number"]
        constraints = [
            models.UniqueConstraint(fields=["experiment", "number"], name="search_trial_number_unique"),
        ]

    def __str__(self) -> str:
        return f"trial {self.number} of experiment {self.experiment_id}: {self.outcome}"

    def as_trial(self) -> Trial:
        """The row as the pure search code takes it."""
        return Trial(
            number=self.number,
            params=dict(self.params),
            outcome=self.outcome,
            margin=self.margin,
            throughput=self.throughput_rps,
            engine_s=self.engine_s,
            reason=self.reason,
        )

    def mark_measured(
        self, *, margin: float, worst_class: str, throughput_rps: float | None, engine_s: float
    ) -> None:
        self.margin = margin
        self.worst_class = worst_class
        self.throughput_rps = throughput_rps
        self.engine_s = engine_s
        self.outcome = outcome_of(margin)
        self.save(update_fields=["margin", "worst_class", "throughput_rps", "engine_s", "outcome"])

    def mark_failed(self, *, reason: str, engine_s: float) -> None:
        """No measurement (the server did not start, the run failed or was invalid): kept, with why."""
        self.outcome = self.Outcome.FAILED
        self.reason = reason[:2000]
        self.engine_s = engine_s
        self.margin = None
        self.save(update_fields=["outcome", "reason", "engine_s", "margin"])

    def as_json(self) -> dict[str, Any]:
        """The trial as the report and the API carry it."""
        return {
            "number": self.number,
            "params": dict(self.params),
            "args": dict(self.args),
            "run_id": str(self.run.run_id) if self.run_id and self.run else None,
            "outcome": self.outcome,
            "margin": self.margin,
            "worst_class": self.worst_class,
            "throughput_rps": self.throughput_rps,
            "engine_s": self.engine_s,
            "reason": self.reason,
            "confirmed": self.confirmed,
        }
