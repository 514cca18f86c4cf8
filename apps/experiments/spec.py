"""The experiment spec: YAML in, a validated plain dict out (and back).

Pure: no Django. ``parse_spec`` collects every problem it finds, each naming
the field path (``workload.mixtures.80-20``, ``candidates[2].args``) and the
reason, so a user fixes a spec in one pass. Nothing is saved by this module;
the service that creates the experiment only runs once the spec is valid.
The format is documented in docs/SPEC.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import yaml

from apps.analysis.compare import PRIMARY_CHOICES
from apps.experiments.generation import GENERATION_FLAGS, GENERATION_KEYS

# Scheduler args a cell may vary, with their types. Everything else that
# shapes the server is a frozen control (same for every cell) or is refused.
CELL_ARGS: dict[str, type] = {
    "max_num_batched_tokens": int,
    "max_num_seqs": int,
    "enable_chunked_prefill": bool,
    "scheduling_policy": str,
    "long_prefill_token_threshold": int,
    "max_num_queued_reqs": int,
}
SCHEDULING_POLICIES = ("fcfs", "priority")
ARRIVAL_PROCESSES = ("constant", "poisson", "gamma")
# Replay a stored imported trace (manage.py trace_import) instead of generating arrivals.
TRACE_PROCESS = "trace"
CONTROL_KEYS = {
    "dtype",
    "tensor_parallel_size",
    "max_model_len",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "enable_prefix_caching",
    "speculative_decoding",
    "seed",
    "generation",
}
# Sections every experiment has (the create form types each one), and the optional ones.
CORE_SECTIONS = frozenset(
    {
        "name",
        "description",
        "owner",
        "model",
        "controls",
        "engine",
        "baseline",
        "candidates",
        "classes",
        "workload",
    }
)
OPTIONAL_SECTIONS = frozenset({"scenarios", "calibration", "analysis", "recovery", "quality"})
TOP_KEYS = CORE_SECTIONS | OPTIONAL_SECTIONS
WORKLOAD_KEYS = {
    "mixtures",
    "rates",
    "mixture_rates",
    "rates_source",
    "arrival",
    "repeats",
    "repeat_traces",
    "output_mode",
    "seed",
    "warmup_s",
    "observation_s",
    "drain_deadline_s",
    "max_dispatch_lag_ms",
    "uniform_companion",
}
# workload.repeat_traces: every repeat replays the same frozen traces (repeat variation is then
# the server's), or each repeat gets its own draw from the seed (traffic variation included).
REPEAT_TRACES = ("same", "fresh")


# workload.output_mode: exact forces every request's length (ignore_eos, min_tokens); natural
# sends the length as a cap only and records what the model did (length, finish_reason).
OUTPUT_MODES = ("exact", "natural")


# A class's primary metric: the tail its gains are judged on (docs/ANALYSIS.md);
# left out, the short class is judged on TTFT and the long class on end-to-end latency.
PRIMARY_METRICS = PRIMARY_CHOICES

# Upper bounds of a spec (docs/SPEC.md, "Limits"), checked before anything expands, so a
# careless or hostile spec is a field error, never a plan the web process tries to build.
MAX_SPEC_BYTES = 1_000_000
MAX_YAML_DEPTH = 32
MAX_CELLS = 200
MAX_CLASSES = 50
MAX_MIXTURES = 20
MAX_RATES = 20
MAX_REPEATS = 100
MAX_WINDOW_S = 86_400.0  # any one window: warm-up, observation, drain
MAX_TOKENS = 1_048_576  # max_model_len and any token count
MAX_RATE_RPS = 100_000.0
MAX_LATENCY_MS = 86_400_000.0
MAX_SEED = 2**63 - 1
MAX_PRIORITY = 1_000_000
MAX_KV_BYTES = 2**50
MAX_PARALLEL = 1024
MAX_CV = 1000.0
# Anything else numeric: a value no setting of tailtune's needs.
NUMBER_CEILING = 1e15


# Start and stop of a server around each run (seconds): the plan's estimates and its cap.
RUN_OVERHEAD_S = 60.0


@dataclass(frozen=True)
class SpecLimits:
    """The caps on a whole plan; the service reads them from settings (TAILTUNE_MAX_RUNS, ...)."""

    max_runs: int = 10_000
    max_engine_hours: float = 2_000.0
    # Engine time a run costs beyond its windows (start, confirm, warm-up, stop).
    run_overhead_s: float = RUN_OVERHEAD_S


DEFAULT_LIMITS = SpecLimits()
CONTRACT_KEYS = ("ttft_p99_ms", "e2e_p99_ms", "max_stall_ms", "error_rate")
WEIGHT_TOLERANCE = 1e-6


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """A spec that cannot be used; ``errors`` lists every problem found."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


