from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.experiments.models import Experiment
from apps.runs.models import Host, MetricSample, RequestRecord, Run
from tests.ui.factories import seed_records


def _running(experiment: Experiment) -> tuple[Run, Run]:
    """One run done (60 s), one measuring now with a few records and scrapes."""
    Experiment.objects.filter(pk=experiment.pk).update(status="running")
    experiment.refresh_from_db()
    done, live = list(experiment.runs.order_by("plan_position"))
    now = timezone.now()
    host = Host.objects.create(name="cpu-a", queue="host.cpu-a", last_heartbeat=now)
    Run.objects.filter(pk=done.pk).update(
        status="done", started_at=now - timedelta(seconds=100), finished_at=now - timedelta(seconds=40)
    )
    Run.objects.filter(pk=live.pk).update(
        status="measuring",
        host=host,
        started_at=now - timedelta(seconds=20),
        requests_planned=40,
        requests_sent=17,
        log_tail="\n".join(f"line {i}" for i in range(100)),
    )
    live.refresh_from_db()
    seed_records(live, per_run=10, rng=__import__("random").Random(3))
    RequestRecord.objects.filter(run=live, index=5).update(
        first_token_ns=None, end_ns=None, last_token_ns=None
    )
    for name, value in (("vllm:num_requests_waiting", 3.0), ("vllm:kv_cache_usage_perc", 0.42)):
        MetricSample.objects.create(
            run=live, t_ns=1, phase="during", name=name, kind="gauge", value=value - 1
        )
        MetricSample.objects.create(run=live, t_ns=2, phase="during", name=name, kind="gauge", value=value)
    return done, live


