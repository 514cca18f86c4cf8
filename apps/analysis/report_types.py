"""The analysis report's shape: what ``report.build_report`` returns and ``Decision.report``
stores, with its verdict records (the decision, the paired comparisons, the checks, the
findings). Types only: no Django, nothing runs here.

TypedDicts, not dataclasses: the report is JSON in a JSONField, rendered by templates and
read back by the gate and the approval manifest, so its stored form stays the plain dict it
always was. Keys the code writes on every report are required; keys written later (the gain
family's marks, the seed check) or only in some outcomes are ``NotRequired``. Where a part
really is free-form JSON (a class's pooled metrics, a problem's detail), it is ``JSONObject``:
named, not typed. tests/test_typed_contracts.py checks a real report against these
declarations, so they cannot drift from what build_report produces.

No ``from __future__ import annotations`` here: on Python 3.11 a TypedDict's
``__required_keys__`` ignores ``NotRequired`` written as a string annotation. Keys named
``class`` (a keyword) use the functional form.

Over 500 lines on purpose: it is the report's whole shape, one declaration per part, and
tests/test_typed_contracts.py checks a real report against all of it in one place.
"""

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

# A value that really is arbitrary JSON: named, not typed.
JSONValue = Any
JSONObject = dict[str, JSONValue]
# One class's metrics of a run or pooled over repeats (apps/analysis/metrics.class_metrics).
ClassMetrics = JSONObject
# Decision.report as stored: the Report of its day. One stored before a key existed lacks it, so
# the pages, the gate and the manifest read a stored report with ``.get(...)`` and a default.
StoredReport = Mapping[str, JSONValue]


class CompareOptionsJSON(TypedDict):
    """compare_options.CompareOptions.to_json()."""

    resamples: int
    seed: int
    confidence: float
    min_effect_rel: float
    min_effect_abs: dict[str, float]
    family_alpha: float
    noninferiority_margin_rel: float
    contract_alpha: float
    itl_min_repeats: int
    seed_check: bool


class ReportOptionsJSON(TypedDict):
    """report_options.ReportOptions.to_json(): the report's options, and a spec's ``analysis``."""

    compare: CompareOptionsJSON
    agreed_rates: list[str] | None
    stall_ratio: float
    max_preemption_share: float
    usd_per_gpu_hour: float | None
    # Absent from reports and specs stored before it existed (the default, 0.2, applies).
    pool_headroom: NotRequired[float]


class MetricVerdict(TypedDict):
    """One metric of a paired comparison (compare.judge), then the gain family's marks."""

    b0: float | None
    candidate: float | None
    b0_censored: bool
    candidate_censored: bool
    b0_above: float | None
    candidate_above: float | None
    diff: float | None
    ci: list[float | None]
    ci_unbounded: list[bool]
    b0_repeats: list[float | None]
    candidate_repeats: list[float | None]
    repeat_diffs: list[float | None]
    repeat_std: float | None
    repeat_range: list[float | None] | None
    threshold: float | None
    improvement: float | None
    harm: float | None
    p_better: float
    p_worse: float
    p_worse_repeats: float | None
    draws: int
    noninferior: bool | None
    noninferiority_margin: float | None
    judged: bool
    note: str | None
    worse: bool
    material: bool
    direction: str  # "better" | "same" | "worse"
    # The run-level test (compare.judge; absent from reports made before it).
    p_better_bootstrap: NotRequired[float]
    p_worse_bootstrap: NotRequired[float]
    p_better_rounds: NotRequired[float]
    p_worse_rounds: NotRequired[float]
    run_sd: NotRequired[float | None]
    run_sd_rel: NotRequired[float | None]
    rounds_df: NotRequired[int | None]
    rounds_scale: NotRequired[str | None]
    # The repeats' pooled spread the gate's test allowed for, relative (0.18: runs 18% apart).
    repeats_sd_rel: NotRequired[float | None]
    # Set by family.apply on the gain family's members.
    in_family: NotRequired[bool]
    p_better_adj: NotRequired[float]
    # Set by the seed check (paired.judge_sweep) when it ran.
    borderline: NotRequired[bool]


