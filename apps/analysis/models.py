"""The stored outcome of analysing an experiment."""

from __future__ import annotations

from django.db import models


class Decision(models.Model):
    class Outcome(models.TextChoices):
        RETAIN = "retain"
        RETUNE = "retune"
        ISOLATE = "isolate"
        INCONCLUSIVE = "inconclusive"

    experiment = models.OneToOneField(
        "experiments.Experiment", on_delete=models.CASCADE, related_name="decision"
    )
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    # Cell id of the candidate to adopt (retune), else B0's.
    chosen_cell = models.CharField(max_length=32, blank=True)
    rule = models.TextField()
    evidence = models.JSONField(default=dict)
    checks = models.JSONField(default=dict)
    findings = models.JSONField(default=list)
    # The full report it was taken from, so pages never recompute from records.
    report = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.outcome} {self.chosen_cell}"
