"""Reads the pages share: who may do what, list rows, progress and the live view of a run.

Every query here is bounded: pages never pull an experiment's request records
into Python. A live run's TTFT comes from at most ``LIVE_RECORD_LIMIT`` of its
newest records; distributions are bucketed by the database.

It lives in the lifecycle app because it reads every layer below (runs, records, gauges, the
decision) for the pages above; it stays one module over 500 lines because the pages share its
role checks and bounded queries, which split by page would be written twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.db.models import Avg, Count, ExpressionWrapper, F, IntegerField, Max, Min, Q, QuerySet
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from apps.accounts.roles import APPROVER, EXPERIMENTER, VIEWER, has_role
from apps.analysis.compare_options import CompareOptions, metric_kind
from apps.analysis.family import primary_metrics
from apps.analysis.inference import planned_power
from apps.analysis.models import Decision
from apps.analysis.planned import DEFAULT_RUN_SD_REL, PlannedDesign, RunSpread, planned_design
from apps.experiments.models import Experiment
from apps.experiments.offers import hosts_able
from apps.experiments.plan import expand_plan
from apps.experiments.spec import RUN_OVERHEAD_S
from apps.experiments.spec_types import NormalizedSpec
from apps.runs.models import MetricSample, RequestRecord, Run
from workers.engine.gauges import GAUGE_NAMES

LIVE_RECORD_LIMIT = 5000
LOG_TAIL_LINES = 40
HISTOGRAM_BUCKETS = 40
NS_PER_MS = 1_000_000

# The live gauges, under the names vLLM has used for them across releases.
# GAUGE_NAMES: workers/engine/gauges.py (the worker publishes the same gauges while a run goes).


# --- access ------------------------------------------------------------------


def can_read(user: Any) -> bool:
    return any(has_role(user, role) for role in (VIEWER, EXPERIMENTER, APPROVER))


def can_create(user: Any) -> bool:
    return has_role(user, EXPERIMENTER)


def can_operate(user: Any, experiment: Experiment) -> bool:
    """Start and cancel: experimenters, on their own experiments (superusers on any)."""
    if getattr(user, "is_superuser", False):
        return True
    return has_role(user, EXPERIMENTER) and experiment.owner_id == user.pk


def approve_refusal(user: Any, experiment: Experiment) -> str | None:
    """Why this user may not approve this experiment now, or None when they may."""
    if not has_role(user, APPROVER):
        return "only approvers can approve an experiment"
    if experiment.owner_id == user.pk:
        return "the author of an experiment cannot approve it"
    if experiment.status != Experiment.Status.ANALYSED:
        return f"the experiment is {experiment.status}; only an analysed experiment can be approved"
    return None


# --- the list ------------------------------------------------------------------


def experiment_list_rows(*, status: str = "") -> QuerySet[Experiment]:
    """Newest first, with run counts, the decision and the last activity annotated."""
    qs = (
        # The decision's outcome only: its report can weigh megabytes per experiment.
        Experiment.objects.select_related("owner")
        .annotate(
            decision_outcome=F("decision__outcome"),
            decision_cell=F("decision__chosen_cell"),
        )
        .annotate(
            runs_total=Count("runs"),
            runs_finished=Count("runs", filter=Q(runs__status__in=sorted(Run.FINISHED))),
            runs_last=Max("runs__updated_at"),
        )
        # SQLite's MAX(a, NULL) is NULL where Postgres' GREATEST skips NULLs.
        .annotate(last_activity=Greatest("updated_at", Coalesce("runs_last", "updated_at")))
        .order_by("-created_at", "-id")
    )
    if status:
        qs = qs.filter(status=status)
    return qs


# --- plan estimate ----------------------------------------------------------------


@dataclass(frozen=True)
class PlanEstimate:
    runs: int
    cells: int
    mixtures: int
    rates: int
    repeats: int
    # Warm-up + observation + drain deadline: the replay of one run.
    seconds_per_run: float
    # Server starts: one per run, or with engine reuse (spec engine.reuse) one per cell and
    # round; each costs ``start_s`` (start and stop).
    starts: int = 0
    start_s: float = RUN_OVERHEAD_S
    # Per agreed (mixture, rate) and class: the smallest change of its primary metric the
    # design finds with 80% power, the larger of the request counts' limit and the run-level
    # one at the spread between runs (apps/analysis/planned.py), and the repeats it would take
    # to find the non-inferiority margin where it cannot.
    power: tuple[PlannedDesign, ...] = ()
    # The spread assumed where no earlier experiment measured one, and the change the verdict
    # must be able to see (the non-inferiority margin, analysis.compare).
    assumed_run_sd_rel: float = DEFAULT_RUN_SD_REL
    target_rel: float = CompareOptions.noninferiority_margin_rel
    # The rates the figure used are provisional until B0's capacity probe freezes them.
    provisional_rates: bool = False
    # The rollback rehearsal of the proposed cell (None: recovery.rehearse is false): its
    # windows plus two server starts.
    rehearsal_s: float | None = None

    @property
    def short_of_target(self) -> list[PlannedDesign]:
        """The points where the plan cannot find the non-inferiority margin with 80% power."""
        return [p for p in self.power if not p.finds_target]

    @property
    def gpu_hours(self) -> float:
        return (
            self.runs * self.seconds_per_run + self.starts * self.start_s + (self.rehearsal_s or 0.0)
        ) / 3600.0


# How many of the latest analysed experiments of the same model and hardware are read for a
# class's measured spread between runs.
SPREAD_LOOKBACK = 20


def previous_run_spreads(spec: NormalizedSpec) -> dict[str, RunSpread]:
    """Per class name of ``spec``: the spread between whole runs of its primary metric measured by
    the last analysed experiment of the same model path on the hardware of a host able to run
    the spec (its report's ``statistics.power`` ``run_sd_rel``, the largest over its agreed
    points). A class no such experiment measured (a report made before the run-level test, a
    single repeat, another primary metric) is left out: the estimate assumes a spread for it.
    """
    hardware = set(
        hosts_able(max_model_len=spec["controls"]["max_model_len"])
        .exclude(hardware_id="")
        .values_list("hardware_id", flat=True)
    )
    if not hardware:
        return {}
    kinds = {name: metric_kind(metric) for name, metric in primary_metrics(spec["classes"]).items()}
    # Only the power table of each report: a report can weigh megabytes.
    rows = (
        Experiment.objects.filter(
            model_path=spec["model"]["path"], hardware_id__in=hardware, decision__isnull=False
        )
        .order_by("-decision__updated_at", "-pk")
        .values_list("pk", "name", "hardware_id", "decision__report__statistics__power")[:SPREAD_LOOKBACK]
    )
    out: dict[str, RunSpread] = {}
    for pk, name, hardware_id, power in rows:
        measured: dict[str, float] = {}
        for p in power if isinstance(power, list) else []:
            if not isinstance(p, dict):
                continue
            cls, rel = p.get("class"), p.get("run_sd_rel")
            if cls in kinds and cls not in out and isinstance(rel, (int, float)) and math.isfinite(rel):
                if metric_kind(str(p.get("metric") or "")) == kinds[cls]:
                    measured[cls] = max(float(rel), measured.get(cls, 0.0))
        for cls, rel in measured.items():
            out[cls] = RunSpread(rel, measured_in=f"{name} (#{pk}, hardware {hardware_id})")
        if len(out) == len(kinds):
            break
    return out


def plan_estimate(spec: NormalizedSpec) -> PlanEstimate:
    """Runs and GPU time of a validated spec: runs x (warm-up + observation + drain + start/stop),
    and the power it states (the spread between runs looked up by ``previous_run_spreads``)."""
    w = spec["workload"]
    # A search: B0 and the cells it will confirm through the design, after a screening run
    # (a server start of its own) per trial, at most max_trials.
    search = spec.get("search")
    confirm = int(search["confirm"]) if search else 0
    screening = int(search["budget"]["max_trials"]) if search else 0
    candidates = len(spec["candidates"]) + confirm
    cells = [spec["baseline"]["id"]] + [c["id"] for c in spec["candidates"]]
    cells += [f"confirmed {i + 1}" for i in range(confirm)]
    reuse = bool((spec.get("engine") or {}).get("reuse", True))
    plan = expand_plan(
        cell_ids=cells,
        mixtures=list(w["mixtures"]),
        rates=list(w["rates"]),
        repeats=w["repeats"],
        seed=w["seed"],
        group_by_cell=reuse,
    )
    per_run = float(w["warmup_s"]) + float(w["observation_s"]) + float(w["drain_deadline_s"])
    analysis, calibration, recovery = spec.get("analysis"), spec.get("calibration"), spec.get("recovery")
    compare_opts = CompareOptions.from_mapping(analysis.get("compare") if analysis else None)
    power = planned_power(
        classes=spec["classes"],
        mixtures=w["mixtures"],
        rates=w["rates"],
        repeats=int(w["repeats"]),
        observation_s=float(w["observation_s"]),
        candidates=candidates,
        alpha=compare_opts.family_alpha,
        primary=primary_metrics(spec["classes"]),
        agreed_rates=analysis.get("agreed_rates") if analysis else None,
    )
    design = planned_design(
        power,
        spreads=previous_run_spreads(spec),
        repeats=int(w["repeats"]),
        cells=len(cells),
        candidates=candidates,
        alpha=compare_opts.family_alpha,
        target_rel=compare_opts.noninferiority_margin_rel,
        min_effect_rel=compare_opts.min_effect_rel,
    )
    return PlanEstimate(
        runs=len(plan) + screening,
        cells=len(cells),
        mixtures=len(w["mixtures"]),
        rates=len(w["rates"]),
        repeats=w["repeats"],
        seconds_per_run=per_run,
        starts=(len(cells) * int(w["repeats"]) if reuse else len(plan)) + screening,
        power=tuple(design),
        target_rel=compare_opts.noninferiority_margin_rel,
        provisional_rates=bool(calibration and calibration.get("enabled")),
        rehearsal_s=per_run + 2 * RUN_OVERHEAD_S if not recovery or recovery.get("rehearse", True) else None,
    )


# --- progress --------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    total: int
    finished: int
    by_status: dict[str, int]
    active: int
    eta_s: float | None
    eta_basis: str  # "measured" (mean finished run) or "planned" (windows + overhead)

    @property
    def percent(self) -> float:
        return 100.0 * self.finished / self.total if self.total else 0.0

    @property
    def running(self) -> bool:
        return self.active > 0 or self.by_status.get("queued", 0) > 0


def experiment_progress(*, experiment: Experiment) -> Progress:
    """Runs finished / total, and time left from the mean measured run duration.

    Runs on several hosts go in parallel, so the time left divides by the
    number of hosts serving this experiment right now (at least one).
    """
    counts = dict(experiment.runs.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    total = sum(counts.values())
    finished = sum(n for s, n in counts.items() if s in Run.FINISHED)
    active = sum(n for s, n in counts.items() if s in Run.ACTIVE)
    remaining = total - finished
    durations = [
        (end - start).total_seconds()
        for start, end in experiment.runs.filter(status=Run.Status.DONE, started_at__isnull=False)
        .exclude(finished_at__isnull=True)
        .values_list("started_at", "finished_at")
        if start is not None and end is not None
    ]
    hosts = (
        experiment.runs.filter(status__in=sorted(Run.ACTIVE), host__isnull=False)
        .values("host")
        .distinct()
        .count()
    )
    eta: float | None = None
    basis = "measured"
    if remaining and experiment.status == Experiment.Status.RUNNING:
        if durations:
            mean = sum(durations) / len(durations)
        else:
            basis = "planned"
            w = experiment.workload
            mean = w.warmup_s + w.observation_s + w.drain_deadline_s + RUN_OVERHEAD_S
        eta = remaining * mean / max(1, hosts)
        # The run in flight is partly done already: do not count it twice.
        now = timezone.now()
        for started in experiment.runs.filter(status__in=sorted(Run.ACTIVE)).values_list(
            "started_at", flat=True
        ):
            if started is not None:
                eta -= min(mean, (now - started).total_seconds()) / max(1, hosts)
        eta = max(0.0, eta)
    return Progress(
        total=total, finished=finished, by_status=counts, active=active, eta_s=eta, eta_basis=basis
    )


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h} h {m:02d} min"
    if m:
        return f"{m} min {s:02d} s"
    return f"{s} s"


def run_rows(*, experiment: Experiment, filters: dict[str, str] | None = None) -> QuerySet[Run]:
    qs = experiment.runs.select_related("cell", "host", "retry_of", "retry").order_by("plan_position", "id")
    filters = filters or {}
    if filters.get("cell"):
        qs = qs.filter(cell__cell_id=filters["cell"])
    if filters.get("mixture"):
        qs = qs.filter(mixture=filters["mixture"])
    if filters.get("rate"):
        qs = qs.filter(rate_name=filters["rate"])
    if filters.get("status"):
        qs = qs.filter(status=filters["status"])
    return qs


# --- a run's live view and its distributions ---------------------------------------


def _nearest_rank(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    k = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[k - 1]


def live_ttft(*, run: Run, limit: int = LIVE_RECORD_LIMIT) -> list[dict[str, Any]]:
    """Per class, TTFT so far (from planned arrival) over the run's newest ``limit`` records.

    Requests still waiting for their first token are counted apart: a live
    percentile of the finished ones alone would flatter a stalling server.
    """
    ttft = ExpressionWrapper(F("first_token_ns") - F("planned_ns"), output_field=IntegerField())
    rows = list(
        RequestRecord.objects.filter(run=run, warmup=False)
        .order_by("-index")
        .annotate(ttft_ns=ttft)
        .values_list("request_class", "ttft_ns", "error_kind")[:limit]
    )
    by_class: dict[str, dict[str, Any]] = {}
    for cls, value, error in rows:
        entry = by_class.setdefault(cls, {"values": [], "waiting": 0, "errors": 0})
        if error:
            entry["errors"] += 1
        elif value is None:
            entry["waiting"] += 1
        else:
            entry["values"].append(value / NS_PER_MS)
    out = []
    for cls in sorted(by_class):
        entry = by_class[cls]
        values = sorted(entry["values"])
        out.append(
            {
                "name": cls,
                "n": len(values),
                "waiting": entry["waiting"],
                "errors": entry["errors"],
                "p50_ms": _nearest_rank(values, 0.50),
                "p95_ms": _nearest_rank(values, 0.95),
                "p99_ms": _nearest_rank(values, 0.99),
            }
        )
    return out


def latest_gauges(*, run: Run) -> dict[str, float | None]:
    """The newest scraped value of each live gauge (None when never scraped): from the stored
    samples once the run has ended, from what the worker publishes while it goes."""
    live = (run.live or {}).get("gauges") if run.status in Run.ACTIVE else None
    if live:
        return {key: live.get(key) for key in GAUGE_NAMES}
    out: dict[str, float | None] = {}
    for key, names in GAUGE_NAMES.items():
        sample = (
            MetricSample.objects.filter(run=run, server="", name__in=names, value__isnull=False)
            .order_by("-t_ns", "-id")
            .values_list("value", flat=True)
            .first()
        )
        out[key] = sample
    return out


def gauge_series(*, run: Run, limit: int = 20_000) -> dict[str, list[tuple[float, float]]]:
    """Each gauge's [(t_s, value)] in time order, label sets summed per scrape."""
    wanted = {name: key for key, names in GAUGE_NAMES.items() for name in names}
    rows = (
        MetricSample.objects.filter(run=run, server="", name__in=list(wanted), value__isnull=False)
        .order_by("t_ns", "id")
        .values_list("name", "t_ns", "value")[:limit]
    )
    acc: dict[str, dict[int, float]] = {}
    for name, t_ns, value in rows:
        if value is None:
            continue
        series = acc.setdefault(wanted[name], {})
        series[t_ns] = series.get(t_ns, 0.0) + float(value)
    return {key: [(t / 1e9, v) for t, v in sorted(points.items())] for key, points in acc.items()}


