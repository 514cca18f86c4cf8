"""Check 4 cannot be picked: every rollback rehearsal attempt of a cell is kept and shown, and a
repeat needs a reason that goes to the audit log (issue #31, item 2).

The worker's part is done by hand here (records and the switch facts written as
workers/rehearsal_run.py writes them); the rest is the real path: the analysis task queues the
first attempt, the results page's form repeats it, the analysis task analyses again, the
report command prints the report, an approver approves and the manifest is read back.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from apps.analysis.report_types import Report
from apps.approvals.manifest_types import ManifestContent
from apps.approvals.services import approval_revoke, experiment_approve
from apps.audit.models import AuditEvent
from apps.experiments.models import Experiment
from apps.lifecycle.rehearsal_schedule import RehearsalError, rehearsal_due, rehearsal_start
from apps.runs.dispatch import ANALYSE_EXPERIMENT, HOST_PULL
from apps.runs.models import RequestRecord, Run
from tests.analysis.factories import analysis_spec
from tests.dispatch_support import hold_tasks
from tests.experiments.factories import make_experiment
from tests.runs.factories import make_host
from tests.test_typed_contracts import _problems
from tests.ui.factories import analysed
from workers.tasks import analyse_experiment

pytestmark = pytest.mark.django_db
MS = 1_000_000


def _finish(run: Run, *, recovers: bool) -> None:
    """The rehearsal ran: one request every 0.5 s; after the switch B0 answers in 100 ms
    (``recovers``) or in 5 s, over the short class's 2 s TTFT contract (it never recovers)."""
    switch_s = run.warmup_seconds + run.observation_seconds / 2
    end_s = run.warmup_seconds + run.observation_seconds
    n = int(end_s * 2)
    rows = []
    for i in range(n):
        planned = int(i * 0.5 * 1e9)
        after = planned >= switch_s * 1e9
        ttft = (100 if recovers or not after else 5000) * MS
        rows.append(
            RequestRecord(
                run=run, index=i, request_class="short", warmup=False, input_tokens=64,
                expected_output_tokens=8, planned_ns=planned, sent_ns=planned + 100_000,
                admission_delay_ns=0, first_token_ns=planned + ttft, last_token_ns=planned + ttft + 70 * MS,
                end_ns=planned + ttft + 71 * MS, output_tokens=8, prompt_tokens=64, chunks=8,
                max_gap_ns=10 * MS, http_status=200, finish_reason="length",
                backend="b0" if after else "candidate",
            )
        )  # fmt: skip
    RequestRecord.objects.bulk_create(rows)
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.DONE,
        requests_planned=n,
        requests_sent=n,
        finished_at=timezone.now(),
        summary={
            "rehearsal": {
                "switch_at_s": switch_s,
                "cut_at_s": switch_s + run.drain_deadline_seconds,
                "standby": "warm",
            }
        },
    )


def _fail(run: Run, reason: str) -> None:
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED, reason=reason, finished_at=timezone.now())


def _analyse(experiment: Experiment) -> None:
    """The analysis task, as the worker's last run sends it: analysed again, no new attempt queued."""
    analyse_experiment(experiment_pk=experiment.pk)
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.ANALYSED, experiment.status_reason


@pytest.fixture
def rehearsed_once(monkeypatch, author):  # type: ignore[no-untyped-def]
    """The decision proposes C1; the analysis queued its rehearsal, which B0 did not recover from."""
    hold_tasks(monkeypatch, HOST_PULL, ANALYSE_EXPERIMENT)
    make_host()
    # Enough requests per run, and three repeats (one has no spread between runs to weigh a
    # gain against), for C1's lower TTFT to be a material, family-wise significant gain.
    experiment = analysed(make_experiment(owner=author, name="rehearsed", **analysis_spec(3)), per_run=200)
    assert experiment.decision.chosen_cell == "C1"
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    first = rehearsal_due(experiment_id=experiment.pk, chosen_cell="C1")
    assert first is not None
    _finish(first, recovers=False)
    _analyse(experiment)
    return experiment


