"""The rehearsal on the pages: started from the results page, its chart and check 4 shown."""

from __future__ import annotations

import json

import pytest

from apps.analysis.models import Decision
from apps.analysis.rehearsal_measures import rehearsal_measures
from apps.audit.models import AuditEvent
from apps.experiments.models import Experiment
from apps.runs.models import Run
from tests.analysis.test_rehearsal_measures import CLASSES, rec
from tests.runs.factories import make_host


@pytest.mark.django_db
def test_the_author_rehearses_a_candidate_from_the_results_page(client, author, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    make_host()
    client.force_login(author)
    page = client.get(f"/experiments/{analysed_experiment.pk}/results/")
    assert b'id="rehearse-form"' in page.content and b"s of engine time" in page.content
    response = client.post(f"/experiments/{analysed_experiment.pk}/rehearse/", {"cell": "C1"})
    assert response.status_code == 302
    run = Run.objects.get(experiment=analysed_experiment, kind=Run.Kind.REHEARSAL)
    assert run.cell.cell_id == "C1" and run.status == "queued" and run.dispatched_at is not None
    source = analysed_experiment.runs.filter(kind=Run.Kind.SWEEP).first()
    assert run.trace_sha256 == source.trace_sha256  # a frozen sweep trace, not a new one
    analysed_experiment.refresh_from_db()
    assert analysed_experiment.status == Experiment.Status.RUNNING
    assert "rehearsing the rollback of C1" in analysed_experiment.status_reason
    event = AuditEvent.objects.get(action="rehearsal.queued")
    assert (event.actor, event.detail["cell"]) == (author, "C1")


@pytest.mark.django_db
@pytest.mark.parametrize(("cell", "words"), [("B0", "choose a candidate"), ("C9", "no cell")])
def test_a_bad_rehearsal_request_names_the_cell_and_saves_nothing(
    client, author, analysed_experiment, cell, words
) -> None:  # type: ignore[no-untyped-def]
    make_host()
    client.force_login(author)
    response = client.post(f"/experiments/{analysed_experiment.pk}/rehearse/", {"cell": cell})
    assert response.status_code == 400
    assert words in response.content.decode()
    assert not Run.objects.filter(kind=Run.Kind.REHEARSAL).exists()
    analysed_experiment.refresh_from_db()
    assert analysed_experiment.status == Experiment.Status.ANALYSED


@pytest.mark.django_db
def test_only_the_author_starts_a_rehearsal(client, other_experimenter, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(other_experimenter)
    assert client.post(f"/experiments/{analysed_experiment.pk}/rehearse/", {"cell": "C1"}).status_code == 403
    assert not Run.objects.filter(kind=Run.Kind.REHEARSAL).exists()


@pytest.mark.django_db
def test_the_results_page_shows_the_rehearsal_timeline_and_check_4(
    client, author, analysed_experiment
) -> None:  # type: ignore[no-untyped-def]
    records = [rec(i, i * 0.5, ttft_ms=3000.0 if 10 <= i * 0.5 < 14 else 100.0) for i in range(60)]
    records[3].update(cut=True, unfinished=True)
    samples = [{"t_ns": 12_000_000_000, "name": "vllm:num_requests_waiting", "kind": "gauge", "value": 7.0}]
    measures = rehearsal_measures(
        records=records, planned=60, b0_samples=samples, classes=CLASSES, switch_s=10.0, cut_s=12.0,
        end_s=30.0, window_s=5.0, max_recovery_s=10.0,
    )  # fmt: skip
    measures["standby"] = "cold"
    decision = Decision.objects.get(experiment=analysed_experiment)
    decision.report = {
        **decision.report,
        "rehearsals": {"C1": {"run": None, "status": "done", "measures": measures}},
    }
    decision.checks = {
        **decision.checks,
        "recovery": {"status": "pass", "reason": "B0 recovered 4 s after the switch", "measures": measures},
    }
    decision.report["checks"] = decision.checks
    decision.save()
    client.force_login(author)
    page = client.get(f"/experiments/{analysed_experiment.pk}/results/").content.decode()
    assert 'id="check-4"' in page and "B0 recovered 4 s after the switch" in page
    start = page.index('id="rehearsal-timeline-C1"')
    figure = json.loads(page[page.index(">", start) + 1 : page.index("</script>", start)])
    names = {t["name"] for t in figure["data"]}
    assert {"short TTFT p99", "B0 waiting requests"} <= names
    assert [s["x0"] for s in figure["layout"]["shapes"]] == [10.0, 12.0]
    assert "cold standby" in page and "unaccounted 0" in page
