"""Load and faults on the real service: the CPU engine, real Postgres and Redis, real workers.

    .venv/bin/python bench/faults/faults.py viewers|redis|postgres|kills [--out bench/results/faults-<name>.md]

Each scenario runs small experiments (tests/experiments/factories.small_spec: B0 and C1 on the
tiny model) through the real pipeline, in its own database (``tailtune_faults``) and Redis
database (7), and records what happened in bench/results/faults-<scenario>.md:

- ``viewers``: ``manage.py serve`` (gunicorn and a worker); while a run measures, 50
  concurrent viewers poll the live page and ``progress.json`` every second. Recorded: every
  response's status and time, and each run's status and dispatch lag against its tolerance.
- ``redis``: Redis is shut down (no save) while the first run measures and started again
  30 s later. Recorded: the experiment's end and each run's.
- ``postgres``: Postgres is restarted while a run writes its records. Recorded: each run's
  end and reason, and per run the records against the plan (none lost, none twice).
- ``kills``: 20 SIGKILLs of the worker's process group in random phases (starting, warming,
  measuring, draining: one drawn, waited for, killed within 1.5 s) of an experiment of 16
  runs, the worker started again at once each time. Recorded: every run's end (done,
  failed and retried, cancelled), duplicate or missing records, and vLLM processes left over.

It needs the CPU engine (`make engine`) and takes minutes per scenario; it restarts the shared
Redis and Postgres, so run it on a machine nothing else is using.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DB = "tailtune_faults"
ENV = {
    "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB}",
    "CELERY_BROKER_URL": "redis://127.0.0.1:6379/7",
    "CELERY_RESULT_BACKEND": "redis://127.0.0.1:6379/7",
    "SECRET_KEY": "faults-bench",
    "TAILTUNE_HOST": "faults",
    "TAILTUNE_RECONCILE_AFTER_S": "60",
}


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


def setup(tmp: Path) -> None:
    """A fresh database and broker for this bench, then Django on them."""
    sh("psql", "-h", "127.0.0.1", "-U", "postgres", "-c", f"drop database if exists {DB} with (force)")
    sh("psql", "-h", "127.0.0.1", "-U", "postgres", "-c", f"create database {DB}")
    sh("redis-cli", "-n", "7", "flushdb")
    os.environ.update(ENV, TAILTUNE_DATA=str(tmp / "data"), DJANGO_SETTINGS_MODULE="config.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()}


class Worker:
    """``manage.py run_worker`` in its own process group, restarted at will."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.proc, self.starts = tmp, None, 0

    def start(self) -> None:
        log = open(self.tmp / f"worker-{self.starts}.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_worker"], cwd=ROOT, env=child_env(),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.starts += 1
        path = self.tmp / f"worker-{self.starts - 1}.log"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and b" ready." not in path.read_bytes():
            time.sleep(0.2)

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def experiment(name: str, **workload: Any) -> Any:
    from apps.lifecycle.creation import experiment_create
    from tests.experiments.factories import UserFactory, small_spec

    spec = small_spec(name=name)
    spec["workload"] = {**spec["workload"], "max_dispatch_lag_ms": 2000, **workload}
    owner = UserFactory(username="faults", roles=["experimenter"])
    return experiment_create(spec=spec, owner=owner)


