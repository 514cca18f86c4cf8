"""The create form: builds the same spec dict as the YAML format, or takes an uploaded YAML spec.

The form parses only what a field's own shape needs (a comma list, a
``name: class=weight`` line); every rule about the spec lives in
:func:`apps.experiments.spec.validate_spec`, and each error it reports is
shown beside the field that produced its path (``spec_field_for``). Nothing
is saved here: the view calls the service only once the whole spec is valid.
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.forms import formset_factory

from apps.experiments.services import spec_limits
from apps.experiments.spec import (
    ARRIVAL_PROCESSES,
    CONTRACT_KEYS,
    CORE_SECTIONS,
    PRIMARY_METRICS,
    SCHEDULING_POLICIES,
    FieldError,
    SpecError,
    load_yaml,
    parse_spec,
    validate_spec,
)
from apps.workloads.importers import FORMATS as TRACE_FORMATS

MAX_SPEC_BYTES = 1_000_000
POLICY_CHOICES = [("", "(vLLM default)")] + [(p, p) for p in SCHEDULING_POLICIES]
CHUNKED_CHOICES = [("", "(vLLM default)"), ("true", "on"), ("false", "off")]
# Optional scheduler args shown for B0 and each single cell (beside the grid's two axes).
EXTRA_ARGS = ("long_prefill_token_threshold", "max_num_queued_reqs")


def _int_list(text: str) -> list[int]:
    values: list[int] = []
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        try:
            value = int(part)
        except ValueError:
            raise ValidationError(f"{part!r} is not a whole number (enter values like 2048, 4096)") from None
        if value <= 0:
            raise ValidationError(f"{value} must be positive")
        if value in values:
            raise ValidationError(f"{value} is listed twice")
        values.append(value)
    return values


def _chunked(value: str) -> bool | None:
    return {"true": True, "false": False}.get(value)


class ExperimentForm(forms.Form):
    # Identity
    name = forms.CharField(max_length=200, required=False)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    spec_file = forms.FileField(
        required=False,
        label="Or upload a YAML spec",
        help_text="A spec in the format of examples/seed-sweep.yaml; it replaces everything typed below.",
    )
    # The uploaded spec's text, kept across a preview so that Create uses it (a browser never
    # re-sends a file input). Never typed; bounded like any spec.
    spec_text = forms.CharField(required=False, widget=forms.HiddenInput, max_length=1_000_000)
    # Model and frozen controls
    model_path = forms.CharField(max_length=500, required=False, label="Model path")
    model_revision = forms.CharField(max_length=200, required=False, label="Model revision")
    tokenizer_revision = forms.CharField(max_length=200, required=False, label="Tokenizer revision")
    dtype = forms.CharField(max_length=32, required=False, initial="auto")
    tensor_parallel_size = forms.IntegerField(required=False, initial=1, label="Tensor parallel size")
    max_model_len = forms.IntegerField(required=False, label="Max model length (tokens)")
    gpu_memory_utilization = forms.FloatField(required=False, label="GPU memory utilization (0-1)")
    kv_cache_memory_bytes = forms.IntegerField(required=False, label="KV cache memory (bytes)")
    enable_prefix_caching = forms.BooleanField(required=False, label="Prefix caching")
    engine_seed = forms.IntegerField(required=False, initial=0, label="Engine seed")
    generation = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Generation settings (YAML)",
        help_text="e.g. {temperature: 0.0, ignore_eos: true}",
    )
    engine_image = forms.CharField(max_length=300, required=False, label="Engine image")
    # B0
    baseline_id = forms.CharField(max_length=32, required=False, initial="B0", label="Baseline id")
    baseline_captured_from = forms.CharField(
        max_length=500,
        required=False,
        label="Captured from",
        help_text="Where B0's args were read (deployment, date).",
    )
    baseline_max_num_batched_tokens = forms.IntegerField(required=False, label="max_num_batched_tokens")
    baseline_max_num_seqs = forms.IntegerField(required=False, label="max_num_seqs")
    baseline_enable_chunked_prefill = forms.ChoiceField(
        choices=CHUNKED_CHOICES, required=False, label="enable_chunked_prefill"
    )
    baseline_scheduling_policy = forms.ChoiceField(
        choices=POLICY_CHOICES, required=False, label="scheduling_policy"
    )
    baseline_long_prefill_token_threshold = forms.IntegerField(
        required=False, label="long_prefill_token_threshold"
    )
    baseline_max_num_queued_reqs = forms.IntegerField(required=False, label="max_num_queued_reqs")
    # The candidate grid
    grid_max_num_batched_tokens = forms.CharField(
        required=False,
        label="max_num_batched_tokens values",
        help_text="Comma-separated, e.g. 2048, 4096, 8192",
    )
    grid_max_num_seqs = forms.CharField(
        required=False, label="max_num_seqs values", help_text="Comma-separated, e.g. 16, 32"
    )
    grid_enable_chunked_prefill = forms.ChoiceField(
        choices=CHUNKED_CHOICES, required=False, initial="true", label="enable_chunked_prefill (grid)"
    )
    grid_scheduling_policy = forms.ChoiceField(
        choices=POLICY_CHOICES, required=False, label="scheduling_policy (grid)"
    )
    # Workload
    mixtures = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One per line, name: class=weight, ... (weights sum to 1), e.g. 80-20: short=0.8, long=0.2",
    )
    rates = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Rates (req/s)",
        help_text="One per line, name: requests per second, e.g. low: 2.0",
    )
    arrival_process = forms.ChoiceField(
        choices=[(p, p) for p in ARRIVAL_PROCESSES],
        initial="poisson",
        required=False,
        label="Arrival process",
    )
    arrival_cv = forms.FloatField(required=False, label="Arrival CV (gamma only)")
    repeats = forms.IntegerField(required=False, initial=3)
    repeat_traces = forms.ChoiceField(
        choices=[
            ("same", "same: every repeat replays the same frozen traces"),
            ("fresh", "fresh: each repeat draws its own traffic from the seed"),
        ],
        initial="same",
        required=False,
        label="Repeats replay",
    )
    output_mode = forms.ChoiceField(
        choices=[
            ("exact", "exact: every request decodes exactly its output tokens"),
            ("natural", "natural: output tokens are a cap; the model stops where it stops"),
        ],
        initial="exact",
        required=False,
        label="Output lengths",
    )
    seed = forms.IntegerField(required=False, initial=0, label="Workload seed")
    warmup_s = forms.FloatField(required=False, initial=10, label="Warm-up (s)")
    observation_s = forms.FloatField(required=False, initial=120, label="Observation window (s)")
    drain_deadline_s = forms.FloatField(required=False, initial=60, label="Drain deadline (s)")
    max_dispatch_lag_ms = forms.FloatField(
        required=False,
        initial=5,
        label="Dispatch-lag tolerance (ms)",
        help_text="How late the load generator may send a request (p99 of send time minus planned time) "
        "before the run is invalid: later than this, the offered load was not the planned one. A few ms "
        "on a quiet client machine; more where the client shares CPUs with the engine.",
    )
    # A real trace to replay instead of generated arrivals (stored when the experiment is created).
    trace_file = forms.FileField(
        required=False,
        label="Or replay a real trace",
        help_text="An Azure, BurstGPT, Mooncake or vLLM timed-trace file; every run replays it "
        "(the arrival fields above are then ignored). Data you upload is stored by its hash.",
    )
    trace_format = forms.ChoiceField(
        choices=[(f, f) for f in TRACE_FORMATS], required=False, label="Trace format"
    )
    trace_classes = forms.CharField(
        required=False,
        initial="short:1024,long",
        label="Classes by input length",
        help_text="name:max_input_tokens, ..., the last without a limit; names must be the classes below.",
    )
    trace_busiest_s = forms.FloatField(
        required=False, min_value=1, label="Keep the busiest (s)", help_text="Empty: the whole file."
    )
    extra = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        label="More spec sections (YAML)",
        help_text="Top-level spec sections the fields above do not cover (e.g. scenarios, calibration), "
        "as in docs/SPEC.md.",
    )

    # Field groups, in the order the template shows them.
    SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("Experiment", ("name", "description", "spec_file")),
        (
            "Model and frozen controls",
            (
                "model_path",
                "model_revision",
                "tokenizer_revision",
                "dtype",
                "tensor_parallel_size",
                "max_model_len",
                "gpu_memory_utilization",
                "kv_cache_memory_bytes",
                "enable_prefix_caching",
                "engine_seed",
                "generation",
                "engine_image",
            ),
        ),
        (
            "Baseline B0 (production's args)",
            (
                "baseline_id",
                "baseline_captured_from",
                "baseline_max_num_batched_tokens",
                "baseline_max_num_seqs",
                "baseline_enable_chunked_prefill",
                "baseline_scheduling_policy",
                "baseline_long_prefill_token_threshold",
                "baseline_max_num_queued_reqs",
            ),
        ),
        (
            "Candidate grid (cross product)",
            (
                "grid_max_num_batched_tokens",
                "grid_max_num_seqs",
                "grid_enable_chunked_prefill",
                "grid_scheduling_policy",
            ),
        ),
        (
            "Workload",
            (
                "mixtures",
                "rates",
                "arrival_process",
                "arrival_cv",
                "repeats",
                "repeat_traces",
                "output_mode",
                "seed",
                "warmup_s",
                "observation_s",
                "drain_deadline_s",
                "max_dispatch_lag_ms",
                "extra",
            ),
        ),
        ("Real trace (optional)", ("trace_file", "trace_format", "trace_classes", "trace_busiest_s")),
    )

    def sections(self) -> list[tuple[str, list[forms.BoundField]]]:
        return [(title, [self[name] for name in names]) for title, names in self.SECTIONS]

    def clean_grid_max_num_batched_tokens(self) -> list[int]:
        return _int_list(self.cleaned_data.get("grid_max_num_batched_tokens") or "")

    def clean_grid_max_num_seqs(self) -> list[int]:
        return _int_list(self.cleaned_data.get("grid_max_num_seqs") or "")

    def clean_generation(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("generation") or "").strip()
        if not text:
            return {}
        try:
            value = load_yaml(text)
        except SpecError as exc:
            raise ValidationError(f"not valid YAML; write it like {{temperature: 0.0}} ({exc})") from None
        if not isinstance(value, dict):
            raise ValidationError("must be a mapping, like {temperature: 0.0}")
        return value

    def clean_extra(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("extra") or "").strip()
        if not text:
            return {}
        try:
            value = load_yaml(text)
        except SpecError as exc:
            raise ValidationError(f"not valid YAML ({exc})") from None
        if not isinstance(value, dict):
            raise ValidationError("must be a mapping of spec sections, like {scenarios: [...]}")
        typed = sorted(set(value) & TYPED_SECTIONS)
        if typed:
            raise ValidationError(f"{', '.join(typed)}: set these with the fields above")
        return value

    def clean_mixtures(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for n, line in enumerate((self.cleaned_data.get("mixtures") or "").splitlines(), start=1):
            if not line.strip():
                continue
            name, sep, rest = line.partition(":")
            if not sep or not name.strip():
                raise ValidationError(f"line {n}: write it as name: class=weight, class=weight")
            weights: dict[str, Any] = {}
            for part in rest.split(","):
                if not part.strip():
                    continue
                cls, eq, weight = part.partition("=")
                if not eq or not cls.strip():
                    raise ValidationError(f"line {n}: {part.strip()!r} should be class=weight")
                try:
                    weights[cls.strip()] = float(weight)
                except ValueError:
                    raise ValidationError(f"line {n}: weight {weight.strip()!r} is not a number") from None
            if name.strip() in out:
                raise ValidationError(f"line {n}: mixture {name.strip()!r} is named twice")
            out[name.strip()] = weights
        return out

    def clean_rates(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for n, line in enumerate((self.cleaned_data.get("rates") or "").splitlines(), start=1):
            if not line.strip():
                continue
            name, sep, value = line.partition(":")
            if not sep or not name.strip():
                raise ValidationError(f"line {n}: write it as name: requests per second")
            if name.strip() in out:
                raise ValidationError(f"line {n}: rate {name.strip()!r} is named twice")
            try:
                out[name.strip()] = float(value)
            except ValueError:
                raise ValidationError(f"line {n}: {value.strip()!r} is not a number of req/s") from None
        return out

    def clean_spec_file(self) -> Any:
        f = self.cleaned_data.get("spec_file")
        if f is not None and f.size > MAX_SPEC_BYTES:
            raise ValidationError(f"the file is {f.size} bytes; a spec is at most {MAX_SPEC_BYTES}")
        return f


class CellForm(forms.Form):
    """A candidate entered one by one (beside, or instead of, the grid)."""

    cell_id = forms.CharField(max_length=32, required=False, label="id")
    max_num_batched_tokens = forms.IntegerField(required=False)
    max_num_seqs = forms.IntegerField(required=False)
    enable_chunked_prefill = forms.ChoiceField(choices=CHUNKED_CHOICES, required=False)
    scheduling_policy = forms.ChoiceField(choices=POLICY_CHOICES, required=False)
    long_prefill_token_threshold = forms.IntegerField(required=False)
    max_num_queued_reqs = forms.IntegerField(required=False)


class ClassForm(forms.Form):
    name = forms.CharField(max_length=64, required=False)
    input_tokens = forms.IntegerField(required=False)
    output_tokens = forms.IntegerField(required=False)
    priority = forms.IntegerField(required=False, initial=0)
    shared_prefix_tokens = forms.IntegerField(required=False, initial=0)
    ttft_p99_ms = forms.FloatField(required=False, label="TTFT p99 (ms)")
    e2e_p99_ms = forms.FloatField(required=False, label="E2E p99 (ms)")
    max_stall_ms = forms.FloatField(required=False, label="Max stall (ms)")
    error_rate = forms.FloatField(required=False, label="Error rate (0-1)")
    primary_metric = forms.ChoiceField(
        choices=[("", "by role (short: TTFT, long: E2E)")] + [(m, m) for m in PRIMARY_METRICS],
        required=False,
        label="Primary metric",
    )


CellFormSet = formset_factory(CellForm, extra=2, max_num=100)
ClassFormSet = formset_factory(ClassForm, extra=1, max_num=50)

# Spec sections the typed fields build; "extra" may add any other top-level section.
TYPED_SECTIONS = CORE_SECTIONS


def _blank(data: dict[str, Any]) -> bool:
    return all(v in (None, "", [], {}) for v in data.values())


def _args(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    args: dict[str, Any] = {}
    for key in ("max_num_batched_tokens", "max_num_seqs", *EXTRA_ARGS):
        value = data.get(prefix + key)
        if value is not None:
            args[key] = value
    chunked = _chunked(data.get(prefix + "enable_chunked_prefill") or "")
    if chunked is not None:
        args["enable_chunked_prefill"] = chunked
    if data.get(prefix + "scheduling_policy"):
        args["scheduling_policy"] = data[prefix + "scheduling_policy"]
    return args


class SpecBuild:
    """The spec a submitted form describes, and where each of its candidates came from.

    ``candidate_origin[i]`` is ("grid", None) or ("cell", row) so an error at
    ``candidates[i]`` is shown beside the grid or that cell's row.
    """

    def __init__(
        self, spec: dict[str, Any], candidate_origin: list[tuple[str, int | None]], class_rows: list[int]
    ) -> None:
        self.spec = spec
        self.candidate_origin = candidate_origin
        # classes[i] of the spec came from row class_rows[i] of the formset (blank rows drop out).
        self.class_rows = class_rows


def build_spec(form: ExperimentForm, cells: Any, classes: Any, *, owner: str) -> SpecBuild:
    """The spec dict (not yet validated) from the cleaned form and formsets."""
    d = form.cleaned_data
    controls: dict[str, Any] = {
        "dtype": d.get("dtype") or "auto",
        "tensor_parallel_size": 1 if d.get("tensor_parallel_size") is None else d["tensor_parallel_size"],
        "max_model_len": d.get("max_model_len"),
        "enable_prefix_caching": bool(d.get("enable_prefix_caching")),
        "speculative_decoding": False,
        "seed": 0 if d.get("engine_seed") is None else d["engine_seed"],
        "generation": d.get("generation") or {},
    }
    if d.get("gpu_memory_utilization") is not None:
        controls["gpu_memory_utilization"] = d["gpu_memory_utilization"]
    if d.get("kv_cache_memory_bytes") is not None:
        controls["kv_cache_memory_bytes"] = d["kv_cache_memory_bytes"]

    candidates: list[dict[str, Any]] = []
    origin: list[tuple[str, int | None]] = []
    grid_common = _args(
        {
            "enable_chunked_prefill": d.get("grid_enable_chunked_prefill"),
            "scheduling_policy": d.get("grid_scheduling_policy"),
        }
    )
    budgets = d.get("grid_max_num_batched_tokens") or []
    seqs = d.get("grid_max_num_seqs") or []
    if budgets or seqs:
        # One list left empty means "keep B0's value" for that axis.
        for budget in budgets or [None]:
            for seq in seqs or [None]:
                args = dict(grid_common)
                if budget is not None:
                    args["max_num_batched_tokens"] = budget
                if seq is not None:
                    args["max_num_seqs"] = seq
                candidates.append({"id": f"C{len(candidates) + 1}", "args": args})
                origin.append(("grid", None))
    for row, cell in enumerate(cells.cleaned_data if cells.is_valid() else []):
        if not cell or _blank(cell):
            continue
        cell_id = (cell.get("cell_id") or "").strip() or f"C{len(candidates) + 1}"
        candidates.append({"id": cell_id, "args": _args(cell)})
        origin.append(("cell", row))

    class_list: list[dict[str, Any] | None] = []
    for cls in classes.cleaned_data if classes.is_valid() else []:
        if not cls or _blank(cls):
            class_list.append(None)  # keep row numbers aligned with classes[i]
            continue
        entry: dict[str, Any] = {
            "name": cls.get("name") or "",
            "input_tokens": cls.get("input_tokens"),
            "output_tokens": cls.get("output_tokens"),
            "priority": cls.get("priority") or 0,
            "shared_prefix_tokens": cls.get("shared_prefix_tokens") or 0,
            "contract": {k: cls.get(k) for k in CONTRACT_KEYS if cls.get(k) is not None},
        }
        if cls.get("primary_metric"):
            entry["primary_metric"] = cls["primary_metric"]
        class_list.append(entry)

    arrival: dict[str, Any] = {"process": d.get("arrival_process") or "poisson"}
    if d.get("arrival_cv") is not None:
        arrival["cv"] = d["arrival_cv"]
    spec: dict[str, Any] = {
        "name": d.get("name") or "",
        "description": d.get("description") or "",
        "owner": owner,
        "model": {
            "path": d.get("model_path") or "",
            "revision": d.get("model_revision") or "",
            "tokenizer_revision": d.get("tokenizer_revision") or "",
        },
        "controls": controls,
        "engine": {"image": d.get("engine_image") or ""},
        "baseline": {
            "id": d.get("baseline_id") or "",
            "captured_from": d.get("baseline_captured_from") or "",
            "args": _args(d, "baseline_"),
        },
        "candidates": candidates,
        # Blank rows drop out; the row index of every error is re-mapped below.
        "classes": [c for c in class_list if c is not None],
        "workload": {
            "mixtures": d.get("mixtures") or {},
            "rates": d.get("rates") or {},
            "rates_source": "manual",
            "arrival": arrival,
            "repeats": d.get("repeats"),
            "repeat_traces": d.get("repeat_traces") or "same",
            "output_mode": d.get("output_mode") or "exact",
            "seed": d.get("seed"),
            "warmup_s": d.get("warmup_s"),
            "observation_s": d.get("observation_s"),
            "drain_deadline_s": d.get("drain_deadline_s"),
            "max_dispatch_lag_ms": d.get("max_dispatch_lag_ms"),
        },
    }
    spec.update(d.get("extra") or {})
    return SpecBuild(spec, origin, [i for i, c in enumerate(class_list) if c is not None])


# spec path prefix -> form field, for the paths that map one to one.
_DIRECT: dict[str, str] = {
    "name": "name",
    "description": "description",
    "model.path": "model_path",
    "model.revision": "model_revision",
    "model.tokenizer_revision": "tokenizer_revision",
    "controls.dtype": "dtype",
    "controls.tensor_parallel_size": "tensor_parallel_size",
    "controls.max_model_len": "max_model_len",
    "controls.gpu_memory_utilization": "gpu_memory_utilization",
    "controls.kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "controls.enable_prefix_caching": "enable_prefix_caching",
    "controls.seed": "engine_seed",
    "controls.generation": "generation",
    "controls.speculative_decoding": "engine_image",
    "engine.image": "engine_image",
    "baseline.id": "baseline_id",
    "baseline.captured_from": "baseline_captured_from",
    "workload.mixtures": "mixtures",
    "workload.rates": "rates",
    "workload.arrival.process": "arrival_process",
    "workload.arrival.cv": "arrival_cv",
    "workload.arrival": "arrival_process",
    "workload.repeats": "repeats",
    "workload.repeat_traces": "repeat_traces",
    "workload.output_mode": "output_mode",
    "workload.seed": "seed",
    "workload.warmup_s": "warmup_s",
    "workload.observation_s": "observation_s",
    "workload.drain_deadline_s": "drain_deadline_s",
    "workload.max_dispatch_lag_ms": "max_dispatch_lag_ms",
}
_INDEXED = re.compile(r"^(candidates|classes)\[(\d+)\](?:\.(.*))?$")


def spec_field_for(path: str, build: SpecBuild) -> tuple[str, int | None, str | None]:
    """Where an error at a spec path is shown: ("form", None, field) | ("cells"|"classes", row, field).

    A field of None means the error belongs to the form (or formset) as a whole.
    """
    if path.startswith("baseline.args"):
        arg = path.split(".")[2] if path.count(".") >= 2 else ""
        field = f"baseline_{arg}"
        return (
            "form",
            None,
            field if field in ExperimentForm.base_fields else "baseline_max_num_batched_tokens",
        )
    m = _INDEXED.match(path)
    if m:
        kind, index, rest = m.group(1), int(m.group(2)), m.group(3) or ""
        leaf = rest.split(".")[-1] if rest else ""
        if kind == "classes":
            rows = build.class_rows
            row = rows[index] if index < len(rows) else None
            return ("classes", row, leaf if leaf in ClassForm.base_fields else None)
        origin = build.candidate_origin[index] if index < len(build.candidate_origin) else ("grid", None)
        if origin[0] == "cell":
            field = "cell_id" if leaf == "id" else leaf
            return ("cells", origin[1], field if field in CellForm.base_fields else None)
        grid_field = (
            f"grid_{leaf}" if f"grid_{leaf}" in ExperimentForm.base_fields else "grid_max_num_batched_tokens"
        )
        return ("form", None, grid_field)
    if path == "candidates":
        return ("form", None, "grid_max_num_batched_tokens")
    if path == "classes":
        return ("classes", None, None)
    for prefix in sorted(_DIRECT, key=len, reverse=True):
        if path == prefix or path.startswith(prefix + "."):
            return ("form", None, _DIRECT[prefix])
    head = re.split(r"[.\[]", path, maxsplit=1)[0]
    if head in build.spec and head not in TYPED_SECTIONS:
        return ("form", None, "extra")
    return ("form", None, None)


def attach_spec_errors(
    error: SpecError, build: SpecBuild, form: ExperimentForm, cells: Any, classes: Any
) -> None:
    """Put each of the validator's errors beside its field (or above the form when it has none),
    each once."""
    seen: set[tuple[str, int | None, str | None, str]] = set()
    for e in error.errors:
        where, row, field = spec_field_for(e.path, build)
        message = f"{e.path}: {e.message}"
        if (where, row, field, message) in seen:
            continue
        seen.add((where, row, field, message))
        if where == "form":
            form.add_error(field, message)
        else:
            formset = cells if where == "cells" else classes
            if row is None or row >= len(formset.forms):
                formset.non_form_errors().append(message)
            else:
                formset.forms[row].add_error(field, message)


def spec_from_upload(form: ExperimentForm) -> dict[str, Any]:
    """Parse the uploaded YAML spec (or the one a preview kept); raise SpecError naming lines and
    fields. The text is kept in the form's ``spec_text`` for the next step."""
    upload = form.cleaned_data.get("spec_file")
    if upload:
        raw = upload.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError([FieldError(f"byte {exc.start}", "the file is not UTF-8 text")]) from None
    else:
        text = form.cleaned_data.get("spec_text") or ""
    data = form.data.copy()  # type: ignore[attr-defined]  # a QueryDict: copies are mutable
    data["spec_text"] = text
    form.data = data
    return parse_spec(text, limits=spec_limits())


def validate_built(build: SpecBuild) -> dict[str, Any]:
    return validate_spec(build.spec, limits=spec_limits())
