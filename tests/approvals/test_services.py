"""experiment_approve / experiment_reject: who may, when, what is written, and that it never changes."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from apps.approvals import manifest as mf
from apps.approvals.models import Approval, RollbackManifest
from apps.approvals.services import ApprovalError, experiment_approve, experiment_reject
from apps.audit.models import AuditEvent
from apps.experiments.models import Experiment
from apps.runs.models import Run
from tests.experiments.factories import UserFactory


@pytest.mark.django_db
def test_it_approves_and_freezes_the_manifest(analysed_experiment, approver) -> None:  # type: ignore[no-untyped-def]
    experiment = analysed_experiment
    chosen = experiment.decision.chosen_cell
    manifest = experiment_approve(
        deployment_revision="rel-1",
        experiment=experiment,
        approver=approver,
        chosen_cell=chosen,
        reason="better TTFT",
        route_target="chat-pool",
    )
    experiment.refresh_from_db()
    assert experiment.status == "approved"
    approval = Approval.objects.get(experiment=experiment)
    assert (approval.verdict, approval.chosen_cell, approval.approver) == ("approved", chosen, approver)
    doc = mf.document(manifest.content, manifest.sha256)
    assert mf.verify(doc)
    base = doc["baseline"]
    assert base["cell_id"] == "B0"
    assert base["effective_args"]["source"] == mf.CONFIRMED
    assert base["effective_args"]["args"] == {
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 8,
        "max_model_len": 2048,
    }
    assert base["image_digest"].startswith("sha256:")
    assert base["model"] == {"path": experiment.model_path, "revision": experiment.model_revision}
    assert base["tokenizer_revision"] == experiment.tokenizer_revision
    assert base["deployment"] == {
        "revision": "rel-1",
        "captured_from": "prod",
        "route_target": "chat-pool",
    }
    # Prefix caching and speculative decoding pinned explicitly, and the capacity a rollback needs.
    assert (
        base["controls"]["enable_prefix_caching"] is False
        and base["controls"]["speculative_decoding"] is False
    )
    reserve = base["capacity"]["rollback_reserve"]
    assert reserve["servers_per_candidate_server"] == 1 and reserve["gpus_per_server"] == 1
    assert reserve["standby"] in ("warm", "cold") and reserve["statement"].startswith("reserve one B0 server")
    assert base["health_probe"]["path"] == "/health"
    assert base["capacity"]["hardware_id"] == "cpu-test"
    assert base["drain_deadline_seconds"] == 20 and "drain_deadline_s" not in base  # the method's name
    assert doc["version"] == 2
    assert base["abort_thresholds"]["short"] == {
        "ttft_p99_ms": 2000,
        "e2e_p99_ms": 5000,
        "max_stall_ms": 1000,
        "error_rate": 0.05,
    }
    assert base["owner"] == "erin"
    if chosen != "B0":
        assert doc["overlay"]["cell_id"] == chosen
        assert doc["overlay"]["changes"]["max_num_batched_tokens"]["baseline"] == 2048
    ev = doc["evidence"]
    assert ev["experiment"]["id"] == experiment.pk
    assert ev["trace_sha256"] == sorted(set(experiment.runs.values_list("trace_sha256", flat=True)))
    assert ev["decision"]["outcome"] == experiment.decision.outcome
    event = AuditEvent.objects.get(experiment=experiment, action="experiment.approved")
    assert (event.actor, event.target, event.detail["manifest_sha256"]) == (approver, chosen, manifest.sha256)


@pytest.mark.django_db
def test_it_falls_back_to_requested_args_when_the_engine_confirmed_none(
    analysed_experiment, approver
) -> None:  # type: ignore[no-untyped-def]
    Run.objects.filter(experiment=analysed_experiment).update(effective_args=None)
    manifest = experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=analysed_experiment,
        approver=approver,
        chosen_cell="B0",
        reason="keep",
    )
    eff = manifest.content["baseline"]["effective_args"]
    assert eff["source"] == mf.REQUESTED
    assert eff["args"] == {"max_num_batched_tokens": 2048, "max_num_seqs": 8}
    assert manifest.content["overlay"] is None
    # Nothing the engine confirmed: no complete args are claimed, and the manifest says why.
    assert "complete" not in eff and eff["complete_from"].startswith("none: no run confirmed")


@pytest.mark.django_db
def test_the_manifest_holds_the_complete_effective_arguments(analysed_experiment, approver) -> None:  # type: ignore[no-untyped-def]
    from workers.engine.vllm_args import catalogue

    # What the engine reports: the requested args, and its log's non-default args (a production
    # flag tailtune does not vary among them, and the test run's own port and model path).
    logged = {
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 8,
        "swap_space": 16,
        "port": 38001,
        "model": "/m",
    }
    Run.objects.filter(experiment=analysed_experiment, cell__cell_id="B0").update(
        effective_args={"max_num_batched_tokens": 2048, "max_num_seqs": 8, "vllm_non_default_args": logged}
    )
    manifest = experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=analysed_experiment,
        approver=approver,
        chosen_cell="B0",
        reason="keep",
    )
    eff = manifest.content["baseline"]["effective_args"]
    complete = eff["complete"]
    defaults = {k: v for k, v in catalogue("0.32.0").defaults().items() if v is not None}
    # Every flag with a default is there; the server's own values win over the defaults.
    assert set(defaults) - mf.TEST_RUN_LOCAL - {"model"} <= set(complete)
    assert (complete["max_num_batched_tokens"], complete["max_num_seqs"], complete["swap_space"]) == (
        2048,
        8,
        16,
    )
    assert complete["scheduling_policy"] == defaults["scheduling_policy"] == "fcfs"
    assert "port" not in complete and "model" not in complete
    assert eff["complete_from"].startswith("vLLM 0.32.0's parser defaults")
    assert mf.verify(mf.document(manifest.content, manifest.sha256))


@pytest.mark.django_db
def test_an_approved_manifest_cannot_change(analysed_experiment, approver) -> None:  # type: ignore[no-untyped-def]
    manifest = experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=analysed_experiment,
        approver=approver,
        chosen_cell="B0",
        reason="ok",
    )
    before = (manifest.sha256, manifest.content)
    manifest.content = {**manifest.content, "overlay": {"cell_id": "C1"}}
    with pytest.raises(ValidationError, match="immutable"):
        manifest.save()
    with pytest.raises(ValidationError, match="immutable"):
        manifest.delete()
    stored = RollbackManifest.objects.get(pk=manifest.pk)
    assert (stored.sha256, stored.content) == before
    # A second approval is refused too: the experiment is no longer analysed.
    other = UserFactory(username="ben", roles=["approver"])
    with pytest.raises(ApprovalError, match="approved"):
        experiment_approve(
            deployment_revision="rel-1",
            route_target="svc/llm",
            experiment=analysed_experiment,
            approver=other,
            chosen_cell="B0",
            reason="again",
        )


@pytest.mark.django_db
def test_it_refuses_the_author_even_when_they_are_an_approver(analysed_experiment, author) -> None:  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import Group

    author.groups.add(Group.objects.get(name="approver"))
    with pytest.raises(PermissionDenied, match="author"):
        experiment_approve(
            deployment_revision="rel-1",
            route_target="svc/llm",
            experiment=analysed_experiment,
            approver=author,
            chosen_cell="B0",
            reason="mine",
        )
    assert not Approval.objects.exists()


@pytest.mark.django_db
def test_it_refuses_non_approvers(analysed_experiment, viewer, other_experimenter) -> None:  # type: ignore[no-untyped-def]
    for user in (viewer, other_experimenter):
        with pytest.raises(PermissionDenied, match="only approvers"):
            experiment_approve(
                deployment_revision="rel-1",
                route_target="svc/llm",
                experiment=analysed_experiment,
                approver=user,
                chosen_cell="B0",
                reason="x",
            )
        with pytest.raises(PermissionDenied):
            experiment_reject(experiment=analysed_experiment, approver=user, reason="x")


@pytest.mark.django_db
def test_it_refuses_experiments_not_analysed(experiment, approver) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ApprovalError, match="only an analysed experiment"):
        experiment_approve(
            deployment_revision="rel-1",
            route_target="svc/llm",
            experiment=experiment,
            approver=approver,
            chosen_cell="B0",
            reason="x",
        )
    Experiment.objects.filter(pk=experiment.pk).update(status="analysed")
    experiment.refresh_from_db()
    with pytest.raises(ApprovalError, match="no decision"):
        experiment_approve(
            deployment_revision="rel-1",
            route_target="svc/llm",
            experiment=experiment,
            approver=approver,
            chosen_cell="B0",
            reason="x",
        )


@pytest.mark.django_db
def test_it_only_approves_the_proposal_or_b0_with_a_reason(analysed_experiment, approver) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ApprovalError, match="proposal or B0"):
        experiment_approve(
            deployment_revision="rel-1",
            route_target="svc/llm",
            experiment=analysed_experiment,
            approver=approver,
            chosen_cell="nope",
            reason="x",
        )
    with pytest.raises(ApprovalError, match="reason"):
        experiment_approve(
            deployment_revision="rel-1",
            route_target="svc/llm",
            experiment=analysed_experiment,
            approver=approver,
            chosen_cell="B0",
            reason="  ",
        )
    assert not Approval.objects.exists() and not RollbackManifest.objects.exists()
    analysed_experiment.refresh_from_db()
    assert analysed_experiment.status == "analysed"


@pytest.mark.django_db
def test_it_rejects_without_a_manifest(analysed_experiment, approver) -> None:  # type: ignore[no-untyped-def]
    approval = experiment_reject(experiment=analysed_experiment, approver=approver, reason="too noisy")
    analysed_experiment.refresh_from_db()
    assert analysed_experiment.status == "rejected"
    assert (approval.verdict, approval.chosen_cell) == ("rejected", "B0")
    assert not RollbackManifest.objects.exists()
    assert AuditEvent.objects.filter(action="experiment.rejected", actor=approver).exists()


@pytest.mark.django_db
def test_it_refuses_a_superuser_who_is_not_an_approver(analysed_experiment, django_user_model) -> None:  # type: ignore[no-untyped-def]
    root = django_user_model.objects.create_superuser("root", password="pw-root-123")
    with pytest.raises(PermissionDenied, match="only approvers"):
        experiment_approve(
            deployment_revision="rel-1",
            route_target="svc/llm",
            experiment=analysed_experiment,
            approver=root,
            chosen_cell="B0",
            reason="admin",
        )
    assert not Approval.objects.exists()


@pytest.mark.django_db
def test_it_keeps_the_admin_from_editing_an_experiment_or_its_decision(
    client, analysed_experiment, django_user_model
) -> None:  # type: ignore[no-untyped-def]
    # An owner changed in the admin would let the author approve; a decision edited there would
    # change the evidence. Superusers read these in the admin and change nothing.
    root = django_user_model.objects.create_superuser("root", password="pw-root-123")
    client.force_login(root)
    pk = analysed_experiment.pk
    page = client.get(f"/admin/experiments/experiment/{pk}/change/")
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    response = client.post(f"/admin/experiments/experiment/{pk}/change/", {"owner": root.pk, "name": "mine"})
    assert response.status_code == 403
    assert client.post(f"/admin/experiments/experiment/{pk}/delete/", {"post": "yes"}).status_code == 403
    decision = analysed_experiment.decision
    assert client.post(f"/admin/analysis/decision/{decision.pk}/delete/", {"post": "yes"}).status_code == 403
    analysed_experiment.refresh_from_db()
    assert analysed_experiment.owner != root and Experiment.objects.filter(pk=pk).exists()


def _proposing_c1_with_check_4(experiment: Experiment, check: dict) -> None:
    from apps.analysis.models import Decision

    decision = Decision.objects.get(experiment=experiment)
    decision.outcome, decision.chosen_cell = "retune", "C1"
    # Check 3 passed for C1 (its own tests are below): check 4 is the subject here.
    scenarios = {"status": "pass", "runs": [{"scenario": "burst", "cell": "C1", "run": "r-1", "held": True}]}
    decision.checks = {**decision.checks, "recovery": check, "failure_scenarios": scenarios}
    decision.save()
    experiment.refresh_from_db()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "check",
    [
        {"status": "fail", "reason": "B0 recovered after 75 s, more than max_recovery_s (60 s)"},
        {"status": "not rehearsed", "reason": "the spec turned the rollback rehearsal off"},
        {"status": "pending", "reason": "the rollback of C1 has not been rehearsed yet"},
    ],
    ids=["failed", "not-rehearsed", "pending"],
)
def test_approving_a_candidate_whose_rollback_is_unproven_needs_a_typed_reason(
    analysed_experiment, approver, check
) -> None:  # type: ignore[no-untyped-def]
    _proposing_c1_with_check_4(analysed_experiment, check)
    with pytest.raises(ApprovalError, match=f"check 4 \\(recovery\\) is {check['status']}"):
        experiment_approve(
            deployment_revision="rel-1",
            route_target="svc/llm",
            experiment=analysed_experiment,
            approver=approver,
            chosen_cell="C1",
            reason="faster",
        )
    assert not Approval.objects.exists() and not RollbackManifest.objects.exists()
    # Keeping B0 needs no override: there is nothing to roll back.
    manifest = experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=analysed_experiment,
        approver=approver,
        chosen_cell="C1",
        reason="faster",
        recovery_override="the router drains in 5 s in production; cold start measured separately",
    )
    recovery = manifest.content["evidence"]["recovery"]
    assert recovery["check"] == check["status"]
    assert recovery["override_reason"].startswith("the router drains")
    assert recovery.get("not_rehearsed", False) == (check["status"] == "not rehearsed")
    event = AuditEvent.objects.get(experiment=analysed_experiment, action="experiment.approved")
    assert event.detail["check_4"] == check["status"]
    assert event.detail["check_4_override"].startswith("the router drains")


@pytest.mark.django_db
def test_a_passed_rehearsal_goes_into_the_manifest_without_an_override(analysed_experiment, approver) -> None:  # type: ignore[no-untyped-def]
    from apps.analysis.models import Decision

    measures = {
        "standby": "cold",
        "switch_at_s": 40.0,
        "cut_at_s": 60.0,
        "time_to_recover_s": 31.5,
        "max_recovery_s": 60.0,
        "surge": {"peak_waiting": 12.0, "peak_kv_usage": 0.8, "preemptions": 0.0},
        "cut": 3,
        "accounting": {"unaccounted": 0},
    }
    _proposing_c1_with_check_4(
        analysed_experiment, {"status": "pass", "reason": "B0 recovered 31.5 s after the switch"}
    )
    decision = Decision.objects.get(experiment=analysed_experiment)
    decision.report = {
        **decision.report,
        "rehearsals": {"C1": {"run": "run-uuid", "status": "done", "measures": measures}},
    }
    decision.save()
    analysed_experiment.refresh_from_db()
    manifest = experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=analysed_experiment,
        approver=approver,
        chosen_cell="C1",
        reason="ok",
    )
    recovery = manifest.content["evidence"]["recovery"]
    assert recovery["check"] == "pass" and recovery["run"] == "run-uuid"
    assert (recovery["standby"], recovery["time_to_recover_s"], recovery["cut_streams"]) == ("cold", 31.5, 3)
    assert recovery["surge"]["peak_waiting"] == 12.0
    assert recovery["exercised"]["drain_deadline_seconds"] == 20.0
    assert "override_reason" not in recovery


@pytest.mark.django_db
def test_an_approver_revokes_and_the_manifest_is_superseded_but_still_verifies(
    analysed_experiment, approver, viewer, client
) -> None:  # type: ignore[no-untyped-def]
    from apps.approvals.models import Revocation
    from apps.approvals.services import approval_revoke

    experiment = analysed_experiment
    manifest = experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=experiment,
        approver=approver,
        chosen_cell="B0",
        reason="keep B0",
    )
    before = (bytes(manifest.json_bytes), bytes(manifest.yaml_bytes), manifest.sha256)
    with pytest.raises(PermissionDenied):
        approval_revoke(experiment=experiment, actor=viewer, reason="no")
    with pytest.raises(ApprovalError, match="reason"):
        approval_revoke(experiment=experiment, actor=approver, reason="  ")
    assert not Revocation.objects.exists()
    other = UserFactory(roles=["approver"])
    approval_revoke(experiment=experiment, actor=other, reason="p99 regressed in production")
    experiment.refresh_from_db()
    assert experiment.status == "revoked" and "p99 regressed" in experiment.status_reason
    event = AuditEvent.objects.get(action="experiment.revoked")
    assert event.actor == other and event.detail["from"] == "approved" and event.detail["to"] == "revoked"
    assert event.detail["manifest_sha256"] == manifest.sha256 and event.detail["manifest"] == "superseded"
    # The evidence is untouched: the same bytes, the same digests, still verifiable.
    manifest = RollbackManifest.objects.get(pk=manifest.pk)
    assert (bytes(manifest.json_bytes), bytes(manifest.yaml_bytes), manifest.sha256) == before
    assert mf.verify(mf.document(manifest.content, manifest.sha256))
    client.force_login(viewer)
    response = client.get(f"/experiments/{experiment.pk}/manifest.json")
    assert response.status_code == 200 and response.content == before[0]
    assert response["X-Manifest-Status"] == "superseded" and response["X-Manifest-Superseded-At"]
    page = client.get(f"/experiments/{experiment.pk}/results/").content.decode()
    assert "manifest-superseded" in page and "p99 regressed in production" in page
    # Once revoked: not again, not re-analysed, never approved again.
    with pytest.raises(ApprovalError, match="only an approved experiment"):
        approval_revoke(experiment=experiment, actor=other, reason="again")
    from apps.analysis.services import DecisionFrozen, experiment_analyse

    with pytest.raises(DecisionFrozen):
        experiment_analyse(experiment_id=experiment.pk)
    assert not experiment.can_transition("approved")
    revocation = Revocation.objects.get()
    with pytest.raises(ValidationError):
        revocation.save()
    with pytest.raises(ValidationError):
        revocation.delete()


@pytest.mark.django_db
def test_the_revoke_form_is_for_approvers_and_goes_through_the_api_too(
    analysed_experiment, approver, author, client
) -> None:  # type: ignore[no-untyped-def]
    from rest_framework.test import APIClient

    from apps.accounts.tokens import token_create

    experiment = analysed_experiment
    experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=experiment,
        approver=approver,
        chosen_cell="B0",
        reason="keep B0",
    )
    client.force_login(author)  # an experimenter, not an approver: no form, and a POST is refused
    assert "revoke-form" not in client.get(f"/experiments/{experiment.pk}/results/").content.decode()
    assert client.post(f"/experiments/{experiment.pk}/revoke/", {"reason": "x"}).status_code == 403
    client.force_login(approver)
    assert "revoke-form" in client.get(f"/experiments/{experiment.pk}/results/").content.decode()
    _, plaintext = token_create(user=approver, name="oncall")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert api.post(f"/api/v1/experiments/{experiment.pk}/revoke", {}, format="json").status_code == 400
    done = api.post(f"/api/v1/experiments/{experiment.pk}/revoke", {"reason": "incident 42"}, format="json")
    assert done.status_code == 200 and done.json()["status"] == "revoked"
    assert AuditEvent.objects.get(action="experiment.revoked").detail["api_token"] == "oncall"
    again = api.post(f"/api/v1/experiments/{experiment.pk}/revoke", {"reason": "again"}, format="json")
    assert again.status_code == 400


@pytest.mark.django_db
@pytest.mark.parametrize("missing", ["deployment_revision", "route_target"])
def test_the_deployment_revision_and_route_target_are_required_never_guessed(
    analysed_experiment, approver, missing
) -> None:  # type: ignore[no-untyped-def]
    fields = {"deployment_revision": "rel-1", "route_target": "svc/llm"}
    with pytest.raises(ApprovalError) as info:
        experiment_approve(
            experiment=analysed_experiment,
            approver=approver,
            chosen_cell="B0",
            reason="ok",
            **{**fields, missing: "  "},
        )
    assert info.value.field == missing
    assert not Approval.objects.exists() and not RollbackManifest.objects.exists()
    manifest = experiment_approve(
        experiment=analysed_experiment, approver=approver, chosen_cell="B0", reason="ok", **fields
    )
    deployment = manifest.content["baseline"]["deployment"]
    # Its own field: captured_from (free text about where B0 came from) is kept apart.
    assert deployment == {"revision": "rel-1", "captured_from": "prod", "route_target": "svc/llm"}


@pytest.mark.django_db
def test_a_candidate_on_another_engine_build_is_in_the_manifests_overlay(approver) -> None:  # type: ignore[no-untyped-def]
    from tests.experiments.factories import make_experiment, small_spec
    from tests.ui.factories import analysed

    spec = small_spec()
    engine = {"image": "vllm/vllm-openai:v0.33.0", "model_revision": "rev-2"}
    experiment = analysed(
        make_experiment(
            owner=UserFactory(roles=["experimenter"]),
            candidates=[{**spec["candidates"][0], "engine": engine}],
        )
    )
    # The manifest is the subject here, not the statistics: propose C1 as a retune would.
    from apps.analysis.models import Decision

    Decision.objects.filter(experiment=experiment).update(outcome="retune", chosen_cell="C1")
    experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=experiment,
        approver=approver,
        chosen_cell="C1",
        reason="faster",
        recovery_override="CPU test",
        scenarios_override="CPU test",
    )
    content = RollbackManifest.objects.get(experiment=experiment).content
    assert content["overlay"]["engine"] == engine
    assert content["baseline"]["image"] == experiment.engine_image  # rolling back: B0's own build


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("runs", "status"),
    [
        ([], "not run"),
        (
            [
                {"scenario": "burst", "cell": "C1", "run": "r-1", "held": True},
                {"scenario": "long_prefill_flood", "cell": "C1", "run": "r-2", "held": False},
                {"scenario": "burst", "cell": "B0", "run": "r-3", "held": True},
            ],
            "fail",
        ),
    ],
    ids=["not-run", "failed"],
)
def test_approving_a_candidate_without_passed_failure_scenarios_needs_a_typed_reason(
    analysed_experiment, approver, runs, status
) -> None:  # type: ignore[no-untyped-def]
    _proposing_c1_with_check_4(analysed_experiment, {"status": "pass", "reason": "recovered"})
    from apps.analysis.models import Decision

    decision = Decision.objects.get(experiment=analysed_experiment)
    decision.checks = {**decision.checks, "failure_scenarios": {"status": "listed", "runs": runs}}
    decision.save()
    with pytest.raises(ApprovalError, match=f"check 3 \\(failure scenarios\\) is {status}"):
        experiment_approve(
            deployment_revision="rel-1",
            route_target="svc/llm",
            experiment=analysed_experiment,
            approver=approver,
            chosen_cell="C1",
            reason="faster",
        )
    assert not Approval.objects.exists() and not RollbackManifest.objects.exists()
    manifest = experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=analysed_experiment,
        approver=approver,
        chosen_cell="C1",
        reason="faster",
        scenarios_override="the flood scenario is not our traffic: no prefill floods behind the gateway",
    )
    check3 = manifest.content["evidence"]["failure_scenarios"]
    assert check3["check"] == status and check3["override_reason"].startswith("the flood scenario")
    assert [r["run"] for r in check3["runs"]] == [r["run"] for r in runs if r["cell"] == "C1"]
    event = AuditEvent.objects.get(experiment=analysed_experiment, action="experiment.approved")
    assert event.detail["check_3"] == status and event.detail["check_3_override"].startswith("the flood")


@pytest.mark.django_db
def test_keeping_b0_or_a_candidate_whose_scenarios_held_needs_no_check_3_reason(
    analysed_experiment, approver
) -> None:  # type: ignore[no-untyped-def]
    _proposing_c1_with_check_4(analysed_experiment, {"status": "pass", "reason": "recovered"})
    manifest = experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=analysed_experiment,
        approver=approver,
        chosen_cell="C1",
        reason="ok",
    )
    check3 = manifest.content["evidence"]["failure_scenarios"]
    assert check3["check"] == "pass" and "override_reason" not in check3
    event = AuditEvent.objects.get(experiment=analysed_experiment, action="experiment.approved")
    assert event.detail["check_3"] == "pass" and "check_3_override" not in event.detail


@pytest.mark.django_db
def test_a_scenario_run_that_failed_and_was_retried_is_judged_by_its_retry(
    analysed_experiment, approver
) -> None:  # type: ignore[no-untyped-def]
    from apps.analysis.models import Decision
    from apps.approvals.services import scenario_evidence

    _proposing_c1_with_check_4(analysed_experiment, {"status": "pass", "reason": "recovered"})
    decision = Decision.objects.get(experiment=analysed_experiment)
    point = {"scenario": "burst", "cell": "C1", "mixture": "m", "rate": "r", "repeat": 1}
    decision.checks = {
        **decision.checks,
        "failure_scenarios": {
            "status": "listed",
            "runs": [
                {**point, "run": "lost", "status": "failed", "held": False},
                {**point, "run": "retry", "status": "done", "held": True},
            ],
        },
    }
    decision.save()
    check3 = scenario_evidence(decision, chosen_cell="C1", baseline="B0")
    assert check3["check"] == "pass" and [r["run"] for r in check3["runs"]] == ["retry"]


@pytest.mark.django_db
def test_an_isolate_manifest_carries_the_pools_the_analysed_report_sized(approver) -> None:  # type: ignore[no-untyped-def]
    from apps.analysis.services import experiment_analyse
    from tests.analysis.factories import isolate_experiment

    search = {"status": "done", "capacity_rps": 0.5, "bracketed": True, "steps": []}
    experiment = isolate_experiment({"C1": {"short": search}})
    decision = experiment_analyse(experiment_id=experiment.pk)
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.ANALYSED)
    assert decision.outcome == "isolate" and decision.report["pools"]["pools"][0]["replicas"] == 2
    # Measured again after the analysis: the manifest states what the approver saw, never a recount.
    workload = experiment.workload
    workload.rates_derivation = {"class_capacity": {"C1": {"short": {**search, "capacity_rps": 4.0}}}}
    workload.save(update_fields=["rates_derivation"])
    manifest = experiment_approve(
        deployment_revision="rel-1",
        route_target="chat-pool",
        experiment=experiment,
        approver=approver,
        chosen_cell="B0",
        reason="split the classes",
    )
    doc = mf.document(manifest.content, manifest.sha256)
    assert mf.verify(doc)
    decision.refresh_from_db()  # the report as stored, which report_sha256 digests
    pools = doc["evidence"]["pools"]
    assert pools == decision.report["pools"]
    assert pools["pools"][0]["replicas"] == 2 and pools["pools"][0]["capacity_rps"] == 0.5
    assert doc["evidence"]["decision"]["report_sha256"] == mf.content_sha256(decision.report)


@pytest.mark.django_db
def test_a_manifest_of_another_outcome_has_no_pools(analysed_experiment, approver) -> None:  # type: ignore[no-untyped-def]
    manifest = experiment_approve(
        deployment_revision="rel-1",
        route_target="chat-pool",
        experiment=analysed_experiment,
        approver=approver,
        chosen_cell="B0",
        reason="keep",
    )
    assert analysed_experiment.decision.outcome != "isolate"
    assert "pools" not in manifest.content["evidence"]
