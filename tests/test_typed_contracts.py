"""The typed contracts match what the code really produces: a normalised spec, an analysis
report, the gate's verdict and a rollback manifest, each walked against its TypedDict
(apps/experiments/spec_types.py, apps/analysis/report_types.py, apps/gate/verdict_types.py,
apps/approvals/manifest_types.py). Every key present must be declared, every required key
present, every declared scalar of the type declared and every literal one of those declared;
nested TypedDicts, lists and dicts are walked."""

from __future__ import annotations

import copy
import json
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

import pytest

from apps.analysis.report_types import Report
from apps.approvals import manifest as mf
from apps.approvals.manifest_types import ManifestContent, ManifestDocument
from apps.experiments.spec import validate_spec
from apps.experiments.spec_types import NormalizedSpec
from apps.gate.verdict import gate_verdict
from apps.gate.verdict_types import GateResource, GateVerdict
from tests.analysis.builders import Plan, build, healthy
from tests.experiments.factories import SMALL_SPEC
from tests.gate.test_verdict import report as gate_report
from tests.gate.test_verdict import with_failures, with_metric


def _problems(value: Any, tp: Any, path: str = "") -> list[str]:
    """What in ``value`` the type ``tp`` does not declare, or declares otherwise."""
    if tp is Any:
        return []
    origin = get_origin(tp)
    if origin is Literal:
        return [] if value in get_args(tp) else [f"{path}: {value!r:.60} is not one of {get_args(tp)}"]
    if origin in (Union, types.UnionType):
        options = [t for t in get_args(tp) if t is not type(None)]
        if value is None:
            return [] if len(options) < len(get_args(tp)) else [f"{path}: None is not declared"]
        found = [_problems(value, t, path) for t in options]
        return [] if any(not f for f in found) else found[0]
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping for {tp.__name__}, got {type(value).__name__}"]
        hints = get_type_hints(tp)
        out = [f"{path}.{k}: not declared by {tp.__name__}" for k in value if k not in hints]
        out += [
            f"{path}.{k}: required by {tp.__name__}, missing" for k in tp.__required_keys__ if k not in value
        ]
        for key, item in value.items():
            if key in hints:
                out += _problems(item, hints[key], f"{path}.{key}")
        return out
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        (item_tp,) = get_args(tp)
        return [p for i, item in enumerate(value) for p in _problems(item, item_tp, f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {type(value).__name__}"]
        _, item_tp = get_args(tp)
        return [p for k, item in value.items() for p in _problems(item, item_tp, f"{path}.{k}")]
    if tp is float:  # JSON has one number type: an integral float may read back as an int
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(tp, type):
        ok = isinstance(value, tp)
    else:
        return []
    return [] if ok else [f"{path}: expected {tp.__name__}, got {value!r:.60}"]


def full_spec() -> dict[str, Any]:
    """SMALL_SPEC with every optional section and per-class option the validator knows."""
    spec = copy.deepcopy(SMALL_SPEC)
    spec["controls"]["generation"] = {"temperature": 0.0, "ignore_eos": True}
    spec["engine"] = {"image": "vllm/vllm-openai:v0.9", "reuse": False}
    spec["candidates"].append(
        {"id": "C2", "args": {"enable_chunked_prefill": True, "scheduling_policy": "priority"},
         "engine": {"model_revision": "tiny-llama-local-v2"}}
    )  # fmt: skip
    spec["classes"][0]["primary_metric"] = "ttft_p99_ms"
    spec["classes"][0]["quality"] = {
        "min_exact_match": 0.9,
        "min_agreement_tokens": 4,
        "validators": {"regex": ".*", "json_schema": {"type": "string"}, "finish_reason": "length"},
    }
    spec["workload"].update(
        mixture_rates={"80-20": {"low": 1.5}},
        arrival={"process": "gamma", "cv": 2.0},
        repeat_traces="fresh",
        output_mode="natural",
        uniform_companion=True,
    )
    spec["calibration"] = {"enabled": False, "mixtures": ["80-20"]}
    spec["scenarios"] = {"long_burst": {"cells": ["C1"], "params": {"burst_at_s": 3.0}}}
    spec["analysis"] = {"agreed_rates": ["low"], "compare": {"resamples": 2000}}
    spec["quality"] = {"probe": {"prompts_per_class": 4}}
    spec["recovery"] = {"standby": "cold", "ports": {"candidate": 8100, "b0": 8101}}
    return spec


@pytest.mark.parametrize("raw", [SMALL_SPEC, full_spec()], ids=["small", "every-section"])
def test_it_declares_every_key_of_a_normalised_spec(raw):
    spec = validate_spec(copy.deepcopy(raw))
    assert _problems(spec, NormalizedSpec, "spec") == []
    # What is stored is what was declared: the JSON round trip changes nothing the types name.
    assert _problems(json.loads(json.dumps(spec)), NormalizedSpec, "spec") == []


def search_spec() -> dict[str, Any]:
    """A search instead of a grid (it has no candidates, so it cannot join full_spec)."""
    spec = copy.deepcopy(SMALL_SPEC)
    del spec["candidates"]
    spec["search"] = {
        "space": {"max_num_seqs": {"min": 4, "max": 64, "log": True}, "scheduling_policy": ["fcfs"]}
    }
    return spec


def test_it_declares_every_key_of_a_search_spec():
    spec = validate_spec(search_spec())
    assert _problems(spec, NormalizedSpec, "spec") == []
    assert _problems(json.loads(json.dumps(spec)), NormalizedSpec, "spec") == []


def test_it_covers_the_optional_sections_it_declares():
    spec = validate_spec(full_spec())
    # A search replaces the candidates, so its section is covered by the search spec's test.
    assert NormalizedSpec.__optional_keys__ - {"search"} <= set(spec)


def test_it_finds_a_key_the_types_do_not_declare():
    spec = validate_spec(copy.deepcopy(SMALL_SPEC))
    spec["workload"]["surprise"] = 1  # type: ignore[typeddict-unknown-key]
    del spec["controls"]["seed"]  # type: ignore[misc]
    assert _problems(spec, NormalizedSpec, "spec") == [
        "spec.controls.seed: required by Controls, missing",
        "spec.workload.surprise: not declared by Workload",
    ]


def stalls_everywhere(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    """The short class stalls in every cell: isolate, with its pools sized (report["pools"])."""
    return {"stall_ms": 400.0} if cls == "short" else {}


def slow_short_b0(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    """B0's short class slow: a retune, with the gain family's and the seed check's marks."""
    return {"ttft_ms": 400.0} if (cell == "B0" and cls == "short") else {"ttft_ms": 100.0}


@pytest.mark.parametrize(
    ("behaviour", "kwargs"),
    [
        (healthy, {}),
        (slow_short_b0, {"rollback": {"exists": True, "baseline": "B0"}}),
        (
            healthy,
            {"run_overrides": lambda run: run.update(status="failed") if run["cell"] == "B0" else None},
        ),
        (
            stalls_everywhere,
            {
                "class_capacities": {
                    "C1": {
                        "short": {
                            "status": "done",
                            "capacity_rps": 1.0,
                            "bracketed": False,
                            "steps": 3,
                            "source": "capacity search of C1 on short alone",
                            "lowest_rate_rps": 0.5,
                        }
                    },
                    "B0": {
                        "long": {
                            "status": "failed",
                            "capacity_rps": None,
                            "bracketed": None,
                            "steps": 0,
                            "source": "capacity search of B0 on long alone",
                            "reason": "lost host",
                        }
                    },
                }
            },
        ),  # fmt: skip
    ],
    ids=["retain", "retune", "b0-failed", "isolate-with-pools"],
)
def test_it_declares_every_key_of_a_report(behaviour, kwargs):
    report = build(Plan(), behaviour, **kwargs)
    assert _problems(report, Report, "report") == []
    assert _problems(json.loads(json.dumps(report)), Report, "report") == []


def censored_report() -> dict[str, Any]:
    """A gate report whose candidate left long requests unanswered: every optional case key."""
    r = with_metric(gate_report(), "long", "e2e_p99_ms", b0=900, cand=900, p_worse=0.0005)
    r["comparisons"][1]["metrics"]["e2e_p99_ms"].update(
        harm=None, candidate=None, candidate_censored=True, candidate_above=4200.0, b0_censored=True
    )
    counts = {"offered": 110, "unfinished": 7, "errors": 1}
    r["runs"] = [
        {"cell": cell, "status": "done", "classes": {"long": {"counts": counts}}} for cell in ("B0", "C1")
    ]
    return with_failures(
        r, "C1", [{"mixture": "window", "rate": "window", "class": "short", "broken": ["quality"]}]
    )


@pytest.mark.parametrize(
    ("make", "kwargs"),
    [
        (lambda: build(Plan(), healthy), {"candidate": "C1"}),
        (lambda: build(Plan(), slow_short_b0), {"candidate": "C1"}),
        (censored_report, {}),
        (lambda: None, {"status": "running"}),
        (lambda: None, {"status": "cancelled", "status_reason": "stopped by hand"}),
    ],
    ids=["pass-from-a-report", "retune-report", "censored-regression", "running", "no-analysis"],
)
def test_it_declares_every_key_of_a_gate_verdict(make, kwargs):
    verdict = gate_verdict(make(), **kwargs)
    assert _problems(verdict, GateVerdict, "verdict") == []
    assert _problems(json.loads(json.dumps(verdict)), GateVerdict, "verdict") == []


def test_the_censored_gate_report_reaches_the_optional_case_keys():
    cases = gate_verdict(censored_report())["cases"]
    assert {k for c in cases for k in c} >= {
        "b0_above",
        "b0_unanswered",
        "candidate_above",
        "candidate_unanswered",
    }
    assert any("b0" not in c for c in cases)  # error_rate and quality: no comparison measured them


@pytest.mark.django_db
def test_it_declares_every_key_of_the_gate_resource(analysed_experiment):
    from apps.gate.services import gate_resource

    resource = gate_resource(experiment=analysed_experiment, candidate="C1")
    assert _problems(json.loads(json.dumps(resource)), GateResource, "resource") == []


def _propose_c1(experiment) -> None:
    """The decision proposes C1, with a failed check 3 and a rehearsal that measured check 4."""
    from apps.analysis.models import Decision

    decision = Decision.objects.get(experiment=experiment)
    decision.outcome, decision.chosen_cell = "retune", "C1"
    scenarios = {"status": "fail", "runs": [{"scenario": "burst", "cell": "C1", "run": "r-1", "held": False}]}
    decision.checks = {
        **decision.checks,
        "recovery": {"status": "pass", "reason": "ok"},
        "failure_scenarios": scenarios,
    }
    measures = {
        "standby": "cold", "switch_at_s": 40.0, "cut_at_s": 60.0, "time_to_recover_s": 31.5,
        "max_recovery_s": 60.0, "surge": {"peak_waiting": 12.0}, "cut": 3, "accounting": {"unaccounted": 0},
    }  # fmt: skip
    decision.report = {**decision.report, "rehearsals": {"C1": {"run": "run-uuid", "measures": measures}}}
    decision.save()
    experiment.refresh_from_db()


@pytest.mark.django_db
@pytest.mark.parametrize("chosen", ["B0", "C1"])
def test_it_declares_every_key_of_a_manifest(analysed_experiment, approver, chosen):
    from apps.approvals.services import experiment_approve

    if chosen == "C1":
        _propose_c1(analysed_experiment)
    manifest = experiment_approve(
        experiment=analysed_experiment,
        approver=approver,
        chosen_cell=chosen,
        reason="ok",
        deployment_revision="rel-1",
        route_target="pool",
        recovery_override="measured apart",
        scenarios_override="burst is not our traffic",
    )
    content = json.loads(json.dumps(manifest.content))
    assert _problems(content, ManifestContent, "manifest") == []
    assert _problems(mf.document(content, manifest.sha256), ManifestDocument, "manifest") == []
    if chosen == "C1":  # the overlay, the rehearsal's measures and both override reasons are there
        assert content["overlay"]["cell_id"] == "C1"
        assert content["evidence"]["recovery"]["exercised"]["drain_deadline_seconds"] == 20.0
        assert content["evidence"]["failure_scenarios"]["override_reason"] == "burst is not our traffic"
