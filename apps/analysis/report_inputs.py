"""What build_report (apps/analysis/report.py) reads: the experiment, its cells, classes and runs,
the /metrics samples, the rollback manifest and the quality probes. Types only: no Django.

The database loader (apps/analysis/services.report_rows and the helpers beside it) produces them
from the models; the gate (apps/gate), a recorded result set (tests/analysis/recorded.py), the
synthetic sets and the benches write the same shapes as plain dicts. TypedDicts, not dataclasses,
for that reason: at run time each is the plain dict it always was, so a literal, a JSON file or
a stored report's parts are valid inputs as they stand.

Keys every caller gives and build_report reads with ``[...]`` are required; keys it reads with
``.get(...)`` and a default are ``NotRequired`` (the loader always writes them). Where a part is
free-form JSON from the spec or a model's JSONField (a cell's engine arguments, a workload's
mixtures), it stays ``JSONObject``: named, not typed.

No ``from __future__ import annotations`` here (see report_types.py): on Python 3.11 a
TypedDict's ``__required_keys__`` ignores ``NotRequired`` written as a string annotation.
"""

from typing import NotRequired, TypedDict, cast

from apps.analysis.report_types import JSONObject, JSONValue
from apps.experiments.spec_types import CandidateEngine
from apps.runs.summary_types import QualityProbeAnswers


class HostPrice(TypedDict, total=False):
    """The price per GPU-hour the host that served B0 gave, and its name, when it gave one: the
    cost per token uses it when the spec names no price."""

    host_usd_per_gpu_hour: float | None  # the query keeps only hosts that gave one
    host_name: str


class ExperimentInput(HostPrice, total=False):
    """The experiment as the report reads it; every key optional (read with a default).

    ``hardware_id`` and ``image_digest``, when given, are what every run must match (validity);
    otherwise B0's runs set the reference."""

    id: int | None
    name: str
    model_revision: str
    tokenizer_revision: str
    hardware_id: str
    image_digest: str
    generation: JSONValue  # the spec's sampling settings (apps/experiments/generation.py)
    tensor_parallel_size: int
    output_mode: str  # "exact" | "natural"
    max_dispatch_lag_ms: float | None
    mixtures: dict[str, dict[str, float]]  # mixture -> class -> weight
    # A search experiment (#36): its candidates are the confirmed cells, ranked by margin
    # (decide.decide ``by_margin``).
    search: bool
    enable_prefix_caching: bool  # the controls' prefix caching, every cell's (a frozen control)
    rates: JSONObject  # rate name -> its spec
    rates_source: str  # "manual" (typed in the spec) or "probe" (frozen from B0's measured capacity)
    capacities: dict[str, float]  # mixture -> B0's capacity (req/s) the calibration probe measured


class CellInput(TypedDict):
    """One cell of the plan: B0 (``role`` "baseline") or a candidate, with its engine arguments."""

    cell_id: str
    role: NotRequired[str]
    args: NotRequired[JSONObject]
    position: NotRequired[int]
    engine: NotRequired[CandidateEngine]  # the cell's own image or model revision, when it names one
    # An A/A control cell (the spec's ``control: true``): B0's config run again; its difference from
    # B0 is the measured noise floor and it is never recommended (paired.py, decide.py).
    control: NotRequired[bool]


class ClassInput(TypedDict):
    """One request class and its contract (p99 limits in ms, the error share allowed)."""

    name: str
    ttft_p99_ms: float
    e2e_p99_ms: float
    max_stall_ms: float
    error_rate: float
    input_tokens: NotRequired[int]
    output_tokens: NotRequired[int]
    primary_metric: NotRequired[str | None]
    quality: NotRequired[JSONObject]  # the class's quality contract (apps/analysis/quality_verdict.py)


class RunInput(TypedDict):
    """One run: ``key`` is the run id its records carry; the window in seconds from its origin."""

    key: str
    cell: str
    mixture: str
    rate: str
    repeat: int
    status: str
    warmup_s: float
    observation_s: float
    drain_deadline_s: float
    rate_rps: NotRequired[float | None]
    position: NotRequired[int]  # in its repeat round
    scenario: NotRequired[str]
    reason: NotRequired[str]
    trace_sha256: NotRequired[str]
    corpus_sha256: NotRequired[str]
    hardware_id: NotRequired[str]
    model_revision: NotRequired[str]
    tokenizer_revision: NotRequired[str]
    image_digest: NotRequired[str]
    vllm_version: NotRequired[str]
    effective_args: NotRequired[JSONValue]
    generation: NotRequired[JSONValue]
    dispatch_lag_p99_ms: NotRequired[float | None]
    # The run summary's ``server_spans`` (source, received, joined, answered, share, min_share,
    # used, reason): whether vLLM's per-request spans joined enough of its records to be used
    # (apps/analysis/ttft_parts.py). Absent or None: none recorded.
    server_spans: NotRequired[JSONObject | None]


class StoredRun(RunInput):
    """A run as the database loader reads it: its row's primary key too, which the record and
    sample queries need and the report does not (``report_run`` drops it)."""

    pk: int


def report_run(run: StoredRun) -> RunInput:
    """The run as build_report takes it: the loader's primary key left out, the rest in order."""
    return cast(RunInput, {k: v for k, v in run.items() if k != "pk"})


class SampleValue(TypedDict):
    """One /metrics sample's value: when (from the replay's origin), which series, what kind."""

    t_ns: int
    name: str
    labels: dict[str, str]
    kind: str  # "counter" | "gauge"
    value: float | None


class MetricSampleInput(SampleValue):
    """One /metrics sample of a run with its phase and the server's epoch (apps/analysis/server_metrics.py
    reads them; a restart starts a new epoch)."""

    phase: str
    epoch: int
    # A histogram's cumulative buckets, sum and count (kind "histogram"; workers/engine/scrape.py).
    histogram: NotRequired[JSONObject | None]


class RollbackInput(TypedDict):
    """Whether the approval's rollback manifest exists, and the B0 it names."""

    exists: bool
    baseline: str | None


class QualityProbeInput(QualityProbeAnswers):
    """One done sweep run's quality probe: the answers its summary keeps (trace_sha256, outputs),
    with the run and its cell (apps/analysis/quality.quality_check)."""

    run: str
    cell: str


class ClassCapacity(TypedDict):
    """One cell's measured capacity for one class alone (apps/analysis/pool_sizing.py reads it):
    the highest rate of that class's requests, alone on the cell, at which the class kept its
    contract in a capacity search (apps/lifecycle/calibration.py). ``status`` is the search's:
    "done", or "queued", "failed", "lost" (then ``capacity_rps`` is None and ``reason`` says why);
    a done search with ``capacity_rps`` None found no rate that kept the contract."""

    status: str
    capacity_rps: float | None
    bracketed: bool | None  # False: no probed rate failed, so the capacity is a lower bound
    steps: int
    source: str  # which search measured it, in words
    reason: NotRequired[str]
    lowest_rate_rps: NotRequired[float | None]  # the lowest rate the search tried


class ExperimentInputs(TypedDict):
    """build_report's ``experiment``, ``cells`` and ``classes``, as one loader returns them."""

    experiment: ExperimentInput
    cells: list[CellInput]
    classes: list[ClassInput]
