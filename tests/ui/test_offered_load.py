"""The experiment page says where the sweep's rates came from, and queues goodput-capacity searches."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.experiments.models import Workload
from apps.lifecycle.calibration import cell_goodput_capacity
from apps.runs.dispatch import CELL_GOODPUT_CAPACITY
from apps.runs.models import Host
from apps.runs.selectors import offered_load
from tests.dispatch_support import hold_tasks


def _probed(experiment) -> None:  # type: ignore[no-untyped-def]
    steps = [
        {"step": 0, "run": "00000000-0000-0000-0000-000000000001", "rate_rps": 1.0, "status": "done",
         "passed": True, "failed_because": []},
        {"step": 1, "run": "00000000-0000-0000-0000-000000000002", "rate_rps": 2.0, "status": "done",
         "passed": False, "failed_because": ["long: contract broken (ttft_p99)"]},
    ]  # fmt: skip
    Workload.objects.filter(pk=experiment.workload.pk).update(
        rates={"low": 0.45, "near_capacity": 1.35},
        rates_source="probe",
        rates_derivation={
            "capacities": {"80-20": 1.5},
            "bracketed": {"80-20": True},
            "binding_mixture": "80-20",
            "fractions": {"low": 0.3, "near_capacity": 0.9},
            "rates": {"low": 0.45, "near_capacity": 1.35},
            "probes": [{"mixture": "80-20", "capacity_rps": 1.5, "steps": steps}],
            "frozen_at": timezone.now().isoformat(),
        },
    )
    experiment.workload.refresh_from_db()


@pytest.mark.django_db
def test_it_says_typed_rates_are_typed_by_hand(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    html = client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert "typed by hand" in html and 'id="rates-table"' in html
    assert 'id="goodput-form"' not in html  # a viewer spends no engine time


@pytest.mark.django_db
def test_it_shows_the_probe_that_froze_the_rates(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    _probed(experiment)
    client.force_login(viewer)
    html = client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert "from B0's capacity probe" in html and "Frozen from B0&#x27;s measured capacity" in html
    assert "low 0.3, near_capacity 0.9 of 1.5 req/s (mixture 80-20" in html
    assert "long: contract broken (ttft_p99)" in html
    load = offered_load(experiment=experiment)
    assert load["frozen"] and [s["passed"] for s in load["probes"][0]["steps"]] == [True, False]


@pytest.mark.django_db
def test_it_marks_probe_rates_provisional_until_the_probe_ran(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    Workload.objects.filter(pk=experiment.workload.pk).update(rates_source="probe")
    client.force_login(viewer)
    html = client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert "Provisional: the capacity probe on B0 freezes the rates" in html and "provisional</small>" in html


@pytest.mark.django_db
def test_it_queues_a_goodput_search_on_a_live_host_once(
    client, author, viewer, experiment, monkeypatch, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    held = hold_tasks(monkeypatch, CELL_GOODPUT_CAPACITY)
    sent = held
    url = f"/experiments/{experiment.pk}/goodput/"
    client.force_login(viewer)
    assert client.post(url, {"cell": "C1", "mixture": "80-20"}).status_code == 403
    client.force_login(author)
    page = client.post(url, {"cell": "C1", "mixture": "80-20"}, follow=True).content.decode()
    assert "no host is alive" in page and not sent
    Host.objects.create(name="cpu-a", queue="host.cpu-a", last_heartbeat=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        page = client.post(url, {"cell": "C1", "mixture": "80-20"}, follow=True).content.decode()
    assert "queued on cpu-a" in page and 'class="badge status-queued"' in page
    assert sent == [
        (
            CELL_GOODPUT_CAPACITY,
            {"experiment_pk": experiment.pk, "cell_id": "C1", "mixture": "80-20"},
            "host.cpu-a",
        )
    ]
    again = client.post(url, {"cell": "C1", "mixture": "80-20"}, follow=True).content.decode()
    assert "being measured already" in again and len(sent) == 1
    wrong = client.post(url, {"cell": "C9", "mixture": "80-20"}, follow=True).content.decode()
    assert "cell: no cell &#x27;C9&#x27;" in wrong


@pytest.mark.django_db
def test_it_queues_a_class_capacity_search_for_an_isolate_decisions_pools(
    client, author, experiment, monkeypatch, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    sent = hold_tasks(monkeypatch, CELL_GOODPUT_CAPACITY)
    url = f"/experiments/{experiment.pk}/goodput/"
    client.force_login(author)
    assert 'id="class-capacity-form"' in client.get(f"/experiments/{experiment.pk}/").content.decode()
    Host.objects.create(name="cpu-a", queue="host.cpu-a", last_heartbeat=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        page = client.post(url, {"cell": "C1", "request_class": "short"}, follow=True).content.decode()
    assert "Capacity of C1 for short alone queued on cpu-a" in page
    assert 'id="class-capacity-table"' in page and 'class="badge status-queued"' in page
    assert sent == [
        (
            CELL_GOODPUT_CAPACITY,
            {"experiment_pk": experiment.pk, "cell_id": "C1", "mixture": "", "request_class": "short"},
            "host.cpu-a",
        )
    ]
    # Stored by class, apart from the goodput searches by mixture.
    experiment.workload.refresh_from_db()
    load = offered_load(experiment=experiment)
    assert load["class_capacity"]["C1"]["short"]["status"] == "queued" and "goodput_capacity" not in load
    again = client.post(url, {"cell": "C1", "request_class": "short"}, follow=True).content.decode()
    assert "short alone is being measured already" in again and len(sent) == 1
    wrong = client.post(url, {"cell": "C1", "request_class": "tiny"}, follow=True).content.decode()
    assert "class: no class &#x27;tiny&#x27;" in wrong and len(sent) == 1


@pytest.mark.django_db
def test_it_keeps_a_crashed_goodput_search_as_failed_with_its_reason(experiment) -> None:  # type: ignore[no-untyped-def]
    def crash(*, run_pk: int) -> str:
        raise RuntimeError("engine exploded")

    with pytest.raises(RuntimeError):
        cell_goodput_capacity(experiment_id=experiment.pk, cell_id="C1", mixture="80-20", execute=crash)
    experiment.workload.refresh_from_db()
    entry = offered_load(experiment=experiment)["goodput_capacity"]["C1"]["80-20"]
    assert entry["status"] == "failed" and "engine exploded" in entry["reason"]


@pytest.mark.django_db
def test_it_puts_the_probe_runs_in_the_manifest_by_id(experiment) -> None:  # type: ignore[no-untyped-def]
    from apps.approvals.services import _offered_load

    _probed(experiment)
    load = _offered_load(experiment)
    assert load["source"] == "probe" and load["capacities"] == {"80-20": 1.5}
    assert "probes" not in load
    assert [s["rate_rps"] for s in load["probe_runs"]["80-20"]] == [1.0, 2.0]


@pytest.mark.django_db
def test_it_puts_the_offered_load_and_goodput_capacity_beside_the_comparison(
    client, viewer, analysed_experiment
) -> None:  # type: ignore[no-untyped-def]
    from apps.lifecycle.calibration import _goodput_store

    _goodput_store(
        workload_pk=analysed_experiment.workload.pk,
        cell_id="C1",
        mixture="80-20",
        entry={"status": "done", "capacity_rps": 2.5, "bracketed": True, "steps": []},
    )
    client.force_login(viewer)
    html = client.get(f"/experiments/{analysed_experiment.pk}/results/").content.decode()
    assert "Offered load:</strong> typed by hand" in html
    assert 'id="results-goodput"' in html and "2.5 req/s" in html


@pytest.mark.django_db
def test_the_results_page_shows_an_isolate_decisions_pools(client, viewer) -> None:  # type: ignore[no-untyped-def]
    from apps.analysis.services import experiment_analyse
    from tests.analysis.factories import isolate_experiment

    search = {"status": "done", "capacity_rps": 0.5, "bracketed": True, "steps": []}
    experiment = isolate_experiment({"C1": {"short": search}})
    experiment_analyse(experiment_id=experiment.pk)
    client.force_login(viewer)
    html = client.get(f"/experiments/{experiment.pk}/results/").content.decode()
    assert 'id="results-pools"' in html and "sized at the agreed rates with 20% headroom" in html
    assert "<td>short</td><td>C1</td>" in html and "0.5 req/s" in html and "<strong>2</strong>" in html
    assert "80-20 @ low: 80% → 0.8 req/s (2)" in html
    assert "not measured" in html and f"experiment_calibrate {experiment.pk} --cell B0 --class long" in html
