"""manage.py gate: does this change make any class's tail worse on our real traffic?

The same flags and exit codes as the remote client (clients/tailtune_gate.py);
here it runs on the server: ``--owner`` names the author, the experiment is
created and started directly, and this command waits for the workers' verdict.
With ``--server URL --token-file F`` it is the remote client itself.
Exit: 0 pass, 1 regression, 2 inconclusive, 3 usage or infrastructure error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.experiments.models import Experiment
from apps.experiments.spec import SpecError
from apps.gate.build import GateInput
from apps.gate.services import GateUnavailable, gate_create, gate_resource
from apps.gate.verdict_types import GateResource
from clients import tailtune_gate as client


class Command(BaseCommand):
    help = "Run B0 and a candidate paired on a real traffic window; exit 0 pass, 1 regression, 2 inconclusive, 3 error."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)

        def error(message: str) -> Any:  # argparse's own exit 2 would read as "inconclusive"
            if not getattr(parser, "called_from_command_line", False):
                raise CommandError(f"Error: {message}", returncode=client.USAGE)
            parser.print_usage(sys.stderr)
            sys.stderr.write(f"{parser.prog}: error: {message}\n")
            raise SystemExit(client.USAGE)

        parser.error = error  # type: ignore[method-assign]
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        client.add_arguments(parser, remote=False)
        parser.add_argument("--owner", default=None, help="the author (a username); needed without --server")
        parser.add_argument("--server", default=None, help="run remotely against this tailtune server")
        parser.add_argument("--token-file", default=None, help="with --server: a file holding an API token")

    def handle(self, *args: Any, **opts: Any) -> None:
        ns = argparse.Namespace(**opts)

        def say(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        try:
            if opts["server"]:
                if not opts["token_file"]:
                    raise client.GateError("--server needs --token-file")
                code = client.run_remote(ns, say)
            else:
                code = self._local(ns, say)
        except client.GateError as exc:
            raise CommandError(str(exc), returncode=client.USAGE) from None
        if code:
            raise SystemExit(code)

    def _local(self, ns: argparse.Namespace, say: Any) -> int:
        if not ns.owner:
            raise client.GateError("--owner: name the gate's author (or use --server and --token-file)")
        owner = get_user_model().objects.filter(username=ns.owner).first()
        if owner is None:
            raise client.GateError(f"--owner: no user named {ns.owner!r}")
        body = client.gate_request(ns)
        trace = client.read_file(ns.trace, "--trace", binary=True, limit=None)
        request = GateInput.from_fields(body)
        try:
            experiment = gate_create(request=request, trace_data=trace, owner=owner)
        except SpecError as exc:
            raise client.GateError("; ".join(f"{e.path}: {e.message}" for e in exc.errors)) from None
        except GateUnavailable as exc:
            raise client.GateError(str(exc)) from None
        say(f"gate {experiment.pk} started: {gate_resource(experiment=experiment)['url']}")

        def fetch() -> GateResource:
            fresh = Experiment.objects.select_related("workload").get(pk=experiment.pk)
            return gate_resource(experiment=fresh)

        verdict = client.wait_for_verdict(fetch, timeout_s=ns.timeout, poll_s=ns.poll, say=say)
        return client.finish(verdict, ns, say)