def _repeat(client, experiment: Experiment, reason: str | None):  # type: ignore[no-untyped-def]
    data = {"cell": "C1"} if reason is None else {"cell": "C1", "reason": reason}
    return client.post(f"/experiments/{experiment.pk}/rehearse/", data)


def test_a_rehearsal_repeated_until_it_passes_shows_every_attempt_in_the_report_and_the_manifest(
    client, author, approver, rehearsed_once
) -> None:  # type: ignore[no-untyped-def]
    experiment = rehearsed_once
    client.force_login(author)
    assert _repeat(client, experiment, "the router's health check was misconfigured").status_code == 302
    second = Run.objects.filter(experiment=experiment, kind="rehearsal").order_by("id").last()
    _fail(second, "the switch command exited with status 1: connection refused")
    _analyse(experiment)
    assert _repeat(client, experiment, "router fixed, trying again").status_code == 302
    third = Run.objects.filter(experiment=experiment, kind="rehearsal").order_by("id").last()
    _finish(third, recovers=True)
    _analyse(experiment)
    runs = [str(r.run_id) for r in Run.objects.filter(experiment=experiment, kind="rehearsal").order_by("id")]
    assert len(runs) == 3

    # The report (as experiment_report prints it) lists every attempt with its outcome.
    out = StringIO()
    call_command("experiment_report", str(experiment.pk), "--format", "json", stdout=out)
    report = json.loads(out.getvalue())
    attempts = report["rehearsals"]["C1"]["attempts"]
    assert [a["run"] for a in attempts] == runs
    assert [a["outcome"] for a in attempts] == ["failed", "failed", "passed"]
    assert "did not recover" in attempts[0]["why"] and "switch command" in attempts[1]["why"]
    assert attempts[0]["time_to_recover_s"] is None and attempts[2]["time_to_recover_s"] == 0.0
    assert [a["repeat_reason"] for a in attempts] == [
        None,
        "the router's health check was misconfigured",
        "router fixed, trying again",
    ]
    assert report["rehearsals"]["C1"]["summary"] == "3 attempts, 2 failed"
    # Check 4 is not the latest attempt's alone: two failed, so it fails and says so.
    check4 = report["checks"]["recovery"]
    assert check4["status"] == "fail" and "3 attempts, 2 failed" in check4["reason"]
    assert check4["run"] == runs[-1]
    assert _problems(report, Report, "report") == []

    # The approver sees every attempt before approving.
    client.force_login(approver)
    page = client.get(f"/experiments/{experiment.pk}/approve/").content.decode()
    assert "3 attempts, 2 failed" in page and "router fixed, trying again" in page
    results = client.get(f"/experiments/{experiment.pk}/results/").content.decode()
    assert all(run[:8] in results for run in runs) and "3 attempts, 2 failed" in results

    manifest = experiment_approve(
        experiment=experiment, approver=approver, chosen_cell="C1", reason="faster",
        deployment_revision="rel-1", route_target="svc/llm",
        recovery_override="both failures were the router's, fixed before the third attempt",
        scenarios_override="no failure scenarios in this small spec",
    )  # fmt: skip
    assert _problems(json.loads(json.dumps(manifest.content)), ManifestContent, "manifest") == []
    recovery = manifest.content["evidence"]["recovery"]
    assert recovery["run"] == runs[-1] and recovery["attempts_summary"] == "3 attempts, 2 failed"
    listed = recovery["attempts"]
    assert [(a["run"], a["outcome"]) for a in listed] == list(
        zip(runs, ["failed", "failed", "passed"], strict=True)
    )
    assert [a["time_to_recover_s"] for a in listed] == [None, None, 0.0]
    assert listed[1]["repeat_reason"] == "the router's health check was misconfigured"
    assert listed[2]["requested_by"] == author.get_username()


