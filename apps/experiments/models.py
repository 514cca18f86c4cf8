"""An experiment: baseline B0, candidate cells, request classes and the workload."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models, transaction

from apps.experiments.spec_types import CandidateEngine
from apps.experiments.workload_fields import WORKLOAD_FIELD as SCALAR


class RunsRefused(ValueError):
    """No run or record may be added to the experiment now; the message says which status and why."""


# The one rule for adding evidence: which kinds of runs (runs.Run.Kind), and so which of their
# records and metric samples, an experiment of each status still takes. None: any kind. Every
# writer of runs.Run, RequestRecord and MetricSample asks Experiment.assert_accepts_runs first
# (tests/experiments/test_accepts_runs.py walks them, and fails on a writer it does not list).
# - approved, rejected, revoked: a person decided; the evidence behind a verdict never changes.
# - analysed: the decision is being made on the evidence as it stands. Only the rollback
#   rehearsal (check 4) is part of deciding, so only it may still add runs (and their records).
# - cancelled is not a decision: the plan can be started again, and a run cut short keeps the
#   records it wrote; draft, planned and running take everything.
REHEARSAL_KIND = "rehearsal"
RUN_KINDS_ACCEPTED: dict[str, frozenset[str] | None] = {
    "draft": None,
    "planned": None,
    "running": None,
    "cancelled": None,
    "analysed": frozenset({REHEARSAL_KIND}),
    "approved": frozenset(),
    "rejected": frozenset(),
    "revoked": frozenset(),
}


def runs_refusal(status: str, kind: str) -> str | None:
    """Why an experiment of ``status`` takes no run (or record) of ``kind``; None when it does."""
    accepted = RUN_KINDS_ACCEPTED.get(status, frozenset())
    if accepted is None or kind in accepted:
        return None
    if status == "analysed":
        return (
            "its decision is being made on the evidence it holds, and only the rollback rehearsal "
            "(check 4) may still add to it; measure anything else in a new experiment"
        )
    if status in RUN_KINDS_ACCEPTED:
        return (
            "a person decided it, and the evidence behind a verdict never changes; no run or record "
            "is added to it (measure in a new experiment)"
        )
    return "no run or record is added to an experiment in this status"


def runs_refuse(pk: int, status: str, kind: str) -> None:
    """Raise RunsRefused when experiment ``pk``, read in ``status``, takes no run (or record) of ``kind``."""
    reason = runs_refusal(status, kind)
    if reason is not None:
        raise RunsRefused(f"experiment {pk} is {status}: {reason}")


class Experiment(models.Model):
    class Status(models.TextChoices):
        DRAFT = "draft"
        PLANNED = "planned"
        RUNNING = "running"
        ANALYSED = "analysed"
        APPROVED = "approved"
        REJECTED = "rejected"
        REVOKED = "revoked"
        CANCELLED = "cancelled"

    # Every status change an experiment makes; apps/lifecycle/transition.py writes each one and
    # refuses any other (IllegalTransition). By the step that makes it:
    # - -> planned: the plan is made (draft), or replaced before it started (planned); the freeze
    #   or the capacity probe failed, or the reconciler found the freeze lost (running); planned
    #   again after a cancel.
    # - -> running: started (planned, cancelled); a rollback rehearsal queued (check 4): by hand
    #   while the experiment awaits approval (analysed), or by the analysis, which finds it running.
    #   An analysed experiment takes that one kind of run only (RUN_KINDS_ACCEPTED).
    # - -> analysed: every run finished and the analysis ran (running); results imported from
    #   another machine, from any status in ANALYSED_BY_IMPORT.
    # - -> cancelled: by its author, or by the reconciler when the analysis keeps failing.
    # - -> approved, rejected: a person decided (analysed); -> revoked: the approval withdrawn.
    TRANSITIONS: dict[str, frozenset[str]] = {
        "draft": frozenset({"planned", "cancelled", "analysed"}),
        "planned": frozenset({"planned", "running", "cancelled", "analysed"}),
        "running": frozenset({"analysed", "cancelled", "planned", "running"}),
        "analysed": frozenset({"approved", "rejected", "running", "analysed"}),
        "approved": frozenset({"revoked"}),
        "rejected": frozenset(),
        "revoked": frozenset(),
        "cancelled": frozenset({"planned", "running", "analysed"}),
    }
    # ``manage.py results_import`` analyses from any status a person has not decided (an analysed
    # experiment imported again is analysed again): its rows of TRANSITIONS all lead to analysed.
    ANALYSED_BY_IMPORT = frozenset({"draft", "planned", "running", "analysed", "cancelled"})

    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="experiments")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT, db_index=True)
    status_reason = models.TextField(blank=True)

    # Frozen controls: identical for every cell, so only scheduler args vary.
    model_path = models.CharField(max_length=500)
    model_revision = models.CharField(max_length=200)
    tokenizer_revision = models.CharField(max_length=200)
    dtype = models.CharField(max_length=32, default="auto")
    tensor_parallel_size = models.PositiveIntegerField(default=1)
    max_model_len = models.PositiveIntegerField()
    gpu_memory_utilization = models.FloatField(null=True, blank=True)
    kv_cache_memory_bytes = models.BigIntegerField(null=True, blank=True)
    enable_prefix_caching = models.BooleanField(default=False)
    speculative_decoding = models.BooleanField(default=False)
    engine_seed = models.IntegerField(default=0)
    generation = models.JSONField(default=dict, blank=True)
    engine_image = models.CharField(max_length=300, blank=True)
    # The hardware every run of the experiment runs on: the hardware id of the first host it
    # started on (apps/runs/scheduling.py); hosts with another id take none of its runs.
    hardware_id = models.CharField(max_length=300, blank=True)

    # The spec as imported, kept verbatim so an export round-trips exactly.
    spec = models.JSONField(default=dict)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"

    def controls(self) -> dict[str, Any]:
        """The frozen controls in the spec's form (unset optional ones left out)."""
        controls: dict[str, Any] = {
            "dtype": self.dtype,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "enable_prefix_caching": self.enable_prefix_caching,
            "speculative_decoding": self.speculative_decoding,
            "seed": self.engine_seed,
            "generation": self.generation,
        }
        if self.gpu_memory_utilization is not None:
            controls["gpu_memory_utilization"] = self.gpu_memory_utilization
        if self.kv_cache_memory_bytes is not None:
            controls["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
        return controls

    # A person decided: the evidence is frozen (no re-analysis, no import, no new runs).
    DECIDED = frozenset({"approved", "rejected", "revoked"})

    def can_transition(self, to: str) -> bool:
        return to in self.TRANSITIONS.get(self.status, frozenset())

    def assert_accepts_runs(self, *, kind: str) -> None:
        """Raise RunsRefused unless the experiment may gain a run (or records of a run) of ``kind``.

        The status is read from the database, not from this instance (a worker's copy may be
        hours old); inside a transaction the row is locked as an approval locks it, so no
        approval lands between this check and the caller's write.
        """
        rows = Experiment.objects.filter(pk=self.pk)
        if transaction.get_connection().in_atomic_block:
            rows = rows.select_for_update()
        status = rows.values_list("status", flat=True).first()
        if status is None:
            raise RunsRefused(f"experiment {self.pk} does not exist")
        runs_refuse(self.pk, status, kind)


class CellManager(models.Manager["ServerConfig"]):
    """The cells an experiment's plan, report, pages and manifests hold: every one but a search's
    screening trials that are not confirmed (role ``trial``). Those are cells only so that their
    screening run has a server config to start; until confirmed they are no candidate, and a
    report listing them would show incomplete candidates (docs/SEARCH.md). The lifecycle of a
    search reaches them through ``ServerConfig.with_trials``."""

    def get_queryset(self) -> models.QuerySet[ServerConfig]:
        return super().get_queryset().exclude(role=ServerConfig.Role.TRIAL)


class ServerConfig(models.Model):
    """One cell of the grid: B0 or a candidate, as vLLM scheduler args; or a search's screening
    trial (role ``trial``), which becomes a candidate when it is confirmed."""

    class Role(models.TextChoices):
        BASELINE = "baseline"
        CANDIDATE = "candidate"
        TRIAL = "trial"  # a search's screened config, not (yet) confirmed: hidden by ``objects``

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="cells")
    cell_id = models.CharField(max_length=32)
    role = models.CharField(max_length=16, choices=Role.choices)
    args = models.JSONField(default=dict)
    captured_from = models.TextField(blank=True)
    position = models.PositiveIntegerField(default=0)
    # A candidate that is another engine build or model revision (blank: the experiment's).
    engine_image = models.CharField(max_length=200, blank=True, default="")
    model_revision = models.CharField(max_length=200, blank=True, default="")
    # An A/A cell (the spec's ``control: true``): B0's effective config run again, planned and run
    # like every cell; the report shows its difference from B0 as the measured noise floor and
    # never recommends it (apps/analysis/decide.py).
    control = models.BooleanField(default=False)

    # The default manager (and so ``experiment.cells``) leaves unconfirmed trials out.
    objects = CellManager()
    with_trials = models.Manager["ServerConfig"]()

    class Meta:
        ordering = ["position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["experiment", "cell_id"], name="uniq_cell_per_experiment"),
        ]

    def __str__(self) -> str:
        return self.cell_id

    @property
    def engine(self) -> CandidateEngine:
        """The spec's ``engine`` override of this cell: only what differs from the experiment's."""
        out: CandidateEngine = {}
        if self.engine_image:
            out["image"] = self.engine_image
        if self.model_revision:
            out["model_revision"] = self.model_revision
        return out

    def revision(self, experiment: Experiment) -> str:
        return self.model_revision or experiment.model_revision


