#!/usr/bin/env python3
"""tailtune gate, the remote client: one file, the standard library and httpx only.

A deploy pipeline asks one question: *does this change make any class's tail
worse on our real traffic?* This client sends the trace window, B0 (args or the
approved rollback manifest), the candidate's overlay and the classes to a
tailtune server (``POST /api/v1/gates``), waits while the server's workers run
B0 and the candidate paired on the same frozen window, then writes a JUnit XML
and a Markdown summary and exits:

- 0: no class materially worse and every contract B0 keeps is kept;
- 1: regression (the class, the metric, B0 vs candidate with the interval);
- 2: inconclusive (a run invalid or failed, the load generator fell behind, B0 failed);
- 3: usage or infrastructure error.

    pip install httpx
    python tailtune_gate.py --server https://tailtune.example --token-file token \\
        --trace window.csv --format azure --busiest 300 --classes short:1024,long \\
        --baseline-manifest prod-manifest.json --candidate-args max_num_batched_tokens=1024 \\
        --junit gate.xml --markdown gate.md

``manage.py gate`` on the server takes the same flags (without ``--server``)
and gives the same exit codes; docs/GATE.md has the CI jobs and the rollout
controller examples. Nothing here imports Django: the server reuses the
rendering below, so both forms write the same files.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

PASS, REGRESSION, INCONCLUSIVE, USAGE = 0, 1, 2, 3
EXIT_OF_VERDICT = {"pass": PASS, "regression": REGRESSION, "inconclusive": INCONCLUSIVE}
FORMATS = ("azure", "mooncake", "burstgpt", "vllm-timed", "tailtune")
# What the server accepts as a spec or manifest file; bigger is a usage error here, before upload.
MAX_TEXT_BYTES = 1_000_000


class GateError(Exception):
    """A usage or infrastructure problem: the gate cannot answer (exit 3)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2, which means "inconclusive" here
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(USAGE)


def add_arguments(parser: argparse.ArgumentParser, *, remote: bool) -> None:
    """The gate's flags, shared by this client and ``manage.py gate``."""
    if remote:
        parser.add_argument("--server", required=True, help="the tailtune server's base URL")
        parser.add_argument(
            "--token-file",
            required=True,
            help="a file holding an API token (scopes read and run; experimenter role)",
        )
    parser.add_argument("--trace", required=True, help="the real traffic window to replay")
    parser.add_argument("--format", required=True, choices=FORMATS, help="the trace file's format")
    parser.add_argument(
        "--busiest", type=float, default=None, help="keep the busiest S seconds of the trace (e.g. 300)"
    )
    parser.add_argument(
        "--classes",
        default=None,
        help="split the trace into classes by input length, e.g. short:1024,long "
        "(default: the spec file's classes with their max_input_tokens)",
    )
    parser.add_argument(
        "--spec",
        default=None,
        help="a small YAML/JSON file: model, controls, engine, baseline, classes with contracts, workload",
    )
    parser.add_argument(
        "--baseline-manifest", default=None, help="B0 as last approved: a tailtune rollback manifest"
    )
    parser.add_argument(
        "--baseline-args",
        default=None,
        help="B0's scheduler args, e.g. max_num_seqs=64,max_num_batched_tokens=8192",
    )
    parser.add_argument(
        "--candidate-args",
        default=None,
        help="the candidate as an overlay on B0's args, e.g. max_num_seqs=32",
    )
    parser.add_argument(
        "--candidate-image",
        default=None,
        help="the candidate is another engine build: an image name the GPU host's worker lists "
        "in TAILTUNE_VLLM_COMMANDS",
    )
    parser.add_argument(
        "--candidate-model-revision", default=None, help="the candidate serves another model revision"
    )
    parser.add_argument("--repeats", type=int, default=2, help="paired repeats of B0 and the candidate (2)")
    parser.add_argument("--name", default=None, help="the experiment's name (default: gate + time)")
    parser.add_argument("--junit", default=None, help="write the JUnit XML here")
    parser.add_argument("--markdown", default=None, help="write the Markdown summary here")
    parser.add_argument("--json", default=None, help="write the verdict resource (JSON) here")
    parser.add_argument(
        "--timeout", type=float, default=6 * 3600.0, help="give up (exit 3) after this many seconds"
    )
    parser.add_argument("--poll", type=float, default=10.0, help="seconds between progress checks")


