"""The create page's "Capture B0": a capture (apps/experiments/baseline_capture.Captured) put into
the submitted form's fields, so the page shows production's B0 for review before Preview or Create.

What the capture replaces: B0's id is kept; its note (``captured_from``), args and record are the
capture's; the controls it captured replace the typed ones; the model's revisions and the engine
image where it names them; the model path only where none is typed (a deployment's path or hub
id is not the host's copy of the model: docs/SPEC.md, "The model path"). The record goes in a
hidden field and into the spec's ``baseline.capture`` (apps/experiments/form_spec.build_spec).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml
from django.http import QueryDict

from apps.experiments.baseline_capture import Captured, apply_to_spec
from apps.experiments.forms import EXTRA_ARGS
from apps.experiments.spec import FieldError, SpecError, load_yaml

# Controls -> the form's field.
CONTROL_FIELDS = {
    "dtype": "dtype",
    "tensor_parallel_size": "tensor_parallel_size",
    "max_model_len": "max_model_len",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "seed": "engine_seed",
}
TYPED_ARGS = (
    "max_num_batched_tokens",
    "max_num_seqs",
    "enable_chunked_prefill",
    "scheduling_policy",
    *EXTRA_ARGS,
)
# The request's field -> the form's, for the errors of a capture.
ERROR_FIELDS = {
    "spec_file": "spec_file",
    "source": "capture_source",
    "server": "capture_server",
    "text": "capture_text",
    "experiment": "capture_experiment",
    "container": "capture_container",
}


def _field_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def captured_form_data(data: QueryDict, captured: Captured) -> tuple[QueryDict, list[str]]:
    """A copy of the submitted ``data`` with the capture in its fields, and the notes to show."""
    out = data.copy()
    notes = list(captured.notes)
    for key, field in CONTROL_FIELDS.items():
        if key in captured.controls:
            out[field] = _field_value(captured.controls[key])
    if "generation" in captured.controls:  # a manifest's: the sampling settings it ran with
        generation = captured.controls["generation"] or {}
        out["generation"] = yaml.safe_dump(generation, default_flow_style=True).strip() if generation else ""
    if "enable_prefix_caching" in captured.controls:
        if captured.controls["enable_prefix_caching"]:
            out["enable_prefix_caching"] = "on"
        else:
            out.pop("enable_prefix_caching", None)
    for key in ("revision", "tokenizer_revision"):
        if captured.model.get(key):
            out["model_revision" if key == "revision" else key] = captured.model[key]
    path = captured.model.get("path") or ""
    if not (out.get("model_path") or "").strip():
        out["model_path"] = path
    elif path and path != out.get("model_path"):
        notes.append(
            f"model path: kept {out.get('model_path')!r}; the deployment serves {path!r} (the same model?)"
        )
    if captured.image:
        out["engine_image"] = captured.image
    more = {k: v for k, v in captured.args.items() if k not in TYPED_ARGS}
    for key in TYPED_ARGS:
        out[f"baseline_{key}"] = _field_value(captured.args.get(key))
    out["baseline_more_args"] = (
        yaml.safe_dump(more, sort_keys=True, default_flow_style=False).strip() if more else ""
    )
    record = captured.capture
    out["baseline_captured_from"] = f"{record['source']}: {record['name']}"[:500]
    # The record, and what was captured: a field changed by hand afterwards is said in the record.
    kept = {"record": record, "args": captured.args, "controls": captured.controls}
    out["baseline_capture"] = json.dumps(kept, sort_keys=True)
    return out, notes


def capture_record(kept: Mapping[str, Any], args: Mapping[str, Any], controls: Mapping[str, Any]) -> Any:
    """The spec's ``baseline.capture`` from the page's hidden field: the capture's record, with a
    note naming each of B0's args and controls that differs from what was captured."""

    def mapping(key: str) -> dict[str, Any]:  # the field comes back from the browser: anything
        value = kept.get(key)
        return dict(value) if isinstance(value, Mapping) else {}

    record, captured_args, captured_controls = mapping("record"), mapping("args"), mapping("controls")
    changed = sorted(k for k in set(args) | set(captured_args) if args.get(k) != captured_args.get(k))
    changed += sorted(f"controls.{k}" for k in captured_controls if controls.get(k) != captured_controls[k])
    if changed:
        note = f"changed by hand after the capture: {', '.join(changed)}"[:1000]
        notes = record.get("notes")
        record["notes"] = [*(notes[-19:] if isinstance(notes, list) else []), note]
    return record


def captured_spec_text(text: str, captured: Captured) -> tuple[str, list[str]]:
    """An uploaded spec's text with its B0 replaced by the capture (baseline_capture.apply_to_spec),
    and the notes; SpecError (naming ``spec_file``) when the text is not a spec."""
    try:
        raw = load_yaml(text)
    except SpecError as exc:
        raise SpecError([FieldError("spec_file", f"{e.path}: {e.message}") for e in exc.errors]) from None
    if not isinstance(raw, dict):
        raise SpecError([FieldError("spec_file", "the uploaded spec is not a mapping")])
    out, notes = apply_to_spec(raw, captured)
    return yaml.safe_dump(out, sort_keys=False, default_flow_style=False, allow_unicode=True), notes