def log_tail(run: Run, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join((run.log_tail or "").splitlines()[-lines:])


def record_outcomes(*, run: Run) -> list[dict[str, Any]]:
    """How the run's measured requests ended, per class (one grouped query)."""
    rows = (
        RequestRecord.objects.filter(run=run, warmup=False)
        .values("request_class", "sent", "error_kind", "cancelled", "unfinished")
        .annotate(n=Count("id"))
        .order_by("request_class")
    )
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        counts = out.setdefault(
            r["request_class"], {"total": 0, "completed": 0, "errors": 0, "cancelled": 0, "unfinished": 0}
        )
        counts["total"] += r["n"]
        if not r["sent"] or r["error_kind"]:
            counts["errors"] += r["n"]
        elif r["cancelled"]:
            counts["cancelled"] += r["n"]
        elif r["unfinished"]:
            counts["unfinished"] += r["n"]
        else:
            counts["completed"] += r["n"]
    return [{"name": name, **counts} for name, counts in out.items()]


def latency_histogram(*, run: Run, metric: str, buckets: int = HISTOGRAM_BUCKETS) -> dict[str, Any]:
    """A run's distribution of TTFT or end-to-end latency per class, bucketed in SQL.

    Two aggregate queries whatever the run's size: min/max, then counts per
    (class, bucket). Latency is measured from the planned arrival.
    """
    end_field = {"ttft": "first_token_ns", "e2e": "end_ns"}[metric]
    value = ExpressionWrapper(F(end_field) - F("planned_ns"), output_field=IntegerField())
    base = (
        RequestRecord.objects.filter(run=run, warmup=False)
        .exclude(**{f"{end_field}__isnull": True})
        .annotate(v=value)
    )
    bounds = base.aggregate(lo=Min("v"), hi=Max("v"))
    lo, hi = bounds["lo"], bounds["hi"]
    if lo is None or hi is None:
        return {"width_ms": None, "series": {}}
    lo = max(0, int(lo))
    width = max(1, math.ceil((int(hi) - lo + 1) / buckets))
    bucket = ExpressionWrapper((F("v") - lo) / width, output_field=IntegerField())
    grouped = (
        base.annotate(b=bucket)
        .values("request_class", "b")
        .annotate(n=Count("id"))
        .order_by("request_class", "b")
    )
    series: dict[str, list[tuple[float, int]]] = {}
    for row in grouped:
        start_ms = (lo + int(row["b"]) * width) / NS_PER_MS
        series.setdefault(row["request_class"], []).append((start_ms, row["n"]))
    return {"width_ms": width / NS_PER_MS, "series": series}


def partial_results(*, experiment: Experiment) -> list[dict[str, Any]]:
    """Before analysis: per finished run and class, counts and TTFT mean / max (one grouped query).

    Tail percentiles, goodput and the comparison with B0 need the analysis;
    these are what SQL can aggregate portably, labelled as such on the page.
    """
    runs = {
        r.pk: r
        for r in experiment.runs.filter(status__in=sorted(Run.FINISHED))
        .select_related("cell")
        .order_by("plan_position")
    }
    if not runs:
        return []
    ttft = ExpressionWrapper(F("first_token_ns") - F("planned_ns"), output_field=IntegerField())
    rows = (
        RequestRecord.objects.filter(run_id__in=list(runs), warmup=False)
        .values("run_id", "request_class")
        .annotate(
            n=Count("id"),
            completed=Count("id", filter=Q(end_ns__isnull=False, error_kind__isnull=True, unfinished=False)),
            ttft_mean=Avg(ttft),
            ttft_max=Max(ttft),
        )
        .order_by("run_id", "request_class")
    )
    out = []
    for row in rows:
        run = runs[row["run_id"]]
        out.append(
            {
                "run": run,
                "class": row["request_class"],
                "n": row["n"],
                "completed": row["completed"],
                "ttft_mean_ms": row["ttft_mean"] / NS_PER_MS if row["ttft_mean"] is not None else None,
                "ttft_max_ms": row["ttft_max"] / NS_PER_MS if row["ttft_max"] is not None else None,
            }
        )
    out.sort(key=lambda r: (r["run"].plan_position, r["class"]))
    return out


def goodput_cost(*, experiment: Experiment) -> dict[str, Any]:
    """What one goodput-capacity search costs: at most max_steps runs of the probe's windows (with
    engine.reuse on one server kept up across the steps, workers.pipeline.inline_executor)."""
    from apps.runs.selectors import goodput_settings

    cal = goodput_settings(experiment)
    per_run = float(cal["warmup_s"]) + float(cal["observation_s"]) + float(cal["drain_deadline_s"])
    return {"max_runs": int(cal["max_steps"]), "run_s": per_run, "max_s": int(cal["max_steps"]) * per_run}


def decision_summary(*, experiment: Experiment) -> Decision | None:
    """The decision without its (large) report, for pages that only name it."""
    return Decision.objects.filter(experiment=experiment).defer("report", "evidence").first()


def current_runs(*, experiment: Experiment) -> list[Run]:
    return list(
        experiment.runs.filter(status__in=sorted(Run.ACTIVE))
        .select_related("cell", "host")
        .order_by("plan_position")
    )