def parse_overlay(text: str | None, flag: str) -> dict[str, Any]:
    """``k=v,k2=v2`` as a mapping: integers, true/false and plain text (the server validates names)."""
    out: dict[str, Any] = {}
    if not text:
        return out
    for part in text.split(","):
        key, sep, raw = part.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key or not raw:
            raise GateError(f"{flag}: {part!r} is not key=value")
        if key in out:
            raise GateError(f"{flag}: {key} is given twice")
        value: Any = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        out[key] = value
    return out


def read_file(
    path: str | None, flag: str, *, binary: bool = False, limit: int | None = MAX_TEXT_BYTES
) -> Any:
    if path is None:
        return None
    p = Path(path)
    try:
        size = p.stat().st_size
        if limit is not None and size > limit:
            raise GateError(f"{flag}: {path} is {size} bytes; at most {limit}")
        data = p.read_bytes()
    except OSError as exc:
        raise GateError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None
    if binary:
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GateError(f"{flag}: {path} is not UTF-8 text (byte {exc.start})") from None


def gate_request(opts: argparse.Namespace) -> dict[str, Any]:
    """Everything but the trace bytes, as the server's ``POST /api/v1/gates`` takes it."""
    if opts.repeats < 2:
        raise GateError(
            "--repeats: must be at least 2 (the gate tells a regression from run-to-run noise by the spread between repeats)"
        )
    if opts.busiest is not None and opts.busiest <= 0:
        raise GateError("--busiest: must be positive")
    if opts.timeout <= 0 or opts.poll <= 0:
        raise GateError("--timeout and --poll must be positive")
    body: dict[str, Any] = {
        "format": opts.format,
        "repeats": opts.repeats,
        "baseline_args": parse_overlay(opts.baseline_args, "--baseline-args"),
        "candidate_args": parse_overlay(opts.candidate_args, "--candidate-args"),
    }
    for key, value in (
        ("busiest", opts.busiest),
        ("classes", opts.classes),
        ("name", opts.name),
        ("candidate_image", opts.candidate_image),
        ("candidate_model_revision", opts.candidate_model_revision),
        ("spec", read_file(opts.spec, "--spec")),
        ("baseline_manifest", read_file(opts.baseline_manifest, "--baseline-manifest")),
    ):
        if value is not None:
            body[key] = value
    return body


# ---------------------------------------------------------------- the reports


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g} {unit}".strip()
    return f"{value} {unit}".strip()


def _side(case: Mapping[str, Any], side: str, unit: str) -> str:
    """A side's value, or for a tail censored by unanswered requests its bound and how many."""
    if case.get(side) is not None or f"{side}_unanswered" not in case:
        return _fmt(case.get(side), unit)
    above = case.get(f"{side}_above")
    count = case.get(f"{side}_unanswered") or {}
    bound = f"above {_fmt(above, unit)}" if above is not None else "unknown"
    why = (
        f"{count.get('unfinished', 0)} of {count.get('offered', 0)} requests unfinished at the drain deadline"
    )
    if count.get("failed"):
        why += f", {count['failed']} failed"
    return f"{bound} (censored: {why})"


