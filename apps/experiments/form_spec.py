"""The create form's spec: the spec dict a submitted form describes, and each of the
validator's errors put back beside the field that produced its path.

``build_spec`` turns the cleaned form and formsets (apps/experiments/forms.py) into the same
spec dict as the YAML format, remembering where each candidate and class came from;
``spec_from_upload`` takes an uploaded YAML spec instead. Both are validated by
:func:`apps.experiments.spec.validate_spec`, and ``attach_spec_errors`` shows its errors
(``spec_field_for`` maps a path to a field). Nothing is saved here.
"""

from __future__ import annotations

import re
from typing import Any

from apps.experiments.form_capture import capture_record
from apps.experiments.forms import (
    EXTRA_ARGS,
    TYPED_SECTIONS,
    CellForm,
    ClassForm,
    ExperimentForm,
    _chunked,
)
from apps.experiments.offers import spec_offer_errors
from apps.experiments.services import spec_limits
from apps.experiments.spec import CONTRACT_KEYS, FieldError, SpecError, parse_spec, validate_spec
from apps.experiments.spec_types import NormalizedSpec, RawSpec
from apps.experiments.workload_fields import FORM_WORKLOAD_FIELDS


def _blank(data: dict[str, Any]) -> bool:
    """A row the user left empty: no value typed, and no box ticked."""
    return all(v is False or v in (None, "", [], {}) for v in data.values())


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
        self, spec: RawSpec, candidate_origin: list[tuple[str, int | None]], class_rows: list[int]
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
        candidates.append(
            {"id": cell_id, "args": _args(cell), **({"control": True} if cell.get("control") else {})}
        )
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

    # The typed scheduler fields win over the same flag written in the YAML field.
    baseline_args = {**(d.get("baseline_more_args") or {}), **_args(d, "baseline_")}
    arrival: dict[str, Any] = {"process": d.get("arrival_process") or "poisson"}
    if d.get("arrival_cv") is not None:
        arrival["cv"] = d["arrival_cv"]
    spec: RawSpec = {
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
            "args": baseline_args,
            # The record of a "Capture B0" on this page (apps/experiments/form_capture.py).
            **(
                {"capture": capture_record(d["baseline_capture"], baseline_args, controls)}
                if d.get("baseline_capture")
                else {}
            ),
        },
        "candidates": candidates,
        # Blank rows drop out; the row index of every error is re-mapped below.
        "classes": [c for c in class_list if c is not None],
        "workload": {
            "mixtures": d.get("mixtures") or {},
            "rates": d.get("rates") or {},
            "rates_source": "manual",
            "arrival": arrival,
            # A choice left blank is its default; a number left blank is the checker's to refuse.
            **{
                f.name: (d.get(f.name) or f.default) if f.choices else d.get(f.name)
                for f in FORM_WORKLOAD_FIELDS
            },
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
    "baseline.capture": "capture_source",
    "workload.mixtures": "mixtures",
    "workload.rates": "rates",
    "workload.arrival.process": "arrival_process",
    "workload.arrival.cv": "arrival_cv",
    "workload.arrival": "arrival_process",
    **{f"workload.{f.name}": f.name for f in FORM_WORKLOAD_FIELDS},
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
            field if field in ExperimentForm.base_fields else "baseline_more_args",
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


def spec_from_upload(form: ExperimentForm) -> NormalizedSpec:
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
    return _offered(parse_spec(text, limits=spec_limits()))


def validate_built(build: SpecBuild) -> NormalizedSpec:
    return _offered(validate_spec(build.spec, limits=spec_limits()))


def _offered(spec: NormalizedSpec) -> NormalizedSpec:
    """The spec, once the hosts able to run it offer the switch and router it names (a preview
    says so before Create does)."""
    errors = spec_offer_errors(spec)
    if errors:
        raise SpecError(errors)
    return spec
