"""The spec's traffic: the request classes (their sizes and contracts) and the workload
section (mixtures, rates, per-mixture rates, the arrival process, windows and repeats).

Pure: no Django. Each checker reports into the shared ``_Checker`` and fills its section of the
spec; apps/experiments/spec.validate_spec calls them in the spec's order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from apps.experiments.spec_checker import _Checker
from apps.experiments.spec_rules import (
    ARRIVAL_PROCESSES,
    CONTRACT_KEYS,
    MAX_CV,
    MAX_LATENCY_MS,
    MAX_PRIORITY,
    MAX_RATE_RPS,
    MAX_TOKENS,
    PRIMARY_METRICS,
    TRACE_PROCESS,
    WEIGHT_TOLERANCE,
)
from apps.experiments.spec_types import Calibration, Contract, Prompts, RequestClass
from apps.experiments.workload_fields import WORKLOAD_FIELDS, WORKLOAD_KEYS, WorkloadField


def _check_classes(
    c: _Checker, top: Mapping[str, Any], spec: dict[str, Any], max_model_len: int | None
) -> None:
    """The request classes, each with its contract: fills ``spec["classes"]``."""
    classes_raw = top.get("classes")
    classes: list[RequestClass] = []
    if not isinstance(classes_raw, list) or not classes_raw:
        c.fail("classes", "must be a non-empty list of request classes")
    else:
        names: set[str] = set()
        for i, item in enumerate(classes_raw):
            path = f"classes[{i}]"
            cls = c.mapping(item, path)
            c.unknown(
                cls,
                {
                    "name",
                    "input_tokens",
                    "output_tokens",
                    "priority",
                    "shared_prefix_tokens",
                    "contract",
                    "primary_metric",
                    "quality",
                },
                path,
            )
            name = c.text(cls, "name", path, max_length=64)
            if name in names:
                c.fail(f"{path}.name", f"duplicate class name {name!r}")
            names.add(name)
            contract_raw = c.mapping(cls.get("contract"), f"{path}.contract")
            c.unknown(contract_raw, set(CONTRACT_KEYS), f"{path}.contract")
            contract: Contract = {
                "ttft_p99_ms": c.number(
                    contract_raw, "ttft_p99_ms", f"{path}.contract", positive=True, maximum=MAX_LATENCY_MS
                ),
                "e2e_p99_ms": c.number(
                    contract_raw, "e2e_p99_ms", f"{path}.contract", positive=True, maximum=MAX_LATENCY_MS
                ),
                "max_stall_ms": c.number(
                    contract_raw, "max_stall_ms", f"{path}.contract", positive=True, maximum=MAX_LATENCY_MS
                ),
                "error_rate": c.number(
                    contract_raw, "error_rate", f"{path}.contract", minimum=0.0, maximum=1.0
                ),
            }
            entry: RequestClass = {
                "name": name,
                "input_tokens": c.number(
                    cls, "input_tokens", path, positive=True, integer=True, maximum=MAX_TOKENS
                ),
                "output_tokens": c.number(
                    cls, "output_tokens", path, positive=True, integer=True, maximum=MAX_TOKENS
                ),
                "priority": c.number(
                    cls,
                    "priority",
                    path,
                    required=False,
                    integer=True,
                    minimum=-MAX_PRIORITY,
                    maximum=MAX_PRIORITY,
                    default=0,
                ),
                "shared_prefix_tokens": c.number(
                    cls, "shared_prefix_tokens", path, required=False, minimum=0, integer=True, default=0
                ),
                "contract": contract,
            }
            if cls.get("quality") is not None:
                from apps.experiments.quality_contract import check_class_quality

                quality, problems = check_class_quality(cls.get("quality"), f"{path}.quality")
                for where, message in problems:
                    c.fail(where, message)
                entry["quality"] = quality
            primary = cls.get("primary_metric")
            if primary is not None:
                if primary not in PRIMARY_METRICS:
                    c.fail(f"{path}.primary_metric", f"must be one of {', '.join(PRIMARY_METRICS)}")
                else:
                    entry["primary_metric"] = primary
            if (
                max_model_len
                and entry["input_tokens"]
                and entry["output_tokens"]
                and entry["input_tokens"] + entry["output_tokens"] > max_model_len
            ):
                c.fail(
                    f"{path}.input_tokens",
                    f"input {entry['input_tokens']} + output {entry['output_tokens']} tokens exceed "
                    f"controls.max_model_len ({max_model_len})",
                )
            if (
                entry["shared_prefix_tokens"]
                and entry["input_tokens"]
                and entry["shared_prefix_tokens"] > entry["input_tokens"]
            ):
                c.fail(f"{path}.shared_prefix_tokens", "must not exceed input_tokens")
            classes.append(entry)
    spec["classes"] = classes


def _check_workload(
    c: _Checker,
    top: Mapping[str, Any],
    spec: dict[str, Any],
    class_names: set[str],
    calibration: Calibration | None,
    probing: bool,
) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """The workload section: fills ``spec["workload"]``; returns its mixtures and rates."""
    workload = c.mapping(top.get("workload"), "workload")
    c.unknown(workload, WORKLOAD_KEYS, "workload")
    mixtures_raw = c.mapping(workload.get("mixtures"), "workload.mixtures")
    mixtures: dict[str, dict[str, float]] = {}
    if "mixtures" in workload and not mixtures_raw and isinstance(workload.get("mixtures"), Mapping):
        c.fail("workload.mixtures", "must name at least one mixture")
    for mix_name, weights_raw in mixtures_raw.items():
        path = f"workload.mixtures.{mix_name}"
        weights = c.mapping(weights_raw, path)
        clean: dict[str, float] = {}
        for cls_name, _w in weights.items():
            if cls_name not in class_names:
                c.fail(
                    f"{path}.{cls_name}",
                    f"names unknown class {cls_name!r} (known: {', '.join(sorted(class_names))})",
                )
                continue
            w = c.number(weights, cls_name, path, minimum=0.0, maximum=1.0)
            if w is not None:
                clean[cls_name] = w
        if weights and len(clean) == len(weights) and abs(sum(clean.values()) - 1.0) > WEIGHT_TOLERANCE:
            c.fail(path, f"weights must sum to 1 (they sum to {sum(clean.values()):g})")
        mixtures[mix_name] = clean
    rates_raw = c.mapping(workload.get("rates"), "workload.rates", required=not probing)
    if "rates" in workload and not rates_raw and isinstance(workload.get("rates"), Mapping):
        c.fail("workload.rates", "must name at least one rate")
    rates = {
        name: c.number(rates_raw, name, "workload.rates", positive=True, maximum=MAX_RATE_RPS)
        for name in rates_raw
    }
    mixture_rates = _check_mixture_rates(c, workload.get("mixture_rates"), mixtures, rates, probing)
    arrival = c.mapping(workload.get("arrival"), "workload.arrival", required=False) or {"process": "poisson"}
    c.unknown(arrival, {"process", "cv", "trace_sha256"}, "workload.arrival")
    process = arrival.get("process", "poisson")
    if process not in (*ARRIVAL_PROCESSES, TRACE_PROCESS):
        known = ", ".join((*ARRIVAL_PROCESSES, TRACE_PROCESS))
        c.fail("workload.arrival.process", f"must be one of {known}, got {process!r}")
    trace_sha = None
    if process == TRACE_PROCESS:
        trace_sha = str(arrival.get("trace_sha256") or "")
        if not re.fullmatch(r"[0-9a-f]{64}", trace_sha):
            c.fail("workload.arrival.trace_sha256", "must be the 64-hex sha256 that trace_import printed")
    elif "trace_sha256" in arrival:
        c.fail("workload.arrival.trace_sha256", f"only applies to process: trace, not {process!r}")
    cv = None
    if process == "gamma":
        cv = c.number(arrival, "cv", "workload.arrival", positive=True, maximum=MAX_CV)
    elif "cv" in arrival:
        c.fail("workload.arrival.cv", f"only applies to the gamma process, not {process!r}")
    prompts = _check_prompts(c, workload.get("prompts"), process)
    rates_source = workload.get("rates_source", "manual")
    if rates_source not in ("manual", "probe"):
        c.fail("workload.rates_source", f"must be manual or probe, got {rates_source!r}")
    if probing and calibration is not None:
        # The probe sets these rates before the first candidate runs; until
        # then they are provisional (fraction x start rate), so the plan exists.
        fractions = calibration["fractions"]
        if rates_raw and set(rates) != set(fractions):
            c.fail(
                "workload.rates",
                f"with calibration on, the rates are set by the probe and must be named like "
                f"calibration.fractions ({', '.join(sorted(fractions))}), got {', '.join(sorted(rates))}",
            )
        if not rates_raw:
            rates = {name: round(f * calibration["start_rps"], 6) for name, f in fractions.items()}
        rates_source = "probe"
    spec["workload"] = {
        "mixtures": mixtures,
        "rates": rates,
        **({"mixture_rates": mixture_rates} if mixture_rates else {}),
        "rates_source": rates_source,
        "arrival": {
            "process": process,
            **({"cv": cv} if cv is not None else {}),
            **({"trace_sha256": trace_sha} if trace_sha else {}),
        },
        **({"prompts": prompts} if prompts else {}),
        **{f.name: _check_field(c, workload, f) for f in WORKLOAD_FIELDS},
    }
    return mixtures, rates


def _check_prompts(c: _Checker, raw: Any, process: Any) -> Prompts | None:
    """``workload.prompts``: generated traffic's prompts from a stored corpus, by its sha256.

    Only the format is checked here; that the corpus is stored and covers every class a
    mixture uses is checked when the experiment is created (apps/lifecycle/creation.py)."""
    if raw is None:
        return None
    data = c.mapping(raw, "workload.prompts")
    c.unknown(data, {"corpus_sha256"}, "workload.prompts")
    sha = data.get("corpus_sha256")
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
        c.fail("workload.prompts.corpus_sha256", "must be the 64-hex sha256 that corpus_import printed")
        return None
    if process == TRACE_PROCESS:
        c.fail(
            "workload.prompts",
            "a replayed trace brings its own prompts; prompts only applies to generated traffic",
        )
        return None
    return {"corpus_sha256": sha}


def _check_field(c: _Checker, workload: Mapping[str, Any], field: WorkloadField) -> Any:
    """One of the workload's scalars, as apps/experiments/workload_fields.py declares it."""
    if field.kind is bool:
        return c.boolean(workload, field.name, "workload", default=bool(field.default))
    if field.choices:
        return c.choice(workload, field.name, "workload", field.values)
    return c.number(
        workload,
        field.name,
        "workload",
        positive=field.positive,
        minimum=field.minimum,
        maximum=field.maximum,
        integer=field.kind is int,
    )


def _check_mixture_rates(
    c: _Checker, raw: Any, mixtures: Mapping[str, Any], rates: Mapping[str, Any], probing: bool
) -> dict[str, dict[str, float]]:
    """Per-mixture rates: mixture -> {rate name: req/s}; each name must be a mixture and a rate."""
    if raw is None:
        return {}
    data = c.mapping(raw, "workload.mixture_rates")
    out: dict[str, dict[str, float]] = {}
    for mix_name, per_raw in data.items():
        path = f"workload.mixture_rates.{mix_name}"
        if mix_name not in mixtures:
            c.fail(path, f"names unknown mixture {mix_name!r} (known: {', '.join(sorted(mixtures))})")
            continue
        per = c.mapping(per_raw, path)
        clean: dict[str, float] = {}
        for rate_name in per:
            if rate_name not in rates and not probing:
                c.fail(
                    f"{path}.{rate_name}",
                    f"names unknown rate {rate_name!r} (known: {', '.join(sorted(rates))})",
                )
                continue
            value = c.number(per, rate_name, path, positive=True, maximum=MAX_RATE_RPS)
            if value is not None:
                clean[rate_name] = value
        out[mix_name] = clean
    return out
