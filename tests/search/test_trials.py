"""SearchTrial rows (#36): a trial that could not be measured is kept with its reason, and the
summary the page and report show is read back from the rows alone."""

from __future__ import annotations

import copy

import pytest

from apps.experiments.models import Experiment
from apps.search.models import SearchTrial
from apps.search.selectors import search_summary
from tests.experiments.factories import SMALL_SPEC, make_experiment

pytestmark = pytest.mark.django_db

SPACE = {
    "max_num_seqs": {"values": [4, 8, 16]},
    "max_num_batched_tokens": {"min": 512, "max": 4096, "log": True},
}


def test_trials_are_kept_failed_ones_with_their_reason_and_summarised() -> None:
    experiment: Experiment = make_experiment()
    spec = copy.deepcopy(SMALL_SPEC)
    spec["search"] = {"space": SPACE, "budget": {"max_trials": 10, "max_engine_hours": 2.0}}
    made = []
    for n, (seqs, budget) in enumerate([(4, 512), (8, 1024), (16, 4096), (8, 2048)]):
        made.append(
            SearchTrial.objects.create(
                experiment=experiment,
                number=n,
                params={"max_num_seqs": seqs, "max_num_batched_tokens": budget},
                args={"max_num_seqs": seqs, "max_num_batched_tokens": budget},
            )
        )
    made[0].mark_measured(margin=0.2, worst_class="long", throughput_rps=3.0, engine_s=100.0)
    made[1].mark_measured(margin=0.3, worst_class="short", throughput_rps=2.0, engine_s=100.0)
    made[2].mark_failed(reason="server did not start: KV cache too small", engine_s=60.0)
    summary = search_summary(experiment_id=experiment.pk, spec=spec, run_engine_s=100.0)
    assert summary is not None
    outcomes = [(t["number"], t["outcome"], t["reason"]) for t in summary["trials"]]
    assert outcomes == [
        (0, "kept", ""),
        (1, "kept", ""),
        (2, "failed", "server did not start: KV cache too small"),
        (3, "running", ""),
    ]
    assert summary["pareto"] == [0, 1]
    assert summary["engine_hours"] == round(260 / 3600, 3)
    # 3 x 4 configs (512..4096 by doubling), each with B0 through 1 mixture x 1 rate x 1 repeat.
    assert summary["grid_configs"] == 12 and summary["grid_engine_hours"] == round(13 * 100 / 3600, 1)
    assert search_summary(experiment_id=experiment.pk, spec=SMALL_SPEC, run_engine_s=100.0) is None
