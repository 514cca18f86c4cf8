"""Render compare.py's JSON as the markdown tables of bench/results/replay.md.

python bench/replay/report.py bench/results/replay-raw.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _f(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _achieved(row: dict[str, Any]) -> float | None:
    # Both the share of planned requests that arrived and the rate they arrived at:
    # a client that sends everything but stretches the run over twice the time is at 50%.
    count = row.get("achieved_ratio")
    rate = row["achieved_rps"] / row["rate"] if row.get("achieved_rps") else None
    return min(x for x in (count, rate) if x is not None) if count is not None or rate is not None else None


def _meets(row: dict[str, Any]) -> bool:
    achieved = _achieved(row)
    lag = row.get("lag_p99_ms")
    err = row.get("ttft_p99_err_ms")
    return bool(
        achieved is not None
        and achieved >= 0.995
        and lag is not None
        and lag <= 5.0
        and err is not None
        and abs(err) <= 5.0
    )


def render(data: dict[str, Any]) -> str:
    """One table over every repeat (rows carry "repeat"), then each client's best rates."""
    rows = [{**r, "meets": _meets(r)} for r in data["rows"]]
    repeats = sorted({r.get("repeat", 1) for r in rows})
    clients = list(dict.fromkeys(r["client"] for r in rows))
    rates = sorted({r["rate"] for r in rows})
    out = [
        "| rate | client | rep | achieved/planned | lag p50 / p99 ms | TTFT err p50 / p99 ms | ITL err p50 / p99 ms "
        "| self-reported lag p99 ms | client CPU % of a core | meets | load 1m |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|:-:|---:|",
    ]
    for rate in rates:
        for client in clients:
            for rep in repeats:
                r = next(
                    (
                        x
                        for x in rows
                        if x["client"] == client and x["rate"] == rate and x.get("repeat", 1) == rep
                    ),
                    None,
                )
                if r is None:
                    continue
                if r.get("report_error"):
                    note = f"no report: {r['report_error'][:80]}"
                    out.append(
                        f"| {rate:g} | {client} | {rep} | {note} | | | | | | no | {_f(r.get('loadavg_1m'))} |"
                    )
                    continue
                ratio = _achieved(r)
                out.append(
                    f"| {rate:g} | {client} | {rep} | {_f(ratio * 100 if ratio is not None else None)}% "
                    f"| {_f(r.get('lag_p50_ms'))} / {_f(r.get('lag_p99_ms'))} "
                    f"| {_f(r.get('ttft_p50_err_ms'))} / {_f(r.get('ttft_p99_err_ms'))} "
                    f"| {_f(r.get('itl_p50_err_ms'), 2)} / {_f(r.get('itl_p99_err_ms'), 2)} "
                    f"| {_f(r.get('self_lag_p99_ms'))} "
                    f"| {_f(r.get('client_cpu_run_pct'), 0)} | {'yes' if r.get('meets') else 'no'} "
                    f"| {_f(r.get('loadavg_1m'))} |"
                )
    out += ["", "Highest rate at which each client met all three bounds, per repeat:", ""]
    for client in clients:
        parts = []
        for rep in repeats:
            met = [
                x["rate"]
                for x in rows
                if x["client"] == client and x.get("repeat", 1) == rep and x.get("meets")
            ]
            parts.append(f"repeat {rep}: {f'{max(met):g} req/s' if met else 'none'}")
        out.append(f"- {client}: " + "; ".join(parts))
    tt = [r for r in rows if r["client"].startswith("tailtune") and r.get("ttft_err_req_p99_ms") is not None]
    if tt:
        out += [
            "",
            "tailtune's per-request TTFT error (matched to the mock's log by request tag), p50 / p99 ms:",
            "",
        ]
        for r in tt:
            out.append(
                f"- {r['client']} @ {r['rate']:g} (repeat {r.get('repeat', 1)}): {_f(r['ttft_err_req_p50_ms'], 2)} / {_f(r['ttft_err_req_p99_ms'], 2)}"
                f" (self-reported dispatch lag p99 {_f(r.get('self_lag_p99_ms'), 2)} ms)"
            )
    return "\n".join(out) + "\n"


def load(paths: list[str]) -> dict[str, Any]:
    """Rows of several compare.py outputs, the n-th file being repeat n (a file of burst runs
    counts its own repeats: its rows are a client of their own, "<client> bursts of N")."""
    rows = []
    seen: dict[str, int] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())["rows"]
        kind = "bursts" if any(r.get("burst_size") for r in data) else "rates"
        seen[kind] = n = seen.get(kind, 0) + 1
        for row in data:
            if row.get("burst_size"):
                row = {**row, "client": f"{row['client']} bursts of {row['burst_size']}"}
            rows.append({**row, "repeat": n})
    return {"rows": rows}


if __name__ == "__main__":
    print(render(load(sys.argv[1:])))
