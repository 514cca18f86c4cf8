"""The decision's rule in words, built from the evidence that decided it. Pure.

apps/analysis/decide.py decides; this module says why, per branch, naming what fired: B0's
broken contracts with their values and limits, each candidate's first blocking reason with its
numbers, and, where a comparison was left unsettled (a candidate not materially better on what
B0 broke, or not shown non-inferior), the change this design detects and the repeats or window
that would detect the observed difference with 80% power (apps/analysis/settle.py). The
numbers come from the report's own parts (acceptance failures, comparisons, validity problems),
so the words can be re-derived from a stored report like the decision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apps.analysis.overload import calibrate_text
from apps.analysis.report_types import Comparison, ConsideredCandidate, JSONObject
from apps.analysis.settle import Design, needed_text, pct

# At most this many items of one kind are named in a rule; the evidence holds the rest.
NAMED = 3
# A failure's contract key -> (its words, the failure's value key, the class's limit key).
LIMITS = {
    "ttft": ("TTFT p99", "ttft_p99", "ttft_p99_ms"),
    "e2e": ("end-to-end p99", "e2e_p99", "e2e_p99_ms"),
    "stall": ("max stall p99", "max_stall_p99", "max_stall_ms"),
}

Point = tuple[str, str, str, str]  # (mixture, rate, class, metric)


def ms(x: float | None) -> str:
    return "unknown" if x is None or not math.isfinite(x) else f"{x:,.0f} ms"


def percentile(p: Mapping[str, Any] | None) -> str:
    """A censored-percentile block ({"ms", "censored", "above_ms"}) in words."""
    if not p:
        return "unknown"
    if p.get("censored"):
        return f"above {ms(p.get('above_ms'))} (not observed)"
    return ms(p.get("ms"))


def _listed(items: Sequence[str], sep: str = "; ") -> str:
    more = len(items) - NAMED
    return sep.join(items[:NAMED]) + (f"{sep}and {more} more" if more > 0 else "")


def at(mix: str, rate: str) -> str:
    return f"{mix} @ {rate}"


def failure(f: Mapping[str, Any], limits: Mapping[str, Mapping[str, Any]]) -> str:
    """One acceptance failure: the class, what it broke where, each value against its limit."""
    where = at(f["mixture"], f["rate"])
    if f.get("class") is None:  # a point without a done run of some repeat
        return f"{where}: {', '.join(f.get('broken') or [])}"
    values = []
    for key in f.get("broken") or []:
        if key in LIMITS:
            words, value, limit = LIMITS[key]
            lim = (limits.get(f["class"]) or {}).get(limit)
            against = f" against {ms(lim)}" if lim is not None else ""
            values.append(f"{words} {percentile(f.get(value))}{against}")
        elif key == "error_rate":
            lim = (limits.get(f["class"]) or {}).get("error_rate")
            rate = f.get("error_rate")
            shown = f"{rate:.1%}" if isinstance(rate, (int, float)) else "unknown"
            values.append(f"error rate {shown}" + (f" against {lim:.1%}" if lim is not None else ""))
        else:
            values.append(str(key))
    return f"{f['class']} {', '.join(f.get('broken') or [])} at {where} ({'; '.join(values)})"


def value(metric: str, x: float | None) -> str:
    """A compared metric's value in its unit: ms, req/s or a share."""
    if x is None or not math.isfinite(x):
        return "unknown"
    if metric == "goodput_rps":
        return f"{x:,.2f} req/s"
    if metric == "contract_share":
        return f"{x:.1%}"
    return ms(x)


def change(v: Mapping[str, Any], cell: str, metric: str = "") -> str:
    """B0's value, the candidate's and the relative difference of one compared metric."""

    def side(x: float | None, censored: bool, above: float | None) -> str:
        return f"above {value(metric, above)} (not observed)" if censored else value(metric, x)

    b0 = side(v.get("b0"), bool(v.get("b0_censored")), v.get("b0_above"))
    cand = side(v.get("candidate"), bool(v.get("candidate_censored")), v.get("candidate_above"))
    rel = relative(v)
    return f"B0 {b0}, {cell} {cand}" + (f" ({rel:+.0%})" if rel is not None else "")