def _short(value: Any) -> str:
    """A number for an error message: a huge integer is named by its size, not printed whole."""
    if isinstance(value, int) and abs(value) >= 10**18:
        return f"a {len(str(abs(value)))}-digit number"
    return repr(value)


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


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, from JSON "\\ud800"
        return False
    return True


class _Checker:
    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def fail(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path, message))

    def mapping(self, value: Any, path: str, *, required: bool = True) -> dict[str, Any]:
        if value is None and not required:
            return {}
        if not isinstance(value, Mapping):
            self.fail(path, "required mapping is missing" if value is None else "must be a mapping")
            return {}
        return {str(k): v for k, v in value.items()}

    def unknown(self, data: Mapping[str, Any], allowed: AbstractSet[str], path: str) -> None:
        for key in sorted(set(data) - allowed):
            self.fail(f"{path}.{key}" if path else key, "unknown field")

    def text(
        self, data: Mapping[str, Any], key: str, path: str, *, required: bool = True, max_length: int = 10_000
    ) -> str:
        value = data.get(key)
        where = f"{path}.{key}" if path else key
        if value is None or value == "":
            if required:
                self.fail(where, "is required")
            return ""
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            self.fail(where, "must be a string")
            return ""
        text = str(value)
        if len(text) > max_length:
            self.fail(where, f"is {len(text)} characters; at most {max_length}")
            return ""
        if "\x00" in text or not _encodable(text):
            self.fail(where, "must be plain text (no NUL character, valid UTF-8)")
            return ""
        return text

    def number(
        self,
        data: Mapping[str, Any],
        key: str,
        path: str,
        *,
        required: bool = True,
        positive: bool = False,
        minimum: float | None = None,
        maximum: float | None = None,
        integer: bool = False,
        default: Any = None,
    ) -> Any:
        where = f"{path}.{key}" if path else key
        if key not in data or data[key] is None:
            if required:
                self.fail(where, "is required")
            return default
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(where, f"must be a number, got {value!r}")
            return default
        if integer and not (isinstance(value, int) or float(value).is_integer()):
            self.fail(where, f"must be a whole number, got {value!r}")
            return default
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(where, f"must be finite, got {value!r}")
            return default
        if positive and value <= 0:
            self.fail(where, f"must be positive, got {value!r}")
            return default
        if minimum is not None and value < minimum:
            self.fail(where, f"must be at least {minimum}, got {value!r}")
            return default
        ceiling = maximum if maximum is not None else NUMBER_CEILING
        if value > ceiling:
            shown = maximum if maximum is not None else f"{NUMBER_CEILING:g}"
            self.fail(where, f"must be at most {shown}, got {_short(value)}")
            return default
        if minimum is None and not positive and value < -NUMBER_CEILING:
            self.fail(where, f"must be at least {-NUMBER_CEILING:g}, got {_short(value)}")
            return default
        return int(value) if integer else float(value)

    def choice(self, data: Mapping[str, Any], key: str, path: str, choices: tuple[str, ...]) -> str:
        """One of ``choices``; the first when the key is absent."""
        value = data.get(key, choices[0])
        if value not in choices:
            self.fail(f"{path}.{key}", f"must be {' or '.join(choices)}, got {value!r:.60}")
            return choices[0]
        return str(value)

    def boolean(self, data: Mapping[str, Any], key: str, path: str, *, default: bool) -> bool:
        if key not in data or data[key] is None:
            return default
        if not isinstance(data[key], bool):
            self.fail(f"{path}.{key}", f"must be true or false, got {data[key]!r}")
            return default
        return data[key]


