"""Engine time of B0's capacity probe on the CPU engine: one server per step, then one for all steps.

The probe (apps/lifecycle/calibration.py) runs its steps inline through the worker's pipeline
(``workers.pipeline.inline_executor``). With ``engine.reuse`` off every step starts B0's server
anew; on (the default) the first step starts it and each later step replays on it after the
idle check (and the prefix-cache reset where caching is on). Both modes probe the same spec
(same seed, so the same probe traces for the same rates) in one invocation, one after the
other, and the script records per mode: server starts, engine-seconds by part
(apps/runs/engine_time.py, from what each probe run recorded), each step's rate and outcome,
and the frozen rates. The steps' outcomes are live measurements, so the frozen rates agree
only when every step's pass or fail agrees; the script says whether they did.

Run (a scratch database; it is migrated, and each mode's experiment is left in it):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tailtune_bench \\
    .venv/bin/python bench/calibration/probe_engine_time.py [--steps 3] [--out bench/results/probe_engine_time.md]
``--dry-run`` checks the script's set-up (the spec for each mode) without starting an engine.
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

from apps.experiments.models import Experiment  # noqa: E402
from apps.experiments.spec import load_yaml, validate_spec  # noqa: E402
from apps.lifecycle.creation import experiment_create  # noqa: E402
from apps.lifecycle.running import experiment_freeze_and_enqueue  # noqa: E402
from apps.runs import dispatch  # noqa: E402
from apps.runs.engine_time import engine_time_summary  # noqa: E402
from apps.runs.models import Run  # noqa: E402
from workers import pipeline  # noqa: E402


def probe_spec(*, reuse: bool, steps: int) -> dict[str, Any]:
    """bench/engine_time/spec.yaml's model, controls and classes, B0 only, probed for one mixture."""
    spec = load_yaml((REPO / "bench/engine_time/spec.yaml").read_text())
    spec["name"] = f"bench-probe-{'on' if reuse else 'off'}-{int(time.time())}"
    spec["candidates"] = [{"id": "C1", "args": {**spec["baseline"]["args"], "max_num_seqs": 8}}]
    spec["engine"] = {"reuse": reuse, "early_stop": False}
    spec["workload"]["mixtures"] = {"short-only": {"short": 1.0}}
    spec["workload"].pop("rates", None)
    spec["workload"].pop("mixture_rates", None)
    spec["workload"]["max_dispatch_lag_ms"] = 250
    spec["calibration"] = {
        "start_rps": 2.0,
        "max_steps": steps,
        "warmup_s": 1,
        "observation_s": 4,
        "drain_deadline_s": 10,
    }
    spec.pop("scenarios", None)
    return spec


def run_mode(name: str, *, steps: int) -> dict[str, Any]:
    owner, _ = get_user_model().objects.get_or_create(username="bench")
    experiment = experiment_create(spec=probe_spec(reuse=name == "on", steps=steps), owner=owner)
    pipeline.this_host()
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    began = time.monotonic()
    with pipeline.inline_executor() as execute:
        experiment_freeze_and_enqueue(experiment_id=experiment.pk, execute=execute)
    wall = time.monotonic() - began
    experiment.refresh_from_db()
    workload = experiment.workload.__class__.objects.get(pk=experiment.workload.pk)
    probes = list(experiment.runs.filter(kind__in=sorted(Run.PROBES)).order_by("plan_position"))
    account = engine_time_summary(experiment=experiment) or {}
    derivation = workload.rates_derivation or {}
    return {
        "mode": name,
        "experiment": experiment.pk,
        "status": experiment.status,
        "status_reason": experiment.status_reason,
        "steps": [
            {"rate_rps": s.get("rate_rps"), "passed": s.get("passed")}
            for search in derivation.get("probes", [])
            for s in search.get("steps", [])
        ],
        "probe_statuses": [p.status for p in probes],
        "server_pids": len({p.server_pid for p in probes if p.server_pid}),
        "rates": workload.rates,
        "server_starts": account.get("server_starts"),
        "engine_s": account.get("spent_s"),
        "engine_parts_s": account.get("spent_parts_s"),
        "wall_s": round(wall, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="off,on")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench/results/probe_engine_time.md"))
    parser.add_argument("--dry-run", action="store_true", help="check the specs only; start no engine")
    args = parser.parse_args(argv)
    if args.dry_run:
        for mode in args.modes.split(","):
            checked = validate_spec(probe_spec(reuse=mode == "on", steps=args.steps))
            print(f"dry run: mode {mode}: calibration max_steps {checked['calibration']['max_steps']}, ok")
        return
    call_command("migrate", verbosity=0)
    # The tasks the services send (host wake-ups) stay here: this process is the host.
    dispatch.send = lambda name, *, kwargs, queue: None  # type: ignore[assignment]
    results = [run_mode(m, steps=args.steps) for m in args.modes.split(",")]
    lines = [
        "# B0's capacity probe: a server per step, then one server for all steps",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on this CPU machine (2 cores) by "
        "bench/calibration/probe_engine_time.py, both modes in one invocation, one after the other.",
        "",
        "| engine.reuse | steps (rate: pass/fail) | server starts | engine-seconds | start / warm-up / idle / "
        "windows / drain / stop (s) | frozen rates | wall (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        p = r["engine_parts_s"] or {}
        steps = ", ".join(f"{s['rate_rps']:g}: {'pass' if s['passed'] else 'fail'}" for s in r["steps"])
        lines.append(
            f"| {r['mode']} | {steps or r['status_reason']} | {r['server_starts']} | {r['engine_s']} | "
            f"{p.get('start')} / {p.get('warmup')} / {p.get('idle_check')} / {p.get('windows')} / "
            f"{p.get('drain')} / {p.get('stop')} | {r['rates']} | {r['wall_s']} |"
        )
    by = {r["mode"]: r for r in results}
    if "off" in by and "on" in by and by["on"]["engine_s"]:
        off, on = by["off"], by["on"]
        same_steps = off["steps"] == on["steps"]
        lines += [
            "",
            f"- Engine-seconds off / on: **{off['engine_s'] / on['engine_s']:.2f}x** "
            f"({off['engine_s']} / {on['engine_s']}); server starts {off['server_starts']} / {on['server_starts']}.",
            f"- Every step's outcome agreed: **{'yes' if same_steps else 'no'}**; frozen rates identical: "
            f"**{'yes' if off['rates'] == on['rates'] else 'no'}**.",
        ]
    lines += ["", "Raw:", "", "```json", json.dumps(results, indent=1), "```", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
