"""Frozen traces, stored once by hash and referenced by runs."""

from __future__ import annotations

from django.db import models


class Trace(models.Model):
    """A canonical trace (JSONL, see docs/SPEC.md), gzip-compressed.

    The row is keyed by the sha256 of the uncompressed canonical bytes, so the
    same traffic is stored once however many runs replay it, and a run that
    names a hash can only ever get those bytes back.
    """

    sha256 = models.CharField(max_length=64, unique=True)
    corpus_sha256 = models.CharField(max_length=64)
    kind = models.CharField(max_length=32, default="generated")  # generated | uniform | imported | scenario
    label = models.CharField(max_length=200, blank=True)
    requests = models.PositiveIntegerField()
    duration_s = models.FloatField()
    meta = models.JSONField(default=dict)
    stats = models.JSONField(default=dict, blank=True)
    content_gz = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.label or self.kind} {self.sha256[:12]}"


class Corpus(models.Model):
    """A prompt corpus (apps/workloads/corpus.py): prompt texts or chat messages per class,
    redacted before it was stored, gzip-compressed, keyed like a trace by the sha256 of its
    canonical bytes; a trace replaying it names it in ``corpus_sha256``."""

    sha256 = models.CharField(max_length=64, unique=True)
    source = models.CharField(max_length=32)  # file | request-log
    label = models.CharField(max_length=200, blank=True)
    entries = models.PositiveIntegerField()
    meta = models.JSONField(default=dict)
    content_gz = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "corpora"

    def __str__(self) -> str:
        return f"{self.label or self.source} corpus {self.sha256[:12]}"
