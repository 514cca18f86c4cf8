"""The normalised experiment spec's shape: what ``spec.validate_spec`` returns and
``Experiment.spec`` stores. Types only: no Django, nothing runs here.

TypedDicts, not dataclasses: the spec is JSON in a JSONField, exported as YAML and read by
templates, so the stored form stays the plain dict it always was. Every section the validator
fills in is required; the optional sections (and the keys it writes only when given) are
``NotRequired``. tests/test_typed_contracts.py checks a real normalised spec against these
declarations, so they cannot drift from what the validator produces. docs/SPEC.md documents
each field.

No ``from __future__ import annotations`` here: on Python 3.11 a TypedDict's
``__required_keys__`` ignores ``NotRequired`` written as a string annotation.

A spec stored before a key existed may lack it: readers of ``Experiment.spec`` keep their
``.get(...)`` fallbacks; these types say what a spec validated today holds.
"""

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from apps.analysis.report_types import ReportOptionsJSON

# A value that really is arbitrary JSON (a scenario's parameters, a JSON schema): named, not typed.
JSONValue = Any
JSONObject = dict[str, JSONValue]
# A spec before validation (YAML loaded, a form's or a gate's draft): anything may be in it.
RawSpec = dict[str, JSONValue]
# Experiment.spec as stored: the NormalizedSpec of its day. One stored before a section existed
# lacks it, so readers take a stored spec with ``.get(...)`` and a default.
StoredSpec = Mapping[str, JSONValue]


class ModelSpec(TypedDict):
    path: str
    revision: str
    tokenizer_revision: str


# controls.generation: sampling key (apps/experiments/generation.py) -> its number, or a flag.
GenerationSettings = dict[str, float | bool]


class Controls(TypedDict):
    """The frozen controls, the same for every cell (unset optional numbers are None)."""

    dtype: str
    tensor_parallel_size: int
    max_model_len: int
    gpu_memory_utilization: float | None
    kv_cache_memory_bytes: int | None
    enable_prefix_caching: bool
    speculative_decoding: bool
    seed: int
    generation: GenerationSettings


class EngineSpec(TypedDict):
    image: str
    reuse: bool
    early_stop: bool
    stop_on_invalid: NotRequired[bool]  # absent from specs stored before it existed


class CellArgs(TypedDict, total=False):
    """A cell's vLLM args; only those given are present. The scheduler flags a sweep varies
    (spec_rules.CELL_ARGS) are typed here; any other flag of vLLM's parser that is not denied
    (workers/engine/vllm_args.py) may be present too, under its snake_case name, with a JSON value."""

    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool
    scheduling_policy: str
    long_prefill_token_threshold: int
    max_num_queued_reqs: int


class BaselineCapture(TypedDict):
    """Where B0 was captured, when, and the sha256 of what was read (apps/experiments/spec_capture.py)."""

    source: str  # spec_capture.CAPTURE_SOURCES
    name: str
    captured_at: str  # ISO 8601 with its offset
    sha256: str
    vllm_version: NotRequired[str]
    notes: NotRequired[list[str]]


class BaselineSpec(TypedDict):
    id: str
    captured_from: str
    args: CellArgs
    capture: NotRequired[BaselineCapture]  # absent: B0 typed by hand


class CandidateEngine(TypedDict, total=False):
    """A candidate that is another engine build or model revision: only what it overrides."""

    image: str
    model_revision: str


class CandidateSpec(TypedDict):
    id: str
    args: CellArgs
    engine: NotRequired[CandidateEngine]
    control: NotRequired[bool]  # an A/A cell: B0's effective config run again (spec_cross.py)


class Contract(TypedDict):
    ttft_p99_ms: float
    e2e_p99_ms: float
    max_stall_ms: float
    error_rate: float


class QualityValidators(TypedDict, total=False):
    regex: str
    json_schema: JSONObject
    finish_reason: str


class ClassQuality(TypedDict, total=False):
    """A class's quality contract (apps/experiments/quality_contract.py): only the keys given."""

    min_exact_match: float
    min_agreement_tokens: float
    validators: QualityValidators


