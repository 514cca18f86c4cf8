from __future__ import annotations

import uuid

import pytest


@pytest.mark.django_db
def test_it_shows_a_runs_distribution_args_hashes_and_log(client, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    run = analysed_experiment.runs.select_related("cell").get(cell__cell_id="C1")
    client.force_login(viewer)
    response = client.get(f"/runs/{run.run_id}/")
    html = response.content.decode()
    assert response.status_code == 200
    assert run.trace_sha256 in html and run.corpus_sha256 in html
    assert "cpu-test" in html  # hardware id
    assert "max_model_len: 2048" in html  # effective args, as the engine reported them
    assert "Application startup complete." in html
    ctx = response.context
    hist = ctx["ttft_chart"]
    assert {t["name"].split(" ")[0] for t in hist["data"]} == {"short", "long"}
    assert sum(sum(t["y"]) for t in hist["data"]) == 40  # every measured request, warm-up excluded
    assert hist["layout"]["xaxis"]["title"]["text"] == "latency from planned arrival (ms)"
    assert {o["name"]: o["completed"] for o in ctx["outcomes"]} == {"short": 20, "long": 20}
    assert ctx["report_entry"]["key"] == str(run.run_id)
    assert ctx["gauge_chart"]["data"]


@pytest.mark.django_db
def test_it_shows_the_send_loops_stall_and_class(client, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    run = analysed_experiment.runs.get(cell__cell_id="C1")
    run.summary = {**(run.summary or {}), "loop_stall_max_ms": 3.4, "send_priority": "realtime"}
    run.save(update_fields=["summary"])
    client.force_login(viewer)
    html = client.get(f"/runs/{run.run_id}/").content.decode()
    assert "longest stall 3.4 ms · scheduling class realtime" in html


@pytest.mark.django_db
def test_it_shows_an_empty_state_for_a_queued_run(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    run = experiment.runs.first()
    client.force_login(viewer)
    html = client.get(f"/runs/{run.run_id}/").content.decode()
    assert "No request records yet: the run has not started" in html
    assert "No /metrics scrapes recorded" in html


@pytest.mark.django_db
def test_it_answers_404_for_an_unknown_run(client, viewer) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    assert client.get(f"/runs/{uuid.uuid4()}/").status_code == 404


@pytest.mark.django_db
def test_a_retry_and_the_run_it_retries_link_to_each_other(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    from apps.lifecycle.retries import run_requeue_once
    from apps.runs.models import Run

    experiment.__class__.objects.filter(pk=experiment.pk).update(status="running")
    failed = experiment.runs.order_by("plan_position").first()
    Run.objects.filter(pk=failed.pk).update(status="measuring")
    failed.refresh_from_db()
    retry = run_requeue_once(run=failed, reason="worker lost mid-run on host h1")
    assert retry is not None
    client.force_login(viewer)
    page = client.get(f"/experiments/{experiment.pk}/").content.decode()
    n = failed.plan_position + 1
    assert f'retry of <a href="/runs/{failed.run_id}/">#{n} (failed)</a>' in page
    assert f'retried as <a href="/runs/{retry.run_id}/">#{n} (retry)</a>' in page
    assert "worker lost mid-run" in client.get(f"/runs/{retry.run_id}/").content.decode()
    assert f"/runs/{retry.run_id}/" in client.get(f"/runs/{failed.run_id}/").content.decode()
