"""The spec's optional sections: calibration (the capacity probe), failure scenarios,
analysis options, the quality probe and the rollback rehearsal (recovery).

Pure: no Django at import. Where a section's rules belong to another module (the analysis's
ReportOptions, the scenario generators, apps/experiments/quality_contract.py and recovery.py), the
checker imports it when the section is present and reports its problems as field errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, cast

from apps.analysis.report_types import ReportOptionsJSON
from apps.experiments.spec_checker import _Checker
from apps.experiments.spec_rules import CALIBRATION_DEFAULTS, MAX_RATE_RPS, MAX_WINDOW_S, RATES_PER
from apps.experiments.spec_types import Calibration, RecoverySpec, ScenarioSpec


class _Bounds(TypedDict, total=False):
    positive: bool
    minimum: float
    maximum: float
    integer: bool


# The probe's optional numbers, in the documented order, each with its bounds (defaults:
# CALIBRATION_DEFAULTS).
CALIBRATION_NUMBERS: dict[str, _Bounds] = {
    "start_rps": {"positive": True, "maximum": MAX_RATE_RPS},
    "tolerance": {"positive": True, "maximum": 0.99},
    "max_steps": {"integer": True, "minimum": 1, "maximum": 50},
    "warmup_s": {"minimum": 0.0, "maximum": MAX_WINDOW_S},
    "observation_s": {"positive": True, "maximum": MAX_WINDOW_S},
    "drain_deadline_s": {"positive": True, "maximum": MAX_WINDOW_S},
    "min_accepted_share": {"minimum": 0.0, "maximum": 1.0},
}


def _check_calibration(c: _Checker, raw: Any) -> Calibration:
    """The capacity probe's settings (docs/SCENARIOS.md), defaults filled in."""
    path = "calibration"
    data = c.mapping(raw, path)
    c.unknown(data, set(CALIBRATION_DEFAULTS), path)
    d = CALIBRATION_DEFAULTS
    out: dict[str, Any] = {"enabled": c.boolean(data, "enabled", path, default=True)}
    # Filled in the documented order; Calibration once complete.
    for key, bounds in CALIBRATION_NUMBERS.items():
        out[key] = c.number(data, key, path, required=False, default=d[key], **bounds)
    fractions: dict[str, float] = dict(d["fractions"])
    if data.get("fractions") is not None:
        raw_f = c.mapping(data.get("fractions"), f"{path}.fractions")
        if not raw_f:
            c.fail(f"{path}.fractions", "must name at least one rate")
        fractions = {}
        for name in raw_f:
            f = c.number(raw_f, name, f"{path}.fractions", positive=True, maximum=1.0)
            if f is not None:
                fractions[name] = f
    out["fractions"] = fractions
    mixtures = data.get("mixtures")
    if mixtures is not None and (
        not isinstance(mixtures, list) or not mixtures or not all(isinstance(m, str) for m in mixtures)
    ):
        c.fail(f"{path}.mixtures", "must be a non-empty list of mixture names")
        mixtures = None
    out["mixtures"] = list(mixtures) if mixtures is not None else None
    rates_per = data.get("rates_per", d["rates_per"])
    if rates_per not in RATES_PER:
        c.fail(f"{path}.rates_per", f"must be one of {', '.join(RATES_PER)}, got {rates_per!r}")
    out["rates_per"] = rates_per
    return cast(Calibration, out)


