"""Print an experiment's analysis report (computed from its rows now)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.analysis.services import experiment_analyse, experiment_report_build
from apps.experiments.models import Experiment
from apps.search.selectors import search_report


class Command(BaseCommand):
    help = "Print the analysis report of an experiment: per cell x mixture x rate x class metrics, checks, decision."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("experiment_id", type=int)
        parser.add_argument("--format", choices=["json", "summary"], default="json")
        parser.add_argument("--indent", type=int, default=None, help="indent the JSON output")
        parser.add_argument(
            "--save", action="store_true", help="also store the decision (experiment_analyse)"
        )
        parser.add_argument(
            "--options",
            default=None,
            help="analysis options as JSON instead of the spec's analysis section, "
            'e.g. {"agreed_rates": ["near_capacity"], "compare": {"resamples": 500}}',
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        exp_id = opts["experiment_id"]
        if not Experiment.objects.filter(pk=exp_id).exists():
            raise CommandError(f"experiment {exp_id} does not exist")
        options = None
        if opts["options"] is not None:
            try:
                options = json.loads(opts["options"])
            except json.JSONDecodeError as exc:
                raise CommandError(f"--options is not valid JSON: {exc.msg}") from None
            if opts["save"]:
                raise CommandError("--save stores the decision under the spec's options; drop --options")
        spec = Experiment.objects.values_list("spec", flat=True).get(pk=exp_id) or {}
        search = search_report(experiment_id=exp_id, spec=spec)  # a search experiment's trials
        try:
            if opts["save"]:
                report = experiment_analyse(experiment_id=exp_id, search=search).report
            else:
                report = experiment_report_build(experiment_id=exp_id, options=options, search=search)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if opts["format"] == "json":
            self.stdout.write(json.dumps(report, indent=opts["indent"], sort_keys=True, allow_nan=False))
            return
        d = report["decision"]
        self.stdout.write(f"decision: {d['outcome']} {d['chosen_cell']}\nrule: {d['rule']}")
        if report.get("search"):
            sr = report["search"]
            self.stdout.write(
                f"search: {len(sr['trials'])} trials, {sr['engine_hours']} engine-hours "
                f"(grid of the space: about {sr['grid_engine_hours']}); confirmed {sr['confirmed']}"
            )
        for line in pool_lines(report.get("pools")):
            self.stdout.write(line)
        for name, check in report["checks"].items():
            line = f"check {name}: {check['status']}"
            if name == "recovery" and check.get("reason"):
                line += f" ({check['reason']})"
            self.stdout.write(line)
        for cell, entry in sorted((report.get("rehearsals") or {}).items()):
            if entry.get("summary"):  # every attempt counts, not only the latest
                self.stdout.write(f"rehearsal {cell}: {entry['summary']}")
        for f in report["findings"]:
            self.stdout.write(f"finding: {f['title']} ({len(f['evidence'])} pieces of evidence)")
        st = report.get("statistics") or {}
        fam = st.get("family") or {}
        seed_check = d.get("seed_check") or {}
        self.stdout.write(
            f"gain family: {fam.get('size', 0)} comparisons, Holm at {fam.get('alpha')}, "
            f"{fam.get('gains', 0)} gain(s); {st.get('resamples')} draws"
            + (f"; borderline under seed {seed_check['seed']}" if seed_check.get("borderline") else "")
        )
        for p in st.get("power") or []:
            where = f"{p['mixture']} @ {p['rate']} {p['class']} (n={p['requests']})"
            if p.get("detectable_rel") is not None:
                self.stdout.write(
                    f"power: {where}: {p['metric']} detectable change {p['detectable_rel']:.0%} at 80% power"
                )
            else:
                self.stdout.write(f"power: {where}: {p.get('note') or 'not judged'}")
        for note in st.get("notes") or []:
            self.stdout.write(f"note: {note}")
        self._ttft_parts(report)
        for t in report.get("tail_bounds") or []:
            knobs = ", ".join(t["knobs"]) or "none of the scheduler's"
            self.stdout.write(
                f"tail: {t['cell']} {t['mixture']} @ {t['rate']} {t['class']} {t['tail']} p99: {t['bound']}"
                + (f" ({t['cause']})" if t["bound"] != "unknown" else "")
                + f"; knobs: {knobs}"
            )
        cache = report.get("prefix_cache") or {}
        for row in cache.get("rows") or []:
            rate = f"{row['hit_rate']:.0%}" if row["hit_rate"] is not None else "unknown"
            whose = f"the {row['class']} class's" if row["per"] == "class" else "per run, all classes"
            self.stdout.write(
                f"prefix cache: {row['cell']} {row['mixture']} @ {row['rate']}: hit rate {rate} ({whose})"
            )
        for g in cache.get("gains") or []:
            self.stdout.write(
                f"prefix cache: {g['cell']} {g['class']} {g['metric']} gain from {g['source']}: {g['why']}"
            )

    def _ttft_parts(self, report: dict[str, Any]) -> None:
        """Per cell, point and class: the p50 and p99 requests' own TTFT parts, and how they were split."""
        parts = report.get("ttft_parts") or {}
        labels = {c["key"]: c["label"] for c in parts.get("components") or []}
        for row in parts.get("rows") or []:
            where = f"{row['cell']} {row['mixture']} @ {row['rate']} {row['class']}"
            if row["source"] == "spans":
                how = f"per request, {row['joined']} of {row['requests']} joined"
            elif row["source"] == "histograms":
                how = "per run, not per request (vLLM's histograms)"
            else:
                self.stdout.write(f"ttft parts: {where}: not split ({row['note']})")
                continue
            quantiles = []
            for q in ("p50", "p99"):
                at = row[q]
                if at["censored"]:
                    quantiles.append(f"{q} above {at['above_ms']} ms, not split")
                    continue
                split = ", ".join(
                    f"{labels.get(k, k)} {v:.1f}" for k, v in (at["parts"] or {}).items() if v is not None
                )
                quantiles.append(f"{q} {at['ttft_ms']} ms ({split or 'not split'})")
            self.stdout.write(f"ttft parts: {where}: {'; '.join(quantiles)} [{how}]")


