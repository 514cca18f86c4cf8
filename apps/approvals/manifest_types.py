"""The rollback manifest's shape: what ``manifest.build_manifest`` returns (from the records
``services.experiment_approve`` gathers) and ``RollbackManifest.content`` stores. Types only:
no Django, nothing runs here.

TypedDicts, not dataclasses: the content is hashed as canonical JSON and stored as the plain
dict it always was, so a declaration here changes no byte of it. tests/test_typed_contracts.py
checks a real manifest against these declarations. docs/ARCHITECTURE.md ("A manifest anyone
can verify") says what each part is for.

No ``from __future__ import annotations`` here: on Python 3.11 a TypedDict's
``__required_keys__`` ignores ``NotRequired`` written as a string annotation.

A manifest stored before a key existed may lack it, and one read back from a download
(apps/gate/build.py) is whatever the file says once its digest checks: readers of those take
a ``StoredManifest`` with ``.get(...)`` and a default.
"""

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from apps.analysis.report_types import PoolSizing
from apps.experiments.spec_types import BaselineCapture, CandidateEngine, Contract, Controls

# A value that really is arbitrary JSON (an engine's own report of its args): named, not typed.
JSONValue = Any
JSONObject = dict[str, JSONValue]
# A manifest as stored or downloaded: the ManifestDocument of its day.
StoredManifest = Mapping[str, JSONValue]


class EffectiveArgs(TypedDict):
    """The args a cell really ran with, and where that knowledge comes from (manifest.effective_args)."""

    args: JSONObject
    source: str  # manifest.CONFIRMED or manifest.REQUESTED
    confirmed_runs: int
    distinct: int
    # Only when the engine confirmed them: the test run's own values, and how many runs agreed.
    test_run_only: NotRequired[JSONObject]
    agreeing_runs: NotRequired[int]
    # Every arg of vLLM's parser the server ran with (manifest.complete_args): its parser defaults
    # overlaid with what the engine confirmed; ``complete_from`` says from what, or why there is
    # none (no flag catalogue for the engine's version). Absent from manifests written before.
    complete: NotRequired[JSONObject]
    complete_from: NotRequired[str]


class CellRecord(TypedDict):
    """One cell as its done sweep runs ran it (services._cell_record); "" where no run said."""

    cell_id: str
    effective_args: EffectiveArgs
    requested_args: JSONObject
    image_digest: str
    vllm_version: str
    hardware_id: str


class ModelRef(TypedDict):
    path: str
    revision: str


class Deployment(TypedDict):
    """Where B0 runs now: the approver's own fields, never guessed."""

    revision: str
    captured_from: str
    route_target: str


class HealthProbe(TypedDict):
    path: str
    expect_status: int
    interval_s: float
    timeout_s: float


class RollbackReserve(TypedDict):
    """The capacity that must stay reserved so that B0 can take the traffic back."""

    servers_per_candidate_server: int
    gpus_per_server: int
    gpu_memory_utilization: float | None
    kv_cache_memory_bytes: int | None
    standby: str  # "warm" | "cold"
    max_recovery_s: float | None
    statement: str


class Capacity(TypedDict):
    hardware_id: str | None
    tensor_parallel_size: int
    gpu_memory_utilization: float | None
    kv_cache_memory_bytes: int | None
    max_model_len: int
    rollback_reserve: RollbackReserve


class BaselineRecord(TypedDict):
    """Everything needed to put B0 back exactly as it ran: what a rollback applies as is."""

    cell_id: str
    image: str
    image_digest: str | None
    vllm_version: str | None
    model: ModelRef
    tokenizer_revision: str
    effective_args: EffectiveArgs
    requested_args: JSONObject
    controls: Controls
    deployment: Deployment
    health_probe: HealthProbe
    capacity: Capacity
    drain_deadline_seconds: float  # drain_deadline_s in manifests of version 1
    abort_thresholds: dict[str, Contract]  # class -> its contract: a rollout aborts past it
    owner: str
    # Where B0 came from: "B0 typed by hand", or its capture in one line (spec_capture.b0_origin),
    # and the spec's capture record when it has one. Absent from manifests written before.
    b0_origin: NotRequired[str]
    capture: NotRequired[BaselineCapture]


class ApprovedCandidate(TypedDict):
    """The approved candidate, as build_manifest lays it over the baseline record."""

    cell_id: str
    effective_args: EffectiveArgs
    engine: NotRequired[CandidateEngine]  # another engine build or model revision


