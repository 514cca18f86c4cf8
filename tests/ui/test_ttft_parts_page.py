"""The results page's "Where the time to first token goes": the stacked bars per class, the table
of the p50 and p99 requests' parts, the diagnosis per class, and the same in experiment_report."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import numpy as np
import pytest
from django.core.management import call_command

from apps.experiments.models import Experiment
from apps.runs.models import MetricSample, Run
from tests.analysis.spans import usable
from tests.ui.factories import analysed, finish_runs


def _figures(html: str) -> dict[str, Any]:
    return {
        m.group(1): json.loads(m.group(2))
        for m in re.finditer(r'<script id="([^"]+)" type="application/json">(.*?)</script>', html, re.S)
    }


def _joined_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records as the spans' join leaves them: every request spent 60% of its TTFT from the send
    in vLLM's queue, 30% in prefill and 5% in the front end (the rest on the way)."""
    import dataclasses

    from apps.analysis import services

    read = services._report_records

    def joined(run_inputs):  # type: ignore[no-untyped-def]
        records = read(run_inputs)
        table = records.table
        from_send = table.first_token_ns - table.sent_ns
        table.server_columns = {
            "server_queue_ns": np.round(0.6 * from_send),
            "server_prefill_ns": np.round(0.3 * from_send),
            "server_ttft_ns": np.round(0.95 * from_send),
            "server_decode_ns": table.last_token_ns - table.first_token_ns,
        }
        return dataclasses.replace(records, table=table)

    monkeypatch.setattr(services, "_report_records", joined)


@pytest.mark.django_db
def test_it_draws_each_class_s_ttft_parts_per_request_and_the_diagnosis(
    client, viewer, author, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from apps.analysis.services import experiment_analyse
    from tests.experiments.factories import make_experiment

    experiment = make_experiment(owner=author, name="parts")
    finish_runs(experiment)
    Run.objects.filter(experiment=experiment).update(summary={"server_spans": usable()})
    _joined_spans(monkeypatch)
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    experiment_analyse(experiment_id=experiment.pk)
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.ANALYSED)

    client.force_login(viewer)
    html = client.get(f"/experiments/{experiment.pk}/results/").content.decode()
    section = html[html.index('id="ttft-parts"') :]
    figures = _figures(html)
    for i, name in enumerate(("short", "long")):
        fig = figures[f"ttft-parts-{i}"]
        assert f"Where {name}'s TTFT goes" in fig["layout"]["title"]["text"]
        assert fig["layout"]["barmode"] == "relative"
        bars = {t["name"]: t for t in fig["data"] if t["type"] == "bar"}
        assert {"queue", "prefill", "server front end", "client, network and HTTP"} <= set(bars)
        # B0 then the candidate, each at p50 and p99.
        assert bars["queue"]["x"] == [["B0 (B0)", "B0 (B0)", "C1", "C1"], ["p50", "p99", "p50", "p99"]]
        marker = next(t for t in fig["data"] if t["type"] == "scatter")
        # Each bar is one request's parts: they stack up to its TTFT, the class's at that rank.
        for j, ttft in enumerate(marker["y"]):
            stacked = sum(t["y"][j] for t in bars.values() if t["y"][j] is not None)
            assert stacked == pytest.approx(ttft, abs=0.01)
            assert bars["queue"]["y"][j] == pytest.approx(0.6 * (ttft - 0.1), abs=0.01)
    report = Experiment.objects.get(pk=experiment.pk).decision.report
    row = next(r for r in report["ttft_parts"]["rows"] if (r["cell"], r["class"]) == ("B0", "short"))
    assert (row["source"], row["joined_share"]) == ("spans", 1.0)
    assert 'id="ttft-parts-table"' in section and "per request, 1 of 1 run" in section
    # The diagnosis: every class of every cell at the agreed point, queue-bound here.
    assert 'id="tail-bounds-table"' in section
    bounds = {(t["cell"], t["class"]): t for t in report["tail_bounds"]}
    assert bounds[("B0", "short")]["bound"] == "queue"
    assert bounds[("B0", "short")]["why"] in section.replace("&#x27;", "'")
    assert any(f["id"] == "tail_bound" for f in report["findings"])

    out = io.StringIO()
    call_command("experiment_report", str(experiment.pk), "--format", "summary", stdout=out)
    text = out.getvalue()
    assert re.search(r"ttft parts: B0 80-20 @ low short: p50 [\d.]+ ms \(queue [\d.]+, prefill", text), text
    assert f"[per request, {row['joined']} of {row['requests']} joined]" in text
    # The scrapes saw preemptions: the queue is put down to KV pressure, with its knobs.
    assert (
        "tail: B0 80-20 @ low short ttft p99: queue (kv cache pressure); knobs: kv_cache_memory_bytes" in text
    )


def _histogram(run: Run, name: str, t_ns: int, phase: str, buckets: list[list[Any]]) -> MetricSample:
    count = buckets[-1][1]
    return MetricSample(
        run=run,
        t_ns=t_ns,
        phase=phase,
        name=name,
        kind="histogram",
        value=count,
        histogram={"buckets": buckets, "sum": 1.0, "count": count},
    )


@pytest.mark.django_db
def test_without_spans_the_page_says_the_split_is_per_run(client, viewer, author, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tests.experiments.factories import make_experiment
    from tests.ui import factories

    seed = factories.seed_samples

    def with_histograms(run: Run, **kw: Any) -> None:
        seed(run, **kw)
        zero = [[0.01, 0], [0.1, 0], [1.0, 0], ["+Inf", 0]]
        MetricSample.objects.bulk_create(
            [
                _histogram(run, "vllm:request_queue_time_seconds", 0, "before", zero),
                _histogram(run, "vllm:time_to_first_token_seconds", 0, "before", zero),
                _histogram(run, "vllm:request_queue_time_seconds", 10**10, "after", [[0.01, 30], [0.1, 40], [1.0, 43], ["+Inf", 43]]),
                _histogram(run, "vllm:time_to_first_token_seconds", 10**10, "after", [[0.01, 0], [0.1, 33], [1.0, 43], ["+Inf", 43]]),
            ]
        )  # fmt: skip

    monkeypatch.setattr(factories, "seed_samples", with_histograms)
    experiment = analysed(make_experiment(owner=author, name="per-run"))
    report = experiment.decision.report
    row = next(r for r in report["ttft_parts"]["rows"] if (r["cell"], r["class"]) == ("B0", "short"))
    assert (row["source"], row["per_request"]) == ("histograms", False)
    assert row["p50"]["parts"]["queue_ms"] is not None and row["p50"]["parts"]["server_rest_ms"] is not None
    client.force_login(viewer)
    html = client.get(f"/experiments/{experiment.pk}/results/").content.decode()
    section = html[html.index('id="ttft-parts"') :]
    assert "<strong>per run, not per request</strong>" in section
    assert "no server spans recorded" in section
    fig = _figures(html)["ttft-parts-0"]
    queue = next(t for t in fig["data"] if t["name"] == "queue")
    assert set(queue["marker"]["pattern"]["shape"]) == {"/"}  # hatched: per run


@pytest.mark.django_db
def test_a_report_made_before_the_split_shows_no_section(client, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    decision = analysed_experiment.decision
    for key in ("ttft_parts", "tail_bounds", "prefix_cache"):
        decision.report.pop(key, None)
    decision.save()
    client.force_login(viewer)
    response = client.get(f"/experiments/{analysed_experiment.pk}/results/")
    assert response.status_code == 200
    assert 'id="ttft-parts"' not in response.content.decode()