def _check_scenarios(c: _Checker, raw: Any, cell_ids: set[str]) -> dict[str, ScenarioSpec]:
    """Failure scenarios: name -> {cells, params}; parameters checked by the generator's own rules."""
    from apps.workloads.scenario_traces import DEFAULTS, scenario_params

    data = c.mapping(raw, "scenarios")
    out: dict[str, ScenarioSpec] = {}
    for name, options_raw in data.items():
        path = f"scenarios.{name}"
        if name not in DEFAULTS:
            c.fail(path, f"unknown scenario (known: {', '.join(sorted(DEFAULTS))})")
            continue
        options = c.mapping(options_raw, path, required=False)
        # The normalised form nests the parameters under "params"; both spellings are accepted,
        # so a validated (or exported) spec validates again to itself.
        nested = options.pop("params", None)
        if nested is not None:
            options.update(c.mapping(nested, f"{path}.params"))
        cells = options.pop("cells", None)
        if cells is not None:
            if not isinstance(cells, list) or not all(isinstance(x, str) for x in cells):
                c.fail(f"{path}.cells", "must be a list of cell ids")
                cells = None
            else:
                for i, cell in enumerate(cells):
                    if cell_ids and cell not in cell_ids:
                        c.fail(f"{path}.cells[{i}]", f"names unknown cell {cell!r}")
        for key in sorted(set(options) - set(DEFAULTS[name])):
            c.fail(f"{path}.{key}", "unknown field")
        params = {k: v for k, v in options.items() if k in DEFAULTS[name]}
        try:
            scenario_params(name, params)
        except ValueError as exc:
            c.fail(path, str(exc))
        out[name] = {"cells": cells, "params": params}
    return out


def _check_analysis(c: _Checker, raw: Any, rate_names: set[str]) -> ReportOptionsJSON | None:
    """Analysis options (docs/ANALYSIS.md), checked by the analysis's own parser; None when
    they are wrong (the problem is reported)."""
    from apps.analysis.report import ReportOptions

    data = c.mapping(raw, "analysis")
    agreed = data.get("agreed_rates")
    if agreed is not None and not isinstance(agreed, list):
        c.fail("analysis.agreed_rates", f"must be a list of rate names, got {agreed!r:.60}")
        return None
    for i, name in enumerate(agreed or []):
        if not isinstance(name, str):
            c.fail(f"analysis.agreed_rates[{i}]", f"must be a rate name, got {name!r:.60}")
            return None
        if name not in rate_names:
            c.fail(f"analysis.agreed_rates[{i}]", f"names unknown rate {name!r}")
    try:
        return ReportOptions.from_mapping(data).to_json()
    except (TypeError, ValueError) as exc:
        # An option whose parser names it (analysis.pool_headroom) is reported at its own path.
        field = getattr(exc, "field", None)
        c.fail(f"analysis.{field}" if field else "analysis", str(exc))
        return None


def _check_quality(
    c: _Checker, top: Mapping[str, Any], spec: dict[str, Any], max_model_len: int | None
) -> None:
    """The quality probe's options, checked against each class's quality floor: fills ``spec["quality"]``."""
    from apps.experiments.quality_contract import check_quality

    options, problems = check_quality(top.get("quality"))
    for where, message in problems:
        c.fail(where, message)
    spec["quality"] = options
    cap = options["probe"].get("max_tokens")
    for i, cls in enumerate(spec.get("classes") or []):
        minimum = (cls.get("quality") or {}).get("min_agreement_tokens")
        if cap and minimum is not None and minimum > cap:
            c.fail(
                f"classes[{i}].quality.min_agreement_tokens",
                f"is more than the probe's max_tokens ({cap}): no answer could reach it",
            )
        if cap and max_model_len and cls.get("input_tokens") and cls["input_tokens"] + cap > max_model_len:
            c.fail(
                "quality.probe.max_tokens",
                f"{cls['name']}'s {cls['input_tokens']} input tokens + {cap} exceed "
                f"controls.max_model_len ({max_model_len})",
            )


def _check_recovery(
    c: _Checker, raw: Any, workload: Mapping[str, Any], mixtures: set[str], rates: set[str]
) -> RecoverySpec:
    """The rollback rehearsal (apps/experiments/recovery.py), checked against the trace's windows."""
    from apps.experiments.recovery import check_recovery

    options, problems = check_recovery(
        raw, warmup_s=workload.get("warmup_s"), observation_s=workload.get("observation_s")
    )
    for path, message in problems:
        c.fail(path, message)
    for key, known in (("mixture", mixtures), ("rate", rates)):
        name = options.get(key)
        if name is not None and known and name not in known:
            c.fail(f"recovery.{key}", f"names unknown {key} {name!r}")
    return options