def _check_args(c: _Checker, raw: Any, path: str, max_model_len: int | None) -> dict[str, Any]:
    args = c.mapping(raw, path)
    out: dict[str, Any] = {}
    for key, value in args.items():
        where = f"{path}.{key}"
        if key not in CELL_ARGS:
            if key in CONTROL_KEYS:
                c.fail(where, "is a frozen control: set it once under controls, not per cell")
            else:
                allowed = ", ".join(sorted(CELL_ARGS))
                c.fail(where, f"is not an allowed vLLM scheduler flag (allowed: {allowed})")
            continue
        kind = CELL_ARGS[key]
        if kind is bool:
            if not isinstance(value, bool):
                c.fail(where, f"must be true or false, got {value!r}")
                continue
            out[key] = value
        elif kind is int:
            number = c.number(args, key, path, positive=True, integer=True)
            if number is not None:
                out[key] = number
        elif key == "scheduling_policy":
            if value not in SCHEDULING_POLICIES:
                c.fail(where, f"must be one of {', '.join(SCHEDULING_POLICIES)}, got {value!r}")
                continue
            out[key] = value
    budget = out.get("max_num_batched_tokens")
    chunked = out.get("enable_chunked_prefill", True)
    if budget is not None and max_model_len is not None and not chunked and budget < max_model_len:
        # vLLM refuses this: without chunking, one prompt must fit in one step.
        c.fail(
            f"{path}.max_num_batched_tokens",
            f"{budget} is below controls.max_model_len ({max_model_len}) with chunked prefill off; "
            "vLLM refuses that (raise it or set enable_chunked_prefill: true)",
        )
    return out


