"""The gate on the CPU engine, end to end: real workers replay a real traffic window through B0 and
the candidate, and the gate's exit code, JUnit and Markdown answer the pipeline's question.

The window: 20 s of the shipped Azure conversation trace from 208 s in (a window of median
busyness) with its real arrival times and sizes, every request kept (~113, 5.6 req/s), so that
the 2-core CPU engine serves it with ``max_num_seqs: 8`` (the tiny model decodes a token in a
few ms) but not one at a time, and each class has more than the 59 requests over two repeats
that a p95 needs to be judged at all (84 long and 106 short after the warm-up). These tests
once replayed 40 s at every other request (the same requests per class, half the rate); the
shorter window gives the same answers in about 60% of the time: measured locally at 20 s, the
unchanged candidate's p95s were within 4% of B0's (the gate calls 50% material here) and the
starved one's over 12x.

- an unchanged candidate passes (exit 0), through the single-file remote client against a live
  server, as a CI runner would run it;
- a candidate with ``max_num_seqs: 1`` under the same window serializes the requests and builds
  a queue: exit 1,
  the class named, a failing JUnit case (``manage.py gate`` on the server);
- a dispatch-lag tolerance no load generator can meet makes the first run unusable: the gate
  skips the rest of its runs (the answer can only be inconclusive) and exits 2.
"""

from __future__ import annotations

import csv
import datetime
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.core.management import CommandError, call_command

from apps.accounts.tokens import token_create
from apps.experiments.models import Experiment
from tests.engine_support import ENGINE_MARKS
from tests.experiments.factories import SMALL_SPEC, UserFactory
from tests.orchestration.conftest import Workers

pytestmark = [*ENGINE_MARKS, pytest.mark.django_db(transaction=True)]
# Its claim rests on B0's tail at this load, measured with the whole machine (tests/lanes.py): on
# one core, beside another lane, B0's p95s were 8x longer and the unchanged candidate's ttft p95
# 33% over B0's (against 4% alone; the gate calls 50% material).
WHOLE_MACHINE = pytest.mark.whole_machine(reason="latency at a load sized for the whole machine")

AZURE = Path(settings.BASE_DIR) / "examples" / "traces" / "AzureLLMInferenceTrace_conv.csv"
CLIENT = Path(settings.BASE_DIR) / "clients" / "tailtune_gate.py"
START_S = 208.0
WINDOW_S = 20.0