# One candidate against B0 at a (mixture, rate, class); ``primary`` and ``repairs`` are set by
# family.apply, which every report runs.
Comparison = TypedDict(
    "Comparison",
    {
        "cell": str,
        "mixture": str,
        "rate": str,
        "class": str,
        "requests": list[int],
        "level": str | None,
        "metrics": dict[str, MetricVerdict],
        # The spread between whole runs of the class's primary metric (noise_floor.noise_floor).
        "noise_floor": NotRequired[JSONObject],
        "primary": NotRequired[str | None],
        "repairs": NotRequired[list[str]],
    },
)


class FamilySummary(TypedDict):
    """family.apply's summary of the gain family."""

    alpha: float
    size: int
    gains: int
    method: str
    not_judged: list[str]


class StatisticsFamily(FamilySummary):
    planned_size: int


class Statistics(TypedDict):
    family: StatisticsFamily
    resamples: int
    block: str
    seed: int
    borderline_comparisons: int
    notes: list[str]
    power: list[JSONObject]  # per agreed (mixture, rate, class); a note instead where not judged


class ConsideredCandidate(TypedDict):
    """A candidate as the decision weighed it (decide.decide)."""

    cell: str
    eligible: bool
    reasons: list[str]
    min_goodput_gain: float | None
    worst_p99_ratio: float | None
    material_better: list[list[str]]
    material_worse: list[list[str]]
    not_shown_noninferior: list[list[str]]
    not_repaired: list[list[str]]
    rejected_by: list[JSONObject]
    # A search experiment's confirmed cell: its worst class margin to its contract (decide.by_margin).
    confirmed_margin: NotRequired[float | None]


class DecisionEvidence(TypedDict, total=False):
    """What the decision rests on: B0's problems when it is inconclusive for lack of B0, else
    the candidates weighed (and the passing cells when B0 breaks a contract)."""

    problems: list[JSONObject]
    b0_meets_contracts: bool
    candidates: list[ConsideredCandidate]
    b0_failures: list[JSONObject]
    passing: list[str]
    passing_invalid: list[str]
    # Comparisons the decision could not settle, each with what this design detects and the
    # repeats or window that would detect the difference seen (apps/analysis/rule_text.py).
    unsettled: list[JSONObject]
    # B0 overloaded at an agreed point: those points, and the advice the decision would have given.
    overload: list[JSONObject]
    advice_not_applicable: JSONObject


class SeedCheck(TypedDict):
    seed: int
    outcome: str
    chosen_cell: str
    borderline: bool


class Decision(TypedDict):
    """retain / retune / isolate / inconclusive, the cell chosen and why (decide.decide)."""

    outcome: str
    chosen_cell: str
    rule: str
    evidence: DecisionEvidence
    seed_check: NotRequired[SeedCheck]  # when the comparison ran under a second seed


class ValidityCheck(TypedDict):
    status: str
    invalid_cells: list[str]
    baseline_valid: bool
    problems: list[JSONObject]  # each names its cell and problem, with the detail it has
    warnings: list[str]
    reference: JSONObject
    max_dispatch_lag_ms: float | None
    worst_dispatch_lag_p99_ms: float | None


class CellAcceptance(TypedDict):
    passed: bool
    failures: list[JSONObject]
    checked: int


class AcceptanceCheck(TypedDict):
    status: str
    rule: str
    cells: dict[str, CellAcceptance]
    agreed: list[list[JSONValue]]  # [mixture, rate, repeat]


class QualityCheck(TypedDict):
    status: str
    failing_cells: list[str]
    reference_run: JSONValue
    cells: dict[str, dict[str, JSONObject]]  # cell -> class -> its numbers and verdict


