"""The gate's experiment: B0 and one candidate, paired on one real traffic window. Pure: no Django.

Where each part comes from (docs/GATE.md):

- **B0**: the approved rollback manifest (``--baseline-manifest``, its digest
  checked; the production config as last approved is the baseline record with
  the approved overlay applied), or the gate file's ``model``, ``controls``,
  ``engine`` and ``baseline.args`` with ``--baseline-args`` on top. Both at
  once is refused: B0 must come from one place.
- **The candidate**: B0's args with ``--candidate-args`` laid over them.
- **Classes**: the trace split by input length (``--classes short:1024,long``,
  or the gate file's ``classes[].max_input_tokens``); each class's contract from
  the gate file, else the manifest's abort thresholds, else none (then only a
  material regression against B0 fails the gate).
- **Traffic**: the trace's real arrival times, replayed whole in every run;
  the mixture and rate only label the runs with what the window holds.
"""

from __future__ import annotations

import copy
import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apps.approvals import manifest as mf
from apps.experiments.spec import CONTROL_KEYS, MAX_LATENCY_MS, FieldError, SpecError, load_yaml
from apps.experiments.spec_cross import effective_config
from apps.experiments.spec_types import RawSpec
from workers.engine.vllm_args import check_arg

BASELINE_ID = "B0"
CANDIDATE_ID = "C1"
MIXTURE = "window"
RATE = "window"
FILE_KEYS = frozenset(
    {"name", "description", "model", "controls", "engine", "baseline", "classes", "workload", "analysis"}
)
FILE_WORKLOAD_KEYS = frozenset({"warmup_s", "drain_deadline_s", "max_dispatch_lag_ms", "seed"})
FROM_MANIFEST = ("model", "controls", "engine")
# A class nobody gave a contract: every limit at the spec's ceiling, so only a regression fails it.
NO_CONTRACT = {
    "ttft_p99_ms": MAX_LATENCY_MS,
    "e2e_p99_ms": MAX_LATENCY_MS,
    "max_stall_ms": MAX_LATENCY_MS,
    "error_rate": 1.0,
}
# A regression is told from a run that was slow as a whole by the spread between repeats
# (apps/analysis/inference.repeats_p_worse): one repeat a side has no spread.
MIN_REPEATS = 2
MIN_REPEATS_MESSAGE = (
    f"must be an integer of at least {MIN_REPEATS}: the gate tells a regression from run-to-run "
    "noise by the spread between repeats"
)
DEFAULTS = {"warmup_s": 5.0, "drain_deadline_s": 60.0, "max_dispatch_lag_ms": 50.0, "seed": 0}


@dataclass
class GateInput:
    """What the gate was asked, as the client sends it (``POST /api/v1/gates``)."""

    trace_format: str
    repeats: int = 2
    busiest_s: float | None = None
    classes: str | None = None
    spec_text: str | None = None
    manifest_text: str | None = None
    baseline_args: dict[str, Any] = field(default_factory=dict)
    candidate_args: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    # Another engine build (an image the host lists) and/or model revision for the candidate.
    candidate_engine: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> GateInput:
        """From the request's fields, named as the client sends them (``POST /api/v1/gates``,
        clients/tailtune_gate.gate_request): the API and ``manage.py gate`` build it here."""
        return cls(
            trace_format=str(fields["format"]),
            repeats=fields.get("repeats", 2),
            busiest_s=fields.get("busiest"),
            classes=fields.get("classes"),
            spec_text=fields.get("spec"),
            manifest_text=fields.get("baseline_manifest"),
            baseline_args=dict(fields.get("baseline_args") or {}),
            candidate_args=dict(fields.get("candidate_args") or {}),
            name=fields.get("name"),
            candidate_engine={
                k: str(fields[f"candidate_{k}"])
                for k in ("image", "model_revision")
                if fields.get(f"candidate_{k}")
            },
        )


@dataclass
class Baseline:
    """B0 and what the gate needs around it, from the manifest or the gate file."""

    model: dict[str, Any]
    controls: dict[str, Any]
    engine: dict[str, Any]
    args: dict[str, Any]
    captured_from: str
    contracts: dict[str, dict[str, Any]]
    workload: dict[str, Any]
    classes: list[dict[str, Any]]
    analysis: dict[str, Any] | None
    name: str | None
    description: str