def window(tmp: Path) -> Path:
    """The trace window described above, in the Azure format (real timestamps, as written)."""
    with AZURE.open(newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    t0 = datetime.datetime.fromisoformat(body[0][0][:26])
    kept = [
        r
        for r in body
        if START_S <= (datetime.datetime.fromisoformat(r[0][:26]) - t0).total_seconds() < START_S + WINDOW_S
    ]
    out = tmp / "window.csv"
    with out.open("w", newline="") as f:
        csv.writer(f).writerows([header, *kept])
    return out


def gate_file(tmp: Path, **workload: object) -> Path:
    doc = {
        "model": SMALL_SPEC["model"],
        "controls": SMALL_SPEC["controls"],
        "baseline": {"captured_from": "prod", "args": {"max_num_batched_tokens": 2048, "max_num_seqs": 8}},
        # Contracts well above what this machine serves the window in (p99s of 1-2.5 s were
        # measured for B0 in the 40 s window, about 1 s in this one, and an unchanged candidate
        # differed from it by up to 0.7 s between runs):
        # a contract judged right at the machine's noise would test the noise, not the gate.
        "classes": [
            {
                "name": "short",
                "max_input_tokens": 1024,
                "contract": {
                    "ttft_p99_ms": 8000,
                    "e2e_p99_ms": 15000,
                    "max_stall_ms": 6000,
                    "error_rate": 0.05,
                },
            },
            {
                "name": "long",
                "contract": {
                    "ttft_p99_ms": 12000,
                    "e2e_p99_ms": 20000,
                    "max_stall_ms": 8000,
                    "error_rate": 0.05,
                },
            },
        ],
        # The client shares 2 cores with the engine (and, on a busy machine, with whatever else runs):
        # a candidate serving one request at a time keeps a core saturated and the load generator
        # was measured up to 2.1 s late at p99 under extra load. The claims here (the exit code, the
        # class named) do not hinge on sub-second timing; a run later than this is still invalid.
        "workload": {"warmup_s": 2, "drain_deadline_s": 60, "max_dispatch_lag_ms": 5000, **workload},
        # What counts as material on this host. An unchanged candidate's two runs (the middle of an
        # ABBA order) were measured 28% slower than B0's in the long class's e2e p95, in both
        # repeats (CI: bootstrap p 0.004, across repeats 0.0025): the shared 2-core machine drifts
        # by that much over minutes, in a pattern two repeats cannot tell from a regression. So, as
        # docs/GATE.md advises for a host whose A/A gate shows drift, a tail change counts only
        # above 50% of B0's value here; the starved candidate is over 4x.
        "analysis": {"compare": {"min_effect_rel": 0.5}},
    }
    path = tmp / "gate.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def local_gate(tmp: Path, owner: str, *extra: str) -> int:
    """``manage.py gate`` on the server; its exit code."""
    try:
        call_command(
            "gate", "--owner", owner, "--trace", str(window(tmp)), "--format", "azure",
            "--busiest", str(WINDOW_S), "--junit", str(tmp / "gate.xml"), "--markdown", str(tmp / "gate.md"),
            "--poll", "2", "--timeout", "1200", *extra,
        )  # fmt: skip
    except SystemExit as exc:
        return int(exc.code or 0)
    except CommandError as exc:
        return exc.returncode
    return 0


def junit_cases(path: Path) -> list[ET.Element]:
    return list(ET.parse(path).getroot().iter("testcase"))


@WHOLE_MACHINE
def test_an_unchanged_candidate_passes_through_the_remote_client(
    workers: Workers, live_server, tmp_path: Path, roles: None
) -> None:  # type: ignore[no-untyped-def]
    workers.start()
    _, plaintext = token_create(user=UserFactory(username="ci", roles=["experimenter"]), name="pipeline")
    token = tmp_path / "token"
    token.write_text(plaintext + "\n")
    # Only the standard library and httpx: run it as a CI runner would, outside Django.
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [
            sys.executable, "-I", str(CLIENT), "--server", live_server.url, "--token-file", str(token),
            "--trace", str(window(tmp_path)), "--format", "azure", "--busiest", str(WINDOW_S),
            "--spec", str(gate_file(tmp_path)), "--candidate-args", "max_num_seqs=8",
            "--junit", str(tmp_path / "gate.xml"), "--markdown", str(tmp_path / "gate.md"),
            "--json", str(tmp_path / "gate.json"), "--poll", "2", "--timeout", "1200",
        ],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:], workers.logs())
    cases = junit_cases(tmp_path / "gate.xml")
    assert cases and not any(c.find("failure") is not None or c.find("error") is not None for c in cases)
    assert {c.get("classname") for c in cases} == {"short", "long"}
    summary = (tmp_path / "gate.md").read_text()
    assert "pass" in summary and f"/experiments/{Experiment.objects.get().pk}/" in summary


