"""A flag production sets round-trips (#34 item 2): spec -> cell -> the server's argv -> the
confirmation -> the approved manifest, unchanged, for B0 and for the candidate that inherits it."""

from __future__ import annotations

from typing import Any

import pytest

from apps.analysis.models import Decision
from apps.approvals import manifest as mf
from apps.approvals.services import experiment_approve
from apps.runs.models import Run
from tests.experiments.factories import UserFactory, make_experiment
from tests.ui.factories import analysed
from workers.engine.confirm import VLLM_DEFAULTS, compare_effective, parse_non_default_args
from workers.engine.launcher import HostConfig, build_launch
from workers.pipeline import run_controls

HOST = HostConfig(vllm_command=("vllm", "serve"))
PASS_THROUGH = {"kv_cache_dtype": "fp8", "block_size": 16, "enforce_eager": True}


def _log_line(requested: dict[str, Any], model: str) -> str:
    """vLLM's startup line: every arg that differs from its parser's default, as a dict repr."""
    logged: dict[str, Any] = {"model": model}
    for key, value in requested.items():
        if VLLM_DEFAULTS.get(key) != value:
            logged[key] = [value] if key == "served_model_name" else value
    return f"(APIServer pid=1) INFO 01-01 00:00:00 [api_utils.py:286] non-default args: {logged!r}\n"


@pytest.mark.django_db
def test_pass_through_flags_reach_the_argv_the_confirmation_and_the_manifest() -> None:
    experiment = make_experiment(
        baseline={
            "id": "B0",
            "captured_from": "prod",
            "args": {"max_num_batched_tokens": 2048, **PASS_THROUGH},
        },
        candidates=[{"id": "C1", "args": {"max_num_batched_tokens": 512}}],
    )
    cells = {c.cell_id: c for c in experiment.cells.all()}
    assert cells["C1"].args == {**PASS_THROUGH, "max_num_batched_tokens": 512}
    analysed(experiment)

    for run in experiment.runs.filter(status=Run.Status.DONE).select_related("cell"):
        plan = build_launch(
            model=experiment.model_path,
            cell_args=run.cell.args,
            controls=run_controls(experiment, run.cell),
            host=HOST,
            port=8000,
            base_env={},
        )
        assert {"--kv-cache-dtype=fp8", "--block-size=16", "--enforce-eager"} <= set(plan.argv)
        conf = compare_effective(
            requested=plan.requested,
            model=plan.model,
            served_model_name=plan.served_model_name,
            non_default_args=parse_non_default_args(_log_line(plan.requested, plan.model)),
            models_payload={
                "data": [{"id": plan.served_model_name, "max_model_len": experiment.max_model_len}]
            },
            cache_config={
                "block_size": "16",
                "cache_dtype": "fp8",
                "enable_prefix_caching": "False",
                "kv_cache_memory_bytes": str(experiment.kv_cache_memory_bytes),
            },
        )
        assert conf.ok, conf.reason
        run.effective_args = conf.record()
        run.save(update_fields=["effective_args"])

    # One repeat proves nothing, so the analysis keeps B0: propose C1 as a decision would, since what
    # is tested here is what the manifest carries, not the analysis.
    Decision.objects.filter(experiment=experiment).update(chosen_cell="C1")
    experiment.refresh_from_db()
    manifest = experiment_approve(
        deployment_revision="rel-2",
        experiment=experiment,
        approver=UserFactory(roles=["approver"]),
        chosen_cell="C1",
        reason="the smaller budget",
        route_target="chat-pool",
        recovery_override="not rehearsed in this test",
        scenarios_override="not run in this test",
    )
    doc = mf.document(manifest.content, manifest.sha256)
    base, overlay = doc["baseline"], doc["overlay"]
    assert base["effective_args"]["source"] == mf.CONFIRMED
    for args in (base["effective_args"]["args"], overlay["effective_args"]["args"]):
        assert {k: args[k] for k in PASS_THROUGH} == PASS_THROUGH
    assert base["requested_args"] == {"max_num_batched_tokens": 2048, **PASS_THROUGH}
    # The candidate changes only its budget: the flags it inherited are no change.
    assert "max_num_batched_tokens" in overlay["changes"]
    assert not set(PASS_THROUGH) & set(overlay["changes"])
