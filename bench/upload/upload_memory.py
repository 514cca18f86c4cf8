"""The web process's memory while a trace is uploaded: 3 MB and 300 MB side by side, by each route.

    .venv/bin/python bench/upload/upload_memory.py [--big-mb 300] [--out bench/results/upload_memory.md]

Starts the real service (`manage.py serve --no-worker`, gunicorn with one web worker, on the
embedded defaults in a temporary data folder) and uploads an Azure-format trace file streamed
from disk (httpx), once small and once big, by each route that takes one: the create page
(logged in as an experimenter, the seed spec), ``POST /api/v1/traces`` and ``POST
/api/v1/gates`` (a token; a host row with a fresh heartbeat so the gate is accepted). For each
upload it reads the gunicorn worker's peak resident memory (VmHWM, /proc) before and after.
The web request only streams the file to a temporary file (config/uploadhandlers.py) and
queues its import (apps/lifecycle/trace_upload.py, apps/gate/uploads.py); no worker runs here, so
nothing parses it. The claim: the web worker's peak does not grow with the file.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "examples" / "seed-sweep.yaml"
ROW = "2023-11-16 18:15:{s:02d}.{us:07d},{ctx},{gen}\n"
ROUTES = ("create page", "POST /api/v1/traces", "POST /api/v1/gates")
GATE_FILE = """
model: {path: .engine/models/tiny-llama, revision: r1, tokenizer_revision: r1}
controls: {max_model_len: 2048, dtype: bfloat16, kv_cache_memory_bytes: 33554432}
baseline: {captured_from: bench, args: {max_num_batched_tokens: 2048, max_num_seqs: 8}}
classes:
  - {name: short, max_input_tokens: 400, contract: {ttft_p99_ms: 1000, e2e_p99_ms: 5000, max_stall_ms: 1000, error_rate: 0.01}}
  - {name: long, contract: {ttft_p99_ms: 5000, e2e_p99_ms: 20000, max_stall_ms: 2000, error_rate: 0.01}}
