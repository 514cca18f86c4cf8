"""The experiment spec: YAML in, a validated plain dict out (and back).

Pure: no Django. ``parse_spec`` collects every problem it finds, each naming
the field path (``workload.mixtures.80-20``, ``candidates[2].args``) and the
reason, so a user fixes a spec in one pass. Nothing is saved by this module;
the service that creates the experiment only runs once the spec is valid.
The format is documented in docs/SPEC.md.

The validator's parts: spec_rules.py (the allowed keys, choices and limits, all re-exported
here), spec_checker.py (the errors and the field checker), spec_cells.py (controls, baseline,
candidates), spec_workload.py (classes and workload) and spec_sections.py (the optional sections).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import yaml

from apps.experiments.spec_capture import check_capture
from apps.experiments.spec_cells import _check_args, _check_candidates, _check_controls
from apps.experiments.spec_checker import FieldError, SpecError, _Checker
from apps.experiments.spec_cross import check_cross
from apps.experiments.spec_rules import (
    ARRIVAL_PROCESSES,
    CALIBRATION_DEFAULTS,
    CELL_ARGS,
    CONTRACT_KEYS,
    CONTROL_KEYS,
    CORE_SECTIONS,
    DEFAULT_LIMITS,
    MAX_CELLS,
    MAX_CLASSES,
    MAX_CV,
    MAX_KV_BYTES,
    MAX_LATENCY_MS,
    MAX_MIXTURES,
    MAX_PARALLEL,
    MAX_PRIORITY,
    MAX_RATE_RPS,
    MAX_RATES,
    MAX_REPEATS,
    MAX_SEED,
    MAX_SPEC_BYTES,
    MAX_TOKENS,
    MAX_WINDOW_S,
    MAX_YAML_DEPTH,
    NUMBER_CEILING,
    OPTIONAL_SECTIONS,
    PRIMARY_METRICS,
    RATES_PER,
    RUN_OVERHEAD_S,
    SCHEDULING_POLICIES,
    TOP_KEYS,
    TRACE_PROCESS,
    WEIGHT_TOLERANCE,
    SpecLimits,
)
from apps.experiments.spec_search import TRIAL_ID, check_search
from apps.experiments.spec_sections import (
    _check_analysis,
    _check_calibration,
    _check_quality,
    _check_recovery,
    _check_scenarios,
)
from apps.experiments.spec_types import NormalizedSpec
from apps.experiments.spec_workload import _check_classes, _check_workload
from apps.experiments.workload_fields import OUTPUT_MODES, REPEAT_TRACES, WORKLOAD_KEYS
from workers.engine.model_paths import model_path_problem

# The spec's API: what other code imports from here (the constants live in spec_rules.py, the
# workload's fields in workload_fields.py).
__all__ = [
    "ARRIVAL_PROCESSES",
    "CALIBRATION_DEFAULTS",
    "CELL_ARGS",
    "CONTRACT_KEYS",
    "CONTROL_KEYS",
    "CORE_SECTIONS",
    "DEFAULT_LIMITS",
    "MAX_CELLS",
    "MAX_CLASSES",
    "MAX_CV",
    "MAX_KV_BYTES",
    "MAX_LATENCY_MS",
    "MAX_MIXTURES",
    "MAX_PARALLEL",
    "MAX_PRIORITY",
    "MAX_RATE_RPS",
    "MAX_RATES",
    "MAX_REPEATS",
    "MAX_SEED",
    "MAX_SPEC_BYTES",
    "MAX_TOKENS",
    "MAX_WINDOW_S",
    "MAX_YAML_DEPTH",
    "NUMBER_CEILING",
    "OPTIONAL_SECTIONS",
    "OUTPUT_MODES",
    "PRIMARY_METRICS",
    "RATES_PER",
    "REPEAT_TRACES",
    "RUN_OVERHEAD_S",
    "SCHEDULING_POLICIES",
    "TOP_KEYS",
    "TRACE_PROCESS",
    "WEIGHT_TOLERANCE",
    "WORKLOAD_KEYS",
    "FieldError",
    "SpecError",
    "SpecLimits",
    "dump_spec",
    "load_yaml",
    "parse_spec",
    "plan_size",
    "validate_spec",
]


class _BoundedLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing aliases (an alias bomb expands to billions of nodes while
    being read) and nesting deeper than MAX_YAML_DEPTH (Python's recursion would give out)."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise _Refused(mark, "aliases (*name) are not allowed in a spec: write the value out")
        self.depth += 1
        try:
            if self.depth > MAX_YAML_DEPTH:
                raise _Refused(self.peek_event().start_mark, f"nested deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _Refused(Exception):
    def __init__(self, mark: Any, message: str) -> None:
        super().__init__(message)
        self.mark = mark
        self.message = message


def load_yaml(text: str, *, where: str = "document") -> Any:
    """YAML text to Python, or SpecError naming the line: bounded in size, depth and aliases.

    ``where`` is what the text is: a whole document (``document``, a request's ``body``), whose
    errors are named by their line, or one field of a request (the gate's ``spec``), whose
    errors are named by the field, the line leading the message.
    """

    def error(mark: Any, message: str) -> SpecError:
        if mark is None:
            return SpecError([FieldError(where, message)])
        if where in ("document", "body"):
            return SpecError([FieldError(f"line {mark.line + 1}", message)])
        return SpecError([FieldError(where, f"line {mark.line + 1}: {message}")])

    if len(text) > MAX_SPEC_BYTES:
        raise SpecError([FieldError(where, f"is {len(text)} characters; the limit is {MAX_SPEC_BYTES}")])
    try:
        return yaml.load(text, Loader=_BoundedLoader)
    except _Refused as exc:
        raise error(exc.mark, exc.message) from None
    except yaml.YAMLError as exc:
        raise error(
            getattr(exc, "problem_mark", None), f"not valid YAML: {getattr(exc, 'problem', exc)}"
        ) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more digits than Python converts
        raise SpecError([FieldError(where, f"cannot be read: {str(exc)[:200]}")]) from None


def parse_spec(text: str, *, limits: SpecLimits = DEFAULT_LIMITS) -> NormalizedSpec:
    """Parse and validate a YAML spec; return the normalised spec or raise SpecError."""
    return validate_spec(load_yaml(text), limits=limits)


def validate_spec(raw: Any, *, limits: SpecLimits = DEFAULT_LIMITS) -> NormalizedSpec:
    """Validate a spec already loaded into Python; return it normalised.

    Every number has an upper bound, and the plan's size (runs and engine-hours)
    is computed from the counts and checked against ``limits`` before anything
    is expanded. The spec is filled in section by section (each checker writes its own), so
    it is a plain dict until no error is left; only then does it have NormalizedSpec's shape
    (tests/test_typed_contracts.py holds the two together).
    """
    c = _Checker()
    top = c.mapping(raw, "spec")
    if not top:
        raise SpecError(c.errors or [FieldError("spec", "is empty")])
    c.unknown(top, TOP_KEYS, "")
    spec: dict[str, Any] = {
        "name": c.text(top, "name", "", max_length=200),
        "description": c.text(top, "description", "", required=False),
        "owner": c.text(top, "owner", "", required=False, max_length=150),
    }

    model = c.mapping(top.get("model"), "model")
    c.unknown(model, {"path", "revision", "tokenizer_revision"}, "model")
    spec["model"] = {
        "path": c.text(model, "path", "model", max_length=500),
        "revision": c.text(model, "revision", "model", max_length=200),
        "tokenizer_revision": c.text(model, "tokenizer_revision", "model", max_length=200),
    }
    if spec["model"]["path"]:
        problem = model_path_problem(
            spec["model"]["path"], limits.model_roots, base_dir=limits.model_base_dir
        )
        if problem is not None:
            c.fail("model.path", problem)

    max_model_len = _check_controls(c, top, spec)

    engine = c.mapping(top.get("engine"), "engine", required=False)
    c.unknown(engine, {"image", "reuse", "early_stop", "stop_on_invalid"}, "engine")
    spec["engine"] = {
        "image": c.text(engine, "image", "engine", required=False, max_length=300),
        # One server per cell and round, idle-checked between traces (workers/pull.py); false:
        # one start per run.
        "reuse": c.boolean(engine, "reuse", "engine", default=True),
        # Skip a cell's remaining sweep runs once it can no longer be accepted
        # (apps/analysis/early_stop.py); false: run every planned run.
        "early_stop": c.boolean(engine, "early_stop", "engine", default=True),
        # Skip every queued sweep run once one has ended unusable (invalid, failed, dispatch lag
        # over the tolerance): a gate's answer is then inconclusive (apps/lifecycle/run_skipping.py).
        "stop_on_invalid": c.boolean(engine, "stop_on_invalid", "engine", default=False),
    }

    baseline = c.mapping(top.get("baseline"), "baseline")
    c.unknown(baseline, {"id", "args", "captured_from", "capture"}, "baseline")
    spec["baseline"] = {
        "id": c.text(baseline, "id", "baseline", max_length=32),
        "captured_from": c.text(baseline, "captured_from", "baseline", required=False),
        "args": _check_args(c, baseline.get("args"), "baseline.args", max_model_len),
    }
    # Where B0 was captured (apps/experiments/spec_capture.py); absent: B0 typed by hand.
    capture = check_capture(c, baseline.get("capture"))
    if capture is not None:
        spec["baseline"]["capture"] = capture

    seen = _check_candidates(c, top, spec, max_model_len)

    _check_classes(c, top, spec, max_model_len)
    class_names = {cls["name"] for cls in spec["classes"]}

    calibration = _check_calibration(c, top.get("calibration")) if "calibration" in top else None
    probing = bool(calibration and calibration["enabled"])

    mixtures, rates = _check_workload(c, top, spec, class_names, calibration, probing)

    if calibration is not None:
        for i, name in enumerate(calibration["mixtures"] or []):
            if name not in mixtures:
                c.fail(f"calibration.mixtures[{i}]", f"names unknown mixture {name!r}")
        spec["calibration"] = calibration
    if "scenarios" in top:
        spec["scenarios"] = _check_scenarios(c, top.get("scenarios"), set(seen))
    if "analysis" in top:
        analysis = _check_analysis(c, top.get("analysis"), set(rates))
        # Wrong options are reported; {} holds their place until the errors are raised.
        spec["analysis"] = {}
        if analysis is not None:
            spec["analysis"] = analysis
    if "quality" in top or any("quality" in cls for cls in spec.get("classes") or []):
        _check_quality(c, top, spec, max_model_len)
    if "recovery" in top:
        spec["recovery"] = _check_recovery(
            c, top.get("recovery"), spec["workload"], set(mixtures), set(rates)
        )
    if "search" in top:
        spec["search"] = check_search(
            c,
            top.get("search"),
            baseline_args=spec["baseline"]["args"],
            max_model_len=max_model_len,
            mixtures=mixtures,
            rates=rates,
            class_tokens={
                cls["name"]: int(cls.get("input_tokens") or 0) + int(cls.get("output_tokens") or 0)
                for cls in spec.get("classes") or []
            },
        )
        if TRIAL_ID.fullmatch(str(spec["baseline"].get("id") or "")):
            c.fail("baseline.id", "T<number> names a search's trial cells: give B0 another id")
    _check_counts(c, spec)
    # Rules across sections (a class priority under fcfs, two cells with one config, a budget
    # below a class's prompt): apps/experiments/spec_cross.py.
    check_cross(c, spec)
    if not c.errors:
        _check_plan_size(c, cast(NormalizedSpec, spec), limits)

    if c.errors:
        raise SpecError(c.errors)
    return cast(NormalizedSpec, spec)


def _check_counts(c: _Checker, spec: Mapping[str, Any]) -> None:
    """How many of each list the plan multiplies: cells, classes, mixtures, rates."""
    w = spec.get("workload") or {}
    for path, count, limit in (
        ("candidates", 1 + len(spec.get("candidates") or []), MAX_CELLS),
        ("classes", len(spec.get("classes") or []), MAX_CLASSES),
        ("workload.mixtures", len(w.get("mixtures") or {}), MAX_MIXTURES),
        ("workload.rates", len(w.get("rates") or {}), MAX_RATES),
    ):
        if count > limit:
            c.fail(path, f"{count} is too many; at most {limit}")


def plan_size(spec: NormalizedSpec, limits: SpecLimits = DEFAULT_LIMITS) -> tuple[int, float]:
    """(runs, engine-hours) a validated spec plans, from its counts alone (nothing is expanded).

    Sweep runs = cells x mixtures x rates x repeats (a search: B0 and its ``confirm`` cells, plus
    one screening run per trial, at most ``max_trials``); the uniform companions add
    cells x mixtures x rates; each failure scenario at most one run per cell; the
    rollback rehearsal (on unless ``recovery.rehearse`` is false) one run that starts
    two servers. A run costs its windows plus ``limits.run_overhead_s`` per server start.
    """
    w = spec["workload"]
    search = spec.get("search")
    per_run = float(w["warmup_s"]) + float(w["observation_s"]) + float(w["drain_deadline_s"])
    screening_runs = 0
    # A search: each trial one run (one server) at the screening point, then its best k confirmed
    # like a grid's candidates; with an engine-hours budget, the screening stops there.
    if search is not None:
        screening_runs = int(search["budget"]["max_trials"])
        cells = 1 + int(search["confirm"])
    else:
        cells = 1 + len(spec["candidates"])
    points = cells * len(w["mixtures"]) * len(w["rates"])
    runs = points * int(w["repeats"])
    if w.get("uniform_companion"):
        runs += points
    runs += cells * len(spec.get("scenarios") or {})
    hours = runs * (per_run + limits.run_overhead_s) / 3600.0
    if screening_runs:
        screening_hours = screening_runs * (per_run + limits.run_overhead_s) / 3600.0
        cap = search["budget"]["max_engine_hours"] if search is not None else None
        runs += screening_runs
        hours += min(screening_hours, cap) if cap is not None else screening_hours
    recovery = spec.get("recovery")
    if recovery is None or recovery.get("rehearse", True):
        # The rollback rehearsal of the proposed cell: one run, two servers started.
        runs += 1
        hours += (per_run + 2 * limits.run_overhead_s) / 3600.0
    return runs, hours


def _check_plan_size(c: _Checker, spec: NormalizedSpec, limits: SpecLimits) -> None:
    runs, hours = plan_size(spec, limits)
    if runs > limits.max_runs:
        c.fail(
            "workload.repeats",
            f"the plan would have {runs} runs; the limit is {limits.max_runs} (TAILTUNE_MAX_RUNS): "
            "fewer cells, mixtures, rates or repeats",
        )
    if hours > limits.max_engine_hours:
        c.fail(
            "workload.observation_s",
            f"the plan would take about {hours:,.0f} engine-hours; the limit is {limits.max_engine_hours:g} "
            "(TAILTUNE_MAX_ENGINE_HOURS): shorter windows or a smaller plan",
        )


def dump_spec(spec: Mapping[str, Any]) -> str:
    """Serialise a normalised spec as YAML (keys in the documented order)."""
    return yaml.safe_dump(dict(spec), sort_keys=False, default_flow_style=False, allow_unicode=True)
