"""The numbers the incident reported: p99.9 per class (only from enough requests) and the cost
per 1M output tokens per cell, from the spec's price or the host's."""

from __future__ import annotations

import numpy as np
import pytest

from apps.analysis.metrics import P999_NEED, p999
from apps.analysis.services import experiment_report_build
from apps.runs.hosts import host_register_local
from apps.runs.models import Host, Run
from tests.analysis.builders import Plan, build, healthy


def test_p999_needs_enough_requests_for_the_maximum_to_bound_it() -> None:
    assert P999_NEED == 2995
    few = p999(np.arange(2994, dtype=float), np.zeros(0))
    assert few == {
        "ms": None,
        "censored": False,
        "above_ms": None,
        "not_enough": True,
        "n": 2994,
        "need": 2995,
    }
    values = np.arange(1, 10001, dtype=float)  # 1..10,000 ms
    enough = p999(values, np.zeros(0))
    assert enough["ms"] == 9990.0 and not enough["not_enough"] and enough["n"] == 10000
    # Unobserved values rank above every observed one: past them the p99.9 is only bounded.
    censored = p999(values[:9985], np.full(15, 20000.0))
    assert censored["censored"] and censored["ms"] is None and censored["above_ms"] == 20000.0


def test_every_class_carries_its_p999_and_says_when_it_is_not_enough() -> None:
    report = build(Plan(), healthy)
    run = report["runs"][0]
    for m in run["classes"].values():
        for key in ("ttft_ms", "e2e_ms", "max_stall_ms"):
            assert m[key]["p999"]["not_enough"] and m[key]["p999"]["need"] == 2995
    pooled = report["aggregates"][0]["pooled"]
    assert pooled["ttft_ms"]["p999"]["n"] == 180  # 60 per repeat, 3 repeats


def test_cost_per_million_output_tokens_per_cell_from_the_specs_price() -> None:
    report = build(Plan(), healthy, options={"usd_per_gpu_hour": 3.6})
    costs = report["costs"]
    assert costs["usd_per_gpu_hour"] == 3.6 and costs["price_source"].startswith("spec")
    # 120 requests x 16 tokens in a 10 s window: 192 tokens/s; 3.6 $/h / 3600 / 192 x 1e6.
    for cell in ("B0", "C1", "C2"):
        assert costs["cells"][cell] == {
            "runs": 3,
            "output_tokens_per_s": 192.0,
            "usd_per_1m_output_tokens": pytest.approx(5.2083, abs=1e-4),
        }
    unpriced = build(Plan(), healthy)["costs"]
    assert unpriced["usd_per_gpu_hour"] is None and unpriced["price_source"].startswith("not given")
    assert unpriced["cells"]["B0"]["usd_per_1m_output_tokens"] is None
    assert unpriced["cells"]["B0"]["output_tokens_per_s"] == 192.0


@pytest.mark.parametrize("value", [0, -1, "cheap", True])
def test_a_bad_price_is_refused(value) -> None:  # type: ignore[no-untyped-def]
    from apps.analysis.report import ReportOptions

    with pytest.raises(ValueError, match="usd_per_gpu_hour"):
        ReportOptions.from_mapping({"usd_per_gpu_hour": value})


@pytest.mark.django_db
def test_the_hosts_price_is_used_when_the_spec_gives_none(analysed_experiment, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TAILTUNE_USD_PER_GPU_HOUR", "2.5")
    host = host_register_local()
    assert host.usd_per_gpu_hour == 2.5
    Run.objects.filter(experiment=analysed_experiment).update(host=host)
    costs = experiment_report_build(experiment_id=analysed_experiment.pk)["costs"]
    assert costs["usd_per_gpu_hour"] == 2.5 and host.name in costs["price_source"]
    assert all(c["usd_per_1m_output_tokens"] > 0 for c in costs["cells"].values())
    monkeypatch.setenv("TAILTUNE_USD_PER_GPU_HOUR", "a lot")
    with pytest.raises(ValueError, match="TAILTUNE_USD_PER_GPU_HOUR"):
        host_register_local()
    assert Host.objects.get(pk=host.pk).usd_per_gpu_hour == 2.5


@pytest.mark.django_db
def test_the_results_page_shows_cost_beside_every_cell(client, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    page = client.get(f"/experiments/{analysed_experiment.pk}/results/").content.decode()
    assert 'id="cost-table"' in page and "$ per 1M output tokens" in page
    for cell in analysed_experiment.cells.values_list("cell_id", flat=True):
        assert f"<td>{cell}" in page


@pytest.mark.django_db
def test_the_results_page_shows_p999_or_not_enough_requests(client, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    page = client.get(f"/experiments/{analysed_experiment.pk}/results/").content.decode()
    assert 'id="tails-table"' in page and "TTFT p99.9" in page
    assert "not enough requests" in page  # the fixture's 40 requests a run cannot give a p99.9