def relative(v: Mapping[str, Any]) -> float | None:
    """candidate / B0 - 1 where both are observed and B0 is positive."""
    b0, cand = v.get("b0"), v.get("candidate")
    if v.get("b0_censored") or v.get("candidate_censored") or not b0 or cand is None or b0 <= 0:
        return None
    return float(cand) / float(b0) - 1.0


@dataclass
class Words:
    """What the rule needs to read besides the decision's own evidence (decide builds it once)."""

    limits: Mapping[str, Mapping[str, Any]]  # class -> its contract
    comps: Mapping[tuple[str, str, str, str], Comparison]  # (cell, mixture, rate, class) -> comparison
    problems: Mapping[str, list[JSONObject]]  # cell -> its validity problems
    failures: Mapping[str, list[JSONObject]]  # cell -> its acceptance failures
    designs: Mapping[Point, Design]
    margin_rel: float | None = None  # the non-inferiority margin, read off the comparisons
    unsettled: list[JSONObject] = field(default_factory=list)  # filled by the words that name one

    def verdict(self, cell: str, point: Sequence[str]) -> Mapping[str, Any] | None:
        mix, rate, cls, metric = point
        c = self.comps.get((cell, mix, rate, cls))
        return (c["metrics"].get(metric) if c else None) or None

    def b0_broke(self, b0_failures: Sequence[Mapping[str, Any]]) -> str:
        return _listed([failure(f, self.limits) for f in b0_failures])

    def settle(self, cell: str, point: Sequence[str], why: str) -> str:
        """What this design detects on the point's metric and what would detect the difference
        seen; recorded in ``unsettled`` for the evidence."""
        mix, rate, cls, metric = point
        v = self.verdict(cell, point)
        design = self.designs.get((mix, rate, cls, metric))
        rel = relative(v) if v else None
        entry: JSONObject = {"cell": cell, "mixture": mix, "rate": rate, "class": cls, "metric": metric}
        entry.update(why=why, b0=(v or {}).get("b0"), candidate=(v or {}).get("candidate"), change_rel=rel)
        if design is None or rel is None:
            entry["note"] = "no power figure: the metric is censored or not a latency B0 measured"
            self.unsettled.append(entry)
            return ""
        if why == "not shown non-inferior" and self.margin_rel is not None:
            needed = design.to_detect(self.margin_rel)
            if needed.found:  # the data suffice: the candidate's own difference keeps it out
                entry.update(
                    target_rel=_num(self.margin_rel),
                    detectable_rel=_num(needed.detectable_rel),
                    note="this design finds a change the size of the margin: the difference itself "
                    "keeps the interval beyond it, not a lack of data",
                )
                self.unsettled.append(entry)
                return f" (this design detects {pct(needed.detectable_rel)}: the difference itself, not a lack of data)"
        elif rel >= 0:
            entry.update(detectable_rel=_num(design.detectable_rel()), note="not lower than B0's at all")
            self.unsettled.append(entry)
            return f": {cell} is not lower than B0 there, so more data would not make it a repair"
        else:
            needed = design.to_detect(rel)
        text = needed_text(design, needed)
        entry.update(
            target_rel=_num(needed.change_rel),
            detectable_rel=_num(needed.detectable_rel),
            repeats=design.rounds,
            repeats_needed=needed.repeats,
            observation_s=design.observation_s,
            window_s_needed=needed.window_s,
            below_material=needed.below_material,
            note=text,
        )
        self.unsettled.append(entry)
        return f": {text}"

    def blocker(self, c: ConsideredCandidate, only: Sequence[str] | None = None) -> str:
        """The candidate's blocking reasons (those in ``only``, when given), each a clause with the
        evidence behind it, to follow the cell's name."""
        reasons = [r for r in c["reasons"] if only is None or r in only]
        return "; ".join(self._reason(c, r) for r in reasons)

    def _reason(self, c: ConsideredCandidate, reason: str) -> str:
        cell = c["cell"]
        if reason == "invalid":
            named = [_problem(p) for p in self.problems.get(cell) or []]
            return f"is invalid ({_listed(named)})" if named else "is invalid"
        if reason == "breaks a contract":
            return f"breaks {_listed([failure(f, self.limits) for f in self.failures.get(cell) or []])}"
        if reason == "a class is materially worse than B0":
            worse = [self._point(cell, p) for p in c["material_worse"]]
            return f"is materially worse than B0 on {_listed(worse)}"
        if reason.startswith("not shown non-inferior"):
            shown = [self._not_shown(cell, p) for p in c["not_shown_noninferior"]]
            return f"is not shown non-inferior on {_listed(shown)}"
        if reason == "no material gain":
            return f"has no material gain{self._best_gain(cell)}"
        if reason == "not materially better on what B0 broke":
            unrepaired = [
                self._point(cell, p) + self.settle(cell, p, "not materially better on what B0 broke")
                for p in c["not_repaired"]
            ]
            return f"is not materially better on what B0 broke: {_listed(unrepaired)}"
        if reason.startswith("A/A control cell"):
            return f"is an {reason}"
        return f"is rejected by the decision table: {reason}"

    def _point(self, cell: str, p: Sequence[str]) -> str:
        return f"{p[2]} {p[3]} at {at(p[0], p[1])}, {change(self.verdict(cell, p) or {}, cell, p[3])}"

    def settleable(self) -> bool:
        """Every unsettled comparison named so far would be settled by more repeats or a longer window."""
        return all(u.get("repeats_needed") or u.get("window_s_needed") for u in self.unsettled)

    def _not_shown(self, cell: str, p: Sequence[str]) -> str:
        mix, rate, cls, metric = p
        if metric.startswith("not enough requests"):
            return f"{cls} at {at(mix, rate)} ({metric})"
        v = self.verdict(cell, p) or {}
        ci = v.get("ci") or [None, None]
        upper = ci[1] if len(ci) > 1 else None
        b0 = v.get("b0")
        up = (
            f"its interval reaches {upper / b0:+.0%} of B0"
            if upper is not None and b0
            else "its interval is open"
        )
        margin = f" against the {pct(self.margin_rel)} margin" if self.margin_rel is not None else ""
        return f"{cls} {metric} at {at(mix, rate)} ({up}{margin})" + self.settle(
            cell, p, "not shown non-inferior"
        )

    def _best_gain(self, cell: str) -> str:
        """The candidate's largest improvement on a primary metric, and what the design detects there."""
        best: tuple[float, Sequence[str], Mapping[str, Any]] | None = None
        for (c_cell, mix, rate, cls), comp in sorted(self.comps.items()):
            metric = comp.get("primary")
            if c_cell != cell or not metric or metric not in comp["metrics"]:
                continue
            rel = relative(comp["metrics"][metric])
            if rel is not None and (best is None or rel < best[0]):
                best = (rel, (mix, rate, cls, metric), comp["metrics"][metric])
        if best is None:
            return ""
        _, (mix, rate, cls, metric), v = best
        design = self.designs.get((mix, rate, cls, metric))
        detects = f"; this design detects {pct(design.detectable_rel())} there" if design else ""
        return f" (its best primary metric: {cls} {metric} at {at(mix, rate)}, {change(v, cell, metric)}{detects})"