@WHOLE_MACHINE
def test_a_starved_candidate_fails_the_gate_and_names_the_class(
    workers: Workers, tmp_path: Path, roles: None
) -> None:
    workers.start()
    UserFactory(username="release", roles=["experimenter"])
    # Every request of the window (5.6 req/s, as for the unchanged candidate): B0's 8 sequence
    # slots serve it, one slot builds a queue that grows through the window in every repeat (the
    # contracts B0 keeps break). At half the rate of the 40 s window this test once replayed, this
    # machine served even one slot with p95s only 1.3-2.7x B0's, which two repeats
    # cannot tell from a run slow as a whole (docs/GATE.md, bench/results/gate_power.md): the
    # gate then rightly said pass. The queued server saturates this 2-core host, which then left
    # a normal-class send loop waiting up to 20 s for a core (sends 31 s late in CI); the loop
    # runs in the real-time class here and stays within milliseconds
    # (bench/results/send_priority.md). The wide tolerance keeps the claim, the verdict, on a
    # host that refuses that class: late sends only understate the candidate's harm.
    # The candidate's queue never drains (one slot for the window's 113 requests): its runs wait
    # out the drain deadline, 15 s rather than the 60 s the other tests give B0 to finish (B0's
    # runs drain in seconds), which the unanswered requests then record as censored tails. (It
    # was 30 s; each second of it is a second of the suite's whole-machine time, twice.)
    spec = gate_file(tmp_path, max_dispatch_lag_ms=30000, drain_deadline_s=15)
    code = local_gate(tmp_path, "release", "--spec", str(spec), "--candidate-args", "max_num_seqs=1")
    experiment = Experiment.objects.get()
    assert code == 1, (
        (tmp_path / "gate.md").read_text() if (tmp_path / "gate.md").exists() else "",
        workers.logs(),
    )
    failed = [c for c in junit_cases(tmp_path / "gate.xml") if c.find("failure") is not None]
    assert failed, (tmp_path / "gate.md").read_text()
    compared = 0
    for case in failed:
        message = case.find("failure").get("message")  # type: ignore[union-attr]
        assert case.get("classname") in ("short", "long") and message.startswith(case.get("classname"))
        assert "B0" in message and "candidate" in message
        # A paired regression states its interval; a tail the candidate's unfinished requests
        # censor has none, and says how far it is known and how many requests went unanswered; a
        # broken contract (the error rate has no paired difference) says which, and that B0 keeps it.
        assert "interval" in message or "censored:" in message or "contract that B0 keeps" in message, message
        # At least one case sets the candidate's tail against B0's: an interval where both sides
        # finished, or the bound of a tail the candidate's unfinished requests censor, with how
        # many went unanswered. Which of the two, and whether the paired test also gives a p-value,
        # depends on how far the queue got by the drain deadline: on 2026-12-03 (server starts of
        # 35-75 s on this machine) the candidate left 19 of 84 long requests unfinished, and the
        # failing cases were a censored tail and the error-rate contract B0 keeps, with no p-value.
        compared += "interval" in message or "censored:" in message
    assert compared, [c.find("failure").get("message") for c in failed]  # type: ignore[union-attr]
    summary = (tmp_path / "gate.md").read_text()
    assert "regression" in summary and "**FAIL**" in summary and f"/experiments/{experiment.pk}/" in summary
    assert {c.cell_id: c.args["max_num_seqs"] for c in experiment.cells.all()} == {"B0": 8, "C1": 1}


def test_runs_made_invalid_on_purpose_are_inconclusive(workers: Workers, tmp_path: Path, roles: None) -> None:
    workers.start()
    UserFactory(username="release", roles=["experimenter"])
    # A dispatch-lag tolerance of a microsecond: no load generator meets it, so no run is usable.
    spec = gate_file(tmp_path, max_dispatch_lag_ms=0.001)
    # Two repeats (the least the gate takes) of the busiest 10 s of the window.
    code = local_gate(
        tmp_path, "release", "--spec", str(spec), "--busiest", "10", "--candidate-args", "max_num_seqs=4"
    )
    assert code == 2, workers.logs()
    # The first run settled it: the other three were skipped, not run (engine.stop_on_invalid).
    runs = list(Experiment.objects.get().runs.filter(kind="sweep").order_by("plan_position"))
    assert [r.status for r in runs] == ["invalid", "skipped", "skipped", "skipped"], [
        (r.status, r.reason) for r in runs
    ]
    assert "dispatch lag" in runs[0].reason, runs[0].reason
    assert all(
        r.reason == f"the answer is inconclusive (run {runs[0].run_id} invalid: {runs[0].reason})"
        for r in runs[1:]
    ), [r.reason for r in runs]
    root = ET.parse(tmp_path / "gate.xml").getroot()
    errors = [c for c in root.iter("testcase") if c.find("error") is not None]
    assert len(errors) == 1 and "dispatch lag" in errors[0].find("error").get("message")  # type: ignore[union-attr]
    assert "inconclusive" in (tmp_path / "gate.md").read_text()
