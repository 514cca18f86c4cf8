from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from apps.approvals.models import Approval, RollbackManifest


@pytest.mark.django_db
def test_it_offers_the_proposal_and_b0(client, approver, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(approver)
    response = client.get(f"/experiments/{analysed_experiment.pk}/approve/")
    assert response.status_code == 200
    choices = [c[0] for c in response.context["form"].fields["chosen_cell"].choices]
    proposed = analysed_experiment.decision.chosen_cell
    assert choices == ([proposed, "B0"] if proposed != "B0" else ["B0"])


@pytest.mark.django_db
def test_it_approves_through_the_page(client, approver, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(approver)
    proposed = analysed_experiment.decision.chosen_cell
    response = client.post(
        f"/experiments/{analysed_experiment.pk}/approve/",
        {
            "verdict": "approve",
            "deployment_revision": "rel-1",
            "route_target": "svc/llm",
            "chosen_cell": proposed,
            "reason": "lower TTFT, no class worse",
        },
    )
    assert response.status_code == 302
    analysed_experiment.refresh_from_db()
    assert analysed_experiment.status == "approved"
    assert RollbackManifest.objects.get(experiment=analysed_experiment).approval.approver == approver
    page = client.get(f"/experiments/{analysed_experiment.pk}/").content.decode()
    assert "Manifest (YAML)" in page and 'id="approve"' not in page


@pytest.mark.django_db
def test_it_rejects_through_the_page(client, approver, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(approver)
    client.post(
        f"/experiments/{analysed_experiment.pk}/approve/", {"verdict": "reject", "reason": "noisy host"}
    )
    analysed_experiment.refresh_from_db()
    assert analysed_experiment.status == "rejected"
    assert not RollbackManifest.objects.exists()


@pytest.mark.django_db
def test_it_asks_for_a_reason_and_saves_nothing_without_one(client, approver, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(approver)
    response = client.post(
        f"/experiments/{analysed_experiment.pk}/approve/",
        {
            "verdict": "approve",
            "deployment_revision": "rel-1",
            "route_target": "svc/llm",
            "chosen_cell": "B0",
            "reason": "",
        },
    )
    assert response.status_code == 400
    assert "reason" in response.context["form"].errors
    assert not Approval.objects.exists()


@pytest.mark.django_db
def test_it_refuses_a_cell_that_was_not_offered(client, approver, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(approver)
    response = client.post(
        f"/experiments/{analysed_experiment.pk}/approve/",
        {
            "verdict": "approve",
            "deployment_revision": "rel-1",
            "route_target": "svc/llm",
            "chosen_cell": "C9",
            "reason": "x",
        },
    )
    assert response.status_code == 400
    assert not Approval.objects.exists()


@pytest.mark.django_db
def test_it_forbids_the_author_viewers_and_experimenters(
    client, author, viewer, other_experimenter, analysed_experiment
) -> None:  # type: ignore[no-untyped-def]
    author.groups.add(Group.objects.get(name="approver"))
    url = f"/experiments/{analysed_experiment.pk}/approve/"
    for user, why in (
        (author, b"author"),
        (viewer, b"only approvers"),
        (other_experimenter, b"only approvers"),
    ):
        client.force_login(user)
        assert client.get(url).status_code == 403
        response = client.post(
            url,
            {
                "verdict": "approve",
                "deployment_revision": "rel-1",
                "route_target": "svc/llm",
                "chosen_cell": "B0",
                "reason": "x",
            },
        )
        assert response.status_code == 403
        assert why in response.content
    assert not Approval.objects.exists()


@pytest.mark.django_db
def test_it_forbids_approving_before_analysis(client, approver, experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(approver)
    response = client.get(f"/experiments/{experiment.pk}/approve/")
    assert response.status_code == 403
    assert b"only an analysed experiment can be approved" in response.content


@pytest.mark.django_db
def test_approving_without_the_deployment_revision_names_the_field_and_saves_nothing(
    client, approver, analysed_experiment
) -> None:  # type: ignore[no-untyped-def]
    client.force_login(approver)
    response = client.post(
        f"/experiments/{analysed_experiment.pk}/approve/",
        {"verdict": "approve", "chosen_cell": "B0", "reason": "keep", "route_target": "svc/llm"},
    )
    assert response.status_code == 400
    form = response.context["form"]
    assert (
        "deployment_revision" in form.errors
        and "deployment revision" in form.errors["deployment_revision"][0]
    )
    assert not Approval.objects.exists() and not RollbackManifest.objects.exists()
