"""The review bundle: one self-contained HTML file an approver attaches to a change ticket.

Why HTML and not PDF (docs/ARCHITECTURE.md, "The review bundle"): it is text, so two bundles
diff; it needs no renderer on the server (a PDF would need a headless browser or a layout
engine in the web process); every browser opens it, offline, and it prints to PDF from there.
It carries no script and loads nothing: the style is inline and the charts are SVG images in
``data:`` URIs, so it shows the same with the network off.

What it holds, in reading order:

1. the decision, its one or two reasons and the per-class chart (apps/analysis/results_summary.py);
2. the contracts (each class's limits);
3. the four checks;
4. the rollback manifest and its digest, when the experiment was approved;
5. the findings as tables, the "not enough requests" table;
6. the key charts as static images (B0 against the compared cell; TTFT p99 per cell and class);
7. the run table;
8. each trace's summary statistics, with a short redacted sample of its requests.

Secrets: nothing comes from the request or the user but their name; prompt text appears only
in the sample, cut short and passed again through every named redaction rule; token ids never.
``bundle_download`` renders, hashes and writes the ``review_bundle.downloaded`` audit event with
the file's sha256, which the response also sends as ``X-Bundle-Sha256``.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from django.template.loader import render_to_string
from django.utils import timezone

from apps.analysis import results_summary
from apps.analysis.services import recovery_check_now
from apps.approvals.models import RollbackManifest
from apps.audit.services import audit_record
from apps.experiments.models import Experiment
from apps.workloads.models import Trace
from apps.workloads.redaction import NAMED_RULES, redactor

SAMPLE_REQUESTS = 5
SAMPLE_CHARS = 80
AUDIT_ACTION = "review_bundle.downloaded"


@dataclass(frozen=True)
class Bundle:
    body: bytes
    sha256: str
    filename: str


def svg_data_uri(svg: str) -> str:
    """An SVG drawing as an ``<img src>`` that needs no network."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def tail_chart_svg(report: Mapping[str, Any], *, width: int = 640) -> str:
    """TTFT p99 per cell and class at each agreed point, as bars (ms): the run table's headline."""
    rows = []
    for a in report.get("aggregates") or []:
        p99 = ((a.get("pooled") or {}).get("ttft_ms") or {}).get("p99") or {}
        value = results_summary.num(p99.get("ms"))
        if value is not None:
            rows.append((f"{a['cell']} · {a['class']} · {a['mixture']} @ {a['rate']}", value, a["cell"]))
    if not rows:
        return ""
    rows.sort()
    baseline = report.get("baseline", "B0")
    label_w, row_h, top = 230, 18, 20
    plot_w = width - label_w - 60
    top_value = max(v for _, v, _ in rows) or 1.0
    height = top + row_h * len(rows) + 8
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" font-family="system-ui, sans-serif" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
        '<text x="4" y="14" font-size="12" fill="#444">TTFT p99 (ms), pooled over repeats; B0 grey</text>',
    ]
    for i, (label, value, cell) in enumerate(rows):
        y = top + i * row_h
        w = max(plot_w * value / top_value, 1.0)
        colour = "#999" if cell == baseline else "#1f5fa8"
        out.append(f'<text x="4" y="{y + 12}" font-size="11" fill="#222">{escape(label)}</text>')
        out.append(f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" fill="{colour}"/>')
        out.append(
            f'<text x="{label_w + w + 4:.1f}" y="{y + 12}" font-size="11" fill="#222">'
            f"{results_summary.fmt(value)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _excerpt(request: Mapping[str, Any]) -> str:
    """A request's prompt, cut to SAMPLE_CHARS and redacted by every named rule."""
    text = request.get("prompt")
    if text is None and request.get("messages"):
        text = str(request["messages"][-1].get("content", ""))
    if not text:
        return ""
    cut = str(text)[:SAMPLE_CHARS]
    return redactor(rules=list(NAMED_RULES)).text(cut) + ("…" if len(str(text)) > SAMPLE_CHARS else "")


def trace_sample(trace: Trace, n: int = SAMPLE_REQUESTS) -> list[dict[str, Any]]:
    """The first ``n`` measured requests of a stored trace (read lazily: a trace can be large)."""
    out: list[dict[str, Any]] = []
    with gzip.GzipFile(fileobj=io.BytesIO(bytes(trace.content_gz))) as f:
        for i, line in enumerate(f):
            if i == 0:  # the header
                continue
            r = json.loads(line)
            if r.get("warmup"):
                continue
            out.append(
                {
                    "index": r.get("index"),
                    "t_offset_s": r.get("t_offset_s"),
                    "class": r.get("class"),
                    "input_tokens": r.get("input_tokens"),
                    "output_tokens": r.get("output_tokens"),
                    "prompt": _excerpt(r),
                }
            )
            if len(out) >= n:
                break
    return out


def _stats_rows(stats: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for key, value in stats.items():
        if isinstance(value, Mapping):
            text = ", ".join(f"{k} {results_summary.fmt(v)}" for k, v in value.items())
        else:
            text = results_summary.fmt(value)
        rows.append((key.replace("_", " "), text))
    return rows


def traces(experiment: Experiment) -> list[dict[str, Any]]:
    hashes = sorted(
        {h for h in experiment.runs.filter(kind="sweep").values_list("trace_sha256", flat=True) if h}
    )
    out = []
    for trace in Trace.objects.filter(sha256__in=hashes).order_by("label", "sha256"):
        out.append(
            {
                "label": trace.label or trace.kind,
                "sha256": trace.sha256,
                "requests": trace.requests,
                "duration_s": trace.duration_s,
                "stats": _stats_rows(trace.stats or {}),
                "sample": trace_sample(trace),
            }
        )
    return out


def _contracts(classes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "name": c.get("name"),
            "ttft_p99_ms": c.get("ttft_p99_ms"),
            "e2e_p99_ms": c.get("e2e_p99_ms"),
            "max_stall_ms": c.get("max_stall_ms"),
            "error_rate": c.get("error_rate"),
            "primary_metric": c.get("primary_metric") or "by role",
        }
        for c in classes
    ]


def bundle_render(*, experiment: Experiment, actor_name: str = "") -> bytes:
    """The bundle's bytes for an analysed experiment (ValueError when it has no report)."""
    decision = getattr(experiment, "decision", None) if hasattr(experiment, "decision") else None
    if decision is None or not decision.report:
        raise ValueError("no results yet: the review bundle needs an analysed experiment")
    report = decision.report
    top = results_summary.summary(report, outcome=decision.outcome, chosen=decision.chosen_cell)
    manifest = RollbackManifest.objects.filter(experiment=experiment).first()
    manifest_json = manifest.file("json") if manifest is not None else None
    charts = [
        (title, svg_data_uri(svg))
        for title, svg in (
            (
                "Each class's primary metric: B0 against " + str(top["compared_cell"] or "—"),
                top["change_svg"],
            ),
            ("TTFT p99 per cell and class", tail_chart_svg(report)),
        )
        if svg
    ]
    context = {
        "experiment": experiment,
        "decision": decision,
        "top": top,
        "report": report,
        "contracts": _contracts(report.get("classes") or []),
        "checks": {
            **report.get("checks", {}),
            "recovery": recovery_check_now(experiment=experiment, report=report),
        },
        "manifest": manifest,
        "manifest_text": manifest_json[0].decode("utf-8") if manifest_json else "",
        "manifest_file_sha256": manifest_json[1] if manifest_json else "",
        "charts": charts,
        "runs": report.get("runs") or [],
        "traces": traces(experiment),
        "generated_at": timezone.now(),
        "generated_by": actor_name,
    }
    return render_to_string("approvals/bundle.html", context).encode("utf-8")


def bundle_download(*, experiment: Experiment, actor: Any) -> Bundle:
    """Render the bundle, hash it and record the download with its sha256 in the audit log."""
    body = bundle_render(experiment=experiment, actor_name=getattr(actor, "get_username", lambda: "")())
    sha = hashlib.sha256(body).hexdigest()
    audit_record(
        action=AUDIT_ACTION,
        actor=actor,
        experiment=experiment,
        target=f"experiment {experiment.pk}",
        detail={"sha256": sha, "bytes": len(body)},
    )
    return Bundle(body=body, sha256=sha, filename=f"review-bundle-{experiment.pk}.html")