def case_line(case: Mapping[str, Any]) -> str:
    """``short ttft_p99_ms: B0 812 ms, candidate 1530 ms, diff +718 ms [95% +402, +1101]`` and why;
    a censored tail reads ``candidate above 9000 ms (censored: 37 of 220 requests unfinished …)``."""
    unit = case.get("unit") or ""
    ci = case.get("ci") or [None, None]
    parts = [
        f"{case['class']} {case['metric']}: B0 {_side(case, 'b0', unit)}, "
        f"candidate {_side(case, 'candidate', unit)}"
    ]
    if case.get("diff") is not None:
        lo = "−∞" if ci[0] is None else f"{ci[0]:+.4g}"
        hi = "+∞" if ci[1] is None else f"{ci[1]:+.4g}"
        parts.append(
            f"diff {case['diff']:+.4g} {unit} [{case.get('confidence', 0.95):.0%} interval {lo}, {hi}]"
        )
    if case.get("message"):
        parts.append(str(case["message"]))
    return "; ".join(parts)


def drift_line(verdict: Mapping[str, Any]) -> str | None:
    """The drift between runs the gate allowed for, over its judged cases: each case's message
    says its own; this names the widest (``runs spread by up to 35% between repeats ...``)."""
    judged = [
        c
        for c in verdict.get("cases") or []
        if c.get("repeats_sd_rel") is not None and c["outcome"] != "skipped"
    ]
    if not judged:
        return None
    widest = max(judged, key=lambda c: float(c["repeats_sd_rel"]))
    b0_n, cand_n = widest.get("repeats") or ["?", "?"]
    return (
        f"drift allowed for: runs spread by up to {float(widest['repeats_sd_rel']):.0%} between repeats "
        f"({widest['class']} {widest['metric']}, {b0_n} runs of B0 and {cand_n} of the candidate); "
        "a regression had to stand out from that"
    )


def render_junit(verdict: Mapping[str, Any]) -> str:
    """One test case per class × metric; a regression is a failure, an unjudged metric skipped,
    and an inconclusive gate one erroring case that says why."""
    cases = list(verdict.get("cases") or [])
    url = verdict.get("url") or ""
    lines = []
    failures = sum(1 for c in cases if c["outcome"] == "fail")
    skipped = sum(1 for c in cases if c["outcome"] == "skipped")
    errors = 1 if verdict.get("verdict") == "inconclusive" else 0
    total = len(cases) + errors
    lines.append('<?xml version="1.0" encoding="UTF-8"?>')
    lines.append(
        f'<testsuites name="tailtune gate" tests="{total}" failures="{failures}" errors="{errors}" skipped="{skipped}">'
    )
    lines.append(
        f"  <testsuite name={quoteattr('tailtune gate ' + str(verdict.get('candidate') or ''))} "
        f'tests="{total}" failures="{failures}" errors="{errors}" skipped="{skipped}">'
    )
    lines.append("    <properties>")
    for key in ("experiment", "baseline", "candidate", "verdict", "url"):
        lines.append(
            f"      <property name={quoteattr(key)} value={quoteattr(str(verdict.get(key) or ''))}/>"
        )
    drift = drift_line(verdict)
    if drift:
        lines.append(f'      <property name="drift" value={quoteattr(drift)}/>')
    lines.append("    </properties>")
    if errors:
        why = "; ".join(verdict.get("reasons") or []) or "inconclusive"
        lines.append('    <testcase classname="gate" name="inconclusive">')
        lines.append(f"      <error message={quoteattr(why[:1000])}>{escape(why)}\n{escape(url)}</error>")
        lines.append("    </testcase>")
    for case in cases:
        lines.append(
            f"    <testcase classname={quoteattr(str(case['class']))} name={quoteattr(str(case['metric']))}>"
        )
        text = escape(case_line(case))
        if case["outcome"] == "fail":
            lines.append(
                f"      <failure message={quoteattr(case_line(case)[:1000])}>{text}\n{escape(url)}</failure>"
            )
        elif case["outcome"] == "skipped":
            lines.append(
                f"      <skipped message={quoteattr(str(case.get('message') or 'not judged')[:1000])}/>"
            )
        else:
            lines.append(f"      <system-out>{text}</system-out>")
        lines.append("    </testcase>")
    lines.append("  </testsuite>")
    lines.append("</testsuites>")
    return "\n".join(lines) + "\n"