class RequestClass(models.Model):
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="classes")
    name = models.CharField(max_length=64)
    input_tokens = models.PositiveIntegerField()
    output_tokens = models.PositiveIntegerField()
    priority = models.IntegerField(default=0)
    shared_prefix_tokens = models.PositiveIntegerField(default=0)
    # The contract this class must keep.
    ttft_p99_ms = models.FloatField()
    e2e_p99_ms = models.FloatField()
    max_stall_ms = models.FloatField()
    error_rate = models.FloatField()
    # The metric a gain of this class is judged on (apps/analysis/family.py); "" = by role.
    primary_metric = models.CharField(max_length=32, blank=True, default="")
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["experiment", "name"], name="uniq_class_per_experiment"),
        ]

    def __str__(self) -> str:
        return self.name


class Workload(models.Model):
    """The experiment's traffic. The scalars' defaults (and their bounds, labels and help) are
    declared once in apps/experiments/workload_fields.py."""

    class Arrival(models.TextChoices):
        CONSTANT = "constant"
        POISSON = "poisson"
        GAMMA = "gamma"
        TRACE = "trace"

    experiment = models.OneToOneField(Experiment, on_delete=models.CASCADE, related_name="workload")
    mixtures = models.JSONField(default=dict)  # name -> {class: weight by request count}
    rates = models.JSONField(default=dict)  # name -> req/s
    # mixture -> {rate name: req/s}: a mixture's own rates (typed, or frozen from its
    # probed capacity); a mixture not listed uses ``rates``.
    mixture_rates = models.JSONField(default=dict, blank=True)
    rates_source = models.CharField(max_length=16, default="manual")  # manual | probe
    rates_derivation = models.JSONField(default=dict, blank=True)
    arrival_process = models.CharField(max_length=16, choices=Arrival.choices, default=Arrival.POISSON)
    arrival_cv = models.FloatField(null=True, blank=True)
    imported_trace_sha256 = models.CharField(max_length=64, blank=True)
    repeats = models.PositiveIntegerField(default=SCALAR["repeats"].default)
    # same: every repeat replays the (mixture, rate)'s one frozen trace; fresh: one trace per repeat.
    repeat_traces = models.CharField(max_length=8, default=SCALAR["repeat_traces"].default)
    # exact: every request decodes exactly its output_tokens; natural: output_tokens is a cap.
    output_mode = models.CharField(max_length=8, default=SCALAR["output_mode"].default)
    # The quality probe's frozen prompt set (a stored trace), set at freeze when the spec has one.
    quality_probe_sha256 = models.CharField(max_length=64, blank=True)
    seed = models.BigIntegerField(default=SCALAR["seed"].default)
    warmup_s = models.FloatField(default=SCALAR["warmup_s"].default)
    observation_s = models.FloatField(default=SCALAR["observation_s"].default)
    drain_deadline_s = models.FloatField(default=SCALAR["drain_deadline_s"].default)
    max_dispatch_lag_ms = models.FloatField(default=SCALAR["max_dispatch_lag_ms"].default)

    def __str__(self) -> str:
        return f"workload of {self.experiment_id}"

    def rate_for(self, mixture: str, rate_name: str) -> float:
        """The req/s of one (mixture, rate): the mixture's own when it has one, else the shared one."""
        own = (self.mixture_rates or {}).get(mixture) or {}
        return float(own[rate_name] if rate_name in own else self.rates[rate_name])