"""
API_FIELDS = {
    "POST /api/v1/traces": {
        "format": "azure", "classes": "short:400,long", "model_dir": ".engine/models/tiny-llama",
        "tokenizer_revision": "r1", "max_model_len": "2048", "busiest": "60",
    },
    "POST /api/v1/gates": {"format": "azure", "busiest": "60", "spec": GATE_FILE, "candidate_args": '{"max_num_seqs": 4}'},
}  # fmt: skip


def write_trace(path: Path, size_bytes: int) -> int:
    """An Azure-format CSV of about ``size_bytes`` (ten rows per second of trace time)."""
    rows = 0
    with path.open("w") as out:
        out.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        while out.tell() < size_bytes:
            block = "".join(
                ROW.format(
                    s=(rows + i) // 10 % 60, us=((rows + i) % 10) * 1_000_000, ctx=300 + (i % 7) * 50, gen=8
                )
                for i in range(10_000)
            )
            out.write(block)
            rows += 10_000
    return rows


def vm_hwm_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", text).group(1))  # type: ignore[union-attr]


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out.append(int(entry.name))
    return out


def gunicorn_worker(serve_pid: int) -> int:
    """The one gunicorn worker: serve -> gunicorn master -> worker."""
    for _ in range(600):
        for master in children(serve_pid):
            workers = children(master)
            if workers:
                return workers[0]
        time.sleep(0.1)
    raise SystemExit("no gunicorn worker appeared")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--big-mb", type=int, default=300)
    parser.add_argument("--small-mb", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "upload_memory.md"))
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="parse the arguments, say what would run and stop (the smoke test; needs no engine)",
    )
    opts = parser.parse_args(argv)
    if opts.dry_run:  # needs a service start on its own migrated data folder: the suite checks only this far
        print(f"dry run: {vars(opts)}")
        return
    work = Path(tempfile.mkdtemp(prefix="tailtune-upload-bench-"))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(TAILTUNE_DATA=str(work / "data"), SECRET_KEY="upload-bench", TAILTUNE_HOST="upload-bench")
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run(
        [python, "manage.py", "user_add", "bench", "--password-stdin", "--role", "experimenter"],
        cwd=ROOT, env=env, check=True, capture_output=True, input="bench-pass-123\n", text=True,
    )  # fmt: skip
    subprocess.run(
        [python, "manage.py", "shell", "-c",
         "from django.utils import timezone; from apps.runs.models import Host; "
         "Host.objects.create(name='bench', queue='host.bench', vllm_command=['vllm', 'serve'], "
         "last_heartbeat=timezone.now() + timezone.timedelta(days=1))"],
        cwd=ROOT, env=env, check=True, capture_output=True,
    )  # fmt: skip
    api_token = subprocess.run(
        [python, "manage.py", "token_create", "bench", "--name", "upload-bench", "--scope", "read,run"],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    files = {}
    for label, mb in (("small", opts.small_mb), ("big", opts.big_mb)):
        path = work / f"{label}.csv"
        rows = write_trace(path, mb * 1024 * 1024)
        files[label] = (path, rows)
    port = 18000 + os.getpid() % 1000
    serve = subprocess.Popen(
        [python, "manage.py", "serve", "--no-worker", "--web-workers", "1", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    results = []
    try:
        with httpx.Client(base_url=base, timeout=600) as client:
            for _ in range(600):
                try:
                    if client.get("/accounts/login/").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            login = client.get("/accounts/login/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)  # type: ignore[union-attr]
            client.post(
                "/accounts/login/",
                data={"username": "bench", "password": "bench-pass-123", "csrfmiddlewaretoken": token},
            )
            worker = gunicorn_worker(serve.pid)
            api = {"Authorization": f"Bearer {api_token}"}
            for route, label in [(r, size) for r in ROUTES for size in ("small", "big")]:
                path, rows = files[label]
                if route != "create page":
                    before = vm_hwm_kib(worker)
                    started = time.perf_counter()
                    with path.open("rb") as f:
                        response = client.post(
                            route.split()[-1],
                            data=API_FIELDS[route],
                            files={
                                "file" if route.endswith("traces") else "trace": (path.name, f, "text/csv")
                            },
                            headers=api,
                        )
                    took = time.perf_counter() - started
                    after = vm_hwm_kib(worker)
                    assert response.status_code == 202, (route, response.status_code, response.text[:2000])
                    results.append((route, label, path.stat().st_size, rows, before, after, took))
                    continue
                page = client.get("/experiments/new/")
                token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
                before = vm_hwm_kib(worker)
                started = time.perf_counter()
                with path.open("rb") as f:
                    response = client.post(
                        "/experiments/new/",
                        data={
                            "csrfmiddlewaretoken": token,
                            "spec_text": SPEC.read_text(),
                            "trace_format": "azure",
                            "trace_classes": "short:400,long",
                            "create": "1",
                        },
                        files={"trace_file": (path.name, f, "text/csv")},
                    )
                took = time.perf_counter() - started
                after = vm_hwm_kib(worker)
                assert (
                    response.status_code == 302 and "/experiments/uploads/" in response.headers["location"]
                ), (
                    response.status_code,
                    response.text[:2000],
                )
                results.append((route, label, path.stat().st_size, rows, before, after, took))
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=60)
    lines = [
        "# The web process's memory while a trace is uploaded",
        "",
        f"`.venv/bin/python bench/upload/upload_memory.py --big-mb {opts.big_mb}` (gunicorn, one web worker,",
        "embedded defaults; by each route the upload streams to a temporary file and its import is",
        "queued for a worker; peak RSS is the worker's VmHWM, which only grows).",
        "",
        "| route | upload | file | rows | web worker peak RSS before | after | growth | request time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for route, label, size, rows, before, after, took in results:
        lines.append(
            f"| {route} | {label} | {size / 2**20:.1f} MiB | {rows} | {before / 1024:.1f} MiB | "
            f"{after / 1024:.1f} MiB | {(after - before) / 1024:.1f} MiB | {took:.1f} s |"
        )
    small = [r for r in results if r[1] == "small"]
    big = [r for r in results if r[1] == "big"]
    lines += [
        "",
        f"File ratio big/small: {big[0][2] / small[0][2]:.0f}x, three big uploads in all. Peak RSS after the "
        f"last big upload / after the first small one: {big[-1][5] / small[0][5]:.2f}x. The web worker's "
        "memory does not follow the file's size on any route.",
    ]
    text = "\n".join(lines) + "\n"
    Path(opts.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
