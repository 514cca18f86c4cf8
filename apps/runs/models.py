"""Runs, the hosts that execute them, and their measurements.

Measurements live in their own rows; a measure that was not taken is NULL,
never 0.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone


class Host(models.Model):
    """A machine that serves one candidate at a time (a GPU host, or this CPU)."""

    name = models.CharField(max_length=100, unique=True)
    queue = models.CharField(max_length=100, unique=True)
    devices = models.CharField(max_length=100, blank=True)  # CUDA_VISIBLE_DEVICES
    vllm_command = models.JSONField(default=list)  # argv prefix, e.g. ["vllm", "serve"]
    # Other engine builds this host can start, by the image name a candidate's spec gives:
    # {"vllm/vllm-openai:v0.33.0": ["docker", "run", ..., "vllm/vllm-openai:v0.33.0"]}.
    engines = models.JSONField(default=dict, blank=True)
    # What the operator lets a rehearsal on this host run and reach (TAILTUNE_SWITCH_COMMANDS,
    # TAILTUNE_ROUTERS), by the name a spec's ``recovery.switch`` / ``recovery.router`` gives:
    # {"drain-a": ["/opt/ops/switch", "{candidate_url}"]} and
    # {"prod": {"url": "http://router:8080", "backend_header": "x-backend"}}.
    switches = models.JSONField(default=dict, blank=True)
    routers = models.JSONField(default=dict, blank=True)
    # The directories a candidate's model path may lie under on this host (absolute paths).
    model_roots = models.JSONField(default=list, blank=True)
    bind_host = models.CharField(max_length=100, default="127.0.0.1")
    max_model_len = models.PositiveIntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    hardware_id = models.CharField(max_length=300, blank=True)
    # Digest of the container image the vLLM command runs (empty for a local install,
    # whose version and RECORD hash the engine records instead).
    image_digest = models.CharField(max_length=300, blank=True)
    # What one GPU of this host costs per hour (TAILTUNE_USD_PER_GPU_HOUR), for the report's
    # cost per 1M output tokens; null: not given.
    usd_per_gpu_hour = models.FloatField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    worker_pid = models.IntegerField(null=True, blank=True)
    # The worker's start time (clock ticks since boot, /proc/<pid>/stat field 22): a recovering
    # worker signals the recorded pid only while it still belongs to that process.
    worker_pid_start = models.BigIntegerField(null=True, blank=True)
    # Lease: the run this host is serving now; claimed with a conditional update.
    current_run = models.OneToOneField(
        "runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="leased_host"
    )
    # Server processes this host's worker started and has not yet reaped.
    server_pids = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return self.name


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        STARTING = "starting"
        WARMING = "warming"
        MEASURING = "measuring"
        DRAINING = "draining"
        DONE = "done"
        INVALID = "invalid"
        FAILED = "failed"
        CANCELLED = "cancelled"
        # Never started: its cell can no longer be accepted (early stopping); the reason names
        # the run and the class and metric that settled it.
        SKIPPED = "skipped"

    class Kind(models.TextChoices):
        """What a run is: the one field that says so (``scenario`` only names a ``scenario`` run's scenario)."""

        SWEEP = "sweep"  # a (cell, mixture, rate, repeat) of the plan: the decision's data
        UNIFORM = "uniform"  # the uniform-spacing companion of a sweep trace
        CALIBRATION = "calibration"  # a capacity-probe or goodput-search step, run inline
        PACE = "pace"  # B0's decode-pace probe that sizes the failure scenarios, run inline
        SCENARIO = "scenario"  # a failure scenario (docs/SCENARIOS.md)
        REHEARSAL = "rehearsal"  # the rollback rehearsal of the proposed cell (check 4)
        # A search's screening run of one trial at the screening point (docs/SEARCH.md): scored
        # onto its SearchTrial, never part of the report's sweep, checks or verdict.
        SCREEN = "screen"

    # The capacity probe's steps, goodput searches and the pace probe: run inline, kept out of the sweep.
    PROBES = frozenset({Kind.CALIBRATION, Kind.PACE})
    FINISHED = {"done", "invalid", "failed", "cancelled", "skipped"}
    ACTIVE = {"starting", "warming", "measuring", "draining"}

    run_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    experiment = models.ForeignKey("experiments.Experiment", on_delete=models.CASCADE, related_name="runs")
    cell = models.ForeignKey("experiments.ServerConfig", on_delete=models.CASCADE, related_name="runs")
    mixture = models.CharField(max_length=64)
    rate_name = models.CharField(max_length=64)
    rate_rps = models.FloatField()
    repeat = models.PositiveIntegerField()
    # Position inside its repeat round (a randomised order per round) and in the whole plan.
    round_position = models.PositiveIntegerField()
    plan_position = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.SWEEP, db_index=True)
    # The failure scenario's name (apps/workloads/scenario_layouts.SCENARIOS, or the priority check)
    # of a ``scenario`` run; empty for every other kind (the constraint below holds them together).
    scenario = models.CharField(max_length=64, blank=True)
    trace = models.ForeignKey("workloads.Trace", null=True, blank=True, on_delete=models.PROTECT)
    trace_sha256 = models.CharField(max_length=64, blank=True)
    corpus_sha256 = models.CharField(max_length=64, blank=True)
    image_digest = models.CharField(max_length=300, blank=True)
    vllm_version = models.CharField(max_length=100, blank=True)
    model_revision = models.CharField(max_length=200, blank=True)
    tokenizer_revision = models.CharField(max_length=200, blank=True)
    hardware_id = models.CharField(max_length=300, blank=True)
    effective_args = models.JSONField(null=True, blank=True)
    # The sampling settings every request of the run carried, as the load generator reports
    # sending them (controls.generation; null: not recorded, e.g. a run that never replayed).
    generation = models.JSONField(null=True, blank=True)
    warmup_seconds = models.FloatField()
    observation_seconds = models.FloatField()
    drain_deadline_seconds = models.FloatField()

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    reason = models.TextField(blank=True)
    # When the run became runnable: hosts pull only dispatched queued runs (apps/runs/scheduling.py).
    # A queued run's ``host`` is the host that reserved it (the rest of its cell's round, kept for
    # the server that host has up); null: any qualifying host may take it.
    dispatched_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # A run that failed through no fault of the candidate (host lost, worker
    # killed) is re-run once as a new row; the failed one stays as evidence.
    # While the run goes: the newest scraped gauges, written every couple of seconds for the live
    # page (the samples themselves are stored at the end of the run).
    live = models.JSONField(default=dict, blank=True)
    retry_of = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retry"
    )
    host = models.ForeignKey(Host, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs")
    server_pid = models.IntegerField(null=True, blank=True)
    log_path = models.CharField(max_length=500, blank=True)
    log_tail = models.TextField(blank=True)

    # Progress, written by the worker so the UI never has to ask it.
    requests_planned = models.PositiveIntegerField(null=True, blank=True)
    requests_sent = models.PositiveIntegerField(default=0)
    # Validity of the load generator itself.
    dispatch_lag_p50_ms = models.FloatField(null=True, blank=True)
    dispatch_lag_p99_ms = models.FloatField(null=True, blank=True)
    dispatch_lag_max_ms = models.FloatField(null=True, blank=True)
    achieved_rate_rps = models.FloatField(null=True, blank=True)
    summary = models.JSONField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    measuring_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["plan_position", "id"]
        indexes = [models.Index(fields=["experiment", "status"])]
        constraints = [
            models.CheckConstraint(
                name="run_scenario_only_on_scenario_kind",
                condition=(
                    (models.Q(kind="scenario") & ~models.Q(scenario=""))
                    | (~models.Q(kind="scenario") & models.Q(scenario=""))
                ),
            )
        ]

    def __str__(self) -> str:
        return f"{self.cell.cell_id}/{self.mixture}/{self.rate_name}/r{self.repeat}"

    @property
    def scenario_label(self) -> str:
        """What the pages, the export and the report call the run's scenario (the wording they had
        before ``kind``): the failure scenario's name, the kind of a uniform, calibration or
        rehearsal or screening run ("calibration" for a pace run too), "" for a sweep run."""
        return self.scenario if self.kind == self.Kind.SCENARIO else SCENARIO_LABEL_OF_KIND[self.kind]


# Run.scenario_label of the kinds that are not a failure scenario (the report's "scenario" of a run,
# apps/analysis/checks.py's CALIBRATION_SCENARIO, UNIFORM_SCENARIO and REHEARSAL_SCENARIO).
SCENARIO_LABEL_OF_KIND: dict[str, str] = {
    Run.Kind.SWEEP: "",
    Run.Kind.UNIFORM: "uniform",
    Run.Kind.CALIBRATION: "calibration",
    Run.Kind.PACE: "calibration",
    Run.Kind.REHEARSAL: "rehearsal",
    Run.Kind.SCREEN: "screen",
}


class RequestRecord(models.Model):
    """One replayed request, as the load generator observed it.

    Times are nanoseconds from the run's origin (perf_counter_ns); NULL means
    never observed. An experiment can hold millions of these: rows are written
    in bulk (COPY on Postgres) and (run, index) is unique, so a retried batch
    can never double a measurement.
    """

    # No index of its own: the unique (run, index) constraint's index leads with run and serves
    # every lookup by run; a third index on the table was an eighth of a COPY's time
    # (bench/results/ingest.md, 2026-12-04). No foreign key constraint on the database either:
    # its check, one query per row, was two thirds of the server's time for a batch. What the
    # check kept is kept otherwise (migration 0019): the ingest locks the run's row once per
    # batch, as the check would (apps/runs/ingest.py ``_accepting``), and the database refuses to
    # delete (or renumber) a run that still has records. Django's CASCADE deletes the records
    # first, as before.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="records", db_index=False, db_constraint=False
    )
    index = models.PositiveIntegerField()
    request_class = models.CharField(max_length=64)
    warmup = models.BooleanField(default=False)
    priority = models.IntegerField(default=0)
    input_tokens = models.PositiveIntegerField()
    expected_output_tokens = models.PositiveIntegerField()
    planned_ns = models.BigIntegerField()
    sent = models.BooleanField(default=True)
    sent_ns = models.BigIntegerField(null=True)
    admission_delay_ns = models.BigIntegerField(null=True)
    first_token_ns = models.BigIntegerField(null=True)
    last_token_ns = models.BigIntegerField(null=True)
    end_ns = models.BigIntegerField(null=True)
    output_tokens = models.IntegerField(null=True)
    prompt_tokens = models.IntegerField(null=True)
    chunks = models.IntegerField(default=0)
    max_gap_ns = models.BigIntegerField(null=True)
    chunk_gaps = models.JSONField(default=dict)
    token_gaps = models.JSONField(default=dict)
    http_status = models.IntegerField(null=True)
    error_kind = models.CharField(max_length=16, null=True)
    error = models.TextField(null=True)
    finish_reason = models.CharField(max_length=32, null=True)
    cancelled = models.BooleanField(default=False)
    unfinished = models.BooleanField(default=False)
    # Recovery rehearsals (workers/replay/rehearsal_client.py): cut at the drain deadline after the
    # switch, and the server that answered; False and "" for every other run.
    cut = models.BooleanField(default=False)
    backend = models.CharField(max_length=64, blank=True, default="")
    # The server's own timings of the request, in nanoseconds (durations, not times from the
    # origin), from vLLM's span of it joined by request id after the run (workers/engine/spans.py);
    # NULL where no span was joined (docs/ANALYSIS.md, "The server's own timings").
    server_queue_ns = models.BigIntegerField(null=True)
    server_prefill_ns = models.BigIntegerField(null=True)
    server_decode_ns = models.BigIntegerField(null=True)
    server_ttft_ns = models.BigIntegerField(null=True)
    server_e2e_ns = models.BigIntegerField(null=True)
    # Times, not durations: the server's arrival and first token of the request, its clock moved
    # onto the replay's (ns from the origin, like sent_ns); a priority order is read from them.
    server_arrival_ns = models.BigIntegerField(null=True)
    server_first_token_ns = models.BigIntegerField(null=True)

    class Meta:
        # The unique (run, index) index is the table's only index besides the primary key's: it
        # serves every lookup by run. A (run, request_class) index cost each record an eighth of
        # the server's time in a COPY and saved the per-run grouped reads one to two milliseconds
        # (bench/results/ingest.md, 2026-12-04, later).
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="uniq_record_per_run_index")]

    def __str__(self) -> str:
        return f"run {self.run_id} request {self.index}"


