"""The results page's top in plain words, from a stored report. Pure.

An approver reads the page in a minute (issue #37): what was decided and the one or two reasons
that decided it; per class, B0 against the compared cell on the class's primary metric with its
interval, beside the contract (``change_rows`` and ``change_chart_svg``, a small server-drawn
SVG: no script, no network); each finding as a table of the same columns whatever its evidence
(``finding_table``); and the many "not enough requests to judge" notes as one table
(``thin_rows``). Nothing here reads the database: the review bundle (apps/approvals/bundle.py)
draws the same parts from the same report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any, TypedDict

from apps.analysis.family import primary_metrics

HEADLINES = {
    "retain": "Keep B0: no change",
    "retune": "Change to {cell}",
    "isolate": "Isolate the classes: no single config keeps every contract",
    "inconclusive": "No decision: a rerun or a person must settle it",
}
# The contract limit a metric is held to, by the metric's family.
CONTRACT_OF = {"ttft": "ttft_p99_ms", "e2e": "e2e_p99_ms", "max_stall": "max_stall_ms"}
THIN = re.compile(r"not enough requests to judge (?P<what>.+?) \(n=(?P<n>\d+) < (?P<need>\d+)\)")
WHY = {
    "stall_during_prefill": "streams stall while prefill runs",
    "short_requests_wait": "short requests queue behind long ones",
    "preemptions_rise_with_max_num_seqs": "the KV cache is recomputed instead of reused",
    "throughput_up_class_loses": "a class pays for the aggregate gain",
    "long_requests_never_finish": "long requests are never served",
    "no_material_gain": "the change is not worth its risk",
    "tail_bound": "it names the knob that moves the tail",
    "b0_overloaded": "the measured load outran B0 itself",
}


class ChangeRow(TypedDict):
    """One class at one point: B0 and the compared cell on the class's primary metric."""

    cls: str
    point: str
    metric: str
    b0: float | None
    candidate: float | None
    diff: float | None
    ci: tuple[float | None, float | None]
    limit: float | None
    judged: bool
    note: str


class FindingRow(TypedDict):
    cell: str
    cls: str
    metric: str
    b0: str
    candidate: str
    change: str
    threshold: str
    why: str


class ThinRow(TypedDict):
    """Requests too few to judge: one row per point and class, every metric it held back."""

    point: str
    cls: str
    requests: int
    needed: str
    metrics: str


def num(v: Any) -> float | None:
    """A stored value as a finite float: a number, or a percentile's ``{"value": ...}``."""
    if isinstance(v, Mapping):  # a percentile: {"ms": ...} in the report, {"value": ...} elsewhere
        v = v.get("ms", v.get("value"))
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def fmt(v: Any, unit: str = "") -> str:
    """A value as a reader wants it: rounded, with its unit; "—" when absent."""
    if isinstance(v, Mapping) and v.get("censored"):
        x = num(v.get("above_ms", v.get("above")))
        return f"above {fmt(x, unit)}" if x is not None else "censored"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}{unit}"
    x = num(v)
    if x is None:
        return "—" if v is None or isinstance(v, (Mapping, float)) else str(v)
    text = f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.1f}" if abs(x) >= 1 else f"{x:.3g}"
    return f"{text}{unit}"


def metric_words(metric: str) -> str:
    """'ttft_p99_ms' -> 'TTFT p99 (ms)'; 'short_max_stall_p99' -> 'short max stall p99'."""
    unit = " (ms)" if metric.endswith("_ms") else ""
    base = metric.removesuffix("_ms").replace("max_stall", "max stall").replace("_", " ")
    for word in ("ttft", "e2e", "itl", "rps", "kv"):
        base = re.sub(rf"\b{word}\b", word.upper(), base)
    return base + unit


def headline(outcome: str, chosen: str) -> str:
    return HEADLINES.get(outcome, outcome).format(cell=chosen)


def _shorten(reason: str) -> str:
    return "too few requests to judge" if reason.startswith("not enough requests") else reason