class ScenarioCheck(TypedDict):
    status: str
    runs: list[JSONObject]


class AttemptsTally(TypedDict):
    """How a cell's rollback rehearsal attempts came out (apps/analysis/rehearsal.attempts_tally)."""

    summary: str  # what an approver reads first: "3 attempts, 2 failed"
    passed: int
    failed: int
    invalid: int
    pending: int


class RehearsalAttempt(TypedDict):
    """One rollback rehearsal attempt of a cell, in the order they were queued
    (apps/analysis/services.rehearsal_inputs; its outcome: rehearsal.attempt_outcome)."""

    attempt: int  # 1, 2, ...
    run: str
    status: str  # the run's status
    outcome: str  # "passed" | "failed" | "invalid" | "pending"
    why: str  # why it did not pass ("" when it passed)
    requeued_by_service: bool  # failed under a lost worker or host and queued again by the service
    requested_by: str | None  # who queued it (None: the service, after the analysis or a lost host)
    repeat_reason: str | None  # why it was rehearsed again, from the audit log (None: the first)
    queued_at: str | None  # ISO 8601
    finished_at: str | None
    time_to_recover_s: float | None
    max_recovery_s: float | None
    standby: str | None


class RehearsalEntry(TypedDict):
    """A cell's rollback rehearsals: the latest attempt's run, status, reason and full measures
    (apps/analysis/rehearsal.rehearsal_measures; None until it ends done), and every attempt."""

    run: str
    status: str
    reason: str
    measures: JSONObject | None
    attempts: NotRequired[list[RehearsalAttempt]]  # absent from reports stored before attempts were kept
    summary: NotRequired[str]


class RecoveryCheck(TypedDict):
    manifest: bool
    baseline: str | None
    status: str
    reason: str
    cell: NotRequired[str]
    run: NotRequired[JSONValue]
    measures: NotRequired[JSONObject]
    attempts: NotRequired[AttemptsTally]  # every attempt of the chosen cell, counted


class Checks(TypedDict):
    validity: ValidityCheck
    acceptance: AcceptanceCheck
    quality: QualityCheck
    failure_scenarios: ScenarioCheck
    recovery: RecoveryCheck


class FindingText(TypedDict):
    """What a finding is called and what it suggests (findings.FINDINGS)."""

    title: str
    suggests: str


class Finding(TypedDict):
    """An advisory row of the decision table that fired (findings.findings)."""

    id: str
    title: str
    suggests: str
    evidence: list[JSONObject]
    cells: list[str]


class RunWindow(TypedDict):
    warmup_s: float
    observation_s: float
    drain_deadline_s: float


class RunResult(TypedDict):
    """One run's results in the report: its identity, windows and per-class metrics."""

    key: str
    run_id: str
    cell_id: str  # the method's name (apps/runs/record_names.py); ``cell`` is its older alias
    cell: str
    mixture: str
    rate: str
    rate_rps: float | None
    repeat: int
    position: int | None  # in its repeat round (None: the run input did not say)
    scenario: str
    status: str
    reason: str
    trace_sha256: str
    corpus_sha256: str
    hardware_id: str
    model_revision: str
    tokenizer_revision: str
    image_digest: str
    vllm_version: str
    effective_args: JSONValue
    generation: JSONValue
    dispatch_lag_p99_ms: float | None
    warmup_seconds: float
    observation_seconds: float
    drain_deadline_seconds: float
    window: RunWindow  # the older alias of the three windows above
    lateness_ms: JSONObject
    tokens_per_s: float | None
    classes: dict[str, ClassMetrics]
    server: JSONObject


# One (cell, mixture, rate, class) pooled over its done repeats.
Aggregate = TypedDict(
    "Aggregate",
    {
        "cell": str,
        "mixture": str,
        "rate": str,
        "class": str,
        "repeats": list[int],
        "pooled": ClassMetrics,
        "variation": dict[str, JSONObject],
    },
)