def parse_spec(text: str, *, limits: SpecLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Parse and validate a YAML spec; return the normalised spec or raise SpecError."""
    return validate_spec(load_yaml(text), limits=limits)


def validate_spec(raw: Any, *, limits: SpecLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Validate a spec already loaded into Python; return it normalised.

    Every number has an upper bound, and the plan's size (runs and engine-hours)
    is computed from the counts and checked against ``limits`` before anything
    is expanded.
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

    controls = c.mapping(top.get("controls"), "controls")
    c.unknown(controls, CONTROL_KEYS, "controls")
    max_model_len = c.number(
        controls, "max_model_len", "controls", positive=True, integer=True, maximum=MAX_TOKENS
    )
    generation = c.mapping(controls.get("generation"), "controls.generation", required=False)
    spec["controls"] = {
        "dtype": c.text(controls, "dtype", "controls", required=False, max_length=32) or "auto",
        "tensor_parallel_size": c.number(
            controls,
            "tensor_parallel_size",
            "controls",
            required=False,
            positive=True,
            integer=True,
            maximum=MAX_PARALLEL,
            default=1,
        ),
        "max_model_len": max_model_len,
        "gpu_memory_utilization": c.number(
            controls, "gpu_memory_utilization", "controls", required=False, positive=True, maximum=1.0
        ),
        "kv_cache_memory_bytes": c.number(
            controls,
            "kv_cache_memory_bytes",
            "controls",
            required=False,
            positive=True,
            integer=True,
            maximum=MAX_KV_BYTES,
        ),
        "enable_prefix_caching": c.boolean(controls, "enable_prefix_caching", "controls", default=False),
        "speculative_decoding": c.boolean(controls, "speculative_decoding", "controls", default=False),
        "seed": c.number(
            controls, "seed", "controls", required=False, integer=True, minimum=0, maximum=MAX_SEED, default=0
        ),
        "generation": _check_generation(c, generation),
    }
    if spec["controls"]["speculative_decoding"]:
        c.fail(
            "controls.speculative_decoding",
            "speculative decoding is not supported by the engine launcher yet",
        )

    engine = c.mapping(top.get("engine"), "engine", required=False)
    c.unknown(engine, {"image", "reuse", "early_stop"}, "engine")
    spec["engine"] = {
        "image": c.text(engine, "image", "engine", required=False, max_length=300),
        # One server per cell and round, idle-checked between traces (workers/pull.py); false:
        # one start per run.
        "reuse": c.boolean(engine, "reuse", "engine", default=True),
        # Skip a cell's remaining sweep runs once it can no longer be accepted
        # (apps/analysis/early_stop.py); false: run every planned run.
        "early_stop": c.boolean(engine, "early_stop", "engine", default=True),
    }

    baseline = c.mapping(top.get("baseline"), "baseline")
    c.unknown(baseline, {"id", "args", "captured_from"}, "baseline")
    spec["baseline"] = {
        "id": c.text(baseline, "id", "baseline", max_length=32),
        "captured_from": c.text(baseline, "captured_from", "baseline", required=False),
        "args": _check_args(c, baseline.get("args"), "baseline.args", max_model_len),
    }

    candidates_raw = top.get("candidates")
    candidates: list[dict[str, Any]] = []
    if not isinstance(candidates_raw, list) or not candidates_raw:
        c.fail("candidates", "must be a non-empty list of {id, args}")
    else:
        for i, item in enumerate(candidates_raw):
            path = f"candidates[{i}]"
            cand = c.mapping(item, path)
            c.unknown(cand, {"id", "args", "engine"}, path)
            cell: dict[str, Any] = {
                "id": c.text(cand, "id", path, max_length=32),
                "args": _check_args(c, cand.get("args"), f"{path}.args", max_model_len),
            }
            if cand.get("engine") is not None:
                # A candidate that is another engine build or model revision, not only other flags.
                engine = c.mapping(cand.get("engine"), f"{path}.engine")
                c.unknown(engine, {"image", "model_revision"}, f"{path}.engine")
                override = {
                    key: c.text(engine, key, f"{path}.engine", required=False, max_length=200)
                    for key in ("image", "model_revision")
                }
                override = {k: v for k, v in override.items() if v}
                if not override and not any(engine.get(k) for k in ("image", "model_revision")):
                    c.fail(f"{path}.engine", "give image and/or model_revision, or leave engine out")
                if override:
                    cell["engine"] = override
            candidates.append(cell)
    spec["candidates"] = candidates
    seen: dict[str, str] = {}
    for path, cell_id in [("baseline.id", spec["baseline"]["id"])] + [
        (f"candidates[{i}].id", cand["id"]) for i, cand in enumerate(candidates)
    ]:
        if not cell_id:
            continue
        if cell_id in seen:
            c.fail(path, f"duplicate cell id {cell_id!r} (also at {seen[cell_id]})")
        else:
            seen[cell_id] = path

    classes_raw = top.get("classes")
    classes: list[dict[str, Any]] = []
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
            contract = {
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
            entry = {
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
                from apps.experiments.quality import check_class_quality

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
    class_names = {cls["name"] for cls in classes}

    calibration = _check_calibration(c, top.get("calibration")) if "calibration" in top else None
    probing = bool(calibration and calibration["enabled"])

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
        "repeats": c.number(
            workload, "repeats", "workload", positive=True, integer=True, maximum=MAX_REPEATS
        ),
        "repeat_traces": c.choice(workload, "repeat_traces", "workload", REPEAT_TRACES),
        "output_mode": c.choice(workload, "output_mode", "workload", OUTPUT_MODES),
        "seed": c.number(workload, "seed", "workload", integer=True, minimum=0, maximum=MAX_SEED),
        "warmup_s": c.number(workload, "warmup_s", "workload", minimum=0.0, maximum=MAX_WINDOW_S),
        "observation_s": c.number(workload, "observation_s", "workload", positive=True, maximum=MAX_WINDOW_S),
        "drain_deadline_s": c.number(
            workload, "drain_deadline_s", "workload", positive=True, maximum=MAX_WINDOW_S
        ),
        "max_dispatch_lag_ms": c.number(
            workload, "max_dispatch_lag_ms", "workload", positive=True, maximum=MAX_WINDOW_S * 1000
        ),
        # Also replay each (cell, mixture, rate) once on constant spacing: uniform vs bursty.
        "uniform_companion": c.boolean(workload, "uniform_companion", "workload", default=False),
    }

    if calibration is not None:
        for i, name in enumerate(calibration["mixtures"] or []):
            if name not in mixtures:
                c.fail(f"calibration.mixtures[{i}]", f"names unknown mixture {name!r}")
        spec["calibration"] = calibration
    if "scenarios" in top:
        spec["scenarios"] = _check_scenarios(c, top.get("scenarios"), set(seen))
    if "analysis" in top:
        spec["analysis"] = _check_analysis(c, top.get("analysis"), set(rates))
    if "quality" in top or any("quality" in cls for cls in spec.get("classes") or []):
        from apps.experiments.quality import check_quality

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
            if (
                cap
                and max_model_len
                and cls.get("input_tokens")
                and cls["input_tokens"] + cap > max_model_len
            ):
                c.fail(
                    "quality.probe.max_tokens",
                    f"{cls['name']}'s {cls['input_tokens']} input tokens + {cap} exceed "
                    f"controls.max_model_len ({max_model_len})",
                )
    if "recovery" in top:
        spec["recovery"] = _check_recovery(
            c, top.get("recovery"), spec["workload"], set(mixtures), set(rates)
        )
    _check_counts(c, spec)
    if not c.errors:
        _check_plan_size(c, spec, limits)

    if c.errors:
        raise SpecError(c.errors)
    return spec


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


def plan_size(spec: Mapping[str, Any], limits: SpecLimits = DEFAULT_LIMITS) -> tuple[int, float]:
    """(runs, engine-hours) a validated spec plans, from its counts alone (nothing is expanded).

    Sweep runs = cells x mixtures x rates x repeats; the uniform companions add
    cells x mixtures x rates; each failure scenario at most one run per cell; the
    rollback rehearsal (on unless ``recovery.rehearse`` is false) one run that starts
    two servers. A run costs its windows plus ``limits.run_overhead_s`` per server start.
    """
    w = spec["workload"]
    cells = 1 + len(spec["candidates"])
    points = cells * len(w["mixtures"]) * len(w["rates"])
    runs = points * int(w["repeats"])
    if w.get("uniform_companion"):
        runs += points
    runs += cells * len(spec.get("scenarios") or {})
    per_run = float(w["warmup_s"]) + float(w["observation_s"]) + float(w["drain_deadline_s"])
    hours = runs * (per_run + limits.run_overhead_s) / 3600.0
    if (spec.get("recovery") or {}).get("rehearse", True):
        # The rollback rehearsal of the proposed cell: one run, two servers started.
        runs += 1
        hours += (per_run + 2 * limits.run_overhead_s) / 3600.0
    return runs, hours


def _check_plan_size(c: _Checker, spec: Mapping[str, Any], limits: SpecLimits) -> None:
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


def _check_generation(c: _Checker, data: Mapping[str, Any]) -> dict[str, Any]:
    """Known sampling keys only, each a bounded number (or a flag): checked like every other section."""
    path = "controls.generation"
    c.unknown(data, set(GENERATION_KEYS) | set(GENERATION_FLAGS), path)
    out: dict[str, Any] = {}
    for key, (kind, low, high) in GENERATION_KEYS.items():
        if key in data:
            out[key] = c.number(data, key, path, integer=kind is int, minimum=low, maximum=high)
    for key in GENERATION_FLAGS:
        if key in data:
            out[key] = c.boolean(data, key, path, default=False)
    return out


def _check_analysis(c: _Checker, raw: Any, rate_names: set[str]) -> dict[str, Any]:
    """Analysis options (docs/ANALYSIS.md), checked by the analysis's own parser."""
    from apps.analysis.report import ReportOptions

    data = c.mapping(raw, "analysis")
    for i, name in enumerate(data.get("agreed_rates") or []):
        if name not in rate_names:
            c.fail(f"analysis.agreed_rates[{i}]", f"names unknown rate {name!r}")
    try:
        return ReportOptions.from_mapping(data).to_json()
    except (TypeError, ValueError) as exc:
        c.fail("analysis", str(exc))
        return {}


def _check_recovery(
    c: _Checker, raw: Any, workload: Mapping[str, Any], mixtures: set[str], rates: set[str]
) -> dict[str, Any]:
    """The rollback rehearsal (apps/experiments/recovery.py), checked against the trace's windows."""
    from apps.experiments.recovery import check_recovery

    options, problems = check_recovery(
        raw, warmup_s=workload.get("warmup_s"), observation_s=workload.get("observation_s")
    )
    for path, message in problems:
        c.fail(path, message)
    for key, known in (("mixture", mixtures), ("rate", rates)):
        if options[key] is not None and known and options[key] not in known:
            c.fail(f"recovery.{key}", f"names unknown {key} {options[key]!r}")
    return options


CALIBRATION_DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "start_rps": 1.0,
    "tolerance": 0.1,
    "max_steps": 8,
    "warmup_s": 2.0,
    "observation_s": 20.0,
    "drain_deadline_s": 15.0,
    "min_accepted_share": 0.99,
    "fractions": {"low": 0.3, "near_capacity": 0.9},
    "mixtures": None,
    # mixture: each mixture's rates are fractions of its own capacity;
    # experiment: one set of rates, fractions of the smallest capacity.
    "rates_per": "mixture",
}
RATES_PER = ("mixture", "experiment")


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


