"""Creating an experiment: a spec checked, its rows written and its runs planned, in one transaction.

The experiment's life starts here: creation plans the runs (apps/lifecycle/planning.py), so it sits
in the lifecycle app above the experiments app whose rows it writes (tests/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from apps.audit.services import audit_record
from apps.experiments.models import Experiment, RequestClass, ServerConfig, Workload
from apps.experiments.offers import spec_bind_errors, spec_offer_errors
from apps.experiments.services import spec_limits
from apps.experiments.spec import FieldError, SpecError, validate_spec
from apps.experiments.spec_types import NormalizedSpec
from apps.experiments.workload_fields import COLUMN_WORKLOAD_FIELDS
from apps.lifecycle.planning import experiment_plan


def _resolve_owner(spec: Mapping[str, Any], owner: Any) -> Any:
    if owner is not None:
        return owner
    User = get_user_model()
    username = spec.get("owner") or ""
    if not username:
        raise SpecError([FieldError("owner", "is required (or pass an owner)")])
    try:
        return User.objects.get(username=username)
    except User.DoesNotExist:
        raise SpecError([FieldError("owner", f"no user named {username!r}")]) from None


def _check_imported_trace(spec: NormalizedSpec) -> None:
    """An imported trace must be stored, and its classes must be the spec's classes."""
    from apps.workloads.models import Trace

    sha = spec["workload"]["arrival"].get("trace_sha256")
    if not sha:
        return
    row = Trace.objects.filter(sha256=sha).first()
    if row is None:
        raise SpecError(
            [FieldError("workload.arrival.trace_sha256", f"no stored trace {sha} (run trace_import)")]
        )
    from apps.workloads.services import trace_load

    used = {r.klass for r in trace_load(sha256=sha).requests}
    known = {c["name"] for c in spec["classes"]}
    if used - known:
        raise SpecError(
            [
                FieldError(
                    "classes",
                    f"the imported trace uses classes {sorted(used - known)} the spec does not define",
                )
            ]
        )


def _rendered_class_lengths(raw: Any) -> Any:
    """A spec replaying a request log's trace takes each class's ``input_tokens`` from the trace:
    the median of the chat template's rendered counts of its requests (``meta.class_input_tokens``,
    docs/TRACES.md "Request logs and prompt corpora"), before the spec is checked, so every check
    and the analysis read the lengths the server prefills, not typed ones. Any other spec is
    returned as it is."""
    import copy

    from apps.workloads.models import Trace

    try:
        sha = raw["workload"]["arrival"]["trace_sha256"]
        classes = raw["classes"]
    except (KeyError, TypeError):
        return raw
    if not isinstance(sha, str) or not isinstance(classes, list):
        return raw
    row = Trace.objects.filter(sha256=sha).only("meta").first()
    lengths = (row.meta or {}).get("class_input_tokens") if row is not None else None
    if not isinstance(lengths, dict) or not lengths:
        return raw
    out = copy.deepcopy(raw)
    for cls in out["classes"]:
        if isinstance(cls, dict) and cls.get("name") in lengths:
            cls["input_tokens"] = int(lengths[cls["name"]]["median"])
    return out


def _corpus_class_lengths(spec: NormalizedSpec) -> NormalizedSpec:
    """A spec drawing its prompts from a corpus (``workload.prompts``) takes each class's
    ``input_tokens`` from it: the median rendered count of the class's entries that fit the
    context with its output (apps/workloads/corpus_prompts.py), and is checked again with those
    lengths, so every check and the analysis read what the server prefills. The corpus must be
    stored and give every class a mixture uses a prompt; a class with a shared prefix is refused
    (the corpus's texts are the team's, not generated). Any other spec is returned as it is."""
    import copy

    from apps.workloads.chat_template import ChatRenderer, ChatTemplateError
    from apps.workloads.corpus_prompts import corpus_prompts
    from apps.workloads.corpus_store import corpus_load
    from apps.workloads.models import Corpus
    from apps.workloads.services import tokenizer_dir

    prompts = spec["workload"].get("prompts")
    if not prompts:
        return spec
    field = "workload.prompts.corpus_sha256"
    sha = prompts["corpus_sha256"]
    if not Corpus.objects.filter(sha256=sha).exists():
        raise SpecError([FieldError(field, f"no stored corpus {sha} (corpus_import prints it)")])
    shared = [c["name"] for c in spec["classes"] if c.get("shared_prefix_tokens")]
    if shared:
        raise SpecError(
            [FieldError("workload.prompts", f"class(es) {', '.join(shared)} set shared_prefix_tokens, which "
                        "only applies to generated token ids, not to a corpus's prompts")]
        )  # fmt: skip
    try:
        rendered = corpus_prompts(
            corpus_load(sha256=sha),
            sha256=sha,
            renderer=ChatRenderer(tokenizer_dir(spec["model"]["path"])),
            max_model_len=int(spec["controls"]["max_model_len"]),
            output_tokens={c["name"]: int(c["output_tokens"]) for c in spec["classes"]},
        )
    except (ChatTemplateError, OSError, ValueError) as exc:
        raise SpecError(
            [FieldError(field, f"its prompts cannot be rendered with model.path's tokenizer: {exc}")]
        ) from None
    used = sorted(
        {name for weights in spec["workload"]["mixtures"].values() for name, w in weights.items() if w > 0}
    )
    lengths = rendered.lengths()
    missing = [name for name in used if name not in lengths]
    if missing:
        why = ", ".join(
            f"{name} ({rendered.too_long[name]} entries too long for the context with its output)"
            if rendered.too_long.get(name)
            else name
            for name in missing
        )
        raise SpecError([FieldError(field, f"the corpus has no usable prompt for class(es) {why}")])
    raw: Any = copy.deepcopy(spec)
    for cls in raw["classes"]:
        if cls["name"] in lengths:
            cls["input_tokens"] = lengths[cls["name"]]["median"]
    return validate_spec(raw, limits=spec_limits())