def _problem(p: Mapping[str, Any]) -> str:
    where = "/".join(str(p[k]) for k in ("mixture", "rate", "repeat") if k in p)
    return f"{where}: {p['problem']}" if where else str(p["problem"])


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(round(x, 6))


# --- one function per branch of decide.decide ------------------------------------------------


def b0_invalid(problems: Sequence[Mapping[str, Any]], judged: bool) -> str:
    if not judged:
        return "B0 has invalid or missing runs: acceptance judged no agreed point of B0, so nothing can be compared"
    named = _listed([_problem(p) for p in problems])
    return (
        f"B0 has invalid or missing runs, so nothing can be compared: {named}; "
        "rerun B0 there (every candidate is judged against it)"
    )


def retune(words: Words, best: ConsideredCandidate, *, b0_failures: Sequence[Mapping[str, Any]],
           eligible: Sequence[str]) -> str:  # fmt: skip
    """Step 3: the candidate chosen, on what gain, and why it ranked first."""
    cell = best["cell"]
    gains = _listed([words._point(cell, p) for p in best["material_better"]])
    ranked = ""
    if len(eligible) > 1:
        gain, ratio = best["min_goodput_gain"], best["worst_p99_ratio"]
        ranked = (
            f"; ranked first of {len(eligible)} eligible ({', '.join(c for c in eligible if c != cell)} "
            f"next) by smallest goodput gain ({'unknown' if gain is None else f'{gain:+.1%}'}), then worst "
            f"p99 ratio to B0 ({'unknown' if ratio is None else f'{ratio:.2f}'}), then plan order"
        )
    if b0_failures:
        return (
            f"B0 breaks {words.b0_broke(b0_failures)}; {cell} keeps every class contract at every agreed "
            f"point and repairs what B0 broke, materially: {gains}; no class is materially worse than B0 "
            f"and every class's primary metric is shown non-inferior{ranked}"
        )
    return (
        f"{cell} keeps every class contract at every agreed point, is materially better than B0 "
        f"(family-wise controlled) on {gains}, no class is materially worse and every class's primary "
        f"metric is shown non-inferior{ranked}"
    )


