"""The host settings that name what a rehearsal may run and reach (TAILTUNE_SWITCH_COMMANDS,
TAILTUNE_ROUTERS), and how the worker runs an operator's switch command: no shell, a minimal
environment without the worker's secrets, the servers' URLs as whole arguments or environment
variables, a time limit, and only the end of its stderr in the run's reason."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any, cast

import pytest

from apps.experiments.recovery import DEFAULTS
from apps.experiments.spec_types import RecoverySpec
from apps.runs.hosts import host_register_local, routers, switch_commands
from workers.engine.server import EngineServer
from workers.switch import (
    SWITCH_STDERR_CHARS,
    SwitchFailed,
    _run_switch_command,
    route_resolve,
    switch_argv,
)

CANDIDATE = "http://127.0.0.1:8101"
B0 = "http://127.0.0.1:8102"
# Writes its argv and environment as JSON to the file its first argument names.
DUMP = (
    "import json, os, sys; json.dump({'argv': sys.argv[2:], 'env': dict(os.environ)}, open(sys.argv[1], 'w'))"
)


def _servers() -> tuple[EngineServer, EngineServer]:
    return cast(EngineServer, SimpleNamespace(base_url=CANDIDATE)), cast(
        EngineServer, SimpleNamespace(base_url=B0)
    )


def _run(argv: list[str]) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    _run_switch_command(argv, *_servers(), facts, 0)
    return facts


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("{", "not a JSON object"),
        ('["touch", "x"]', "must be a JSON object"),
        ('{"a": "curl -X POST http://r/switch"}', "non-empty list"),
        ('{"a": []}', "non-empty list"),
        ('{"bad name": ["x"]}', "is not a name"),
        ('{"a": ["{b0_url}"]}', "cannot be a placeholder"),
        ('{"a": ["curl", "http://r/switch?to={b0_url}"]}', "whole argument"),
    ],
)
def test_a_bad_switch_commands_setting_names_the_variable(raw, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="TAILTUNE_SWITCH_COMMANDS") as info:
        switch_commands(raw)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("[]", "must be a JSON object"),
        ('{"r": "http://r:1"}', "must be an object"),
        ('{"r": {"url": "ftp://r"}}', "http(s) URL"),
        ('{"r": {"url": "http://r:99999"}}', "valid port"),
        ('{"r": {"url": "http://r:1", "backend_header": "X Served"}}', "header name"),
        ('{"r": {"url": "http://r:1", "token": "x"}}', "must be an object"),
    ],
)
def test_a_bad_routers_setting_names_the_variable(raw, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="TAILTUNE_ROUTERS") as info:
        routers(raw)
    assert words in str(info.value)


@pytest.mark.django_db
def test_the_host_row_advertises_the_names_from_its_environment_and_a_bad_value_stops_registration(
    monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TAILTUNE_SWITCH_COMMANDS", json.dumps({"to-b0": ["/opt/switch", "{b0_url}"]}))
    monkeypatch.setenv("TAILTUNE_ROUTERS", json.dumps({"prod": {"url": "http://router:8000/"}}))
    host = host_register_local()
    assert host.switches == {"to-b0": ["/opt/switch", "{b0_url}"]}
    assert host.routers == {"prod": {"url": "http://router:8000", "backend_header": ""}}
    monkeypatch.setenv("TAILTUNE_ROUTERS", "not json")
    with pytest.raises(ValueError, match="TAILTUNE_ROUTERS"):
        host_register_local()


def test_placeholders_are_replaced_only_as_whole_arguments() -> None:
    argv = ["/opt/switch", "{candidate_url}", "{b0_url}", "--to={b0_url}", "{b0_url} "]
    assert switch_argv(argv, candidate_url=CANDIDATE, b0_url=B0) == [
        "/opt/switch",
        CANDIDATE,
        B0,
        "--to={b0_url}",
        "{b0_url} ",
    ]


def test_the_switch_command_gets_no_secret_of_the_worker_and_the_urls_as_arguments(
    monkeypatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DATABASE_URL", "postgres://u:secret@db/tailtune")
    monkeypatch.setenv("SECRET_KEY", "the-secret-key")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://broker/0")
    out = tmp_path / "seen.json"
    facts = _run([sys.executable, "-c", DUMP, str(out), "{candidate_url}", "{b0_url}"])
    seen = json.loads(out.read_text())
    assert facts["switch_command_exit"] == 0
    assert seen["argv"] == [CANDIDATE, B0]
    assert seen["env"]["TAILTUNE_CANDIDATE_URL"] == CANDIDATE and seen["env"]["TAILTUNE_B0_URL"] == B0
    assert not {"DATABASE_URL", "SECRET_KEY", "CELERY_BROKER_URL"} & set(seen["env"])
    assert set(seen["env"]) <= {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TMPDIR",
        "TAILTUNE_CANDIDATE_URL",
        "TAILTUNE_B0_URL",
    }


def test_a_failing_switch_command_leaves_only_the_end_of_its_stderr() -> None:
    noisy = "import sys; sys.stderr.write('x' * 100000 + '\\x1b[31m' + 'the last words'); sys.exit(3)"
    with pytest.raises(SwitchFailed) as info:
        _run([sys.executable, "-c", noisy])
    reason = str(info.value)
    assert reason.startswith("the switch command exited with status 3: ")
    assert reason.endswith("the last words") and "\x1b" not in reason
    assert len(reason) <= len("the switch command exited with status 3: ") + SWITCH_STDERR_CHARS


def _options(**recovery: Any) -> RecoverySpec:
    return cast(RecoverySpec, {**DEFAULTS, **recovery})


def test_the_worker_resolves_names_in_its_own_environment_only(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("TAILTUNE_SWITCH_COMMANDS", raising=False)
    monkeypatch.delenv("TAILTUNE_ROUTERS", raising=False)
    assert route_resolve(_options(), "gpu-1") is None  # tailtune's own switch
    with pytest.raises(SwitchFailed, match="host gpu-1 offers no switch 'to-b0'.*TAILTUNE_SWITCH_COMMANDS"):
        route_resolve(_options(switch="to-b0", router="prod"), "gpu-1")
    monkeypatch.setenv("TAILTUNE_SWITCH_COMMANDS", json.dumps({"to-b0": ["/opt/switch"]}))
    monkeypatch.setenv(
        "TAILTUNE_ROUTERS", json.dumps({"prod": {"url": "http://r:1", "backend_header": "X-B"}})
    )
    route = route_resolve(_options(switch="to-b0", router="prod"), "gpu-1")
    assert route is not None and route.argv == ("/opt/switch",)
    assert (route.url, route.backend_header) == ("http://r:1", "X-B")
    # A spec stored before the names existed still carries a program: it never runs.
    with pytest.raises(SwitchFailed, match="recovery.switch_command.*TAILTUNE_SWITCH_COMMANDS"):
        route_resolve(_options(switch_command=["touch", "/tmp/x"], route_url="http://r:1"), "gpu-1")