def pool_lines(pools: Mapping[str, Any] | None) -> list[str]:
    """An isolate decision's pools in words (apps/analysis/pool_sizing.py): each class's config, its
    capacity alone, its share of the requests and the replicas it needs, or how to measure it."""
    if not pools:
        return []
    out = [f"pools ({pools['headroom']:.0%} headroom): {pools['rule']}"]
    for p in pools["pools"]:
        head = f"pool {p['class']}: {p['cell'] or 'no config'}"
        if p["capacity_rps"] is not None:
            head += f", capacity alone {p['capacity_rps']:g} req/s ({(p.get('capacity') or {}).get('source', '')})"
        for pt in p["points"]:
            offered = f"{pt['offered_rps']:g} req/s" if pt["offered_rps"] is not None else "rate unknown"
            need = (
                f"{pt['replicas']} replicas"
                + (f" at {pt['utilisation']:.0%} of capacity" if pt["utilisation"] is not None else "")
                if pt["replicas"] is not None
                else "replicas unknown"
            )
            head += (
                f"; {pt['mixture']} @ {pt['rate']}: {pt['share']:.0%} of the requests, {offered} -> {need}"
            )
        out.append(head)
        if p["how_to_measure"]:
            out.append(f"  {p['class']}'s capacity alone {p['how_to_measure']}")
        if p["note"]:
            out.append(f"  note: {p['note']}")
    total = pools["total_replicas"]
    out.append(
        f"pools in all: {total} servers"
        if total is not None
        else f"pools in all: unknown until {', '.join(pools['unsized'])} can be sized"
    )
    return out
