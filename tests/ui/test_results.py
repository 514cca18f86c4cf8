from __future__ import annotations

import json

import pytest
from django.utils.html import escape


def _figures(response) -> dict:  # type: ignore[no-untyped-def]
    """Every chart embedded with json_script on the page, by its id."""
    import re

    html = response.content.decode()
    out = {}
    for m in re.finditer(r'<script id="([^"]+)" type="application/json">(.*?)</script>', html, re.S):
        out[m.group(1)] = json.loads(m.group(2))
    return out


@pytest.mark.django_db
def test_it_says_when_results_will_appear(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    response = client.get(f"/experiments/{experiment.pk}/results/")
    assert response.status_code == 200
    assert b"No results yet" in response.content
    assert b"0 of 2 runs have finished" in response.content


@pytest.mark.django_db
def test_it_shows_the_decision_checks_and_every_chart(client, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    response = client.get(f"/experiments/{analysed_experiment.pk}/results/")
    html = response.content.decode()
    decision = analysed_experiment.decision
    assert escape(decision.rule) in html  # the rule's words name cells' and classes' evidence ("B0's")
    for check in ("Validity", "Acceptance", "Failure scenarios", "Recovery"):
        assert check in html
    # How far the decision can be trusted: the gain family, the seed check and the power per class.
    assert 'id="statistics"' in html and "family-wise" in html
    stats = decision.report["statistics"]
    assert f"{stats['resamples']} block-bootstrap draws" in html
    assert html.count("<tr><td>", html.index('id="power"')) >= len(stats["power"])
    figures = _figures(response)
    expected = {"latency-ttft", "latency-e2e", "latency-stall", "paired-diffs", "heat-goodput", "heat-accepted",
                "queue-over-time", "kv-over-time", "preemptions"}  # fmt: skip
    assert expected <= set(figures)
    for name, fig in figures.items():
        layout = fig["layout"]
        titles = [
            v["title"]["text"] for k, v in layout.items() if k.startswith(("xaxis", "yaxis")) and "title" in v
        ]
        assert titles and all(t for t in titles), name
        units = [t for t in titles if "(" in t]
        units += [d["colorbar"]["title"]["text"] for d in fig["data"] if "colorbar" in d]
        assert units, (name, titles)  # the value axis (or a heatmap's colour bar) names its unit
    # Points link to the runs they stand for.
    point = figures["latency-ttft"]["data"][0]["customdata"][0]
    assert point.startswith(f"/experiments/{analysed_experiment.pk}/?cell=")


@pytest.mark.django_db
def test_it_switches_the_mixture_and_rate(client, viewer, author) -> None:  # type: ignore[no-untyped-def]
    from tests.experiments.factories import make_experiment
    from tests.ui.factories import analysed

    workload = {
        **make_experiment.__globals__["SMALL_SPEC"]["workload"],
        "rates": {"low": 1.0, "high": 2.0},
    }
    experiment = analysed(make_experiment(owner=author, name="two-rates", workload=workload), per_run=20)
    client.force_login(viewer)
    low = client.get(f"/experiments/{experiment.pk}/results/?mixture=80-20&rate=low")
    assert (low.context["mixture"], low.context["rate"]) == ("80-20", "low")
    assert "80-20 @ low" in _figures(low)["latency-ttft"]["layout"]["title"]["text"]
    # An unknown choice falls back to a combination that exists.
    odd = client.get(f"/experiments/{experiment.pk}/results/?mixture=nope&rate=low")
    assert (odd.context["mixture"], odd.context["rate"]) in {("80-20", "low"), ("80-20", "high")}
    assert len(_figures(odd)["heat-goodput"]["data"][0]["x"]) == 2


@pytest.mark.django_db
def test_it_shows_partial_results_of_finished_runs_before_analysis(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    import random

    from apps.runs.models import Run
    from tests.ui.factories import seed_records

    run = experiment.runs.select_related("cell").first()
    Run.objects.filter(pk=run.pk).update(status="done")
    seed_records(run, per_run=10, rng=random.Random(5))
    client.force_login(viewer)
    response = client.get(f"/experiments/{experiment.pk}/results/")
    assert b"No results yet" in response.content and b"1 of 2 runs have finished" in response.content
    partial = {p["class"]: p for p in response.context["partial"]}
    assert partial["short"]["n"] + partial["long"]["n"] == 10  # warm-up excluded
    assert (
        partial["long"]["ttft_max_ms"] >= partial["long"]["ttft_mean_ms"] > partial["short"]["ttft_mean_ms"]
    )


@pytest.mark.django_db
def test_it_shows_each_scenario_signal_and_what_did_not_hold(client, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    decision = analysed_experiment.decision
    run = analysed_experiment.runs.first()
    verdict = {
        "held": False,
        "shown": False,
        "must_hold": [{"claim": "every planned request is accounted for", "held": False, "evidence": {}}],
        "signal": {
            "expected": "some long requests of the burst are refused or still unfinished at the drain deadline",
            "shown": False,
            "diagnosis": "the server cleared the burst before the drain deadline",
        },
    }
    report = dict(decision.report)
    report["checks"] = {
        **report["checks"],
        "failure_scenarios": {
            "status": "listed",
            "runs": [{"scenario": "long_burst", "cell": "B0", "run": str(run.run_id), "held": False,
                      "preemptions": None, "verdict": verdict}],
        },
    }  # fmt: skip
    type(decision).objects.filter(pk=decision.pk).update(report=report)
    client.force_login(viewer)
    html = client.get(f"/experiments/{analysed_experiment.pk}/results/").content.decode()
    assert "long_burst · B0" in html and "not shown</span>: some long requests of the burst" in html
    assert "the server cleared the burst" in html
    assert "did not hold: every planned request is accounted for" in html


@pytest.mark.django_db
def test_the_validity_card_shows_the_measured_dispatch_lag_beside_the_tolerance(
    client, viewer, author
) -> None:  # type: ignore[no-untyped-def]
    from apps.runs.models import Run
    from tests.experiments.factories import make_experiment
    from tests.ui.factories import finish_runs

    experiment = make_experiment(owner=author)
    finish_runs(experiment)
    Run.objects.filter(experiment=experiment).update(dispatch_lag_p99_ms=3.25)
    Run.objects.filter(pk=experiment.runs.first().pk).update(dispatch_lag_p99_ms=4.5)
    # As tests.ui.factories.analysed does, without finishing the runs again (it would reset the lags).
    from apps.analysis.services import experiment_analyse
    from apps.experiments.models import Experiment

    Experiment.objects.filter(pk=experiment.pk).update(status="running")
    experiment_analyse(experiment_id=experiment.pk)
    Experiment.objects.filter(pk=experiment.pk).update(status="analysed")
    client.force_login(viewer)
    page = client.get(f"/experiments/{experiment.pk}/results/").content.decode()
    assert "measured worst p99 4.50 ms; tolerance 50.00 ms" in page


@pytest.mark.django_db
def test_check_4_is_recomputed_once_the_manifest_exists(
    client, viewer, analysed_experiment, approver
) -> None:  # type: ignore[no-untyped-def]
    from apps.approvals.services import experiment_approve

    client.force_login(viewer)
    before = client.get(f"/experiments/{analysed_experiment.pk}/results/").content.decode()
    assert "No rollback manifest yet" in before
    experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=analysed_experiment,
        approver=approver,
        chosen_cell="B0",
        reason="keep B0",
    )
    after = client.get(f"/experiments/{analysed_experiment.pk}/results/").content.decode()
    assert "No rollback manifest yet" not in after and "The rollback manifest names baseline B0" in after
    # The stored report, the evidence behind the approval, is unchanged.
    analysed_experiment.decision.refresh_from_db()
    assert analysed_experiment.decision.report["checks"]["recovery"]["manifest"] is False


@pytest.mark.django_db
def test_the_results_page_and_the_api_report_go_out_compressed(client, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    import gzip

    client.force_login(viewer)
    plain = client.get(f"/experiments/{analysed_experiment.pk}/results/")
    packed = client.get(f"/experiments/{analysed_experiment.pk}/results/", HTTP_ACCEPT_ENCODING="gzip")
    assert "Content-Encoding" not in plain and packed["Content-Encoding"] == "gzip"
    assert len(packed.content) < len(plain.content) / 3
    assert b"Log out" in gzip.decompress(packed.content)
    from tests.api.test_api import client_for

    report = client_for(viewer).get(
        f"/api/v1/experiments/{analysed_experiment.pk}/report", HTTP_ACCEPT_ENCODING="gzip"
    )
    assert report.status_code == 200 and report["Content-Encoding"] == "gzip"
    assert (
        json.loads(gzip.decompress(report.content))["decision"]["outcome"]
        == analysed_experiment.decision.outcome
    )
    # Every other page stays as it was.
    detail = client.get(f"/experiments/{analysed_experiment.pk}/", HTTP_ACCEPT_ENCODING="gzip")
    assert "Content-Encoding" not in detail