class ArgChange(TypedDict):
    baseline: JSONValue
    candidate: JSONValue


class Overlay(TypedDict):
    """The candidate as a change to the baseline record, never merged into it."""

    cell_id: str
    applies_to: str | None
    effective_args: EffectiveArgs
    changes: dict[str, ArgChange]  # per arg the candidate sets differently
    engine: NotRequired[CandidateEngine]


class ExperimentRef(TypedDict):
    id: int
    name: str


class DecisionEvidence(TypedDict):
    outcome: str
    chosen_cell: str
    rule: str
    analysed_at: str  # ISO 8601
    report_sha256: str  # the stored report's canonical JSON digest


class ScenarioRunEvidence(TypedDict):
    scenario: str
    run: JSONValue  # the run's key as the report lists it
    held: bool


class ScenarioEvidence(TypedDict):
    """Check 3 for the cell approved (services.scenario_evidence)."""

    check: str  # "pass" | "fail" | "not run" | "not needed"
    reason: str
    runs: NotRequired[list[ScenarioRunEvidence]]  # absent when B0 stays
    override_reason: NotRequired[str]  # the approver's typed reason where check 3 did not pass


class ExercisedLimits(TypedDict):
    drain_deadline_seconds: float  # drain_deadline_s in manifests of version 1
    abort_thresholds: str


class RehearsalAttemptEvidence(TypedDict):
    """One rollback rehearsal attempt of the approved cell, as the report listed it
    (apps/analysis/report_types.RehearsalAttempt)."""

    attempt: int
    run: str
    outcome: str  # "passed" | "failed" | "invalid" | "pending"
    why: str  # why it did not pass ("" when it passed)
    requeued_by_service: bool  # failed under a lost worker or host and queued again by the service
    time_to_recover_s: float | None
    requested_by: str | None  # None: the service queued it
    repeat_reason: str | None  # why it was rehearsed again (None: the first attempt)
    queued_at: str | None
    finished_at: str | None


class RecoveryEvidence(TypedDict):
    """Check 4 as the manifest states it (services._recovery_evidence): the latest rehearsal's run
    and what it measured, or why there is none, and every attempt. Measures are copied as the
    rehearsal reported them."""

    check: str | None
    reason: str | None
    run: NotRequired[JSONValue]  # the latest attempt's
    attempts: NotRequired[list[RehearsalAttemptEvidence]]  # absent where the report listed none
    attempts_summary: NotRequired[str]  # e.g. "3 attempts, 2 failed"
    standby: NotRequired[JSONValue]
    switch_at_s: NotRequired[JSONValue]
    time_to_recover_s: NotRequired[JSONValue]
    max_recovery_s: NotRequired[JSONValue]
    surge: NotRequired[JSONValue]
    cut_streams: NotRequired[JSONValue]
    unaccounted: NotRequired[JSONValue]
    exercised: NotRequired[ExercisedLimits]
    not_rehearsed: NotRequired[bool]
    override_reason: NotRequired[str]


class Evidence(TypedDict):
    """What the approval rests on: the experiment, its traffic, the decision, checks 3 and 4."""

    experiment: ExperimentRef
    offered_load: JSONObject  # apps/runs/selectors.offered_load, the probe's runs by id
    trace_sha256: list[str]
    corpus_sha256: list[str]
    decision: DecisionEvidence
    failure_scenarios: ScenarioEvidence
    recovery: RecoveryEvidence
    # Only when the decision is isolate: each class's pool (config, capacity alone, share, replicas),
    # copied from the stored report the decision names by report_sha256, never recomputed.
    # Absent from manifests written before it existed.
    pools: NotRequired[PoolSizing]


class ApprovalRecord(TypedDict):
    verdict: str
    approver: str
    chosen_cell: str
    reason: str
    at: str  # ISO 8601


class ManifestContent(TypedDict):
    """What is hashed (manifest.content_sha256) and stored as RollbackManifest.content."""

    format: str
    version: int
    baseline: BaselineRecord
    overlay: Overlay | None  # None: B0 itself was approved
    rollback: str
    evidence: Evidence
    approval: ApprovalRecord


class ManifestDocument(ManifestContent):
    """The downloadable manifest: its content plus its own digest."""

    sha256: str


class ManifestFiles(TypedDict):
    """Both downloads' bytes and each one's sha256: RollbackManifest's file fields."""

    json_bytes: bytes
    json_sha256: str
    yaml_bytes: bytes
    yaml_sha256: str