def decision_reasons(decision: Mapping[str, Any], *, baseline: str, limit: int = 2) -> list[str]:
    """The one or two reasons that decided it, in plain words.

    1. The rule's own first clause (what held, what did not).
    2. The chosen candidate's numbers, or, when B0 stays, why the closest candidate lost
       (closest: the lowest worst-p99 ratio against B0).
    """
    rule = str(decision.get("rule") or "")
    first = rule.split(": ", 1)[0].rstrip(".")
    reasons = [first[:1].upper() + first[1:] + "."] if first else []
    evidence = decision.get("evidence") or {}
    candidates = [c for c in evidence.get("candidates") or [] if c.get("cell") != baseline]
    chosen = decision.get("chosen_cell")
    if decision.get("outcome") == "retune":
        c = next((c for c in candidates if c.get("cell") == chosen), None)
        if c is not None:
            gain, ratio = num(c.get("min_goodput_gain")), num(c.get("worst_p99_ratio"))
            parts = [f"{chosen} passes every gate"]
            if gain is not None:
                parts.append(f"its smallest goodput gain is {gain:.0%}")
            if ratio is not None:
                parts.append(f"its worst p99 is {ratio:.2f}× B0's")
            reasons.append(", ".join(parts) + ".")
    elif candidates:
        ranked = sorted(candidates, key=lambda c: num(c.get("worst_p99_ratio")) or math.inf)
        c = ranked[0]
        why = list(dict.fromkeys(_shorten(str(r)) for r in c.get("reasons") or []))
        if why:
            more = f"; and {len(why) - 2} more (below)" if len(why) > 2 else ""
            reasons.append(f"The closest candidate, {c['cell']}, is out: {'; '.join(why[:2])}{more}.")
    if evidence.get("b0_failures"):
        reasons.append(f"B0 breaks its contracts in {len(evidence['b0_failures'])} place(s).")
    return reasons[:limit]


def compared_cell(decision: Mapping[str, Any], *, baseline: str) -> str | None:
    """The cell the summary sets against B0: the chosen one, else the closest candidate."""
    chosen = decision.get("chosen_cell")
    if chosen and chosen != baseline:
        return str(chosen)
    candidates = [
        c for c in (decision.get("evidence") or {}).get("candidates") or [] if c.get("cell") != baseline
    ]
    if not candidates:
        return None
    return str(min(candidates, key=lambda c: num(c.get("worst_p99_ratio")) or math.inf)["cell"])


def change_rows(report: Mapping[str, Any], *, cell: str) -> list[ChangeRow]:
    """Per class and point, B0 → ``cell`` on the class's primary metric (the judged one, else
    the declared one), its difference's interval and the contract's limit for that metric."""
    classes = {str(c["name"]): c for c in report.get("classes") or []}
    declared = primary_metrics(list(classes.values()))
    rows: list[ChangeRow] = []
    for c in report.get("comparisons") or []:
        if c.get("cell") != cell:
            continue
        cls = str(c["class"])
        metric = c.get("primary") or declared.get(cls, "ttft_p99_ms")
        v = (c.get("metrics") or {}).get(metric) or {}
        ci = v.get("ci") or [None, None]
        family = metric.rsplit("_p", 1)[0]
        limit = num((classes.get(cls) or {}).get(CONTRACT_OF.get(family, "")))
        rows.append(
            {
                "cls": cls,
                "point": f"{c['mixture']} @ {c['rate']}",
                "metric": metric,
                "b0": num(v.get("b0")),
                "candidate": num(v.get("candidate")),
                "diff": num(v.get("diff")),
                "ci": (num(ci[0]), num(ci[1])),
                "limit": limit,
                "judged": bool(v.get("judged")),
                "note": _shorten(str(v.get("note") or "")),
            }
        )
    rows.sort(key=lambda r: (r["cls"], r["point"]))
    return rows


