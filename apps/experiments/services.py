"""The experiments app's services: the plan caps a spec is checked against, and the export of an experiment
back to a spec. Creating one plans its runs, so it lives above, in apps/lifecycle/creation.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings

from apps.experiments.model_roots import model_roots_known
from apps.experiments.models import Experiment, ServerConfig, Workload
from apps.experiments.spec import SpecLimits
from apps.experiments.spec_search import search_as_written
from apps.experiments.spec_types import RawSpec
from apps.experiments.workload_fields import WORKLOAD_FIELDS, Scalar


def spec_limits(*, local: bool = False) -> SpecLimits:
    """The plan caps this deployment sets (settings TAILTUNE_MAX_RUNS, TAILTUNE_MAX_ENGINE_HOURS) and
    the model roots it knows (apps/experiments/model_roots.py); ``local``: this process's roots
    only, for a command that reads the model on this machine and needs no database."""
    return SpecLimits(
        max_runs=int(settings.TAILTUNE_MAX_RUNS),
        max_engine_hours=float(settings.TAILTUNE_MAX_ENGINE_HOURS),
        model_roots=model_roots_known(hosts=not local),
        model_base_dir=str(settings.BASE_DIR),
    )


def _workload_scalars(row: Workload, stored: Mapping[str, Any]) -> dict[str, Scalar]:
    """The workload's scalars for the export: the row's columns, the others from the stored spec."""
    return {
        f.name: getattr(row, f.name) if f.column else f.kind(stored.get(f.name, f.default))
        for f in WORKLOAD_FIELDS
    }


def experiment_to_spec(*, experiment: Experiment) -> RawSpec:
    """The experiment as a spec document, built from its rows (what will really run); it validates
    back to the experiment's NormalizedSpec."""
    cells = list(experiment.cells.all())
    baseline = next(c for c in cells if c.role == ServerConfig.Role.BASELINE)
    w = experiment.workload
    controls = experiment.controls()
    arrival: dict[str, Any] = {"process": w.arrival_process}
    if w.arrival_cv is not None:
        arrival["cv"] = w.arrival_cv
    if w.imported_trace_sha256:
        arrival["trace_sha256"] = w.imported_trace_sha256
    prompts = ((experiment.spec or {}).get("workload") or {}).get("prompts")
    extra = {
        key: experiment.spec[key]
        for key in ("scenarios", "calibration", "analysis", "recovery", "quality")
        if (experiment.spec or {}).get(key)
    }
    if (experiment.spec or {}).get("search"):
        extra["search"] = search_as_written(experiment.spec["search"])
    quality = {
        c["name"]: c["quality"] for c in (experiment.spec or {}).get("classes") or [] if c.get("quality")
    }
    return {
        "name": experiment.name,
        "description": experiment.description,
        "owner": experiment.owner.get_username(),
        "model": {
            "path": experiment.model_path,
            "revision": experiment.model_revision,
            "tokenizer_revision": experiment.tokenizer_revision,
        },
        "controls": controls,
        "engine": {"image": experiment.engine_image},
        "baseline": {
            "id": baseline.cell_id,
            "captured_from": baseline.captured_from,
            "args": baseline.args,
            # Where B0 was captured (absent: typed by hand); kept only in the stored spec.
            **(
                {"capture": (experiment.spec or {})["baseline"]["capture"]}
                if ((experiment.spec or {}).get("baseline") or {}).get("capture")
                else {}
            ),
        },
        "candidates": [
            {
                "id": c.cell_id,
                "args": c.args,
                **({"engine": c.engine} if c.engine else {}),
                **({"control": True} if c.control else {}),
            }
            for c in cells
            # A search's confirmed cells are its own result, not the spec's: it names a space.
            if c.role == ServerConfig.Role.CANDIDATE and "search" not in extra
        ],
        "classes": [
            {
                "name": rc.name,
                "input_tokens": rc.input_tokens,
                "output_tokens": rc.output_tokens,
                "priority": rc.priority,
                "shared_prefix_tokens": rc.shared_prefix_tokens,
                **({"primary_metric": rc.primary_metric} if rc.primary_metric else {}),
                **({"quality": quality[rc.name]} if rc.name in quality else {}),
                "contract": {
                    "ttft_p99_ms": rc.ttft_p99_ms,
                    "e2e_p99_ms": rc.e2e_p99_ms,
                    "max_stall_ms": rc.max_stall_ms,
                    "error_rate": rc.error_rate,
                },
            }
            for rc in experiment.classes.all()
        ],
        "workload": {
            "mixtures": w.mixtures,
            "rates": w.rates,
            **({"mixture_rates": w.mixture_rates} if w.mixture_rates else {}),
            "rates_source": w.rates_source,
            "arrival": arrival,
            **({"prompts": prompts} if prompts else {}),
            **_workload_scalars(w, (experiment.spec or {}).get("workload") or {}),
        },
        **extra,
    }