@transaction.atomic
def experiment_create(*, spec: Mapping[str, Any], owner: Any = None) -> Experiment:
    """Create an experiment, its cells, classes, workload and run plan from a spec.

    The spec is validated again here, so no caller can save a half-valid one;
    everything happens in one transaction: a failure leaves nothing behind.
    """
    errors: list[FieldError] = []
    raw = _rendered_class_lengths(spec)
    checked: NormalizedSpec | None = None
    try:
        checked = validate_spec(raw, limits=spec_limits())
    except SpecError as exc:
        errors += exc.errors
    unchecked: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    try:  # an unknown owner is reported with the spec's other errors, not after them
        owner = _resolve_owner(checked if checked is not None else unchecked, owner)
    except SpecError as exc:
        errors += exc.errors
    if checked is not None:  # names no host offers (recovery.switch, recovery.router)
        errors += spec_offer_errors(checked)
        errors += spec_bind_errors(checked)  # development endpoints with no loopback host
    if errors or checked is None:
        raise SpecError(errors)
    spec = _corpus_class_lengths(checked)
    _check_imported_trace(spec)
    spec["owner"] = owner.get_username()
    controls = spec["controls"]
    experiment = Experiment.objects.create(
        name=spec["name"],
        description=spec["description"],
        owner=owner,  # a draft (Experiment.status's default) until experiment_plan below
        model_path=spec["model"]["path"],
        model_revision=spec["model"]["revision"],
        tokenizer_revision=spec["model"]["tokenizer_revision"],
        dtype=controls["dtype"],
        tensor_parallel_size=controls["tensor_parallel_size"],
        max_model_len=controls["max_model_len"],
        gpu_memory_utilization=controls["gpu_memory_utilization"],
        kv_cache_memory_bytes=controls["kv_cache_memory_bytes"],
        enable_prefix_caching=controls["enable_prefix_caching"],
        speculative_decoding=controls["speculative_decoding"],
        engine_seed=controls["seed"],
        generation=controls["generation"],
        engine_image=spec["engine"]["image"],
        spec=spec,
    )
    cells = [
        ServerConfig(
            experiment=experiment,
            cell_id=spec["baseline"]["id"],
            role=ServerConfig.Role.BASELINE,
            args=spec["baseline"]["args"],
            captured_from=spec["baseline"]["captured_from"],
            position=0,
        )
    ]
    for i, cand in enumerate(spec["candidates"], start=1):
        cells.append(
            ServerConfig(
                experiment=experiment,
                cell_id=cand["id"],
                role=ServerConfig.Role.CANDIDATE,
                args=cand["args"],
                engine_image=(cand.get("engine") or {}).get("image", ""),
                model_revision=(cand.get("engine") or {}).get("model_revision", ""),
                control=bool(cand.get("control")),
                position=i,
            )
        )
    ServerConfig.objects.bulk_create(cells)
    RequestClass.objects.bulk_create(
        [
            RequestClass(
                experiment=experiment,
                name=cls["name"],
                input_tokens=cls["input_tokens"],
                output_tokens=cls["output_tokens"],
                priority=cls["priority"],
                shared_prefix_tokens=cls["shared_prefix_tokens"],
                primary_metric=cls.get("primary_metric") or "",
                position=i,
                **cls["contract"],
            )
            for i, cls in enumerate(spec["classes"])
        ]
    )
    w = spec["workload"]
    Workload.objects.create(
        experiment=experiment,
        mixtures=w["mixtures"],
        rates=w["rates"],
        mixture_rates=w.get("mixture_rates") or {},
        rates_source=w["rates_source"],
        arrival_process=w["arrival"]["process"],
        arrival_cv=w["arrival"].get("cv"),
        imported_trace_sha256=w["arrival"].get("trace_sha256", ""),
        **_workload_columns(w),
    )
    audit_record(
        action="experiment.created",
        actor=owner,
        experiment=experiment,
        target=experiment.name,
        detail={"from": None, "to": Experiment.Status.DRAFT, "owner": owner.get_username()},
    )
    experiment_plan(experiment=experiment, actor=owner)
    return experiment


@transaction.atomic
def experiment_create_with_trace(
    *,
    spec: Mapping[str, Any],
    owner: Any,
    trace_data: bytes,
    trace_format: str,
    thresholds: list[tuple[str, int | None]],
    busiest_s: float | None = None,
) -> Experiment:
    """Store an uploaded real trace and create the experiment replaying it, in one transaction.

    A bad file (its error names the line) or a spec the trace does not fit
    rolls back both: nothing is half-saved.
    """
    from apps.workloads.services import tokenizer_dir, trace_import

    spec = validate_spec(spec, limits=spec_limits())
    trace = trace_import(
        data=trace_data,
        fmt=trace_format,
        tokenizer_dir=tokenizer_dir(spec["model"]["path"]),
        tokenizer_revision=spec["model"]["tokenizer_revision"],
        thresholds=thresholds,
        max_model_len=spec["controls"]["max_model_len"],
        busiest_s=busiest_s,
        warmup_s=spec["workload"]["warmup_s"],
        seed=spec["workload"]["seed"],
        label=f"{spec['name']} upload",
    )
    spec["workload"]["arrival"] = {"process": "trace", "trace_sha256": trace.sha256}
    return experiment_create(spec=spec, owner=owner)


def _workload_columns(workload: Mapping[str, object]) -> dict[str, object]:
    """A normalised spec's workload scalars that are columns of its Workload row."""
    return {f.name: workload.get(f.name, f.default) for f in COLUMN_WORKLOAD_FIELDS}