def start(exp: Any) -> None:
    from apps.lifecycle.running import experiment_start

    deadline = time.monotonic() + 120
    while True:
        try:
            experiment_start(experiment=exp)
            return
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def wait(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:  # the database or broker may be down on purpose
            value = None
        if value:
            return value
        time.sleep(1)
    raise SystemExit(f"timed out waiting for {what}")


def status_of(exp: Any) -> str:
    from apps.experiments.models import Experiment

    return str(Experiment.objects.values_list("status", flat=True).get(pk=exp.pk))


def runs_table(exp: Any) -> list[str]:
    from apps.runs.models import RequestRecord, Run

    lines = ["| run | cell | status | retry of | records / planned | distinct | dispatch lag p99 (tolerance) | reason |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in Run.objects.filter(experiment=exp).exclude(kind=Run.Kind.REHEARSAL).order_by("id"):
        idx = list(RequestRecord.objects.filter(run=run).values_list("index", flat=True))
        lag = run.dispatch_lag_p99_ms
        lines.append(
            f"| {run.pk} | {run.cell.cell_id} | {run.status} | {run.retry_of_id or ''} | {len(idx)} / "
            f"{run.requests_planned} | {len(set(idx))} | {'' if lag is None else f'{lag:.1f} ms'} "
            f"({exp.workload.max_dispatch_lag_ms:g} ms) | {(run.reason or '')[:80]} |"
        )
    return lines


def vllm_left() -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
                env = (entry / "environ").read_bytes()
            except OSError:
                continue
            if b"vllm.entrypoints" in cmd and b"TAILTUNE_HOST=faults" in env:
                out.append(int(entry.name))
    return out


def repairs(exp: Any) -> str:
    """What the reconciler repaired on the experiment (audit log), in order."""
    from apps.audit.models import AuditEvent

    found = [
        str(e.detail.get("repair"))
        for e in AuditEvent.objects.filter(experiment=exp, action="experiment.reconciled").order_by("id")
    ]
    return "; ".join(found) if found else "none"


def integrity(exp: Any) -> tuple[int, int]:
    """(runs with a record twice, finished runs missing records) over the experiment."""
    from apps.runs.models import RequestRecord, Run

    doubled = missing = 0
    for run in Run.objects.filter(experiment=exp):
        idx = list(RequestRecord.objects.filter(run=run).values_list("index", flat=True))
        doubled += len(idx) != len(set(idx))
        missing += run.status in ("done", "invalid") and len(set(idx)) != run.requests_planned
    return doubled, missing


# -- scenarios ---------------------------------------------------------------------------------


def viewers(tmp: Path) -> list[str]:
    import httpx

    from tests.experiments.factories import UserFactory

    user = UserFactory(username="viewer", roles=["viewer"])
    user.set_password("viewer-pass-123")
    user.save()
    port = 18500 + os.getpid() % 400
    serve = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port)], cwd=ROOT, env=child_env(),
        stdout=open(tmp / "serve.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait(lambda: httpx.get(base + "/accounts/login/").status_code == 200, 180, "the web")
        exp = experiment("viewers", observation_s=30)
        start(exp)
        wait(lambda: exp.runs.filter(status="measuring").exists(), 600, "a measuring run")
        with httpx.Client(base_url=base) as c:
            page = c.get("/accounts/login/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
            c.post("/accounts/login/", data={"username": "viewer", "password": "viewer-pass-123",
                                              "csrfmiddlewaretoken": token})  # fmt: skip
            cookies = dict(c.cookies)
        results: list[tuple[str, int | None, float]] = []

        async def viewer(n: int) -> None:
            async with httpx.AsyncClient(base_url=base, cookies=cookies, timeout=30) as client:
                while await asyncio.to_thread(status_of, exp) == "running":
                    for path in (f"/experiments/{exp.pk}/", f"/experiments/{exp.pk}/progress.json"):
                        t0 = time.perf_counter()
                        try:
                            r = await client.get(path)
                            code: int | None = r.status_code
                        except httpx.HTTPError:
                            code = None
                        results.append(
                            (path.rsplit("/", 1)[-1] or "live page", code, time.perf_counter() - t0)
                        )
                    await asyncio.sleep(1)

        async def all_viewers() -> None:
            await asyncio.gather(*(viewer(n) for n in range(50)))

        asyncio.run(all_viewers())
        wait(lambda: status_of(exp) in ("analysed", "cancelled"), 900, "the analysis")
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=60)
    errors = [r for r in results if r[1] != 200]
    times = sorted(r[2] for r in results)
    return [
        f"50 viewers, every second, the live page and progress.json, while the experiment ran: "
        f"{len(results)} responses, {len(errors)} not 200 "
        f"({sorted({str(e[1]) for e in errors}) if errors else 'none'}); response time p50 "
        f"{statistics.median(times) * 1000:.0f} ms, p99 {times[int(0.99 * (len(times) - 1))] * 1000:.0f} ms.",
        f"Experiment: {status_of(exp)}.",
        "",
        *runs_table(exp),
    ]


def redis(tmp: Path) -> list[str]:
    worker = Worker(tmp)
    worker.start()
    try:
        exp = experiment("redis restart", observation_s=20)
        start(exp)
        wait(lambda: exp.runs.filter(status="measuring").exists(), 600, "a measuring run")
        sh("redis-cli", "shutdown", "nosave", check=False)
        down_at = time.monotonic()
        time.sleep(30)
        sh("redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379", "--save", "",
           "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/faults.log")  # fmt: skip
        wait(lambda: sh("redis-cli", "ping", check=False).stdout.strip() == "PONG", 60, "Redis")
        back = time.monotonic() - down_at
        end = wait(lambda: status_of(exp) in ("analysed", "cancelled") and status_of(exp), 1500, "the end")
    finally:
        worker.stop()
    doubled, missing = integrity(exp)
    return [
        f"Redis shut down (no save: every queued message lost) while the first run measured, started "
        f"again {back:.0f} s later. Experiment: **{end}**. Runs with a record twice: {doubled}; "
        f"finished runs missing records: {missing}. Reconciler repairs: {repairs(exp)}.",
        "",
        *runs_table(exp),
    ]


def postgres(tmp: Path) -> list[str]:
    from apps.runs.models import RequestRecord

    worker = Worker(tmp)
    worker.start()
    version = sorted(os.listdir("/etc/postgresql"))[0]
    try:
        exp = experiment("postgres restart", observation_s=30)
        start(exp)
        run = wait(lambda: exp.runs.filter(status="measuring").first(), 600, "a measuring run")
        wait(lambda: RequestRecord.objects.filter(run=run).count() >= 3, 120, "records")
        from django.db import connections

        connections.close_all()
        t0 = time.monotonic()
        sh("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart")
        took = time.monotonic() - t0
        end = wait(lambda: status_of(exp) in ("analysed", "cancelled") and status_of(exp), 1500, "the end")
    finally:
        worker.stop()
    doubled, missing = integrity(exp)
    return [
        f"Postgres restarted ({took:.1f} s) while run {run.pk} wrote its records. Experiment: **{end}**. "
        f"Runs with a record twice: {doubled}; finished runs missing records: {missing}. "
        f"Reconciler repairs: {repairs(exp)}.",
        "",
        *runs_table(exp),
    ]


def kills(tmp: Path) -> list[str]:
    from apps.runs.models import Run

    rng = random.Random(20)
    worker = Worker(tmp)
    worker.start()
    phases: list[str] = []
    try:
        exp = experiment("twenty kills", repeats=8)
        start(exp)
        for _ in range(20):
            # A phase drawn at random, waited for (up to 90 s), then a kill within 1.5 s of it;
            # a CPU engine takes longer to start than a run measures, so a kill at a random
            # moment would nearly always land in "starting".
            wanted = rng.choice(sorted(Run.ACTIVE))
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and status_of(exp) == "running":
                if Run.objects.filter(experiment=exp, status=wanted).exists():
                    break
                time.sleep(0.2)
            time.sleep(rng.uniform(0, 1.5))
            current = Run.objects.filter(experiment=exp, status__in=sorted(Run.ACTIVE)).first()
            got = current.status if current else f"between runs, experiment {status_of(exp)}"
            phases.append(got if got == wanted else f"{got} (drawn: {wanted})")
            worker.kill()
            worker.start()
        end = wait(lambda: status_of(exp) in ("analysed", "cancelled") and status_of(exp), 3600, "the end")
    finally:
        worker.stop()
    time.sleep(5)
    left = vllm_left()
    doubled, missing = integrity(exp)
    ends: dict[str, int] = {}
    for run in Run.objects.filter(experiment=exp).exclude(kind=Run.Kind.REHEARSAL):
        key = run.status
        if run.status == "failed":
            key = (
                "failed, retried" if Run.objects.filter(retry_of=run).exists() else "failed (a retry itself)"
            )
        ends[key] = ends.get(key, 0) + 1
    return [
        f"20 SIGKILLs of the worker's process group (phases: {', '.join(phases)}), each followed by a "
        f"fresh worker. Experiment: **{end}**. Runs by how they ended: {ends}. Runs with a record "
        f"twice: {doubled}; finished runs missing records: {missing}; vLLM processes left: {len(left)}. "
        f"Reconciler repairs: {repairs(exp)}.",
        "",
        *runs_table(exp),
    ]


SCENARIOS = {"viewers": viewers, "redis": redis, "postgres": postgres, "kills": kills}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--out")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="parse the arguments, say what would run and stop (the smoke test; needs no engine)",
    )
    opts = parser.parse_args(argv)
    if (
        opts.dry_run
    ):  # needs the CPU engine and restarts of the shared Redis and Postgres: the suite checks only this far
        print(f"dry run: {vars(opts)}")
        return
    tmp = Path(tempfile.mkdtemp(prefix=f"tailtune-faults-{opts.scenario}-"))
    setup(tmp)
    started = time.perf_counter()
    lines = SCENARIOS[opts.scenario](tmp)
    took = time.perf_counter() - started
    text = "\n".join(
        [
            f"# Faults: {opts.scenario}",
            "",
            f"`.venv/bin/python bench/faults/faults.py {opts.scenario}` ({took:.0f} s, CPU engine, "
            "real Postgres and Redis; see the script's docstring).",
            "",
            *lines,
        ]
    )
    out = Path(opts.out or ROOT / "bench" / "results" / f"faults-{opts.scenario}.md")
    out.write_text(text + "\n")
    print(text)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