def change_chart_svg(rows: Sequence[ChangeRow], *, cell: str, width: int = 780) -> str:
    """One small horizontal chart, a row per class and point, each on its own 0..max scale (the
    classes' limits differ by orders of magnitude): B0's value (hollow), the compared cell's
    (filled) with the change's 95% interval as a bar (cut at the row's edge), the contract's limit
    as a red tick, and the numbers in words at the right. Inline SVG: drawn with the page, no
    script, printable."""
    if not rows:
        return ""
    label_w, plot_w, row_h, top = 270, 300, 24, 22
    height = top + row_h * len(rows) + 6
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="change-chart" font-family="system-ui, sans-serif" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="B0 against {escape(cell)} per class">',
        f'<text x="{label_w}" y="14" font-size="12" fill="#444">○ B0   ● {escape(cell)}, bar: 95% interval   '
        "| contract limit   (each row its own scale, ms)</text>",
    ]
    for i, r in enumerate(rows):
        y = top + i * row_h + row_h / 2
        b0, cand, limit = r["b0"], r["candidate"], r["limit"]
        scale = max((v for v in (b0, cand, limit) if v is not None), default=1.0) * 1.12 or 1.0

        def x(v: float, scale: float = scale) -> float:
            return round(label_w + plot_w * min(max(v, 0.0), scale) / scale, 1)

        label = f"{r['cls']} · {metric_words(r['metric']).removesuffix(' (ms)')} · {r['point']}"
        out.append(f'<text x="4" y="{y + 4}" font-size="11" fill="#222">{escape(label)}</text>')
        out.append(f'<line x1="{label_w}" y1="{y}" x2="{label_w + plot_w}" y2="{y}" stroke="#ddd"/>')
        lo, hi = r["ci"]
        if b0 is not None and lo is not None and hi is not None:
            out.append(
                f'<rect x="{x(b0 + lo)}" y="{y - 4}" width="{max(x(b0 + hi) - x(b0 + lo), 1)}" height="8" '
                'fill="#7aa6d8" opacity="0.6"/>'
            )
        if limit is not None:
            out.append(
                f'<line x1="{x(limit)}" y1="{y - 9}" x2="{x(limit)}" y2="{y + 9}" stroke="#c0392b" stroke-width="2"/>'
            )
        if b0 is not None:
            out.append(f'<circle cx="{x(b0)}" cy="{y}" r="5" fill="white" stroke="#333" stroke-width="1.5"/>')
        if cand is not None:
            out.append(f'<circle cx="{x(cand)}" cy="{y}" r="4" fill="#1f5fa8"/>')
        words = f"{fmt(b0)} → {fmt(cand)}" + (f" (limit {fmt(limit)})" if limit is not None else "")
        out.append(
            f'<text x="{label_w + plot_w + 8}" y="{y + 4}" font-size="11" fill="#222">{escape(words)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _point(ev: Mapping[str, Any]) -> str:
    if not ev.get("mixture"):
        return ""
    repeat = f" r{ev['repeat']}" if ev.get("repeat") else ""
    scenario = f" ({ev['scenario']})" if ev.get("scenario") else ""
    return f"{ev['mixture']} @ {ev.get('rate', '')}{repeat}{scenario}"


def _lookup(report: Mapping[str, Any]) -> dict[tuple[str, str, str, str], Mapping[str, Any]]:
    return {
        (c["cell"], c["mixture"], c["rate"], c["class"]): c.get("metrics") or {}
        for c in report.get("comparisons") or []
    }


PLACE = ("cell", "mixture", "rate", "repeat", "scenario", "class")


def finding_table(finding: Mapping[str, Any], report: Mapping[str, Any]) -> list[FindingRow]:
    """A finding's evidence as rows of one shape: cell, class, metric, B0, candidate, change
    with its interval, threshold or limit, and why it matters.

    1. A comparison (``metric`` and ``diff``): B0 and the candidate from the report's
       comparisons; the change with its 95% interval; the material threshold; how many
       thresholds the change is.
    2. A measurement beside B0's (``X`` and ``b0_X``): one row per such pair; each of a
       throughput finding's ``losses`` (a class's metric worse than B0's) a row of its own.
    3. Anything else: its measurements in words in the metric column, its limit as threshold.
    """
    fid = str(finding.get("id", ""))
    why_finding = WHY.get(fid, str(finding.get("title", "")))
    comps = _lookup(report)
    rows: list[FindingRow] = []
    for ev in finding.get("evidence") or []:
        cell = str(ev.get("cell", "")) + (f" · {_point(ev)}" if _point(ev) else "")
        cls = str(ev.get("class", "")) or "—"
        if "metric" in ev and "diff" in ev:
            metric = str(ev["metric"])
            key = (ev.get("cell"), ev.get("mixture"), ev.get("rate"), ev.get("class"))
            v = comps.get(key, {}).get(metric, {})
            ci = ev.get("ci") or [None, None]
            lo, hi = num(ci[0]), num(ci[1])
            interval = (
                f" [{fmt(lo)}, {fmt(hi)}]"
                if lo is not None and hi is not None
                else " (interval: too few requests)"
            )
            times = num(ev.get("diff_over_threshold"))
            rows.append(
                {
                    "cell": cell,
                    "cls": cls,
                    "metric": metric_words(metric),
                    "b0": fmt(v.get("b0")),
                    "candidate": fmt(v.get("candidate")),
                    "change": f"{fmt(ev['diff'])}{interval}",
                    "threshold": fmt(ev.get("threshold")),
                    "why": (f"{abs(times):.1f}× the material threshold; " if times is not None else "")
                    + why_finding,
                }
            )
            continue
        pairs = [k for k in ev if not k.startswith("b0_") and f"b0_{k}" in ev]
        limit = fmt(ev.get("limit_ms")) if "limit_ms" in ev else "—"
        for loss in ev.get("losses") or []:  # a class that pays for an aggregate gain, per metric
            lo, hi = (num(x) for x in (loss.get("ci") or [None, None]))
            rows.append(
                {
                    "cell": cell,
                    "cls": str(loss.get("class", "")),
                    "metric": metric_words(str(loss.get("metric", ""))),
                    "b0": fmt(loss.get("b0")),
                    "candidate": fmt(loss.get("candidate")),
                    "change": fmt(loss.get("diff"))
                    + (f" [{fmt(lo)}, {fmt(hi)}]" if lo is not None and hi is not None else ""),
                    "threshold": "—",
                    "why": f"worse while tokens/s rise; {why_finding}",
                }
            )
        for k in pairs:
            b0, cand = num(ev[f"b0_{k}"]), num(ev[k])
            rows.append(
                {
                    "cell": cell,
                    "cls": cls,
                    "metric": metric_words(k),
                    "b0": fmt(ev[f"b0_{k}"]),
                    "candidate": fmt(ev[k]),
                    "change": fmt(cand - b0) if cand is not None and b0 is not None else "—",
                    "threshold": limit,
                    "why": why_finding,
                }
            )
        if pairs or ev.get("losses"):
            continue
        measured = [
            f"{metric_words(k)} {fmt(v)}"
            for k, v in ev.items()
            if k not in PLACE
            and k != "limit_ms"
            and (not isinstance(v, (list, Mapping)) or isinstance(v, Mapping) and ("ms" in v or "value" in v))
        ]
        rows.append(
            {
                "cell": cell or "all",
                "cls": cls or "—",
                "metric": "; ".join(measured) or "—",
                "b0": "—",
                "candidate": "—",
                "change": "—",
                "threshold": limit,
                "why": why_finding,
            }
        )
    return rows


def thin_rows(report: Mapping[str, Any]) -> list[ThinRow]:
    """Every "not enough requests to judge" note of the comparisons, one row per point and class
    (the same held-back metrics recur for every candidate: one row says it once)."""
    grouped: dict[tuple[str, str, int], dict[str, set[str]]] = {}
    for c in report.get("comparisons") or []:
        for metric, v in sorted((c.get("metrics") or {}).items()):
            m = THIN.search(str(v.get("note") or ""))
            if not m:
                continue
            key = (f"{c['mixture']} @ {c['rate']}", str(c["class"]), int(m["n"]))
            grouped.setdefault(key, {}).setdefault(m["need"], set()).add(
                metric_words(metric).removesuffix(" (ms)")
            )
    return [
        {
            "point": point,
            "cls": cls,
            "requests": n,
            "needed": " · ".join(
                f"{need} ({_levels(names)})" for need, names in sorted(needs.items(), key=_by_need)
            ),
            "metrics": " · ".join(
                f"{need} for {', '.join(sorted(names))}"
                for need, names in sorted(needs.items(), key=_by_need)
            ),
        }
        for (point, cls, n), needs in sorted(grouped.items())
    ]


def _by_need(item: tuple[str, set[str]]) -> int:
    return int(item[0])


def _levels(names: set[str]) -> str:
    """The percentile levels named in metric labels: {'TTFT p99', 'E2E p99'} -> 'p99'."""
    return ", ".join(sorted({m.group(0) for n in names for m in [re.search(r"p\d+", n)] if m})) or "any"


def other_notes(notes: Sequence[str]) -> list[str]:
    """The statistics notes that are not "not enough requests" ones (those are ``thin_rows``)."""
    return [n for n in notes if not str(n).startswith("not enough requests to judge")]


def summary(report: Mapping[str, Any], *, outcome: str, chosen: str) -> dict[str, Any]:
    """Everything the page's top and the review bundle say first, as template context."""
    decision = report.get("decision") or {}
    baseline = str(report.get("baseline") or "B0")
    cell = compared_cell(decision, baseline=baseline)
    rows = change_rows(report, cell=cell) if cell else []
    return {
        "headline": headline(outcome, chosen),
        "reasons": decision_reasons(decision, baseline=baseline),
        "compared_cell": cell,
        "change_rows": rows,
        "change_svg": change_chart_svg(rows, cell=cell or ""),
        "finding_tables": [
            {
                "id": f.get("id"),
                "title": f.get("title"),
                "suggests": f.get("suggests"),
                "rows": finding_table(f, report),
            }
            for f in report.get("findings") or []
        ],
        "thin_rows": thin_rows(report),
        "other_notes": other_notes((report.get("statistics") or {}).get("notes") or []),
    }
