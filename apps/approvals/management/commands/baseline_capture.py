from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandError

from apps.approvals.capture_sources import baseline_capture
from apps.experiments import baseline_capture as bc
from apps.experiments.services import spec_limits
from apps.experiments.spec import SpecError, load_yaml, validate_spec

# The option each source is given with, and the request field its errors are named by.
TEXT_OPTIONS = {"command_file": "command", "kubernetes": "kubernetes", "helm": "helm"}


def _read(path: str, option: str) -> str:
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise CommandError(f"--{option}: {path}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CommandError(f"--{option}: {path}: byte {exc.start}: not UTF-8 text") from None


class Command(BaseCommand):
    help = (
        "Capture B0 from what production runs (a running vLLM server, a `vllm serve` command line, a "
        "Kubernetes manifest, Helm values, or the last approved manifest) and print it as a spec "
        "fragment (model, controls, baseline with its capture record) to merge, or with --spec the "
        "whole spec with its B0 replaced. docs/SPEC.md, 'Capturing B0'."
    )

    def add_arguments(self, parser):
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--url", help="a running vLLM server's base URL (the operator's: any address)")
        source.add_argument("--server", help="a server named in TAILTUNE_CAPTURE_SOURCES")
        source.add_argument("--command-line", help="a `vllm serve ...` command line, as one argument")
        source.add_argument(
            "--command-file", metavar="FILE", help="a file holding the command line (- : stdin)"
        )
        source.add_argument(
            "--kubernetes", metavar="FILE", help="a Deployment, StatefulSet or Pod manifest (- : stdin)"
        )
        source.add_argument(
            "--helm", metavar="FILE", help="a Helm values file that holds the command (- : stdin)"
        )
        source.add_argument(
            "--experiment", metavar="ID", help="the approved rollback manifest of this experiment"
        )
        source.add_argument(
            "--last-manifest", action="store_true", help="the newest approved rollback manifest not revoked"
        )
        parser.add_argument("--container", help="the container to read where several start vLLM")
        parser.add_argument("--id", default="B0", help="the baseline's id in the fragment (default B0)")
        parser.add_argument(
            "--note", default="", help="baseline.captured_from (free text; default: the source)"
        )
        parser.add_argument(
            "--spec", metavar="FILE", help="write this spec whole, its B0 replaced by the capture"
        )
        parser.add_argument("-o", "--output", metavar="FILE", help="write here instead of standard output")

    def _capture(self, options: dict[str, Any]) -> tuple[bc.Captured, str]:
        """(the capture, the option it came from)."""
        if options["url"] is not None:
            return baseline_capture(source="server", url=options["url"]), "url"
        if options["server"] is not None:
            return baseline_capture(source="server", server=options["server"]), "server"
        if options["command_line"] is not None:
            return baseline_capture(
                source="command", text=options["command_line"], bounded=False
            ), "command-line"
        if options["experiment"] is not None or options["last_manifest"]:
            option = "experiment" if options["experiment"] is not None else "last-manifest"
            return baseline_capture(source="manifest", experiment=options["experiment"]), option
        for key, kind in TEXT_OPTIONS.items():
            if options[key] is not None:
                option = key.replace("_", "-")
                text = _read(options[key], option)
                return baseline_capture(
                    source=kind, text=text, container=options["container"], bounded=False
                ), option
        raise CommandError("give one source")  # argparse requires one

    def handle(self, *args, **options):
        try:
            captured, option = self._capture(options)
        except SpecError as exc:
            raise CommandError(
                "nothing captured:\n"
                + "\n".join(f"  --{self._option(e.path, options)}: {e.message}" for e in exc.errors)
            ) from None
        notes = list(captured.notes)
        if options["spec"]:
            try:
                raw = load_yaml(_read(options["spec"], "spec"))
            except SpecError as exc:
                raise CommandError(
                    f"--spec: {options['spec']}: " + "; ".join(str(e) for e in exc.errors)
                ) from None
            if not isinstance(raw, dict):
                raise CommandError(f"--spec: {options['spec']} is not a spec (a YAML mapping)")
            out, more = bc.apply_to_spec(raw, captured, note=options["note"])
            notes += more
            try:
                validate_spec(out, limits=spec_limits())
            except SpecError as exc:
                raise CommandError(
                    "the spec with the captured B0 is not valid, nothing written:\n"
                    + "\n".join(f"  {e}" for e in exc.errors)
                ) from None
        else:
            out = bc.fragment(captured, baseline_id=options["id"], note=options["note"])
        text = yaml.safe_dump(out, sort_keys=False, default_flow_style=False, allow_unicode=True)
        for note in notes:
            self.stderr.write(f"note: {note}")
        if options["output"]:
            Path(options["output"]).write_text(text, encoding="utf-8")
            self.stderr.write(
                f"B0 captured from {option} into {options['output']} (sha256 {captured.capture['sha256']})"
            )
        else:
            self.stdout.write(text, ending="")

    @staticmethod
    def _option(field: str, options: dict[str, Any]) -> str:
        """The command's option for a field of the capture request."""
        if field == "server":
            return "url" if options["url"] is not None else "server"
        if field == "text":
            return next(
                (k.replace("_", "-") for k in ("command_line", *TEXT_OPTIONS) if options.get(k) is not None),
                "text",
            )
        if field == "experiment":
            return "experiment" if options["experiment"] is not None else "last-manifest"
        return field
