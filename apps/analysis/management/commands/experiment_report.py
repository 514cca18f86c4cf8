"""Print an experiment's analysis report (computed from its rows now)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.analysis.services import experiment_analyse, experiment_report_build
from apps.experiments.models import Experiment


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
        try:
            if opts["save"]:
                report = experiment_analyse(experiment_id=exp_id).report
            else:
                report = experiment_report_build(experiment_id=exp_id, options=options)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if opts["format"] == "json":
            self.stdout.write(json.dumps(report, indent=opts["indent"], sort_keys=True, allow_nan=False))
            return
        d = report["decision"]
        self.stdout.write(f"decision: {d['outcome']} {d['chosen_cell']}\nrule: {d['rule']}")
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