class MetricSample(models.Model):
    """One value scraped from the server's /metrics during a run.

    ``phase`` is before / during / after the measured window; ``epoch`` counts
    server restarts seen inside the run (a counter that went down), so deltas
    are only ever taken within one epoch.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_samples")
    t_ns = models.BigIntegerField()
    taken_at = models.DateTimeField(default=timezone.now)
    phase = models.CharField(max_length=16)
    epoch = models.PositiveIntegerField(default=0)
    name = models.CharField(max_length=200)
    labels = models.JSONField(default=dict)
    kind = models.CharField(max_length=16)  # counter | gauge | histogram | info
    value = models.FloatField(null=True)
    # For histograms: {"buckets": [[le, cumulative_count], ...], "sum": s, "count": n}
    histogram = models.JSONField(null=True)
    # Whose /metrics: "" the run's own server; "b0" the standby B0 of a recovery rehearsal.
    server = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["run", "name"])]

    def __str__(self) -> str:
        return f"{self.name} {self.value}"


class RunDigest(models.Model):
    """A done run's records as the report reads them, packed once (apps/analysis/run_digest.py).

    Derived, never evidence: the records stay the measurement and the digest is rebuilt from
    them whenever it is missing, of another ``version``, or dropped because a record of the run
    was written after it was packed (apps/runs/ingest.py). The report then reads one row per
    run instead of every record: the columns as numpy arrays in one ``np.savez`` blob, the gap
    histograms already merged per class over the run's observation window, and the stop reasons
    counted per class.
    """

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="digest")
    version = models.PositiveSmallIntegerField()
    records = models.PositiveIntegerField()  # how many records it packs
    columns = models.BinaryField()  # np.savez of the packed columns (run_digest.pack)
    class_names = models.JSONField(default=list)  # the run's classes, sorted; "cls" codes index it
    token_gaps = models.JSONField(default=dict)  # class -> bucket -> weight, observation window only
    chunk_gaps = models.JSONField(default=dict)
    stop_reasons = models.JSONField(default=dict)  # class -> finish reason ("none") -> requests
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"digest of run {self.run_id} ({self.records} records, v{self.version})"