class PartsAt(TypedDict):
    """A class's TTFT at one quantile and the parts of ONE request there (ttft_parts.py): per
    request, the request at that rank (or the nearest joined one, ``substitute``); per run, vLLM's
    histogram quantiles beside the class's client quantile (``request`` None)."""

    q: float
    ttft_ms: float | None  # the class's client TTFT at q (from the planned arrival)
    censored: bool
    above_ms: float | None
    parts: dict[str, float | None] | None  # ttft_parts.COMPONENT_KEYS -> ms; None: nothing to split
    request: dict[str, JSONValue] | None  # {"run", "index"} whose parts these are
    request_ttft_ms: float | None  # that request's TTFT: what its parts add up to
    rank: int | None  # the nearest rank k of the q-th TTFT among the pooled requests
    rank_used: int | None  # the rank of the request split (k unless substituted)
    substitute: bool
    note: str | None


# One (cell, mixture, rate, class): its TTFT split at p50 and p99 (ttft_parts.ttft_parts).
TtftPartsRow = TypedDict(
    "TtftPartsRow",
    {
        "cell": str,
        "mixture": str,
        "rate": str,
        "class": str,
        "source": str,  # "spans" (per request) | "histograms" (per run) | "none"
        "per_request": bool,
        "runs": list[str],  # the runs pooled
        "runs_total": int,  # the point's done runs
        "runs_without_spans": list[JSONObject],  # {"run", "reason"}
        "requests": int,
        "joined": int,
        "joined_share": float | None,
        "p50": PartsAt,
        "p99": PartsAt,
        "e2e_p99": JSONObject | None,  # the p99 end-to-end request's own split (ttft_parts.e2e_tail)
        "note": str,
    },
)


class TtftParts(TypedDict):
    components: list[JSONObject]  # {"key", "label", "what"}, bottom of the stack first
    min_share: float
    rows: list[TtftPartsRow]


# One class's tail at one agreed point of one cell: what bounds it (tail_bound.diagnose).
TailBound = TypedDict(
    "TailBound",
    {
        "cell": str,
        "mixture": str,
        "rate": str,
        "class": str,
        "tail": str,  # "ttft" | "e2e" | "stall": the class's primary metric's latency
        "bound": str,  # "queue" | "prefill" | "decode" | "outside the engine" | "unknown"
        "cause": str,
        "per_request": bool,
        "shares": dict[str, float | None],
        "evidence": JSONObject,
        "knobs": list[str],
        "why": str,
    },
)


# What settled a cell early stopping stopped (report.skipped_cells): the run, class and contract
# key its reason names, that run's point and its own [over, judged] count for that key.
StoppedBy = TypedDict(
    "StoppedBy",
    {
        "run": str,
        "mixture": str | None,
        "rate": str | None,
        "repeat": int | None,
        "class": str,
        "metric": str,
        "run_over": list[int] | None,
    },
)


class SkippedCell(TypedDict):
    cell: str
    reason: str
    runs: list[str]
    settled_by: NotRequired[StoppedBy]  # only when early stopping stopped the cell


# B0's load at one (mixture, rate): overload.overload_points.
OverloadPoint = JSONObject


class ReportExperiment(TypedDict):
    id: JSONValue
    name: JSONValue
    model_revision: JSONValue
    tokenizer_revision: JSONValue


class ReportCell(TypedDict):
    cell_id: str
    role: str | None
    args: JSONObject
    control: NotRequired[bool]  # only on an A/A control cell (B0's config run again)


class RecordsSummary(TypedDict):
    total: int
    cohort: int
    unknown_classes: list[str]


DiffPoint = TypedDict(
    "DiffPoint",
    {
        "cell": str,
        "mixture": str,
        "rate": str,
        "class": str,
        "metric": str,
        "diff": float | None,
        "ci": list[float | None],
        "direction": str,
    },
)