HEADLINE = {
    "pass": "✅ pass: no class materially worse, every contract B0 keeps is kept",
    "regression": "❌ regression: a class's tail is materially worse (or breaks a contract B0 keeps)",
    "inconclusive": "⚠️ inconclusive: the runs cannot answer the question",
    "running": "⏳ running",
}


def render_markdown(verdict: Mapping[str, Any]) -> str:
    """The CI job's summary page: the verdict, why, and a table per class × metric."""
    v = str(verdict.get("verdict"))
    url = verdict.get("url") or ""
    out = [
        f"## tailtune gate: {verdict.get('candidate')} vs {verdict.get('baseline')}",
        "",
        f"**{HEADLINE.get(v, v)}** (exit {verdict.get('exit_code')})",
        "",
        f"Experiment [{verdict.get('experiment')}]({url}), traffic: {verdict.get('traffic') or '—'}",
        "",
    ]
    for reason in verdict.get("reasons") or []:
        out.append(f"- {reason}")
    if verdict.get("reasons"):
        out.append("")
    drift = drift_line(verdict)
    if drift:
        out += [drift[0].upper() + drift[1:] + ".", ""]
    cases = verdict.get("cases") or []
    if cases:
        out.append("| class | metric | B0 | candidate | diff [interval] | outcome |")
        out.append("|---|---|---|---|---|---|")
        mark = {"pass": "pass", "fail": "**FAIL**", "skipped": "not judged"}
        for c in cases:
            unit = c.get("unit") or ""
            ci = c.get("ci") or [None, None]
            diff = "—"
            if c.get("diff") is not None:
                lo = "−∞" if ci[0] is None else f"{ci[0]:+.4g}"
                hi = "+∞" if ci[1] is None else f"{ci[1]:+.4g}"
                diff = f"{c['diff']:+.4g} [{lo}, {hi}]"
            note = f" ({c['message']})" if c.get("message") else ""
            out.append(
                f"| {c['class']} | {c['metric']} | {_side(c, 'b0', unit)} | {_side(c, 'candidate', unit)} "
                f"| {diff} | {mark.get(c['outcome'], c['outcome'])}{note} |"
            )
        out.append("")
    return "\n".join(out)


def write_reports(verdict: Mapping[str, Any], opts: argparse.Namespace) -> None:
    for path, body in (
        (opts.junit, render_junit(verdict)),
        (opts.markdown, render_markdown(verdict)),
        (opts.json, json.dumps(verdict, indent=2, sort_keys=True) + "\n"),
    ):
        if path:
            try:
                Path(path).write_text(body, encoding="utf-8")
            except OSError as exc:
                raise GateError(f"cannot write {path}: {exc.strerror or exc}") from None


