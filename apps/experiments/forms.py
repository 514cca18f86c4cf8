"""The create form: its fields (the spec's sections, typed), the cell and class formsets,
and the parsing a field's own shape needs (a comma list, a ``name: class=weight`` line).

Every rule about the spec lives in :func:`apps.experiments.spec.validate_spec`;
apps/experiments/form_spec.py builds the spec dict from a submitted form (or takes an
uploaded YAML spec) and shows each of the validator's errors beside the field that produced
its path. Nothing is saved here: the view calls the service only once the whole spec is valid.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.forms import formset_factory

from apps.experiments.spec import (
    ARRIVAL_PROCESSES,
    CORE_SECTIONS,
    PRIMARY_METRICS,
    SCHEDULING_POLICIES,
    SpecError,
    load_yaml,
)
from apps.experiments.workload_fields import FORM_WORKLOAD_FIELDS, WorkloadField
from apps.workloads.importers import FORMATS as TRACE_FORMATS

MAX_SPEC_BYTES = 1_000_000
CAPTURE_SECTION = "Capture B0 from production (optional)"
POLICY_CHOICES = [("", "(vLLM default)")] + [(p, p) for p in SCHEDULING_POLICIES]
CHUNKED_CHOICES = [("", "(vLLM default)"), ("true", "on"), ("false", "off")]
CAPTURE_CHOICES = [
    ("", "(B0 typed by hand below)"),
    ("server", "a running server"),
    ("command", "a vllm serve command line"),
    ("kubernetes", "a Kubernetes Deployment or Pod"),
    ("helm", "Helm values"),
    ("manifest", "an earlier experiment's approved manifest"),
]
# Optional scheduler args shown for B0 and each single cell (beside the grid's two axes).
EXTRA_ARGS = ("long_prefill_token_threshold", "max_num_queued_reqs")


def _workload_field(field: WorkloadField) -> forms.Field:
    """The create form's field for one of the workload's scalars (optional: the spec checker says
    what is missing, under the field)."""
    if field.choices:
        return forms.ChoiceField(
            choices=list(field.choices),
            required=False,
            initial=field.default,
            label=field.label,
            help_text=field.help,
        )
    number = forms.IntegerField if field.kind is int else forms.FloatField
    return number(required=False, initial=field.default, label=field.label, help_text=field.help)


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
    # Capture B0 from production (apps/experiments/form_capture.py): the source, then "Capture B0"
    # fills the model, controls and B0 fields below and keeps the capture's record.
    capture_source = forms.ChoiceField(choices=CAPTURE_CHOICES, required=False, label="Capture B0 from")
    capture_server = forms.ChoiceField(
        choices=[("", "—")],
        required=False,
        label="Server",
        help_text="A running vLLM server, by the name the operator gave it (TAILTUNE_CAPTURE_SOURCES).",
    )
    capture_text = forms.CharField(
        required=False,
        max_length=1_000_000,
        widget=forms.Textarea(attrs={"rows": 4}),
        label="Command line, manifest or values",
        help_text="A `vllm serve ...` command line, a Deployment or Pod manifest, or Helm values that hold one.",
    )
    capture_experiment = forms.CharField(
        max_length=20,
        required=False,
        label="Experiment id",
        help_text="Whose approved rollback manifest; empty: the newest one not revoked.",
    )
    capture_container = forms.CharField(
        max_length=253, required=False, label="Container", help_text="Where several containers start vLLM."
    )
    # The record of the capture, kept across previews (never typed): apps/experiments/spec_capture.py.
    baseline_capture = forms.CharField(required=False, widget=forms.HiddenInput, max_length=20_000)
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
    baseline_more_args = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="B0's other vLLM flags (YAML)",
        help_text="Every other flag production sets, snake_case, e.g. {kv_cache_dtype: fp8, block_size: 16}; "
        "every candidate keeps them unless it sets its own (docs/SPEC.md, 'Cell args').",
    )
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
    # The workload's scalars (repeats, seed, the windows, the dispatch-lag tolerance, ...): one
    # field per declaration in apps/experiments/workload_fields.py, in its order, here.
    vars().update({f.name: _workload_field(f) for f in FORM_WORKLOAD_FIELDS})
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
            CAPTURE_SECTION,
            ("capture_source", "capture_server", "capture_text", "capture_experiment", "capture_container"),
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
                "baseline_more_args",
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
                *(f.name for f in FORM_WORKLOAD_FIELDS),
                "extra",
            ),
        ),
        ("Real trace (optional)", ("trace_file", "trace_format", "trace_classes", "trace_busiest_s")),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The operator's names only: a URL cannot be chosen here (docs/SECURITY.md).
        names = sorted(getattr(settings, "TAILTUNE_CAPTURE_SOURCES", {}) or {})
        self.fields["capture_server"].choices = [("", "—")] + [(n, n) for n in names]  # type: ignore[attr-defined]

    def clean_baseline_capture(self) -> dict[str, Any] | None:
        text = (self.cleaned_data.get("baseline_capture") or "").strip()
        if not text:
            return None
        try:
            value = json.loads(text)
        except ValueError:
            raise ValidationError("the capture's record cannot be read: capture B0 again") from None
        if not isinstance(value, dict):
            raise ValidationError("the capture's record cannot be read: capture B0 again")
        return value

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

    def clean_baseline_more_args(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("baseline_more_args") or "").strip()
        if not text:
            return {}
        try:
            value = load_yaml(text)
        except SpecError as exc:
            raise ValidationError(f"not valid YAML; write it like {{kv_cache_dtype: fp8}} ({exc})") from None
        if not isinstance(value, dict):
            raise ValidationError("must be a mapping of flags, like {kv_cache_dtype: fp8}")
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
    control = forms.BooleanField(
        required=False,
        label="A/A control",
        help_text="B0's config run again: the report shows its difference from B0 as the noise floor "
        "beside every comparison (docs/SPEC.md, 'Cross-checks'). Its args must be B0's.",
    )


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