def _check_calibration(c: _Checker, raw: Any) -> dict[str, Any]:
    """The capacity probe's settings (docs/SCENARIOS.md), defaults filled in."""
    path = "calibration"
    data = c.mapping(raw, path)
    c.unknown(data, set(CALIBRATION_DEFAULTS), path)
    d = CALIBRATION_DEFAULTS
    out: dict[str, Any] = {
        "enabled": c.boolean(data, "enabled", path, default=True),
        "start_rps": c.number(
            data,
            "start_rps",
            path,
            required=False,
            positive=True,
            maximum=MAX_RATE_RPS,
            default=d["start_rps"],
        ),
        "tolerance": c.number(
            data, "tolerance", path, required=False, positive=True, maximum=0.99, default=d["tolerance"]
        ),
        "max_steps": c.number(
            data,
            "max_steps",
            path,
            required=False,
            integer=True,
            minimum=1,
            maximum=50,
            default=d["max_steps"],
        ),
        "warmup_s": c.number(
            data, "warmup_s", path, required=False, minimum=0.0, maximum=MAX_WINDOW_S, default=d["warmup_s"]
        ),
        "observation_s": c.number(
            data,
            "observation_s",
            path,
            required=False,
            positive=True,
            maximum=MAX_WINDOW_S,
            default=d["observation_s"],
        ),
        "drain_deadline_s": c.number(
            data,
            "drain_deadline_s",
            path,
            required=False,
            positive=True,
            maximum=MAX_WINDOW_S,
            default=d["drain_deadline_s"],
        ),
        "min_accepted_share": c.number(
            data,
            "min_accepted_share",
            path,
            required=False,
            minimum=0.0,
            maximum=1.0,
            default=d["min_accepted_share"],
        ),
    }
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
    return out


def _check_scenarios(c: _Checker, raw: Any, cell_ids: set[str]) -> dict[str, Any]:
    """Failure scenarios: name -> {cells, params}; parameters checked by the generator's own rules."""
    from apps.workloads.scenarios import DEFAULTS, scenario_params

    data = c.mapping(raw, "scenarios")
    out: dict[str, Any] = {}
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


def dump_spec(spec: Mapping[str, Any]) -> str:
    """Serialise a normalised spec as YAML (keys in the documented order)."""
    return yaml.safe_dump(dict(spec), sort_keys=False, default_flow_style=False, allow_unicode=True)