def wait_for_verdict(
    fetch: Callable[[], Mapping[str, Any]],
    *,
    timeout_s: float,
    poll_s: float,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Mapping[str, Any]:
    """Poll the gate resource until its verdict is final, printing progress when it changes."""
    deadline = clock() + timeout_s
    last = None
    while True:
        verdict = fetch()
        if verdict.get("verdict") != "running":
            return verdict
        progress = verdict.get("progress") or {}
        line = f"running: {progress.get('finished', 0)}/{progress.get('total', '?')} runs finished"
        if line != last:
            say(line)
            last = line
        if clock() >= deadline:
            raise GateError(
                f"no verdict within --timeout {timeout_s:g} s (experiment {verdict.get('experiment')} is "
                f"still running: {verdict.get('url')})"
            )
        sleep(poll_s)


def finish(verdict: Mapping[str, Any], opts: argparse.Namespace, say: Callable[[str], None]) -> int:
    """Write the reports, print the verdict and its failing cases, and return the exit code."""
    write_reports(verdict, opts)
    code = EXIT_OF_VERDICT.get(str(verdict.get("verdict")), USAGE)
    say(f"gate: {verdict.get('verdict')} (exit {code}) {verdict.get('url') or ''}".rstrip())
    for reason in verdict.get("reasons") or []:
        say(f"  {reason}")
    drift = drift_line(verdict)
    if drift:
        say(f"  {drift}")
    for case in verdict.get("cases") or []:
        if case["outcome"] == "fail":
            say(f"  FAIL {case_line(case)}")
    return code


# ---------------------------------------------------------------- remote


def _detail(response: Any) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and body.get("errors"):
        return "; ".join(f"{e.get('field')}: {e.get('message')}" for e in body["errors"])
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return json.dumps(body)[:500]


def _json_of(response: Any, what: str) -> Mapping[str, Any]:
    if response.status_code != 200:
        raise GateError(f"{what} failed ({response.status_code}): {_detail(response)}")
    return dict(response.json())


def wait_for_start(
    fetch: Callable[[], Mapping[str, Any]],
    *,
    timeout_s: float,
    poll_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Mapping[str, Any]:
    """Poll the uploaded window until the server has started the gate; returns the gate's
    verdict resource. A window the server refused (a bad line, no live host) is an error."""
    deadline = clock() + timeout_s
    while True:
        upload = fetch()
        if upload.get("status") == "done" and upload.get("gate"):
            return dict(upload["gate"])
        if upload.get("status") == "failed":
            errors = upload.get("errors") or []
            detail = "; ".join(f"{e.get('field')}: {e.get('message')}" for e in errors) or "no reason given"
            raise GateError(f"the server refused the gate: {detail}")
        if clock() >= deadline:
            raise GateError(
                f"the gate did not start within --timeout {timeout_s:g} s (upload {upload.get('url')})"
            )
        sleep(poll_s)


def run_remote(opts: argparse.Namespace, say: Callable[[str], None]) -> int:
    import httpx

    token = (read_file(opts.token_file, "--token-file", limit=10_000) or "").strip()
    if not token:
        raise GateError(f"--token-file: {opts.token_file} is empty")
    body = gate_request(opts)
    trace = read_file(opts.trace, "--trace", binary=True, limit=None)
    base = opts.server.rstrip("/")
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    try:
        with httpx.Client(
            base_url=base, headers=headers, timeout=httpx.Timeout(600.0, connect=30.0)
        ) as client:
            form = {k: v if isinstance(v, str) else json.dumps(v) for k, v in body.items()}
            created = client.post("/api/v1/gates", data=form, files={"trace": (Path(opts.trace).name, trace)})
            if created.status_code != 202:
                raise GateError(f"the server refused the gate ({created.status_code}): {_detail(created)}")
            say("the window is uploaded: the server cuts it and starts the gate")
            gate = wait_for_start(
                lambda: _json_of(client.get(created.json()["url"]), "reading the upload"),
                timeout_s=opts.timeout,
                poll_s=min(opts.poll, 2.0),  # a window is cut in seconds, not minutes
            )
            say(f"gate {gate['experiment']} started: {gate.get('url')}")

            def fetch() -> Mapping[str, Any]:
                got = client.get(f"/api/v1/gates/{gate['experiment']}")
                if got.status_code != 200:
                    raise GateError(f"reading the verdict failed ({got.status_code}): {_detail(got)}")
                return dict(got.json())

            verdict = wait_for_verdict(fetch, timeout_s=opts.timeout, poll_s=opts.poll, say=say)
    except httpx.HTTPError as exc:
        raise GateError(f"cannot reach {base}: {type(exc).__name__}: {exc}") from None
    return finish(verdict, opts, say)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="tailtune_gate.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser, remote=True)
    opts = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        return run_remote(opts, say)
    except GateError as exc:
        print(f"gate: error: {exc}", file=sys.stderr)
        return USAGE


if __name__ == "__main__":
    sys.exit(main())
