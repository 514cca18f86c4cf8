"""Per-class summary of replayed records (warm-up excluded), for the command line and logs.

The analysis app owns the real statistics; this is the quick look a user
gets right after a standalone replay.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from workers.replay.records import GapHistogram, RequestRecord


def _quantile_ms(values_ns: list[int], q: float) -> float | None:
    if not values_ns:
        return None
    ordered = sorted(values_ns)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1] / 1e6


def class_summary(records: Iterable[RequestRecord]) -> list[dict[str, object]]:
    """One row per request class, sorted by class name, over the non-warm-up records."""
    by_class: dict[str, list[RequestRecord]] = {}
    for record in records:
        if not record.warmup:
            by_class.setdefault(record.request_class, []).append(record)
    rows = []
    for name in sorted(by_class):
        group = by_class[name]
        ttft = [
            r.first_token_ns - r.sent_ns
            for r in group
            if r.ok and r.first_token_ns is not None and r.sent_ns is not None
        ]
        e2e = [r.end_ns - r.sent_ns for r in group if r.ok and r.end_ns is not None and r.sent_ns is not None]
        gaps = GapHistogram()
        for r in group:
            if r.ok:
                gaps.merge(r.token_gaps)
        itl_p50 = gaps.quantile(0.5)
        itl_p99 = gaps.quantile(0.99)
        rows.append(
            {
                "class": name,
                "requests": len(group),
                "ok": sum(1 for r in group if r.ok),
                "errors": sum(1 for r in group if r.error_kind is not None),
                "cancelled": sum(1 for r in group if r.cancelled),
                "unfinished": sum(1 for r in group if r.unfinished),
                "not_sent": sum(1 for r in group if not r.sent),
                "ttft_p50_ms": _quantile_ms(ttft, 0.5),
                "ttft_p99_ms": _quantile_ms(ttft, 0.99),
                "itl_p50_ms": itl_p50 / 1000 if itl_p50 is not None else None,
                "itl_p99_ms": itl_p99 / 1000 if itl_p99 is not None else None,
                "e2e_p50_ms": _quantile_ms(e2e, 0.5),
                "e2e_p99_ms": _quantile_ms(e2e, 0.99),
                "output_tokens": sum(r.output_tokens or 0 for r in group if r.ok),
                "token_mismatch": sum(
                    1
                    for r in group
                    if r.ok and r.output_tokens is not None and r.output_tokens != r.expected_output_tokens
                ),
            }
        )
    return rows


def format_table(rows: list[dict[str, object]]) -> str:
    columns = list(rows[0]) if rows else ["class"]
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(line[i]) for line in cells]) for i, c in enumerate(columns)]
    out = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    out += ["  ".join(v.rjust(w) for v, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(out)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)
