"""The gate takes B0 only from a manifest this service issued, and never from a superseded one.

A digest that matches the bytes proves only that the file is whole: anyone can compute it for a
manifest of their own. The gate looks the digest up among the manifests this server's approvals
stored (apps/gate/services.manifest_issued) and says which check refused it.
"""

from __future__ import annotations

import pytest

from apps.approvals import manifest as mf
from apps.experiments.spec import SpecError
from apps.gate.build import GateInput
from apps.gate.services import gate_check
from tests.experiments.factories import UserFactory
from tests.gate.test_gate_api import api_for, post_gate

pytestmark = pytest.mark.django_db


def _approved(experiment, approver):  # type: ignore[no-untyped-def]
    from apps.approvals.models import RollbackManifest
    from apps.approvals.services import experiment_approve

    made = experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=experiment,
        approver=approver,
        chosen_cell="B0",
        reason="production as it runs",
    )
    return RollbackManifest.objects.get(pk=made.pk)  # its content as stored: plain JSON values


def _refusal(text: str) -> str:
    with pytest.raises(SpecError) as caught:
        gate_check(
            GateInput.from_fields(
                {"format": "azure", "classes": "short:1024,long", "baseline_manifest": text}
            )
        )
    (error,) = caught.value.errors
    assert error.path == "baseline_manifest"
    return error.message


def test_it_refuses_a_self_made_manifest_whose_digest_matches_its_bytes(
    analysed_experiment, approver
) -> None:  # type: ignore[no-untyped-def]
    issued = _approved(analysed_experiment, approver)
    # The real manifest with B0's args changed and the digest recomputed: whole, but not issued.
    forged = dict(issued.content)
    forged["baseline"] = {**forged["baseline"], "drain_deadline_s": 1}
    doc = mf.document(forged, mf.content_sha256(forged))
    assert mf.verify(doc)  # the digest check alone would take it
    message = _refusal(mf.to_yaml(doc))
    assert message.startswith(f"manifest sha256 {doc['sha256'][:12]}")
    assert "is not one this service issued" in message


def test_it_takes_a_manifest_this_service_issued_in_either_form(analysed_experiment, approver) -> None:  # type: ignore[no-untyped-def]
    issued = _approved(analysed_experiment, approver)
    for fmt in ("yaml", "json"):
        body, _ = issued.file(fmt)
        base = gate_check(
            GateInput.from_fields(
                {"format": "azure", "classes": "short:1024,long", "baseline_manifest": body.decode()}
            )
        )
        assert base.args == {"max_num_batched_tokens": 2048, "max_num_seqs": 8}
        # The manifest's drain_deadline_seconds (version 2; a version 1 manifest's drain_deadline_s
        # is read in tests/gate/test_gate_api.py) becomes the gate's drain deadline.
        assert issued.content["baseline"]["drain_deadline_seconds"] == 20
        assert base.workload["drain_deadline_s"] == 20


def test_it_refuses_a_superseded_manifest_saying_who_revoked_it_and_when(
    analysed_experiment, approver
) -> None:  # type: ignore[no-untyped-def]
    from apps.approvals.services import approval_revoke

    issued = _approved(analysed_experiment, approver)
    revocation = approval_revoke(
        experiment=analysed_experiment, actor=approver, reason="p99 regressed in prod"
    )
    message = _refusal(bytes(issued.yaml_bytes).decode())
    assert message.startswith(f"manifest sha256 {issued.sha256[:12]}")
    assert f"(experiment {analysed_experiment.pk}, approved by ada" in message
    assert (
        f"was superseded: its approval was revoked on {revocation.created_at:%Y-%m-%d %H:%M} UTC by ada "
        "(p99 regressed in prod)"
    ) in message


def test_the_api_answers_a_self_made_manifest_with_a_400_naming_the_check(
    analysed_experiment, approver
) -> None:  # type: ignore[no-untyped-def]
    issued = _approved(analysed_experiment, approver)
    forged = {**issued.content, "approval": {**issued.content["approval"], "approver": "someone-else"}}
    doc = mf.document(forged, mf.content_sha256(forged))
    response = post_gate(api_for(UserFactory(roles=["experimenter"])), baseline_manifest=mf.to_json(doc))
    assert response.status_code == 400, response.content
    (error,) = [e for e in response.json()["errors"] if e["field"] == "baseline_manifest"]
    assert "is not one this service issued" in error["message"]
