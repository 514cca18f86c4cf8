"""Seeded synthetic result sets for the verdict's error rates (A/A) and power (A/B).

Used by tests/analysis/test_error_rates.py and bench/analysis/aa_power.py; no
database, no Django: records go straight into a RecordTable and through the
real build_report.

The model of one run (a (cell, mixture, rate, repeat) replay):

- ``requests`` arrivals evenly spaced over the observation window, exactly
  ``short_share`` of them short in a shuffled order (the class pattern is the
  trace's, so it is the same for every cell in that repeat);
- each request's own size effect (the trace's, shared by every cell): a
  log-normal factor, so cells are paired on the same requests;
- the run's own noise on top, per request: log-normal, independent, or AR(1)
  in arrival order with coefficient ``phi`` (queueing: a slow request's
  neighbours are slow too), drawn afresh for every cell and repeat;
- short requests: TTFT = 60 ms x effects; long requests: end-to-end =
  2,000 ms x effects (TTFT a quarter of it); a candidate's ``long_factor``
  scales the long class's latencies (0.6 = 40% better everywhere, p99 included);
- ``host_sigma``: a whole run slower or faster (the host busy elsewhere for its
  length): one log-normal factor per run, drawn afresh for every cell and repeat;
- ``round_sigma``: a whole repeat round slower or faster for every cell alike (the
  round's own trace, the host's state that hour): one log-normal factor per
  (mixture, repeat), shared by the cells.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apps.analysis.columns import NO_ERROR, RecordTable
from apps.analysis.report import build_report

MS = 1_000_000
SHORT_TTFT_MS = 60.0
LONG_E2E_MS = 2000.0
REQUEST_SIGMA = 0.35  # the request's own size effect, shared by the cells
RUN_SIGMA = 0.2  # a run's noise per request


@dataclass(frozen=True)
class Design:
    cells: int = 4
    repeats: int = 3
    requests: int = 480  # per run
    short_share: float = 0.8
    points: int = 1  # (mixture, rate) points, all agreed
    phi: float = 0.0  # AR(1) coefficient of the run noise in arrival order; 0 = independent
    long_factor: Mapping[str, float] = field(default_factory=dict)  # cell -> latency factor
    near_limit: bool = False  # contracts at B0's true p99: B0 breaks them by chance
    observation_s: float = 60.0
    host_sigma: float = 0.0  # log-sigma of a factor on a whole run; 0 = every run on an idle host
    round_sigma: float = 0.0  # log-sigma of a factor on a whole round, shared by its cells


def _true_p99(base_ms: float) -> float:
    """The true p99 of base x lognormal(request) x lognormal(run) (the log-sigmas add in quadrature)."""
    sigma = math.hypot(REQUEST_SIGMA, RUN_SIGMA)
    return base_ms * math.exp(2.3263478740408408 * sigma)


def classes(design: Design) -> list[dict[str, Any]]:
    if design.near_limit:
        short_ttft, long_e2e = _true_p99(SHORT_TTFT_MS), _true_p99(LONG_E2E_MS)
    else:
        short_ttft, long_e2e = 10 * _true_p99(SHORT_TTFT_MS), 10 * _true_p99(LONG_E2E_MS)
    return [
        {
            "name": "short",
            "input_tokens": 256,
            "output_tokens": 16,
            "ttft_p99_ms": round(short_ttft, 3),
            "e2e_p99_ms": 1e9,
            "max_stall_ms": 1e9,
            "error_rate": 0.01,
        },
        {
            "name": "long",
            "input_tokens": 4096,
            "output_tokens": 16,
            "ttft_p99_ms": 1e9,
            "e2e_p99_ms": round(long_e2e, 3),
            "max_stall_ms": 1e9,
            "error_rate": 0.01,
        },
    ]


def _noise(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    eps = rng.standard_normal(n)
    if phi <= 0:
        return eps
    x = np.empty(n)
    x[0] = eps[0]
    scale = math.sqrt(1 - phi * phi)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + scale * eps[i]
    return x


def result_set(design: Design, seed: int) -> dict[str, Any]:
    """The inputs of build_report for one seeded synthetic experiment."""
    rng = np.random.default_rng(seed)
    cell_ids = ["B0"] + [f"C{i}" for i in range(1, design.cells)]
    cells = [
        {"cell_id": c, "role": "baseline" if i == 0 else "candidate", "args": {}, "position": i}
        for i, c in enumerate(cell_ids)
    ]
    mixtures = {
        f"m{p}": {"short": design.short_share, "long": 1 - design.short_share} for p in range(design.points)
    }
    n = design.requests
    step = design.observation_s * 1e9 / n
    planned = np.arange(n, dtype=np.float64) * step
    runs: list[dict[str, Any]] = []
    cols: dict[str, list[np.ndarray]] = {}
    run_codes: list[np.ndarray] = []
    cls_codes: list[np.ndarray] = []
    for mix in mixtures:
        for rep in range(design.repeats):
            # Exactly the mixture's share of each class, in a shuffled order.
            is_short = np.arange(n) < round(n * design.short_share)
            rng.shuffle(is_short)
            request_effect = np.exp(REQUEST_SIGMA * rng.standard_normal(n))
            if design.round_sigma > 0:
                request_effect = request_effect * math.exp(design.round_sigma * rng.standard_normal())
            for cell in cell_ids:
                key = f"{cell}|{mix}|{rep}"
                run_noise = np.exp(RUN_SIGMA * _noise(rng, n, design.phi))
                if design.host_sigma > 0:
                    run_noise = run_noise * math.exp(design.host_sigma * rng.standard_normal())
                factor = np.where(is_short, 1.0, design.long_factor.get(cell, 1.0))
                e2e = np.where(is_short, SHORT_TTFT_MS * 3, LONG_E2E_MS) * request_effect * run_noise * factor
                ttft = np.where(is_short, SHORT_TTFT_MS * request_effect * run_noise, e2e / 4)
                ttft = np.minimum(ttft, e2e)
                runs.append(
                    {
                        "key": key,
                        "cell": cell,
                        "mixture": mix,
                        "rate": "r",
                        "rate_rps": n / design.observation_s,
                        "repeat": rep,
                        "scenario": "",
                        "status": "done",
                        "trace_sha256": f"t-{mix}-{rep}",
                        "corpus_sha256": f"c-{mix}-{rep}",
                        "hardware_id": "hw",
                        "model_revision": "m",
                        "tokenizer_revision": "t",
                        "dispatch_lag_p99_ms": 1.0,
                        "warmup_s": 0.0,
                        "observation_s": design.observation_s,
                        "drain_deadline_s": 600.0,
                    }
                )
                run_codes.append(np.full(n, len(runs) - 1))
                cls_codes.append(np.where(is_short, 0, 1))
                for name, value in (
                    ("index", np.arange(n)),
                    ("warmup", np.zeros(n, dtype=bool)),
                    ("planned_ns", planned),
                    ("sent", np.ones(n, dtype=bool)),
                    ("sent_ns", planned),
                    ("admission_delay_ns", np.zeros(n)),
                    ("first_token_ns", planned + ttft * MS),
                    ("last_token_ns", planned + e2e * MS),
                    ("end_ns", planned + e2e * MS),
                    ("output_tokens", np.full(n, 16.0)),
                    ("expected_output_tokens", np.full(n, 16.0)),
                    ("max_gap_ns", np.full(n, 20.0 * MS)),
                    ("http_status", np.full(n, 200.0)),
                    ("cancelled", np.zeros(n, dtype=bool)),
                    ("unfinished", np.zeros(n, dtype=bool)),
                ):
                    cols.setdefault(name, []).append(np.asarray(value))
    total = sum(len(r) for r in run_codes)
    table = RecordTable.from_columns(
        run_keys=[r["key"] for r in runs],
        run=np.concatenate(run_codes),
        class_names=["short", "long"],
        request_class=np.concatenate(cls_codes),
        columns={k: np.concatenate(v) for k, v in cols.items()},
        error_kind=np.full(total, NO_ERROR, dtype=np.int16),
    )
    experiment = {
        "id": seed,
        "name": f"synthetic-{seed}",
        "model_revision": "m",
        "tokenizer_revision": "t",
        "hardware_id": "hw",
        "generation": None,
        "max_dispatch_lag_ms": 5.0,
        "mixtures": mixtures,
        "rates": {"r": n / design.observation_s},
    }
    return {
        "experiment": experiment,
        "cells": cells,
        "classes": classes(design),
        "runs": runs,
        "table": table,
    }


def verdict(design: Design, seed: int, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """build_report's decision for one seeded set, with what the A/A and A/B counts need."""
    inputs = result_set(design, seed)
    report = build_report(**inputs, token_hists={}, chunk_hists={}, options=options)
    d = report["decision"]
    return {
        "seed": seed,
        "outcome": d["outcome"],
        "chosen_cell": d["chosen_cell"],
        "b0_meets_contracts": d["evidence"].get("b0_meets_contracts"),
        "borderline": bool((d.get("seed_check") or {}).get("borderline")),
        "power": report["statistics"]["power"],
    }


def false_retune(results: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for r in results if r["outcome"] == "retune")


def found(results: Sequence[Mapping[str, Any]], cell: str) -> int:
    return sum(1 for r in results if r["outcome"] == "retune" and r["chosen_cell"] == cell)
