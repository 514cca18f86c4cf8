"""Results for UI tests: runs marked done with records, scrapes and a real analysis on top."""

from __future__ import annotations

import random
from typing import Any

from django.utils import timezone

from apps.experiments.models import Experiment
from apps.runs.models import MetricSample, RequestRecord, Run

MS = 1_000_000


def seed_records(run: Run, *, per_run: int, slow: float = 1.0, rng: random.Random) -> None:
    """``per_run`` measured requests (plus a few warm-up ones) spread over the run's windows."""
    classes = list(run.experiment.classes.all())
    warm_ns = int(run.warmup_seconds * 1e9)
    obs_ns = int(run.observation_seconds * 1e9)
    rows = []
    for i in range(per_run + 3):
        cls = classes[i % len(classes)]
        warmup = i < 3
        planned = rng.randrange(0, warm_ns) if warmup else warm_ns + rng.randrange(0, obs_ns)
        ttft = int((40 if cls.input_tokens < 512 else 400) * slow * (1 + rng.random()) * MS)
        first = planned + ttft
        last = first + int(cls.output_tokens * 15 * MS)
        rows.append(
            RequestRecord(
                run=run,
                index=i,
                request_class=cls.name,
                warmup=warmup,
                input_tokens=cls.input_tokens,
                expected_output_tokens=cls.output_tokens,
                planned_ns=planned,
                sent_ns=planned + 100_000,
                admission_delay_ns=0,
                first_token_ns=first,
                last_token_ns=last,
                end_ns=last + 100_000,
                output_tokens=cls.output_tokens,
                prompt_tokens=cls.input_tokens,
                chunks=cls.output_tokens,
                max_gap_ns=int(30 * slow * MS),
                http_status=200,
                finish_reason="length",
            )
        )
    RequestRecord.objects.bulk_create(rows)


def seed_samples(run: Run, *, points: int = 12) -> None:
    samples = []
    for k in range(points):
        t = int(k * 1e9)
        for name, value in (
            ("vllm:num_requests_waiting", float(k % 4)),
            ("vllm:num_requests_running", float(2 + k % 3)),
            ("vllm:kv_cache_usage_perc", 0.1 + 0.05 * (k % 5)),
            ("vllm:num_preemptions_total", float(k // 4)),
        ):
            kind = "counter" if name.endswith("_total") else "gauge"
            samples.append(MetricSample(run=run, t_ns=t, phase="during", name=name, kind=kind, value=value))
    MetricSample.objects.bulk_create(samples)


def finish_runs(experiment: Experiment, *, per_run: int = 40, seed: int = 1) -> None:
    """Every run done, with identical hashes per (mixture, rate, repeat), records and scrapes."""
    rng = random.Random(seed)
    now = timezone.now()
    for run in experiment.runs.select_related("cell", "experiment"):
        run.status = Run.Status.DONE
        run.trace_sha256 = f"{run.mixture}-{run.rate_name}-{run.repeat}".ljust(64, "0")[:64]
        run.corpus_sha256 = f"corpus-{run.mixture}-{run.repeat}".ljust(64, "0")[:64]
        run.hardware_id = "cpu-test"
        run.image_digest = "sha256:" + "ab" * 32
        run.vllm_version = "0.32.0"
        run.effective_args = {**run.cell.args, "max_model_len": experiment.max_model_len}
        run.dispatch_lag_p99_ms = 1.0
        run.requests_planned = per_run + 3
        run.requests_sent = per_run + 3
        run.started_at = now - timezone.timedelta(seconds=40)
        run.measuring_at = now - timezone.timedelta(seconds=30)
        run.finished_at = now
        run.log_tail = "INFO started\nINFO Application startup complete."
        run.save()
        slow = 1.0 if run.cell.role == "baseline" else 0.6
        seed_records(run, per_run=per_run, slow=slow, rng=rng)
        seed_samples(run)


def analysed(experiment: Experiment, **kwargs: Any) -> Experiment:
    """Finish every run, run the real analysis and mark the experiment analysed."""
    from apps.analysis.services import experiment_analyse

    finish_runs(experiment, **kwargs)
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    experiment_analyse(experiment_id=experiment.pk)
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.ANALYSED)
    experiment.refresh_from_db()
    return experiment