def retain(words: Words, considered: Sequence[ConsideredCandidate]) -> str:
    """Step 4, B0 keeps every contract: each candidate and what stopped it."""
    why = [f"{c['cell']} {words.blocker(c)}" for c in considered]
    tail = f": {_listed(why)}" if why else " (there is no candidate)"
    return f"B0 keeps every class contract and no candidate passes every gate with a material gain{tail}"


def isolate(words: Words, b0_failures: Sequence[Mapping[str, Any]],
            considered: Sequence[ConsideredCandidate]) -> str:  # fmt: skip
    """Step 5, no configuration keeps every contract: B0's breaks and each candidate's."""
    cand = [f"{c['cell']} {words.blocker(c, only=('invalid', 'breaks a contract'))}" for c in considered]
    return (
        f"no configuration keeps every class's contract on shared capacity: B0 breaks "
        f"{words.b0_broke(b0_failures)}"
        + (f"; {_listed(cand)}" if cand else "")
        + ": separate the classes with admission control or capacity"
    )


def rerun_invalid(
    words: Words, b0_failures: Sequence[Mapping[str, Any]], passing_invalid: Sequence[str]
) -> str:
    """Inconclusive: only invalid cells keep every contract; a fixed rerun would settle it."""
    named = [
        f"{cell} ({_listed([_problem(p) for p in words.problems.get(cell) or []], ', ')})"
        for cell in passing_invalid
    ]
    return (
        f"B0 breaks {words.b0_broke(b0_failures)}; the only cells that keep every contract have invalid "
        f"runs: {_listed(named)}: rerun them before deciding"
    )


def weigh(
    words: Words, b0_failures: Sequence[Mapping[str, Any]], passing: Sequence[ConsideredCandidate]
) -> str:
    """Inconclusive: cells keep every contract where B0 does not, yet none is eligible. A person must
    weigh a harm or a decision-table rejection; an unsettled comparison more data would settle says
    what data."""
    parts = []
    for c in passing:
        repaired = [words._point(c["cell"], p) for p in c["material_better"]]
        did = f" and materially repairs {_listed(repaired)}" if repaired else ""
        parts.append(f"{c['cell']} keeps every contract{did}, but {words.blocker(c)}")
    if any(c["material_worse"] or c["rejected_by"] for c in passing) or not words.settleable():
        tail = "a person must weigh it"
    else:
        tail = "not settled by this design: the repeats or window stated would settle it"
    return f"B0 breaks {words.b0_broke(b0_failures)}; {_listed(parts)}: {tail}"


def overloaded(points: Sequence[Mapping[str, Any]], advice: Mapping[str, Any]) -> str:
    """B0 itself fell behind its arrivals at an agreed point: name the overload, say the advice
    does not apply at that rate, and how to calibrate."""
    named = []
    for p in points:
        gauge = p.get("waiting_growth_rps")
        waiting = f", its waiting gauge {gauge:+.2f} req/s" if gauge is not None else ""
        capacity = p.get("capacity_rps")
        if capacity:
            against = f"{p['offered_over_capacity']:.2f}x B0's measured capacity of {capacity:g} req/s"
        else:
            against = "no capacity of B0 was measured (rates typed by hand)"
        named.append(
            f"{at(p['mixture'], p['rate'])}: {p['arrivals_rps']:.2f} req/s arrived ({p['offered_rps']:g} req/s "
            f"offered), {p['completions_rps']:.2f} req/s completed, the queue grew by {p['queue_growth_rps']:.2f} req/s "
            f"through the window{waiting}; {against}"
        )
    return (
        f"the experiment measured overload: B0 fell behind its arrivals at {_listed(named)}; retain, "
        f"retune or isolate advice does not apply at that rate (it would have said "
        f"{advice['outcome']} {advice['chosen_cell']}); {calibrate_text(points[0].get('rates_source'))}"
    )
