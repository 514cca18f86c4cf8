"""The pure layer imports without Django (docs/ARCHITECTURE.md: pure modules at the bottom)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PURE = [
    "apps.runs.capacity",
    "apps.runs.summary_types",
    "apps.runs.copy_text",
    "apps.analysis.inference",
    "apps.analysis.resample",
    "apps.analysis.family",
    "apps.analysis.early_stop",
    "apps.analysis.paired",
    "apps.analysis.noise_floor",
    "apps.analysis.charts",
    "apps.analysis.chart_style",
    "apps.analysis.cell_charts",
    "apps.analysis.run_charts",
    "apps.analysis.results_charts",
    "apps.analysis.results_summary",
    "apps.analysis.checks",
    "apps.analysis.decide",
    "apps.analysis.rule_text",
    "apps.analysis.settle",
    "apps.analysis.overload",
    "apps.analysis.report",
    "apps.analysis.report_inputs",
    "apps.analysis.compare",
    "apps.analysis.compare_options",
    "apps.analysis.rounds",
    "apps.analysis.measured",
    "apps.analysis.ttft_parts",
    "apps.analysis.tail_bound",
    "apps.analysis.prefix_cache",
    "apps.analysis.parts_charts",
    "apps.analysis.validity",
    "apps.analysis.report_options",
    "apps.analysis.pool_sizing",
    "apps.analysis.pool_capacity",
    "apps.analysis.scenario_checks",
    "apps.analysis.scenario_records",
    "apps.workloads.scenario_traces",
    "apps.workloads.scenario_sizing",
    "apps.workloads.scenario_layouts",
    "apps.workloads.redaction",
    "apps.workloads.corpus",
    "apps.workloads.corpus_prompts",
    "apps.workloads.requestlog",
    "apps.workloads.chat_template",
    "apps.gate.verdict",
    "apps.notifications.events",
    "apps.history.list_filters",
    "apps.history.pooled",
    "apps.history.side_by_side",
    "apps.history.timeline",
    "apps.experiments.plan",
    "apps.experiments.generation",
    "apps.experiments.spec",
    "apps.experiments.spec_rules",
    "apps.experiments.spec_checker",
    "apps.experiments.spec_cells",
    "apps.experiments.spec_workload",
    "apps.experiments.spec_sections",
    "apps.experiments.spec_capture",
    "apps.experiments.deployment_text",
    "apps.experiments.baseline_capture",
    "apps.experiments.spec_cross",
    "apps.experiments.spec_search",
    "apps.search.objective",
    "apps.search.study",
    "apps.search.steps",
    "apps.analysis.screening",
    "apps.runs.record_names",
    "workers.engine.model_paths",
    "workers.engine.tokenizer_pin",
    "workers.engine.launcher",
    "workers.engine.vllm_args",
    "workers.replay.records",
    "workers.replay.sse",
    "workers.replay.request",
    "workers.replay.result",
    "workers.replay.stream",
    "workers.replay.batches",
]


# One interpreter imports the modules one after another, noting after each the Django modules
# then loaded and any error: a module that pulls Django in shows it at its own import (a module it
# shares with one imported earlier was itself checked there). One start instead of one per module
# (about 2 s each, over two minutes of a lane).
_PROBE = """
import importlib, json, sys, traceback
seen = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        error = None
    except BaseException:
        error = traceback.format_exc()[-2000:]
    seen[name] = {"django": sorted(m for m in sys.modules if m.split(".")[0] == "django"), "error": error}
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def imported() -> dict[str, dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *PURE], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("module", PURE)
def test_a_pure_module_imports_without_django(module: str, imported: dict[str, dict[str, object]]) -> None:
    assert imported[module]["error"] is None, imported[module]["error"]
    assert imported[module]["django"] == [], f"{module} pulls in Django"


def test_the_probe_sees_a_module_that_pulls_in_django() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, "json", "django.utils.timezone", "apps.analysis.settle"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    seen = json.loads(done.stdout)
    assert seen["json"]["django"] == []
    assert "django.utils.timezone" in seen["django.utils.timezone"]["django"]


def test_a_request_carries_the_sampling_settings_and_not_the_replays_flags() -> None:
    from apps.experiments.generation import request_sampling

    assert request_sampling(None) == {} and request_sampling({}) == {}
    sent = request_sampling({"top_p": 0.9, "ignore_eos": False, "temperature": 0.0, "seed": 3})
    assert sent == {"seed": 3, "temperature": 0.0, "top_p": 0.9} and list(sent) == [
        "seed",
        "temperature",
        "top_p",
    ]
