from __future__ import annotations

import io
from collections import Counter

import pytest
from django.core.management import call_command

from apps.experiments.models import Experiment
from apps.experiments.plan import expand_plan
from apps.runs.models import Run
from tests.conftest import SEED_SPEC


def _import(path: str) -> Experiment:
    out = io.StringIO()
    call_command("experiment_import", path, "--owner", "admin", stdout=out)
    return Experiment.objects.get(pk=int(out.getvalue().strip()))


def _plan(experiment: Experiment, *, sweep_only: bool = False) -> list[tuple[str, str, str, int, int]]:
    runs = Run.objects.filter(experiment=experiment)
    if sweep_only:
        runs = runs.filter(kind=Run.Kind.SWEEP)
    return [
        (r.cell.cell_id, r.mixture, r.rate_name, r.repeat, r.round_position)
        for r in runs.select_related("cell").order_by("plan_position")
    ]


@pytest.mark.django_db
def test_it_plans_the_seed_sweep_as_126_runs_each_cell_once_per_group(admin_user) -> None:
    experiment = _import(str(SEED_SPEC))
    # Beside the sweep, the reference sweep plans its uniform companions (one per cell, mixture and
    # rate) and its four failure scenarios against every cell; calibration probes and the rehearsal
    # are made when the experiment starts and after its analysis.
    others = Counter(
        (r.kind, r.scenario) for r in Run.objects.filter(experiment=experiment).exclude(kind=Run.Kind.SWEEP)
    )
    assert others == {
        ("uniform", ""): 7 * 3 * 2,
        **{
            ("scenario", name): 7
            for name in ("long_burst", "kv_pressure", "context_boundary", "cancellation")
        },
    }
    plan = _plan(experiment, sweep_only=True)
    assert len(plan) == 126
    assert experiment.status == Experiment.Status.PLANNED
    groups = Counter((m, r, rep) for _, m, r, rep, _ in plan)
    assert len(groups) == 3 * 2 * 3
    for (mixture, rate, repeat), count in groups.items():
        cells = sorted(c for c, m, r, rep, _ in plan if (m, r, rep) == (mixture, rate, repeat))
        assert cells == ["B0", "C1", "C2", "C3", "C4", "C5", "C6"], (mixture, rate, repeat)
        assert count == 7
    rounds = {rep: [(c, m, r) for c, m, r, rp, _ in plan if rp == rep] for rep in (1, 2, 3)}
    assert rounds[1] != rounds[2] != rounds[3] and rounds[1] != rounds[3]
    assert sorted(rounds[1]) == sorted(rounds[2])


@pytest.mark.django_db
def test_it_plans_the_same_order_on_a_second_import_and_after_export(admin_user, tmp_path) -> None:
    first = _import(str(SEED_SPEC))
    second = _import(str(SEED_SPEC))
    assert _plan(first) == _plan(second)
    out = io.StringIO()
    call_command("experiment_export", str(first.pk), stdout=out)
    exported = tmp_path / "exported.yaml"
    exported.write_text(out.getvalue())
    third = _import(str(exported))
    assert _plan(third) == _plan(first)
    assert third.spec == first.spec


def test_it_changes_the_order_with_the_seed() -> None:
    a = expand_plan(cell_ids=["B0", "C1", "C2"], mixtures=["m"], rates=["low", "high"], repeats=2, seed=1)
    b = expand_plan(cell_ids=["B0", "C1", "C2"], mixtures=["m"], rates=["low", "high"], repeats=2, seed=2)
    assert [(p.cell_id, p.rate_name) for p in a] != [(p.cell_id, p.rate_name) for p in b]
    assert [p.plan_position for p in a] == list(range(12))


def test_with_engine_reuse_each_round_runs_cell_by_cell_in_a_new_random_order() -> None:
    cells = ["B0", "C1", "C2", "C3"]
    plan = expand_plan(
        cell_ids=cells, mixtures=["a", "b"], rates=["low", "high"], repeats=3, seed=5, group_by_cell=True
    )
    assert [p.plan_position for p in plan] == list(range(48))
    orders = []
    for repeat in (1, 2, 3):
        rnd = [p for p in plan if p.repeat == repeat]
        assert sorted((p.cell_id, p.mixture, p.rate_name) for p in rnd) == sorted(
            (c, m, r) for c in cells for m in ("a", "b") for r in ("low", "high")
        )
        # One block of four consecutive runs per cell: the host replays them on one server.
        blocks = [p.cell_id for p in rnd][::4]
        assert all(p.cell_id == blocks[i // 4] for i, p in enumerate(rnd))
        orders.append(blocks)
    assert len({tuple(o) for o in orders}) > 1  # the cells' order is drawn again every round
