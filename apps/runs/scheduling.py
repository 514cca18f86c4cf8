"""Pull scheduling: hosts take the next runnable run from the database when they are free.

Nothing is assigned to a host ahead of time, so a dead host strands nothing and a slow host
does not hold up the end:

1. A run becomes runnable when it is dispatched (``dispatched_at`` set, status queued);
   :func:`runs_dispatch` does that and wakes every qualifying host (a ``host_pull``
   message on its queue, sent on commit; duplicates are harmless).
2. A free host claims with :func:`run_claim_next`: inside one transaction, the first
   runnable run by (experiment, plan position) that it qualifies for, locked with
   ``FOR UPDATE SKIP LOCKED`` so two hosts never take the same row, then moved
   queued -> starting with a conditional update.
3. A host qualifies for an experiment when its hardware id is the experiment's: the
   experiment is pinned to the hardware id of its first host (:func:`experiment_pin_hardware`),
   so one experiment never mixes hardware; when it can serve the experiment's
   ``max_model_len``; and, when the experiment's reused servers need their prefix cache reset
   (vLLM's development endpoints, :func:`dev_mode_needed`), when it binds a loopback address.
4. With engine reuse (the spec's ``engine.reuse``, default on) a host that claims a sweep
   run reserves the rest of that cell's round (queued runs of the same experiment, cell and
   repeat get ``host`` = it) and takes those first, so it replays them back to back on the
   server it has up; a uniform companion reserves the rest of its cell's uniform companions
   the same way. A lost host's reservations are released (:func:`host_release_reserved`)
   and its running run is failed and re-queued (apps/lifecycle/retries.hosts_reap_lost), so the
   other hosts pick both up.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from apps.experiments.models import Experiment
from apps.runs import dispatch
from apps.runs.hosts import hosts_alive
from apps.runs.models import Host, Run
from workers.engine.launcher import dev_mode_refusal, is_loopback

# The queued runs a host replays back to back on one server per cell (engine reuse): a sweep round,
# the uniform companions (workers/slot.py ``slot_key``).
SERIES_KINDS = frozenset({Run.Kind.SWEEP, Run.Kind.UNIFORM})


def reuse_enabled(experiment: Experiment) -> bool:
    """The spec's ``engine.reuse`` (default on): one server per cell and round (and per cell for
    its uniform companions)."""
    return bool(((experiment.spec or {}).get("engine") or {}).get("reuse", True))


def dev_mode_needed(experiment: Experiment) -> bool:
    """Whether the experiment's reused servers have their prefix cache reset between runs
    (workers/engine/idle.py), which takes vLLM's development endpoints: reuse and prefix caching."""
    return reuse_enabled(experiment) and bool(experiment.enable_prefix_caching)


def why_not(host: Host, experiment: Experiment) -> str | None:
    """Why ``host`` may not take the experiment's runs (other hardware, too short a context,
    development endpoints on a bind beyond loopback); None when it may."""
    if host.max_model_len is not None and host.max_model_len < experiment.max_model_len:
        return f"serves at most {host.max_model_len} tokens of context"
    if experiment.hardware_id and host.hardware_id != experiment.hardware_id:
        return f"other hardware: {host.hardware_id or 'not recorded'}"
    if not is_loopback(host.bind_host) and dev_mode_needed(experiment):
        return dev_mode_refusal(host.bind_host)
    return None


def host_qualifies(host: Host, experiment: Experiment) -> bool:
    """Whether ``host`` may take the experiment's runs: same hardware, long enough context."""
    return why_not(host, experiment) is None


def hosts_qualifying(experiment: Experiment) -> list[Host]:
    """The live hosts that may take the experiment's runs, by name."""
    return [h for h in hosts_alive(max_model_len=experiment.max_model_len) if host_qualifies(h, experiment)]


