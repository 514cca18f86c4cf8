"""Capturing B0 from each source (apps/approvals/capture_sources.py): a server only by the name the
operator gave it, the last approved manifest of an earlier experiment, and what is refused before
a deployment's text reaches vLLM's parser (the parses themselves, which import vLLM, are in
tests/engine/test_baseline_capture_engine.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest

from apps.approvals.capture_sources import baseline_capture, capture_server_names
from apps.experiments.spec import SpecError
from tests.capture_support import vllm_like_server


def _error(**kwargs: object) -> tuple[str, str]:
    with pytest.raises(SpecError) as info:
        baseline_capture(**kwargs)  # type: ignore[arg-type]
    (error,) = info.value.errors
    return error.path, error.message


@pytest.fixture
def served() -> Iterator[tuple[str, list[str]]]:
    with vllm_like_server() as found:
        yield found


def test_a_server_is_reached_only_by_a_name_the_operator_gave(served, settings) -> None:  # type: ignore[no-untyped-def]
    url, asked = served
    settings.TAILTUNE_CAPTURE_SOURCES = {"prod": url}
    assert capture_server_names() == ["prod"]
    captured = baseline_capture(source="server", server="prod")
    assert asked == ["/v1/models", "/metrics", "/version"]
    assert captured.capture["name"] == "prod" and captured.model == {"path": "/m/tiny"}
    assert captured.controls["max_model_len"] == 4096
    # A URL in place of a name is an unknown name: nothing is fetched.
    path, message = _error(source="server", server=url)
    assert path == "server" and "is not a server the operator named (named: prod)" in message
    assert asked == ["/v1/models", "/metrics", "/version"]
    settings.TAILTUNE_CAPTURE_SOURCES = {}
    path, message = _error(source="server", server="prod")
    assert "named: none: the operator sets TAILTUNE_CAPTURE_SOURCES" in message


def test_an_unreachable_server_is_an_error_naming_the_server(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TAILTUNE_CAPTURE_SOURCES = {"gone": "http://127.0.0.1:9"}
    path, message = _error(source="server", server="gone")
    assert path == "server" and message.startswith("did not answer /v1/models")


def _approve(experiment, approver):  # type: ignore[no-untyped-def]
    from apps.approvals.models import RollbackManifest
    from apps.approvals.services import experiment_approve

    made = experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=experiment,
        approver=approver,
        chosen_cell="B0",
        reason="production as it runs",
    )
    return RollbackManifest.objects.get(pk=made.pk)


@pytest.mark.django_db
def test_the_last_approved_manifest_gives_b0_as_it_ran(analysed_experiment, approver) -> None:  # type: ignore[no-untyped-def]
    row = _approve(analysed_experiment, approver)
    captured = baseline_capture(source="manifest", experiment=str(analysed_experiment.pk))
    b0 = analysed_experiment.cells.get(role="baseline")
    assert captured.args == b0.args
    assert captured.controls["max_model_len"] == analysed_experiment.max_model_len
    assert captured.model["path"] == analysed_experiment.model_path
    # The digest is of the manifest's file exactly as served (what `sha256sum` of the download prints).
    assert captured.capture["sha256"] == row.json_sha256 == hashlib.sha256(row.file("json")[0]).hexdigest()
    assert captured.capture["source"] == "manifest"
    assert str(analysed_experiment.pk) in captured.capture["name"]
    # No experiment named: the newest approved manifest.
    assert baseline_capture(source="manifest").capture["sha256"] == row.json_sha256


@pytest.mark.django_db
def test_a_revoked_or_missing_manifest_or_a_bad_id_is_an_error_naming_the_experiment(
    analysed_experiment, approver, experiment
) -> None:  # type: ignore[no-untyped-def]
    from apps.approvals.services import approval_revoke

    assert _error(source="manifest") == (
        "experiment",
        "no approved manifest yet: give an experiment, or another source",
    )
    assert _error(source="manifest", experiment=experiment.pk) == (
        "experiment",
        f"experiment {experiment.pk} has no approved rollback manifest",
    )
    for bad in ("1e3", "-1", "99999999999999999999", "١٢"):
        path, message = _error(source="manifest", experiment=bad)
        assert path == "experiment" and "must be an experiment's id" in message
    _approve(analysed_experiment, approver)
    analysed_experiment.refresh_from_db()
    approval_revoke(experiment=analysed_experiment, actor=approver, reason="rolled back")
    path, message = _error(source="manifest", experiment=analysed_experiment.pk)
    assert path == "experiment" and "was revoked" in message
    assert _error(source="manifest")[1].startswith("no approved manifest yet")


def test_an_unknown_source_or_empty_text_is_an_error_naming_its_field() -> None:
    assert _error(source="ftp")[0] == "source"
    assert _error(source="command", text="  ") == (
        "text",
        "is empty: paste the command line, manifest or values",
    )
    path, message = _error(source="kubernetes", text="kind: Service\n")
    assert path == "text" and "no Deployment" in message


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("http://prod:8000", "is not a JSON object"),
        ('["http://prod:8000"]', "must be a JSON object of names to URLs"),
        ('{"prod a": "http://prod:8000"}', "is not a name"),
        ('{"prod": "file:///etc/passwd"}', r"TAILTUNE_CAPTURE_SOURCES\['prod'\] must be an http\(s\) URL"),
        ('{"prod": "http://prod:99999"}', r"must be an http\(s\) URL with a valid port"),
    ],
)
def test_a_bad_capture_sources_setting_stops_the_process_naming_the_variable(
    monkeypatch, raw, message
) -> None:  # type: ignore[no-untyped-def]
    from config.env import ImproperEnv, envurls

    monkeypatch.setenv("TAILTUNE_CAPTURE_SOURCES", raw)
    with pytest.raises(ImproperEnv, match=message):
        envurls("TAILTUNE_CAPTURE_SOURCES")
    monkeypatch.setenv("TAILTUNE_CAPTURE_SOURCES", '{"prod": "http://vllm.internal:8000/"}')
    assert envurls("TAILTUNE_CAPTURE_SOURCES") == {"prod": "http://vllm.internal:8000"}


@pytest.mark.django_db
def test_the_command_prints_the_fragment_or_the_whole_spec_and_names_the_option_at_fault(
    analysed_experiment, approver, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import io

    import yaml
    from django.core.management import CommandError, call_command

    from apps.experiments.spec import dump_spec, parse_spec
    from tests.experiments.factories import small_spec

    with pytest.raises(CommandError, match="--experiment: experiment 9999 has no approved rollback manifest"):
        call_command("baseline_capture", experiment="9999")
    row = _approve(analysed_experiment, approver)
    out = io.StringIO()
    call_command("baseline_capture", experiment=str(analysed_experiment.pk), id="prod", stdout=out)
    fragment = yaml.safe_load(out.getvalue())
    assert (
        fragment["baseline"]["id"] == "prod" and fragment["baseline"]["capture"]["sha256"] == row.json_sha256
    )
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(dump_spec(small_spec()))
    written = tmp_path / "captured.yaml"
    call_command(
        "baseline_capture", last_manifest=True, spec=str(spec_file), output=str(written), stderr=io.StringIO()
    )
    spec = parse_spec(written.read_text())
    assert spec["baseline"]["id"] == "B0" and spec["baseline"]["capture"]["source"] == "manifest"
    assert spec["baseline"]["args"] == analysed_experiment.cells.get(role="baseline").args
    spec_file.write_text("name: [x\n")
    with pytest.raises(CommandError, match="--spec: .*not valid YAML"):
        call_command("baseline_capture", last_manifest=True, spec=str(spec_file))