def _mapping(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError([FieldError(path, "must be a mapping")])
    return dict(value)


def parse_gate_file(text: str | None) -> dict[str, Any]:
    """The small gate file (YAML or JSON): a subset of the experiment spec's keys."""
    if text is None:
        return {}
    data = load_yaml(text, where="spec")
    if data is None:
        return {}
    data = _mapping(data, "spec")
    errors = [
        FieldError(f"spec.{k}", "is not a gate file key") for k in sorted(set(data) - FILE_KEYS, key=str)
    ]
    workload = data.get("workload")
    if workload is not None:
        workload = _mapping(workload, "spec.workload")
        errors += [
            FieldError(f"spec.workload.{k}", f"the gate takes only {', '.join(sorted(FILE_WORKLOAD_KEYS))}")
            for k in sorted(set(workload) - FILE_WORKLOAD_KEYS, key=str)
        ]
    classes = data.get("classes")
    if classes is not None and not isinstance(classes, list):
        errors.append(FieldError("spec.classes", "must be a list"))
    if errors:
        raise SpecError(errors)
    return data


def parse_manifest(text: str) -> dict[str, Any]:
    """A rollback manifest as downloaded (YAML or JSON), its digest checked."""
    try:
        doc = load_yaml(text, where="baseline_manifest")
    except SpecError as exc:
        raise SpecError([FieldError("baseline_manifest", e.message) for e in exc.errors]) from None
    if not isinstance(doc, Mapping) or doc.get("format") != mf.MANIFEST_FORMAT:
        raise SpecError([FieldError("baseline_manifest", f"is not a {mf.MANIFEST_FORMAT} document")])
    # YAML reads the digest's hex as text, numbers as numbers: the canonical JSON is the same.
    doc = json.loads(json.dumps(doc, default=str))
    if not mf.verify(doc):
        raise SpecError(
            [
                FieldError(
                    "baseline_manifest",
                    "its sha256 does not match its content: it was changed after approval",
                )
            ]
        )
    return doc


def baseline_from_manifest(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The production config as last approved: the baseline record, with the approved overlay's args."""
    base = doc.get("baseline") or {}
    overlay = doc.get("overlay")
    args = (
        ((overlay or {}).get("effective_args") or {}).get("args")
        or (base.get("effective_args") or {}).get("args")
        or {}
    )
    # The engine reports frozen controls among its args (max_model_len), and the KV cache facts it
    # chose (num_gpu_blocks): the controls come from the manifest's controls, and B0's args are
    # every arg a cell may carry (the scheduler's and the vLLM flags that pass through).
    args = {k: v for k, v in dict(args).items() if k not in CONTROL_KEYS and check_arg(k, v) is None}
    controls = {k: v for k, v in (base.get("controls") or {}).items() if v is not None}
    model = base.get("model") or {}
    deployment = base.get("deployment") or {}
    evidence = (doc.get("evidence") or {}).get("experiment") or {}
    return {
        "model": {
            "path": model.get("path"),
            "revision": model.get("revision"),
            "tokenizer_revision": base.get("tokenizer_revision"),
        },
        "controls": controls,
        "engine": {"image": base.get("image") or ""},
        "args": dict(args),
        "captured_from": str(
            (deployment.get("revision") if deployment.get("revision") not in (None, "not given") else None)
            or f"manifest of experiment {evidence.get('id', '?')}"
        )[:200],
        "contracts": dict(base.get("abort_thresholds") or {}),
        # drain_deadline_seconds since manifest version 2; drain_deadline_s in older manifests.
        "drain_deadline_s": base.get("drain_deadline_seconds", base.get("drain_deadline_s")),
    }


def resolve_baseline(request: GateInput) -> Baseline:
    """B0 from exactly one place, and the rest of the gate file."""
    gate_file = parse_gate_file(request.spec_text)
    baseline_file = gate_file.get("baseline") or {}
    if not isinstance(baseline_file, Mapping):
        raise SpecError([FieldError("spec.baseline", "must be a mapping")])
    workload = {**DEFAULTS, **dict(gate_file.get("workload") or {})}
    errors: list[FieldError] = []
    if request.manifest_text is not None:
        base = baseline_from_manifest(parse_manifest(request.manifest_text))
        for key in FROM_MANIFEST:
            if key in gate_file:
                errors.append(FieldError(f"spec.{key}", "comes from the baseline manifest; leave it out"))
        if "args" in baseline_file:
            errors.append(FieldError("spec.baseline.args", "B0's args come from the baseline manifest"))
        if request.baseline_args:
            errors.append(FieldError("baseline_args", "B0's args come from the baseline manifest"))
        if base["drain_deadline_s"] and "drain_deadline_s" not in dict(gate_file.get("workload") or {}):
            workload["drain_deadline_s"] = base["drain_deadline_s"]
        model, controls, engine, args = base["model"], base["controls"], base["engine"], base["args"]
        captured, contracts = base["captured_from"], base["contracts"]
    else:
        for key in ("model", "controls"):
            if key not in gate_file:
                errors.append(FieldError(f"spec.{key}", "is required (or give --baseline-manifest)"))
        model = gate_file.get("model") or {}
        controls = gate_file.get("controls") or {}
        engine = gate_file.get("engine") or {}
        args = {**dict(baseline_file.get("args") or {}), **request.baseline_args}
        captured = str(baseline_file.get("captured_from") or "gate")
        contracts = {}
    if errors:
        raise SpecError(errors)
    classes = gate_file.get("classes") or []
    return Baseline(
        model=dict(model) if isinstance(model, Mapping) else model,
        controls=dict(controls) if isinstance(controls, Mapping) else controls,
        engine=dict(engine) if isinstance(engine, Mapping) else engine,
        args=dict(args),
        captured_from=captured,
        contracts=contracts,
        workload=workload,
        classes=[dict(c) if isinstance(c, Mapping) else c for c in classes],
        analysis=gate_file.get("analysis"),
        name=gate_file.get("name"),
        description=str(gate_file.get("description") or ""),
    )


def split_of(request: GateInput, base: Baseline) -> str:
    """The split by input length as trace_import takes it: ``--classes`` or the file's max_input_tokens."""
    if request.classes:
        return request.classes
    parts = []
    for i, c in enumerate(base.classes):
        if not isinstance(c, Mapping) or not c.get("name"):
            raise SpecError([FieldError(f"spec.classes[{i}].name", "is required")])
        limit = c.get("max_input_tokens")
        parts.append(f"{c['name']}:{limit}" if limit is not None else str(c["name"]))
    if not parts:
        raise SpecError(
            [
                FieldError(
                    "classes",
                    "give --classes (e.g. short:1024,long) or classes with max_input_tokens in --spec",
                )
            ]
        )
    return ",".join(parts)


@dataclass
class WindowSummary:
    """What the frozen window holds, per class (its measured part and the whole)."""

    sha256: str
    requests: int
    duration_s: float
    warmup_s: float
    observation_s: float
    counts: dict[str, int]
    input_tokens: dict[str, int]
    output_tokens: dict[str, int]
    priorities: dict[str, int]


def summarize(sha256: str, meta: Mapping[str, Any], rows: Sequence[Any]) -> WindowSummary:
    """Counts and median sizes per class of a canonical trace's requests."""
    by: dict[str, list[Any]] = defaultdict(list)
    for r in rows:
        by[r.klass].append(r)
    duration = max((r.t_offset_s for r in rows), default=0.0)
    return WindowSummary(
        sha256=sha256,
        requests=len(rows),
        duration_s=float(duration),
        warmup_s=float(meta.get("warmup_s") or 0.0),
        observation_s=float(meta.get("observation_s") or duration),
        counts={k: len(v) for k, v in by.items()},
        input_tokens={k: max(1, round(statistics.median(r.input_tokens for r in v))) for k, v in by.items()},
        output_tokens={
            k: max(1, round(statistics.median(r.output_tokens for r in v))) for k, v in by.items()
        },
        priorities={k: Counter(r.priority for r in v).most_common(1)[0][0] for k, v in by.items()},
    )


def _shares(counts: Mapping[str, int]) -> dict[str, float]:
    """Weights by request count, rounded, summing to exactly 1 (the largest class takes the rest)."""
    total = sum(counts.values())
    names = sorted(counts, key=lambda k: (-counts[k], k))
    shares = {k: round(counts[k] / total, 6) for k in names[1:]}
    shares[names[0]] = round(1.0 - sum(shares.values()), 6)
    return {k: shares[k] for k in sorted(shares)}


def _same_config(args: Any, engine: Mapping[str, Any], b0_args: Any) -> bool:
    """The candidate runs B0's effective config (spec_cross.effective_config) on B0's engine."""
    if not isinstance(args, Mapping) or not isinstance(b0_args, Mapping) or engine:
        return False
    return effective_config(args) == effective_config(b0_args)


def gate_spec(request: GateInput, base: Baseline, window: WindowSummary, *, when: str) -> RawSpec:
    """The experiment spec the gate runs: B0 and the candidate, paired, on the frozen window.

    A draft for ``validate_spec`` (experiment_create checks it): B0's model, controls and
    engine are the gate file's or the manifest's as given, so nothing here is normalised yet."""
    if window.requests == 0 or window.observation_s <= 0:
        raise SpecError([FieldError("trace", "the window holds no request to measure")])
    by_name = {str(c.get("name")): c for c in base.classes if isinstance(c, Mapping)}
    classes = []
    for name in sorted(window.counts):
        given = by_name.get(name, {})
        contract = given.get("contract") or base.contracts.get(name) or NO_CONTRACT
        entry: dict[str, Any] = {
            "name": name,
            "input_tokens": window.input_tokens[name],
            "output_tokens": window.output_tokens[name],
            "priority": window.priorities[name],
            "contract": copy.deepcopy(dict(contract)) if isinstance(contract, Mapping) else contract,
        }
        if given.get("primary_metric"):
            entry["primary_metric"] = given["primary_metric"]
        if given.get("quality") is not None:
            # The class's quality contract (checked with the spec): the probe then runs on both cells.
            entry["quality"] = copy.deepcopy(given["quality"])
        classes.append(entry)
    unused = sorted(set(by_name) - set(window.counts))
    if unused:
        raise SpecError(
            [
                FieldError(
                    "spec.classes",
                    f"{unused} have no request in the window (its classes: {sorted(window.counts)})",
                )
            ]
        )
    w = base.workload
    candidate = {**base.args, **request.candidate_args}
    changes = {k: v for k, v in request.candidate_args.items() if base.args.get(k) != v}
    changed = {**changes, **request.candidate_engine}
    spec: RawSpec = {
        "name": request.name or base.name or f"gate {when}",
        "description": base.description
        or f"gate: candidate {json.dumps(changed, sort_keys=True) if changed else '(unchanged)'} vs B0 "
        f"on trace {window.sha256[:12]} ({window.requests} requests, {window.duration_s:.0f} s, "
        f"{request.trace_format}{f', busiest {request.busiest_s:g} s' if request.busiest_s else ''})",
        "model": base.model,
        "controls": base.controls,
        # Never stopped early for a lost candidate: the gate names each regressed class with its
        # paired interval, which needs every repeat, not only the proof it cannot be accepted.
        # Stopped at the first unusable run instead: the answer is then inconclusive anyway.
        "engine": {**base.engine, "early_stop": False, "stop_on_invalid": True}
        if isinstance(base.engine, Mapping)
        else base.engine,
        "baseline": {"id": BASELINE_ID, "captured_from": base.captured_from, "args": base.args},
        "candidates": [
            {
                "id": CANDIDATE_ID,
                "args": candidate,
                **({"engine": dict(request.candidate_engine)} if request.candidate_engine else {}),
                # Unchanged (B0's effective config on B0's engine): an A/A gate, marked as the
                # control cell the spec requires for a copy of B0 (spec_cross.py).
                **({"control": True} if _same_config(candidate, request.candidate_engine, base.args) else {}),
            }
        ],
        "classes": classes,
        "workload": {
            "mixtures": {MIXTURE: _shares(window.counts)},
            "rates": {RATE: round(max(window.requests / max(window.duration_s, 1e-3), 1e-3), 6)},
            "arrival": {"process": "trace", "trace_sha256": window.sha256},
            "repeats": request.repeats,
            "seed": w["seed"],
            "warmup_s": window.warmup_s,
            "observation_s": window.observation_s,
            "drain_deadline_s": w["drain_deadline_s"],
            "max_dispatch_lag_ms": w["max_dispatch_lag_ms"],
        },
        # The gate answers a regression question; the rollback rehearsal belongs to an approval.
        "recovery": {"rehearse": False},
    }
    if base.analysis is not None:
        spec["analysis"] = base.analysis
    return spec


# Spec field paths as the gate's user named them.
_USER_PATHS = (
    ("candidates[0].args", "candidate_args"),
    ("candidates[0].engine.image", "candidate_image"),
    ("candidates[0].engine.model_revision", "candidate_model_revision"),
    ("baseline.args", "baseline_args"),
    ("workload.repeats", "repeats"),
)


def user_path(path: str) -> str:
    for inner, outer in _USER_PATHS:
        if path == inner or path.startswith(inner + "."):
            return outer + path[len(inner) :]
    return path