def hosts_by_qualification(experiment: Experiment) -> tuple[list[Host], list[tuple[Host, str]]]:
    """Live hosts that qualify, and those that do not with why (for the start page)."""
    ok: list[Host] = []
    not_ok: list[tuple[Host, str]] = []
    for host in hosts_alive():
        reason = why_not(host, experiment)
        if reason is None:
            ok.append(host)
        else:
            not_ok.append((host, reason))
    return ok, not_ok


def experiment_pin_hardware(experiment: Experiment, hosts: list[Host]) -> str:
    """Pin an unpinned experiment to the hardware id of its first host (the first live one
    by name); returns the pinned id. A pinned experiment keeps its id."""
    if not experiment.hardware_id and hosts:
        Experiment.objects.filter(pk=experiment.pk, hardware_id="").update(hardware_id=hosts[0].hardware_id)
        experiment.hardware_id = Experiment.objects.values_list("hardware_id", flat=True).get(
            pk=experiment.pk
        )
    return experiment.hardware_id


def host_wake(host: Host) -> None:
    """Tell ``host``'s worker to pull work, once this transaction commits."""
    dispatch.send_on_commit(dispatch.HOST_PULL, kwargs={}, queue=host.queue)


def runs_dispatch(runs: Iterable[Run], experiment: Experiment) -> int:
    """Make ``runs`` runnable by any qualifying host and wake those hosts; returns how many."""
    pks = [r.pk for r in runs]
    n = Run.objects.filter(pk__in=pks, status=Run.Status.QUEUED).update(
        dispatched_at=timezone.now(), host=None
    )
    for host in hosts_qualifying(experiment):
        host_wake(host)
    return n


def _runnable(host: Host) -> QuerySet[Run]:
    alive_experiments = Experiment.objects.filter(status=Experiment.Status.RUNNING).filter(
        Q(hardware_id="") | Q(hardware_id=host.hardware_id)
    )
    if host.max_model_len is not None:
        alive_experiments = alive_experiments.filter(max_model_len__lte=host.max_model_len)
    if not is_loopback(host.bind_host):
        # A few running experiments at most: the rule is read in Python, as why_not reads it.
        refused = [e.pk for e in alive_experiments.filter(enable_prefix_caching=True) if dev_mode_needed(e)]
        alive_experiments = alive_experiments.exclude(pk__in=refused)
    return (
        Run.objects.select_for_update(skip_locked=True, of=("self",))
        .filter(status=Run.Status.QUEUED, dispatched_at__isnull=False, experiment__in=alive_experiments)
        .order_by("experiment_id", "plan_position", "id")
    )


def run_claim_next(*, host: Host) -> Run | None:
    """Claim the next run this host may take (module docstring, steps 2-4); None when none."""
    with transaction.atomic():
        runnable = _runnable(host)
        run = runnable.filter(host=host).first() or runnable.filter(host__isnull=True).first()
        if run is None:
            return None
        now = timezone.now()
        won = Run.objects.filter(pk=run.pk, status=Run.Status.QUEUED).update(
            status=Run.Status.STARTING, host=host, attempts=F("attempts") + 1, started_at=now, updated_at=now
        )
        if won != 1:
            return None
        run = Run.objects.select_related("experiment", "cell", "trace", "experiment__workload").get(pk=run.pk)
        if run.kind in SERIES_KINDS and reuse_enabled(run.experiment):
            series = Run.objects.filter(
                experiment_id=run.experiment_id,
                cell_id=run.cell_id,
                kind=run.kind,
                status=Run.Status.QUEUED,
                host__isnull=True,
            )
            if run.kind == Run.Kind.SWEEP:
                series = series.filter(repeat=run.repeat)
            series.update(host=host)
        return run


def host_release_reserved(host: Host) -> int:
    """Give a host's reserved queued runs back to every qualifying host, and wake those."""
    with transaction.atomic():
        experiments = list(
            Experiment.objects.filter(runs__host=host, runs__status=Run.Status.QUEUED).distinct()
        )
        n = Run.objects.filter(host=host, status=Run.Status.QUEUED).update(host=None)
        for experiment in experiments:
            for other in hosts_qualifying(experiment):
                if other.pk != host.pk:
                    host_wake(other)
    return n
