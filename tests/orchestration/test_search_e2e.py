"""A small search on the CPU engine, end to end (issue #36's acceptance): real workers screen each
trial on a real vLLM server, one trial's config is one vLLM refuses to start (a token budget below
the sequence limit: the spec's checks let it through, vLLM's own do not), and the search goes on,
confirms the one measured trial against B0 in a fresh round and is analysed like a grid.

The same lifecycle with a fake executor, every branch of it, is tests/search/test_search_lifecycle.py;
this is the one run where the servers, the replay, the scoring from real records and the
confirmation's fresh trace all meet.
"""

from __future__ import annotations

import copy

import pytest
from rest_framework.test import APIClient

from apps.accounts.tokens import token_create
from apps.analysis.models import Decision
from apps.experiments.models import Experiment, ServerConfig
from apps.lifecycle.creation import experiment_create
from apps.lifecycle.running import experiment_start
from apps.runs.models import RequestRecord, Run
from apps.search.models import SearchTrial
from tests.engine_support import ENGINE_MARKS
from tests.experiments.factories import SMALL_SPEC, UserFactory
from tests.orchestration.conftest import Workers
from tests.waiting import wait_for

pytestmark = [*ENGINE_MARKS, pytest.mark.django_db(transaction=True)]

# B0 runs 8 sequences; vLLM refuses a token budget below that at start ("max_num_batched_tokens (4)
# must be greater than or equal to max_num_seqs (8)").
IMPOSSIBLE = 4
POSSIBLE = 512


def test_a_small_search_screens_on_the_engine_goes_on_past_a_refused_config_and_confirms_one(
    workers: Workers,
    roles: None,  # the role groups: an earlier transactional test may have flushed them
) -> None:
    workers.start()
    spec = copy.deepcopy(SMALL_SPEC)
    del spec["candidates"]
    spec["search"] = {
        "space": {"max_num_batched_tokens": [IMPOSSIBLE, POSSIBLE]},
        "budget": {"max_trials": 2},
        "confirm": 1,
    }
    experiment = experiment_create(spec=spec, owner=UserFactory(roles=["experimenter"]))
    assert [c.cell_id for c in experiment.cells.all()] == ["B0"] and not experiment.runs.exists()
    assert experiment_start(experiment=experiment) == 0  # a search plans its runs as it goes

    def finished() -> bool:
        return Experiment.objects.get(pk=experiment.pk).status in ("analysed", "cancelled")

    try:
        wait_for(finished, 900, interval_s=2)
    except AssertionError:
        runs = list(experiment.runs.values_list("kind", "status", "reason"))
        raise AssertionError(f"search not finished: runs {runs}\n{workers.logs()}") from None
    experiment.refresh_from_db()
    assert experiment.status == "analysed", (experiment.status_reason, workers.logs())

    # Both configs screened, one at a time, each on its own run of kind screen.
    trials = {t.args["max_num_batched_tokens"]: t for t in SearchTrial.objects.filter(experiment=experiment)}
    assert set(trials) == {IMPOSSIBLE, POSSIBLE}, trials
    refused, measured = trials[IMPOSSIBLE], trials[POSSIBLE]
    # The refused config is a row with vLLM's reason, not a gap; the search went on past it.
    assert refused.outcome == SearchTrial.Outcome.FAILED and refused.margin is None
    assert refused.run is not None and refused.run.kind == Run.Kind.SCREEN
    assert refused.run.status == Run.Status.FAILED
    assert "max_num_seqs" in refused.reason or "max_num_seqs" in refused.run.reason, (
        refused.reason,
        refused.run.reason,
    )
    # The measured one was scored from its real records: a margin, a throughput, engine time.
    screen = measured.run
    assert screen is not None and screen.kind == Run.Kind.SCREEN and screen.status == Run.Status.DONE
    assert RequestRecord.objects.filter(run=screen, http_status=200).count() == screen.requests_planned > 0
    assert measured.margin is not None and measured.throughput_rps and measured.throughput_rps > 0
    assert measured.confirmed and not refused.confirmed

    # Confirmed: the trial's cell became a candidate and ran the design against B0, on fresh data.
    cell_id = f"T{measured.number}"
    assert sorted(c.cell_id for c in experiment.cells.all()) == ["B0", cell_id]
    assert (
        ServerConfig.with_trials.get(experiment=experiment, cell_id=cell_id).role
        == ServerConfig.Role.CANDIDATE
    )
    sweep = list(experiment.runs.filter(kind=Run.Kind.SWEEP).select_related("cell"))
    assert sorted(r.cell.cell_id for r in sweep) == ["B0", cell_id]
    assert {r.status for r in sweep} == {Run.Status.DONE}, [(r.status, r.reason) for r in sweep]
    assert len({r.trace_sha256 for r in sweep}) == 1  # paired: B0 and the cell on the same traffic
    assert sweep[0].trace_sha256 != screen.trace_sha256  # not the screening draw
    for run in sweep:  # each server confirmed running its cell's own budget
        assert run.effective_args["max_num_batched_tokens"] == run.cell.args["max_num_batched_tokens"]
    assert {r.cell.cell_id: r.cell.args["max_num_batched_tokens"] for r in sweep} == {
        "B0": 2048,
        cell_id: POSSIBLE,
    }

    # Analysed like a grid, with the search in the report: the two trials, the one confirmed.
    report = Decision.objects.get(experiment=experiment).report
    assert sorted(c["cell_id"] for c in report["cells"]) == ["B0", cell_id]
    assert len(report["search"]["trials"]) == 2 and report["search"]["confirmed"] == [measured.number]

    # The API and the gate take it like any other experiment: the report with its trials, and a
    # verdict of the confirmed cell against B0 (10 s of traffic judges few tails: any of the three).
    _, plaintext = token_create(user=UserFactory(username="ci", roles=["viewer"]), name="ci")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    served = api.get(f"/api/v1/experiments/{experiment.pk}/report")
    assert served.status_code == 200 and len(served.json()["search"]["trials"]) == 2, served.content[:500]
    gate = api.get(f"/api/v1/gates/{experiment.pk}")
    assert gate.status_code == 200, gate.content[:500]
    assert gate.json()["verdict"] in ("pass", "fail", "inconclusive") and gate.json()["status"] == "analysed"
    assert (gate.json()["baseline"], gate.json()["candidate"]) == ("B0", cell_id), gate.json()
