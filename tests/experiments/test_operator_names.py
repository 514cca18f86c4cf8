"""A spec's recovery.switch and recovery.router are names the operator gave a host able to run
the experiment (TAILTUNE_SWITCH_COMMANDS, TAILTUNE_ROUTERS); any other name is a field error
through the page, the API and experiment_import alike, and nothing is saved. The page and the
API list the names, never the commands or addresses behind them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from apps.accounts.tokens import token_create
from apps.experiments.models import Experiment
from apps.experiments.spec import SpecError, dump_spec
from apps.lifecycle.creation import experiment_create
from apps.runs.models import Host, Run
from tests.experiments.factories import SMALL_SPEC
from tests.ui.forms_data import form_data

pytestmark = pytest.mark.django_db

SWITCH = ["/opt/ops/switch", "--to", "{b0_url}"]
ROUTER = {"url": "http://10.1.2.3:8000", "backend_header": "X-Served-By"}


def client_for(user: Any) -> APIClient:
    _, plaintext = token_create(user=user, name="test")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return api


def _host(name: str, *, switches: Any = None, routers: Any = None, **fields: Any) -> Host:
    return Host.objects.create(
        name=name, queue=f"host.{name}", switches=switches or {}, routers=routers or {}, **fields
    )


def _spec(switch: str = "to-b0", router: str = "prod") -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["recovery"] = {"switch": switch, "router": router}
    return spec


def _fields(spec: dict[str, Any], owner: Any) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        experiment_create(spec=spec, owner=owner)
    return {e.path: e.message for e in info.value.errors}


def _nothing_saved() -> None:
    assert Experiment.objects.count() == 0 and Run.objects.count() == 0


def test_a_name_no_host_offers_is_a_field_error_naming_the_setting(author) -> None:  # type: ignore[no-untyped-def]
    _host("gpu-1", switches={"drain": SWITCH}, routers={"staging": ROUTER})
    errors = _fields(_spec(), author)
    assert "TAILTUNE_SWITCH_COMMANDS" in errors["recovery.switch"] and "drain" in errors["recovery.switch"]
    assert "TAILTUNE_ROUTERS" in errors["recovery.router"] and "staging" in errors["recovery.router"]
    _nothing_saved()


def test_only_enabled_hosts_that_can_serve_the_experiment_count(author) -> None:  # type: ignore[no-untyped-def]
    offered = {"switches": {"to-b0": SWITCH}, "routers": {"prod": ROUTER}}
    _host("off", enabled=False, **offered)
    _host("short-context", max_model_len=SMALL_SPEC["controls"]["max_model_len"] // 2, **offered)
    errors = _fields(_spec(), author)
    assert {"recovery.switch", "recovery.router"} <= set(errors)
    _nothing_saved()
    _host("gpu-1", max_model_len=SMALL_SPEC["controls"]["max_model_len"], **offered)
    experiment = experiment_create(spec=_spec(), owner=author)
    assert (
        experiment.spec["recovery"]["switch"] == "to-b0" and experiment.spec["recovery"]["router"] == "prod"
    )


def test_the_switch_and_the_router_must_be_offered_by_one_host(author) -> None:  # type: ignore[no-untyped-def]
    _host("a", switches={"to-b0": SWITCH})
    _host("b", routers={"prod": ROUTER})
    errors = _fields(_spec(), author)
    assert list(errors) == ["recovery.router"] and "one host" in errors["recovery.router"]
    _nothing_saved()


def test_experiment_import_refuses_an_unlisted_router_and_saves_nothing(tmp_path, admin_user) -> None:  # type: ignore[no-untyped-def]
    _host("gpu-1", switches={"to-b0": SWITCH}, routers={"prod": ROUTER})
    file = tmp_path / "spec.yaml"
    file.write_text(dump_spec(_spec(router="attacker")))
    with pytest.raises(
        CommandError, match="recovery.router: no host able to run this experiment offers router"
    ):
        call_command("experiment_import", str(file), "--owner", "admin")
    _nothing_saved()


def test_experiment_import_refuses_a_switch_command(tmp_path, admin_user) -> None:  # type: ignore[no-untyped-def]
    spec = copy.deepcopy(SMALL_SPEC)
    spec["recovery"] = {
        "switch_command": ["touch", str(tmp_path / "marker")],
        "route_url": "http://10.0.0.1:1",
    }
    file = tmp_path / "spec.yaml"
    file.write_text(dump_spec(spec))
    with pytest.raises(CommandError, match="TAILTUNE_SWITCH_COMMANDS"):
        call_command("experiment_import", str(file), "--owner", "admin")
    _nothing_saved()


def test_the_api_refuses_an_unlisted_switch_and_lists_the_offered_names(author, viewer) -> None:  # type: ignore[no-untyped-def]
    _host("gpu-1", switches={"to-b0": SWITCH}, routers={"prod": ROUTER})
    _host("gpu-2", switches={"drain": SWITCH})
    api = client_for(author)
    response = api.post("/api/v1/experiments", _spec(switch="curl"), format="json")
    assert response.status_code == 400
    errors = {e["field"]: e["message"] for e in response.json()["errors"]}
    assert "TAILTUNE_SWITCH_COMMANDS" in errors["recovery.switch"]
    _nothing_saved()
    assert api.post("/api/v1/experiments", _spec(), format="json").status_code == 201

    reader = client_for(viewer)
    listed = reader.get("/api/v1/hosts/offers")
    assert listed.status_code == 200
    body = listed.json()
    assert body["switches"] == ["drain", "to-b0"] and body["routers"] == ["prod"]
    assert {"name": "gpu-1", "switches": ["to-b0"], "routers": ["prod"]} in body["hosts"]
    text = listed.content.decode()
    assert "10.1.2.3" not in text and "/opt/ops/switch" not in text  # names only
    assert reader.get("/api/v1/hosts/offers?max_model_len=²").status_code == 400
    assert reader.get("/api/v1/hosts/offers?max_model_len=99999999999999999999").status_code == 400


def test_the_page_lists_the_names_and_refuses_an_unlisted_one(client, author, settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings.DATA_DIR = tmp_path / "data"
    _host("gpu-1", switches={"to-b0": SWITCH}, routers={"prod": ROUTER})
    client.force_login(author)
    page = client.get("/experiments/new/").content.decode()
    assert "<code>to-b0</code>" in page and "<code>prod</code>" in page
    assert "10.1.2.3" not in page and "/opt/ops/switch" not in page

    upload = SimpleUploadedFile("spec.yaml", dump_spec(_spec(router="elsewhere")).encode(), "text/yaml")
    response = client.post("/experiments/new/", {"spec_file": upload, "create": "1"})
    assert response.status_code == 400
    assert "recovery.router: no host able to run this experiment offers router" in response.content.decode()
    _nothing_saved()

    typed = client.post(
        "/experiments/new/", form_data(extra="recovery: {switch: nope, router: prod}", create="1")
    )
    assert typed.status_code == 400
    assert "recovery.switch: no host able" in typed.content.decode()
    _nothing_saved()


def test_the_page_and_the_api_refuse_a_program_and_a_url_in_the_spec(
    client, author, settings, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """The older spelling, an argv and an address written in the spec, is refused at every door
    with a field error that names the operator's setting (experiment_import: above)."""
    settings.DATA_DIR = tmp_path / "data"
    _host("gpu-1", switches={"to-b0": SWITCH}, routers={"prod": ROUTER})
    spec = copy.deepcopy(SMALL_SPEC)
    spec["recovery"] = {
        "switch_command": ["touch", str(tmp_path / "marker")],
        "route_url": "http://10.0.0.1:1",
    }

    response = client_for(author).post("/api/v1/experiments", spec, format="json")
    assert response.status_code == 400
    errors = {e["field"]: e["message"] for e in response.json()["errors"]}
    assert "TAILTUNE_SWITCH_COMMANDS" in errors["recovery.switch_command"], errors
    assert "TAILTUNE_ROUTERS" in errors["recovery.route_url"], errors
    _nothing_saved()

    client.force_login(author)
    upload = SimpleUploadedFile("spec.yaml", dump_spec(spec).encode(), "text/yaml")
    page = client.post("/experiments/new/", {"spec_file": upload, "create": "1"})
    assert page.status_code == 400
    text = page.content.decode()
    assert "recovery.switch_command" in text and "TAILTUNE_SWITCH_COMMANDS" in text
    _nothing_saved()
    assert not (tmp_path / "marker").exists()