class RequestClass(TypedDict):
    name: str
    input_tokens: int
    output_tokens: int
    priority: int
    shared_prefix_tokens: int
    contract: Contract
    quality: NotRequired[ClassQuality]
    primary_metric: NotRequired[str]


class Arrival(TypedDict):
    process: str
    cv: NotRequired[float]  # the gamma process only
    trace_sha256: NotRequired[str]  # the trace process only


class Prompts(TypedDict):
    """Where generated traffic's prompts come from: a corpus stored by hash (corpus_import)."""

    corpus_sha256: str


class Workload(TypedDict):
    mixtures: dict[str, dict[str, float]]  # mixture -> {class: weight}
    rates: dict[str, float]  # rate name -> req/s
    mixture_rates: NotRequired[dict[str, dict[str, float]]]  # mixture -> {rate name: req/s}
    rates_source: str
    arrival: Arrival
    # Generated traffic's prompts from a stored corpus (absent: exact-length token ids).
    prompts: NotRequired[Prompts]
    repeats: int
    repeat_traces: str
    output_mode: str
    seed: int
    warmup_s: float
    observation_s: float
    drain_deadline_s: float
    max_dispatch_lag_ms: float
    uniform_companion: bool


class Calibration(TypedDict):
    """The capacity probe's settings, defaults filled in (spec_rules.CALIBRATION_DEFAULTS)."""

    enabled: bool
    start_rps: float
    tolerance: float
    max_steps: int
    warmup_s: float
    observation_s: float
    drain_deadline_s: float
    min_accepted_share: float
    fractions: dict[str, float]
    mixtures: list[str] | None
    rates_per: str


class ScenarioSpec(TypedDict):
    cells: list[str] | None
    params: JSONObject  # checked by the scenario generator's own rules


class QualityProbe(TypedDict):
    prompts_per_class: int
    max_tokens: int
    trace_sha256: str | None


class QualitySpec(TypedDict):
    probe: QualityProbe


class RecoverySpec(TypedDict):
    """The rollback rehearsal's options (apps/experiments/recovery.py), every key filled in."""

    rehearse: bool
    standby: str
    switch_at_s: float | None
    max_recovery_s: float
    window_s: float
    mixture: str | None
    rate: str | None
    switch: str | None  # a name from the host's TAILTUNE_SWITCH_COMMANDS
    router: str | None  # a name from the host's TAILTUNE_ROUTERS
    ports: dict[str, int] | None


class SearchKnob(TypedDict, total=False):
    """One knob of a search's space: a set (``values``) or an integer range (``min``, ``max``, ``log``)."""

    values: list[JSONValue]
    min: int
    max: int
    log: bool


class SearchBudget(TypedDict):
    max_trials: int
    max_engine_hours: float | None  # None: only max_trials bounds the screening
    patience: int | None  # stop after this many trials without a better objective; None: never


class SearchScreening(TypedDict):
    mixture: str
    rate: str
    chosen: str  # "default" (the heaviest mixture at the highest rate) or "given"


class SearchSpec(TypedDict):
    """A search instead of a grid (apps/experiments/spec_search.py), every key filled in."""

    space: dict[str, SearchKnob]  # knob (a CELL_ARGS name) -> its set or range
    budget: SearchBudget
    screening: SearchScreening
    confirm: int  # the best k screened configs confirmed on fresh data


class NormalizedSpec(TypedDict):
    """A validated experiment spec, as ``validate_spec`` returns it (keys in the documented order)."""

    name: str
    description: str
    owner: str
    model: ModelSpec
    controls: Controls
    engine: EngineSpec
    baseline: BaselineSpec
    candidates: list[CandidateSpec]
    classes: list[RequestClass]
    workload: Workload
    calibration: NotRequired[Calibration]
    scenarios: NotRequired[dict[str, ScenarioSpec]]
    analysis: NotRequired[ReportOptionsJSON]
    quality: NotRequired[QualitySpec]
    recovery: NotRequired[RecoverySpec]
    search: NotRequired[SearchSpec]  # a search spec: candidates is empty until confirmation