class ReportCharts(TypedDict):
    class_metrics: list[JSONObject]
    diffs: list[DiffPoint]
    preemptions_per_run: list[JSONObject]


# How an isolate decision sizes its pools (apps/analysis/pool_sizing.py).
class PoolPoint(TypedDict):
    """One agreed point as a class's pool sees it."""

    mixture: str
    rate: str
    rate_rps: float | None  # the agreed point's offered rate, all classes
    share: float  # the class's weight in the mixture (by request count)
    measured_share: float | None  # its share of B0's cohort requests there, pooled
    offered_rps: float | None  # share x rate_rps: what the class's pool must carry
    replicas: int | None  # None: not known (the capacity is not measured)
    utilisation: float | None  # offered / (replicas x capacity)


# "class" is a keyword: the functional form.
Pool = TypedDict(
    "Pool",
    {
        "class": str,
        "cell": str | None,  # the pool's config; None: no valid cell has the class's runs
        "args": JSONObject,
        "chosen_by": str,  # why this cell, in words
        "kept_contract_shared": bool | None,  # the cell kept the class's contract on shared capacity
        "sweep_best": str | None,  # the cell that served the class best on shared capacity
        "capacity": JSONObject | None,  # report_inputs.ClassCapacity of the config, as measured
        "capacity_rps": float | None,
        "how_to_measure": str | None,  # where the capacity is not measured: the command that measures it
        "points": list[PoolPoint],
        "replicas": int | None,  # the most over the agreed points; None: unknown
        "gpus": int | None,  # replicas x GPUs per server
        "sized_at": list[str] | None,  # [mixture, rate] that needs the most replicas
        "note": str,
    },
)


class PoolSizing(TypedDict):
    """Per class, the pool an isolate decision needs (pool_sizing.pool_sizing)."""

    headroom: float  # the share of each replica's capacity left unused (analysis.pool_headroom)
    rule: str
    pools: list[Pool]
    total_replicas: int | None  # None while some pool's capacity is not known
    unsized: list[
        str
    ]  # the classes whose replicas are unknown (capacity not measured, or none kept the contract)
    statement: str


class Report(TypedDict):
    """The whole experiment report (report.build_report), JSON-serialisable throughout."""

    format: str
    version: int
    experiment: ReportExperiment
    options: ReportOptionsJSON
    baseline: str
    cells: list[ReportCell]
    classes: list[JSONObject]
    records: RecordsSummary
    runs: list[RunResult]
    skipped: list[SkippedCell]
    # Per (mixture, rate): did arrivals outrun completions for B0 (apps/analysis/overload.py)?
    overload: list[OverloadPoint]
    aggregates: list[Aggregate]
    comparisons: list[Comparison]
    checks: Checks
    findings: list[Finding]
    statistics: Statistics
    decision: Decision
    output_mode: str
    stop_reasons: JSONObject
    costs: JSONObject
    rehearsals: dict[str, RehearsalEntry]
    charts: ReportCharts
    # Where each class's TTFT goes (apps/analysis/ttft_parts.py), what bounds each class's tail at
    # the agreed points (tail_bound.py; also the ``tail_bound`` finding) and the prefix cache's
    # hit rate beside the latency (prefix_cache.py). Absent from reports made before them.
    ttft_parts: NotRequired[TtftParts]
    tail_bounds: NotRequired[list[TailBound]]
    prefix_cache: NotRequired[JSONObject]
    # Added by the service that stores the report (apps/analysis/services.experiment_report_build):
    # what the servers cost, by part (apps/runs/engine_time.py); None before any run.
    engine_time: NotRequired[JSONObject | None]
    # A search experiment's screened trials, Pareto front, importances and engine-hours
    # (apps/search/selectors.search_report), passed in by the service's caller; absent for a grid.
    search: NotRequired[JSONObject]
    # Only when the decision is isolate: each class's pool, its capacity and replicas (pool_sizing.py).
    pools: NotRequired[PoolSizing]