@pytest.mark.django_db
def test_it_shows_cells_classes_and_the_run_table(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    response = client.get(f"/experiments/{experiment.pk}/")
    html = response.content.decode()
    assert response.status_code == 200
    assert html.count('<tr class="baseline">') >= 1
    assert "0 / 2" in html
    assert 'id="start"' not in html  # a viewer cannot start it
    assert "data-live-url" not in html  # not running: nothing polls


@pytest.mark.django_db
def test_it_filters_the_run_table_by_cell(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    runs = client.get(f"/experiments/{experiment.pk}/?cell=C1").context["runs"]
    assert [r.cell.cell_id for r in runs] == ["C1"]


@pytest.mark.django_db
def test_it_shows_the_live_run_and_polls_only_while_running(client, author, experiment) -> None:  # type: ignore[no-untyped-def]
    done, live = _running(experiment)
    client.force_login(author)
    response = client.get(f"/experiments/{experiment.pk}/live/")
    html = response.content.decode()
    assert f'data-live-url="/experiments/{experiment.pk}/live/"' in html
    assert "17 / 40" in html  # sent / planned
    assert "line 99" in html and "line 10\n" not in html  # only the log's tail
    assert "42%" in html  # KV gauge, latest scrape
    ttft = {t["name"]: t for t in response.context["current"][0]["ttft"]}
    assert ttft["short"]["n"] + ttft["long"]["n"] == 9
    assert ttft["short"]["waiting"] + ttft["long"]["waiting"] == 1
    assert ttft["long"]["p50_ms"] > ttft["short"]["p99_ms"]  # the seeded long prompts are slower
    progress = response.context["progress"]
    assert (progress.finished, progress.total) == (1, 2)
    # One 60 s run measured; the live one is 20 s in: about 40 s left.
    assert progress.eta_basis == "measured"
    assert 35 <= progress.eta_s <= 41
    page = client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert 'id="cancel"' in page

    # Every run finished, the analysis not yet landed: still polled (it used to stop here).
    Run.objects.filter(pk=live.pk).update(status="done", finished_at=timezone.now())
    assert "data-live-url" in client.get(f"/experiments/{experiment.pk}/live/").content.decode()
    Experiment.objects.filter(pk=experiment.pk).update(status="analysed")
    polled = client.get(f"/experiments/{experiment.pk}/live/", headers={"X-Requested-With": "fetch"})
    assert "data-live-url" not in polled.content.decode() and 'data-reload="1"' in polled.content.decode()
    # The page itself, loaded afresh, does not ask to reload.
    assert 'data-reload="1"' not in client.get(f"/experiments/{experiment.pk}/").content.decode()


@pytest.mark.django_db
def test_it_starts_an_experiment_for_its_author(client, author, experiment) -> None:  # type: ignore[no-untyped-def]
    Host.objects.create(name="cpu-a", queue="host.cpu-a", last_heartbeat=timezone.now())
    client.force_login(author)
    response = client.post(f"/experiments/{experiment.pk}/start/", follow=True)
    assert b"Started: 2 runs queued." in response.content
    experiment.refresh_from_db()
    assert experiment.status == "running"
    assert AuditEvent.objects.filter(
        experiment=experiment, action="experiment.started", actor=author
    ).exists()
    live = client.get(f"/experiments/{experiment.pk}/live/").content.decode()
    assert "data-live-url" in live  # queued runs: the page polls


@pytest.mark.django_db
def test_it_explains_why_an_experiment_did_not_start(client, author, experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    response = client.post(f"/experiments/{experiment.pk}/start/", follow=True)
    assert b"Not started: no host can serve this experiment" in response.content
    experiment.refresh_from_db()
    assert experiment.status == "planned"


@pytest.mark.django_db
def test_it_cancels_a_running_experiment_for_its_author(client, author, experiment) -> None:  # type: ignore[no-untyped-def]
    _running(experiment)
    client.force_login(author)
    response = client.post(f"/experiments/{experiment.pk}/cancel/", follow=True)
    assert b"Cancelled" in response.content
    experiment.refresh_from_db()
    assert experiment.status == "cancelled"
    assert AuditEvent.objects.filter(
        experiment=experiment, action="experiment.cancelled", actor=author
    ).exists()


@pytest.mark.django_db
def test_it_refuses_start_and_cancel_to_anyone_but_the_author(
    client, other_experimenter, viewer, approver, experiment
) -> None:  # type: ignore[no-untyped-def]
    for user in (other_experimenter, viewer, approver):
        client.force_login(user)
        assert client.post(f"/experiments/{experiment.pk}/start/").status_code == 403
        assert client.post(f"/experiments/{experiment.pk}/cancel/").status_code == 403
    experiment.refresh_from_db()
    assert experiment.status == "planned"


@pytest.mark.django_db
def test_it_exports_the_spec_as_yaml(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    import yaml

    client.force_login(viewer)
    response = client.get(f"/experiments/{experiment.pk}/spec.yaml")
    spec = yaml.safe_load(response.content)
    assert spec["name"] == "ui-small"
    assert spec["baseline"]["id"] == "B0"


@pytest.mark.django_db
def test_it_serves_progress_as_json_from_the_database(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    run = experiment.runs.first()
    Run.objects.filter(pk=run.pk).update(status="measuring", requests_sent=3, requests_planned=10)
    Run.objects.exclude(pk=run.pk).filter(experiment=experiment).update(status="done")
    client.force_login(viewer)
    data = client.get(f"/experiments/{experiment.pk}/progress.json").json()
    assert data["runs_total"] == experiment.runs.count()
    assert data["runs_finished"] == experiment.runs.count() - 1
    assert [(r["phase"], r["requests_sent"], r["requests_planned"]) for r in data["active_runs"]] == [
        ("measuring", 3, 10)
    ]
    client.logout()
    assert client.get(f"/experiments/{experiment.pk}/progress.json").status_code == 302


@pytest.mark.django_db
def test_a_large_plan_is_shown_a_page_of_runs_at_a_time(client, viewer, author) -> None:  # type: ignore[no-untyped-def]
    from tests.experiments.factories import make_experiment, small_spec

    workload = {**small_spec()["workload"], "repeats": 100, "rates": {"low": 1.0, "high": 2.0}}
    experiment = make_experiment(owner=author, workload=workload)
    assert experiment.runs.count() == 400
    client.force_login(viewer)

    def rows(html: str) -> int:
        table = html.split('id="run-table"', 1)[1].split("</table>", 1)[0]
        return table.count("<tr class=")

    first = client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert rows(first) == 200 and "runs 1–200 of 400" in first
    assert 'href="?page=2#runs">next ›</a>' in first
    second = client.get(f"/experiments/{experiment.pk}/?page=2").content.decode()
    assert rows(second) == 200 and "runs 201–400 of 400" in second and "‹ previous" in second
    # Filters carry over to the pager's links; a filtered table of one page has no pager.
    filtered = client.get(f"/experiments/{experiment.pk}/?cell=C1").content.decode()
    assert "runs 1–200 of 200" not in filtered and 'id="run-pager"' not in filtered
    both = client.get(f"/experiments/{experiment.pk}/?rate=low").content.decode()
    assert "runs 1–200 of 200" not in both


@pytest.mark.django_db
def test_it_shows_the_hosts_that_qualify_and_the_engine_time(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    now = timezone.now()
    Experiment.objects.filter(pk=experiment.pk).update(status="running", hardware_id="1x test CPU")
    Host.objects.create(name="cpu-a", queue="host.cpu-a", last_heartbeat=now, hardware_id="1x test CPU")
    Host.objects.create(name="gpu-z", queue="host.gpu-z", last_heartbeat=now, hardware_id="8x H100")
    first, second = list(experiment.runs.order_by("plan_position"))
    parts = {"start_s": 30.0, "warmup_s": 2.0, "windows_s": 12.0, "drain_s": 1.0, "stop_s": 1.0}
    Run.objects.filter(pk=first.pk).update(
        status="done", started_at=now - timedelta(seconds=60), finished_at=now - timedelta(seconds=14),
        summary={"engine_time": parts},
    )  # fmt: skip
    Run.objects.filter(pk=second.pk).update(
        status="skipped", reason="cannot be accepted (run x broke short ttft)"
    )
    page = client.get(f"/experiments/{experiment.pk}/")
    content = page.content.decode()
    assert 'id="hardware-id">1x test CPU' in content
    assert "qualifies</span> cpu-a" in content and "does not qualify</span> gpu-z" in content
    assert 'id="engine-spent">46 engine-seconds' in content
    assert "early stopping (1 runs skipped)" in content
