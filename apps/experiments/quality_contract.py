"""The quality contract: a scheduler change must not change what the model says (check 2).

The spec's ``quality`` section turns on a **quality probe**: a small frozen prompt set
(``prompts_per_class`` prompts of each class, or a stored canonical trace by ``trace_sha256``),
replayed with greedy decoding on every sweep run right after warm-up; each candidate's
outputs are compared token by token with B0's on the same prompts (apps/analysis/quality_verdict.py).
A class's own ``quality`` sets the minimum exact-match share and mean agreement length, and
optional validators (a regular expression, a JSON schema, or "must stop with
finish_reason stop"). Checked here like every other section: every problem names its field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

import regex

from apps.experiments.schema_bounds import (
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_EXPANDED,
    MAX_SCHEMA_NODES,
    Unbounded,
    check_references,
    check_size,
)
from apps.experiments.spec_types import (
    ClassQuality,
    JSONObject,
    QualityProbe,
    QualitySpec,
    QualityValidators,
)

DEFAULTS: dict[str, Any] = {"prompts_per_class": 8, "max_tokens": 32, "trace_sha256": None}
MAX_PROMPTS_PER_CLASS = 256
MAX_PROBE_TOKENS = 1024
FINISH_REASONS = ("stop", "length")
# A validator's regular expression: searched in each answer within the analysis's time budget
# (apps/analysis/validators.py); its length is bounded here.
MAX_REGEX_CHARS = 2_000
__all__ = [
    "MAX_REGEX_CHARS",
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "MAX_SCHEMA_EXPANDED",
    "MAX_SCHEMA_NODES",
    "check_class_quality",
    "check_json_schema",
    "check_quality",
]


def _number(
    data: Mapping[str, Any], key: str, path: str, problems: list[tuple[str, str]], *, low: float, high: float,
    integer: bool,
) -> Any:  # fmt: skip
    value = data[key]
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    if not ok or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        problems.append((f"{path}.{key}", f"must be {kind} from {low:g} to {high:g}"))
        return None
    return value


def check_quality(raw: Any) -> tuple[QualitySpec, list[tuple[str, str]]]:
    """The normalised top-level ``quality`` section (``{"probe": {...}}``, every key filled in) and
    its problems as (field path, message)."""
    problems: list[tuple[str, str]] = []
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        return _quality(DEFAULTS), [("quality", "must be a mapping")]
    unknown = sorted(set(raw) - {"probe"})
    if unknown:
        problems.append(("quality", f"unknown key(s): {', '.join(map(str, unknown))}"))
    probe = raw.get("probe") or {}
    if not isinstance(probe, Mapping):
        return _quality(DEFAULTS), [*problems, ("quality.probe", "must be a mapping")]
    unknown = sorted(set(probe) - set(DEFAULTS))
    if unknown:
        problems.append(("quality.probe", f"unknown key(s): {', '.join(map(str, unknown))}"))
    out = dict(DEFAULTS)
    path = "quality.probe"
    if "prompts_per_class" in probe:
        out["prompts_per_class"] = _number(
            probe, "prompts_per_class", path, problems, low=1, high=MAX_PROMPTS_PER_CLASS, integer=True
        )
    if "max_tokens" in probe:
        out["max_tokens"] = _number(
            probe, "max_tokens", path, problems, low=1, high=MAX_PROBE_TOKENS, integer=True
        )
    sha = probe.get("trace_sha256")
    if sha is not None:
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            problems.append(
                (f"{path}.trace_sha256", "must be 64 lowercase hex digits (a stored trace's hash)")
            )
        else:
            out["trace_sha256"] = sha
    return _quality(out), problems


def _quality(probe: Mapping[str, Any]) -> QualitySpec:
    """The section around a probe's options (every key of DEFAULTS filled in)."""
    return {"probe": cast(QualityProbe, dict(probe))}


def check_json_schema(schema: Any) -> tuple[JSONObject, str | None]:
    """A validator's JSON schema and the problem with it, if any: a Draft 2020-12 schema within
    the bounds of apps/experiments/schema_bounds.py (size first, then the metaschema, then its
    references), so that validating an answer against it is bounded work."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(schema, Mapping):
        return {}, "not a JSON schema: must be a mapping (a JSON schema)"
    try:
        check_size(schema)
        Draft202012Validator.check_schema(schema)
        check_references(schema)
    except SchemaError as exc:
        return {}, f"not a JSON schema: {exc.message}"
    except Unbounded as exc:
        return {}, f"not a bounded JSON schema: {exc}"
    return cast(JSONObject, dict(schema)), None


def check_class_quality(raw: Any, path: str) -> tuple[ClassQuality, list[tuple[str, str]]]:
    """A class's ``quality``: ``min_exact_match`` (0..1), ``min_agreement_tokens`` (>= 0) and
    ``validators`` (``regex``, ``json_schema``, ``finish_reason``)."""
    problems: list[tuple[str, str]] = []
    if not isinstance(raw, Mapping):
        return {}, [(path, "must be a mapping")]
    unknown = sorted(set(raw) - {"min_exact_match", "min_agreement_tokens", "validators"})
    if unknown:
        problems.append((path, f"unknown key(s): {', '.join(map(str, unknown))}"))
    out: ClassQuality = {}
    if "min_exact_match" in raw:
        out["min_exact_match"] = _number(raw, "min_exact_match", path, problems, low=0, high=1, integer=False)
    if "min_agreement_tokens" in raw:
        out["min_agreement_tokens"] = _number(
            raw, "min_agreement_tokens", path, problems, low=0, high=MAX_PROBE_TOKENS, integer=False
        )
    validators = raw.get("validators")
    if validators is not None:
        vpath = f"{path}.validators"
        if not isinstance(validators, Mapping):
            problems.append((vpath, "must be a mapping"))
        else:
            unknown = sorted(set(validators) - {"regex", "json_schema", "finish_reason"})
            if unknown:
                problems.append((vpath, f"unknown key(s): {', '.join(map(str, unknown))}"))
            checked: QualityValidators = {}
            if "regex" in validators:
                pattern = validators["regex"]
                try:
                    if not isinstance(pattern, str) or len(pattern) > MAX_REGEX_CHARS:
                        raise regex.error(f"must be text of at most {MAX_REGEX_CHARS:,} characters")
                    regex.compile(pattern)
                    checked["regex"] = pattern
                except regex.error as exc:
                    problems.append((f"{vpath}.regex", f"not a regular expression: {exc}"))
            if "json_schema" in validators:
                schema, problem = check_json_schema(validators["json_schema"])
                if problem:
                    problems.append((f"{vpath}.json_schema", problem))
                else:
                    checked["json_schema"] = schema
            if "finish_reason" in validators:
                if validators["finish_reason"] not in FINISH_REASONS:
                    problems.append((f"{vpath}.finish_reason", "must be stop or length"))
                else:
                    checked["finish_reason"] = validators["finish_reason"]
            out["validators"] = checked
    return out, problems
