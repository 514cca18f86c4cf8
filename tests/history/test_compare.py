"""Two experiments side by side (apps/history/side_by_side.py), and the refusals when they were
not measured alike: on the page (/compare/) and the API (/api/v1/compare)."""

from __future__ import annotations

import pytest

from apps.history.side_by_side import NotComparable, Side, compare, refusals
from tests.api.test_api import client_for
from tests.history.factories import analysed_experiment, on_other_traces


def side(experiment_id: int, **changes: object) -> Side:
    fields: dict[str, object] = {
        "experiment_id": experiment_id,
        "name": f"e{experiment_id}",
        "cell": "C1",
        "model_revision": "r1",
        "tokenizer_revision": "t1",
        "hardware": frozenset({"h100x1"}),
        "traces": {("mix", "low"): frozenset({"aa" * 32})},
        "metrics": {("mix", "low", "short"): {"ttft_p99_ms": 100.0, "goodput_rps": None}},
    }
    fields.update(changes)
    return Side(**fields)  # type: ignore[arg-type]


def test_it_compares_the_metrics_both_sides_measured() -> None:
    b = side(2, metrics={("mix", "low", "short"): {"ttft_p99_ms": 80.0, "goodput_rps": 3.0}})
    rows = compare(side(1), b)
    assert rows == [
        {"mixture": "mix", "rate": "low", "request_class": "short", "metric": "ttft_p99_ms",
         "a": 100.0, "b": 80.0, "diff": -20.0, "rel": -0.2},
    ]  # fmt: skip


def test_it_refuses_sides_measured_differently_and_names_every_difference() -> None:
    other = side(
        2,
        traces={("mix", "low"): frozenset({"bb" * 32})},
        hardware=frozenset({"a100x1"}),
        model_revision="r2",
    )
    reasons = refusals(side(1), other)
    assert len(reasons) == 3
    assert reasons[0].startswith("different traces at mix @ low: #1 C1 replayed aaaaaaaaaaaa")
    assert "different hardware" in reasons[1] and "different model revisions: 'r1' and 'r2'" == reasons[2]
    with pytest.raises(NotComparable):
        compare(side(1), other)
    with pytest.raises(NotComparable, match="share no"):
        compare(side(1), side(2, traces={("mix", "high"): frozenset({"aa" * 32})}))


@pytest.mark.django_db
def test_the_page_and_the_api_compare_two_experiments_and_refuse_other_traces(client, viewer) -> None:  # type: ignore[no-untyped-def]
    a = analysed_experiment("first", seed=1)
    b = analysed_experiment("second", seed=2)
    c = on_other_traces(analysed_experiment("elsewhere", seed=3))
    client.force_login(viewer)
    page = client.get(f"/compare/?a={a.pk}&b={b.pk}&a_cell=B0&b_cell=B0")
    assert page.context["comparable"] and page.context["rows"]
    html = page.content.decode()
    assert 'id="compare-table"' in html and "ttft_p99_ms" in html
    refused = client.get(f"/compare/?a={a.pk}&b={c.pk}").content.decode()
    assert 'id="compare-refusal"' in refused and "different traces" in refused
    assert client.get("/compare/?a=x&b=1").status_code == 400

    api = client_for(viewer)
    ok = api.get(f"/api/v1/compare?a={a.pk}&b={b.pk}")
    assert ok.status_code == 200 and ok.json()["comparable"] and ok.json()["b"]["cell"] == "B0"
    no = api.get(f"/api/v1/compare?a={a.pk}&b={c.pk}")
    assert no.status_code == 409 and any("different traces" in r for r in no.json()["reasons"])
    assert api.get(f"/api/v1/compare?a={a.pk}").status_code == 400
    cells = api.get(f"/api/v1/compare?a={a.pk}&b={a.pk}&a_cell=B0&b_cell=C1").json()
    assert cells["comparable"]  # two cells of one experiment
    missing = api.get(f"/api/v1/compare?a={a.pk}&b={b.pk}&b_cell=C9").json()
    assert "has no cell 'C9'" in missing["reasons"][0]
