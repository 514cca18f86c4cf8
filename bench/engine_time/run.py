"""Engine time of a scaled-down seed sweep on the CPU engine: reuse and early stopping off, then on.

The sweep is bench/engine_time/spec.yaml (4 cells x 2 mixtures x 2 rates x 2 repeats = 32
runs; C3 is set up to break the short class's TTFT contract). Each mode creates the
experiment with ``engine.reuse`` and ``engine.early_stop`` set, freezes it and runs it
through the worker's own pull loop (``workers.pipeline.host_pull``) on this host, then
analyses it. It records, per mode: the decision (outcome and chosen cell), server starts,
runs done / skipped, engine-seconds spent by part (apps/runs/engine_time.py, from what each
run recorded) and wall time; then the ratio off / on, and an estimate for the full seed
sweep (examples/seed-sweep.yaml) on a GPU host with a stated 120 s start, with the
arithmetic. Both modes run in one invocation, one after the other, on the same machine.

Run (a scratch database; it is migrated, and each mode's experiment is left in it):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tailtune_bench \\
    .venv/bin/python bench/engine_time/run.py [--modes off,on] [--out bench/results/engine_time.md]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.chdir(REPO)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from apps.analysis.services import experiment_analyse  # noqa: E402
from apps.experiments.models import Experiment  # noqa: E402
from apps.experiments.spec import load_yaml  # noqa: E402
from apps.lifecycle.creation import experiment_create  # noqa: E402
from apps.lifecycle.running import experiment_freeze_and_enqueue  # noqa: E402
from apps.runs import dispatch  # noqa: E402
from apps.runs.engine_time import engine_time_summary  # noqa: E402
from workers import pipeline  # noqa: E402

START_S_GPU = 120.0  # the stated start time of a real model on a GPU host (the figure)


def run_mode(name: str, reuse: bool) -> dict[str, Any]:
    spec = load_yaml((REPO / "bench/engine_time/spec.yaml").read_text())
    spec["name"] = f"bench-engine-time-{name}-{int(time.time())}"
    spec["engine"] = {"reuse": reuse, "early_stop": reuse}
    owner, _ = get_user_model().objects.get_or_create(username="bench")
    experiment = experiment_create(spec=spec, owner=owner)
    host = pipeline.this_host()
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    began = time.monotonic()
    planned = experiment_freeze_and_enqueue(experiment_id=experiment.pk)
    ran = pipeline.host_pull(host=host)
    decision = experiment_analyse(experiment_id=experiment.pk)
    wall = time.monotonic() - began
    account = engine_time_summary(experiment=experiment) or {}
    statuses: dict[str, int] = {}
    for status in experiment.runs.values_list("status", flat=True):
        statuses[status] = statuses.get(status, 0) + 1
    skipped = sorted(set(experiment.runs.filter(status="skipped").values_list("reason", flat=True)))
    # The run that settled each stop, with its load generator's own lateness: a break a stalled
    # client caused is not the server's (docs/ANALYSIS.md, validity).
    settling = []
    for reason in skipped:
        run_id = reason.split("(run ", 1)[-1].split(" ", 1)[0]
        row = (
            experiment.runs.filter(run_id=run_id)
            .values(
                "cell__cell_id",
                "mixture",
                "rate_name",
                "repeat",
                "dispatch_lag_p99_ms",
                "summary__loop_stall_max_ms",
            )
            .first()
        )
        if row:
            settling.append(row)
    return {
        "mode": name,
        "experiment": experiment.pk,
        "reuse": reuse,
        "early_stop": reuse,
        "runs_planned": planned,
        "runs_executed": len(ran),
        "statuses": statuses,
        "skipped_reasons": skipped,
        "settling_runs": settling,
        "outcome": decision.outcome,
        "chosen_cell": decision.chosen_cell,
        "server_starts": account.get("server_starts"),
        "engine_s": account.get("spent_s"),
        "engine_parts_s": account.get("spent_parts_s"),
        "mean_start_s": account.get("mean_start_s"),
        "mean_drain_s": account.get("mean_drain_s"),
        "saved_s": account.get("saved_s"),
        "wall_s": round(wall, 1),
    }


def gpu_estimate(on: dict[str, Any]) -> list[str]:
    """The full seed sweep on a GPU host, from the spec's own windows and a 120 s start."""
    spec = load_yaml((REPO / "examples/seed-sweep.yaml").read_text())
    w = spec["workload"]
    cells = 1 + len(spec["candidates"])
    runs = cells * len(w["mixtures"]) * len(w["rates"]) * int(w["repeats"])
    windows = float(w["warmup_s"]) + float(w["observation_s"])
    drain = float(w["drain_deadline_s"])
    off_s = runs * (START_S_GPU + windows + drain)
    starts = cells * int(w["repeats"])
    # The drain ends when the last request finishes; on the CPU bench it took this share of its deadline.
    drain_share = (on["mean_drain_s"] or 0.0) / 10.0
    on_s = starts * START_S_GPU + runs * (windows + drain_share * drain)
    lost_cell_s = (int(w["repeats"]) - 1) * START_S_GPU + (runs // cells - 1) * (
        windows + drain_share * drain
    )
    return [
        f"- Full seed sweep ({cells} cells x {len(w['mixtures'])} mixtures x {len(w['rates'])} rates x "
        f"{w['repeats']} repeats = {runs} runs; windows {windows:g} s (warm-up + observation), drain deadline "
        f"{drain:g} s, start {START_S_GPU:g} s):",
        f"  - off: {runs} x ({START_S_GPU:g} + {windows:g} + {drain:g}) = {off_s:,.0f} s = {off_s / 3600:.1f} GPU-h",
        f"  - reuse, and the drain ending as on the CPU bench ({drain_share:.0%} of its deadline): "
        f"{starts} starts x {START_S_GPU:g} + {runs} x ({windows:g} + {drain_share:.2f} x {drain:g}) = "
        f"{on_s:,.0f} s = {on_s / 3600:.1f} GPU-h ({off_s / on_s:.2f}x less)",
        f"  - each cell lost after its first run saves a further {lost_cell_s:,.0f} s "
        f"({int(w['repeats']) - 1} starts and {runs // cells - 1} runs' windows and drains)",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="off,on")
    parser.add_argument("--out", default=str(REPO / "bench/results/engine_time.md"))
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="parse the arguments, say what would run and stop (the smoke test; needs no engine)",
    )
    args = parser.parse_args(argv)
    if args.dry_run:  # needs the CPU engine: the suite checks only this far
        print(f"dry run: {vars(args)}")
        return
    call_command("migrate", verbosity=0)
    # The tasks the services send (host wake-ups, the analysis) stay here: this process is the host.
    dispatch.send = lambda name, *, kwargs, queue: None  # type: ignore[assignment]
    results = [run_mode(m, reuse=(m == "on")) for m in args.modes.split(",")]
    lines = [
        "# Engine time: reuse and early stopping off, then on (bench/engine_time/run.py)",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on this CPU machine (2 cores), "
        "both modes in one invocation, one after the other. The sweep: bench/engine_time/spec.yaml.",
        "",
        "| mode | decision | server starts | runs run / skipped | engine-seconds | start / warm-up / idle / "
        "windows / drain / stop (s) | wall (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        p = r["engine_parts_s"] or {}
        lines.append(
            f"| {r['mode']} | {r['outcome']} {r['chosen_cell']} | {r['server_starts']} | "
            f"{r['runs_executed']} / {r['statuses'].get('skipped', 0)} | {r['engine_s']} | "
            f"{p.get('start')} / {p.get('warmup')} / {p.get('idle_check')} / {p.get('windows')} / "
            f"{p.get('drain')} / {p.get('stop')} | {r['wall_s']} |"
        )
    by = {r["mode"]: r for r in results}
    if "off" in by and "on" in by:
        off, on = by["off"], by["on"]
        same = (off["outcome"], off["chosen_cell"]) == (on["outcome"], on["chosen_cell"])
        lines += [
            "",
            f"- Decision identical: **{'yes' if same else 'NO'}** ({off['outcome']} {off['chosen_cell']} / "
            f"{on['outcome']} {on['chosen_cell']}).",
            f"- Engine-seconds off / on: **{off['engine_s'] / on['engine_s']:.2f}x** "
            f"({off['engine_s']} / {on['engine_s']}); server starts {off['server_starts']} / {on['server_starts']}.",
            f"- Skipped with reuse and early stopping on: {'; '.join(on['skipped_reasons']) or 'none'}.",
            *[
                f"  - settled by {r['cell__cell_id']} {r['mixture']} @ {r['rate_name']} repeat {r['repeat']}: "
                f"dispatch lag p99 {r['dispatch_lag_p99_ms']:.0f} ms, longest loop stall "
                f"{r['summary__loop_stall_max_ms'] or 0:.0f} ms"
                for r in on.get("settling_runs", [])
            ],
            f"- Mean drain: {off['mean_drain_s']} s off, {on['mean_drain_s']} s on, against a 10 s deadline.",
            "",
            "## Estimate for the full seed sweep on a GPU host",
            "",
            *gpu_estimate(on),
        ]
    lines += ["", "Raw:", "", "```json", json.dumps(results, indent=1), "```", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