def test_a_repeat_without_a_reason_is_refused_and_saves_nothing(client, author, rehearsed_once) -> None:  # type: ignore[no-untyped-def]
    experiment = rehearsed_once
    client.force_login(author)
    before = (Run.objects.count(), AuditEvent.objects.count())
    for reason in (None, "", "   "):
        response = _repeat(client, experiment, reason)
        assert response.status_code == 400
        assert "reason" in response.content.decode() and "already" in response.content.decode()
    assert (Run.objects.count(), AuditEvent.objects.count()) == before
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.ANALYSED
    # The form says so before anyone posts.
    form = client.get(f"/experiments/{experiment.pk}/rehearse/").content.decode()
    assert "C1 (1 attempt, 1 failed: a repeat needs a reason)" in form
    # The service says the same to any other caller, naming the field.
    with pytest.raises(RehearsalError) as refused:
        rehearsal_start(experiment=experiment, cell_id="C1", actor=author, reason=" ")
    assert refused.value.field == "reason"
    assert Run.objects.count() == before[0]


def test_the_repeat_reason_goes_to_the_audit_log(client, author, rehearsed_once) -> None:  # type: ignore[no-untyped-def]
    experiment = rehearsed_once
    client.force_login(author)
    assert _repeat(client, experiment, "B0's standby was still loading weights").status_code == 302
    second = Run.objects.filter(experiment=experiment, kind="rehearsal").order_by("id").last()
    event = AuditEvent.objects.get(action="rehearsal.queued", target=str(second.run_id))
    assert event.actor == author
    assert event.detail["reason"] == "B0's standby was still loading weights"
    assert event.detail["attempt"] == 2
    first = Run.objects.filter(experiment=experiment, kind="rehearsal").order_by("id").first()
    assert event.detail["earlier_attempts"] == [str(first.run_id)]


def test_the_analysis_never_repeats_a_rehearsal_by_itself(rehearsed_once) -> None:  # type: ignore[no-untyped-def]
    experiment = rehearsed_once
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    assert rehearsal_due(experiment_id=experiment.pk, chosen_cell="C1") is None
    assert Run.objects.filter(experiment=experiment, kind="rehearsal").count() == 1


def test_no_rehearsal_is_repeated_once_a_person_decided(client, author, approver, rehearsed_once) -> None:  # type: ignore[no-untyped-def]
    experiment = rehearsed_once
    experiment_approve(
        experiment=experiment, approver=approver, chosen_cell="C1", reason="faster",
        deployment_revision="rel-1", route_target="svc/llm", recovery_override="measured by hand",
        scenarios_override="no failure scenarios in this small spec",
    )  # fmt: skip
    client.force_login(author)
    for status in ("approved", "revoked"):
        experiment.refresh_from_db()
        assert experiment.status == status
        response = _repeat(client, experiment, "again")
        assert response.status_code == 409, response.status_code
        assert f"the experiment is {status}" in response.content.decode()
        assert Run.objects.filter(experiment=experiment, kind="rehearsal").count() == 1
        if status == "approved":
            approval_revoke(experiment=experiment, actor=approver, reason="production disagrees")


def test_a_rehearsal_the_service_queued_again_after_a_lost_host_is_listed_with_the_service_s_reason(
    author, rehearsed_once
) -> None:  # type: ignore[no-untyped-def]
    from apps.analysis.services import rehearsal_inputs
    from apps.lifecycle.retries import run_requeue_once

    experiment = rehearsed_once
    second = rehearsal_start(experiment=experiment, cell_id="C1", actor=author, reason="B0 was cold")
    Run.objects.filter(pk=second.pk).update(status=Run.Status.MEASURING)
    retry = run_requeue_once(run=second, reason="host lost: h1 stopped heartbeating")
    assert retry is not None and retry.kind == "rehearsal"
    _finish(retry, recovers=True)
    attempts = rehearsal_inputs(experiment=experiment)["C1"]["attempts"]
    assert [(a["outcome"], a["requeued_by_service"]) for a in attempts] == [
        ("failed", False),
        ("invalid", True),
        ("passed", False),
    ]
    assert attempts[2]["repeat_reason"] == "queued again by the service: host lost: h1 stopped heartbeating"
    assert attempts[2]["requested_by"] is None and attempts[1]["requested_by"] == author.get_username()