class TraceUpload(models.Model):
    """A real trace uploaded, imported by a worker, not the web request.

    The web process streams the file to disk (``path``), checks the fields and saves this row;
    the ``tailtune.import_trace`` task parses the file, cuts the busiest window, builds the
    prompts and stores the trace, all in one transaction (apps/lifecycle/trace_upload.py). What
    else it makes is the ``kind``'s: the create page's experiment (from ``spec``), nothing for a
    trace uploaded alone (``POST /api/v1/traces``: it keeps ``trace_sha256``), or a gate's
    experiment, started (``POST /api/v1/gates``, apps/gate/uploads.py).
    A file that does not parse leaves ``errors`` (each naming its field and line) and nothing else.
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        IMPORTING = "importing"
        DONE = "done"
        FAILED = "failed"

    class Kind(models.TextChoices):
        EXPERIMENT = "experiment"
        TRACE = "trace"
        GATE = "gate"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.EXPERIMENT)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    # The validated spec the experiment is created from (kind experiment only).
    spec = models.JSONField(null=True, blank=True)
    # Kind trace: label, and for an imported format model_dir, tokenizer_revision and
    # max_model_len. Kind gate: the gate request's fields as the API took them.
    options = models.JSONField(default=dict, blank=True)
    trace_sha256 = models.CharField(max_length=64, blank=True)
    file_name = models.CharField(max_length=255)
    path = models.CharField(max_length=1024)  # the stored upload, deleted once imported
    size_bytes = models.BigIntegerField()
    trace_format = models.CharField(max_length=32)
    thresholds = models.JSONField()  # [[class, max input tokens or null], ...]
    busiest_s = models.FloatField(null=True, blank=True)
    errors = models.JSONField(default=list, blank=True)
    experiment = models.OneToOneField(
        Experiment, null=True, blank=True, on_delete=models.SET_NULL, related_name="trace_upload"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"upload {self.pk} ({self.file_name}, {self.status})"
