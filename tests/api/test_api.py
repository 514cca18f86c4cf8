"""The REST API: tokens, roles, field errors, four eyes, the manifest and records (real Postgres)."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken
from apps.accounts.tokens import token_create
from apps.audit.models import AuditEvent
from apps.experiments.models import Experiment
from apps.experiments.spec import dump_spec
from apps.runs.models import RequestRecord, Run
from tests.experiments.factories import SMALL_SPEC

pytestmark = pytest.mark.django_db


def client_for(user, name="test") -> APIClient:  # type: ignore[no-untyped-def]
    _, plaintext = token_create(user=user, name=name)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return api


ENDPOINTS = [
    ("get", "/api/v1/experiments"),
    ("post", "/api/v1/experiments"),
    ("get", "/api/v1/experiments/{pk}"),
    ("post", "/api/v1/experiments/{pk}/start"),
    ("post", "/api/v1/experiments/{pk}/cancel"),
    ("get", "/api/v1/experiments/{pk}/report"),
    ("post", "/api/v1/experiments/{pk}/approve"),
    ("get", "/api/v1/experiments/{pk}/manifest.json"),
    ("get", "/api/v1/experiments/{pk}/bundle"),
    ("get", "/api/v1/runs/{run}"),
    ("get", "/api/v1/runs/{run}/records"),
    ("get", "/api/v1/hosts/offers"),
    ("get", "/api/v1/baselines/capture"),
    ("post", "/api/v1/baselines/capture"),
    ("post", "/api/v1/traces"),
    ("get", "/api/v1/traces/uploads/1"),
    ("post", "/api/v1/gates"),
    ("get", "/api/v1/gates/{pk}"),
    ("post", "/api/v1/gates/{pk}"),
]


def test_the_openapi_document_is_served_and_valid(client) -> None:  # type: ignore[no-untyped-def]
    from openapi_spec_validator import validate

    response = client.get("/api/v1/openapi.json")  # no Accept header, as curl sends it
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    doc = json.loads(response.content)
    validate(doc)
    assert (
        client.get("/api/v1/openapi.json", HTTP_ACCEPT="application/yaml")["Content-Type"]
        == (response["Content-Type"])
    )
    as_yaml = client.get("/api/v1/openapi.yaml", HTTP_ACCEPT="application/json")
    assert as_yaml.status_code == 200
    assert "yaml" in as_yaml["Content-Type"]
    assert yaml.safe_load(as_yaml.content) == doc
    assert "/api/v1/experiments/{id}/approve" in doc["paths"]
    assert doc["components"]["securitySchemes"]["tokenAuth"]["scheme"] == "bearer"
    assert client.get("/api/v1/docs/").status_code == 200


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_every_endpoint_refuses_a_missing_wrong_revoked_or_expired_token(
    experiment, author, method, path
) -> None:  # type: ignore[no-untyped-def]
    url = path.format(pk=experiment.pk, run=experiment.runs.first().run_id)
    assert getattr(APIClient(), method)(url).status_code == 401
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Bearer tt_1_not-the-secret")
    assert getattr(wrong, method)(url).status_code == 401
    revoked_token, revoked = token_create(user=author, name="revoked")
    ApiToken.objects.filter(pk=revoked_token.pk).update(revoked_at=timezone.now())
    expired_token, expired = token_create(user=author, name="expired", expires_days=1)
    ApiToken.objects.filter(pk=expired_token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    for plaintext in (revoked, expired):
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
        response = getattr(api, method)(url)
        assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_every_endpoint_refuses_a_user_without_the_role(experiment, nobody, method, path) -> None:  # type: ignore[no-untyped-def]
    url = path.format(pk=experiment.pk, run=experiment.runs.first().run_id)
    assert getattr(client_for(nobody), method)(url).status_code == 403


def test_failed_authentication_is_throttled(settings, experiment) -> None:  # type: ignore[no-untyped-def]
    settings.API_AUTH_FAILURE_LIMIT = 3
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Bearer tt_9_guess")
    assert [wrong.get("/api/v1/experiments").status_code for _ in range(4)] == [401, 401, 401, 429]


def test_a_spec_error_is_a_400_with_field_paths_and_nothing_is_saved(author) -> None:  # type: ignore[no-untyped-def]
    api = client_for(author)
    bad = copy.deepcopy(SMALL_SPEC)
    bad["workload"]["repeats"] = 0
    bad["recovery"] = {"standby": "lukewarm"}
    response = api.post("/api/v1/experiments", bad, format="json")
    assert response.status_code == 400
    fields = {e["field"] for e in response.json()["errors"]}
    assert {"workload.repeats", "recovery.standby"} <= fields
    yaml_response = api.post(
        "/api/v1/experiments", "name: x\nmodel: [unclosed\n", content_type="application/yaml"
    )
    assert yaml_response.status_code == 400
    assert yaml_response.json()["errors"][0]["field"].startswith("line ")
    assert Experiment.objects.count() == 0 and Run.objects.count() == 0


def test_create_from_yaml_makes_the_token_user_the_author_and_audits_the_token(author) -> None:  # type: ignore[no-untyped-def]
    api = client_for(author, name="ci-gate")
    spec = copy.deepcopy(SMALL_SPEC)
    spec["owner"] = "someone-else"
    response = api.post("/api/v1/experiments", dump_spec(spec), content_type="application/yaml")
    assert response.status_code == 201, response.content
    experiment = Experiment.objects.get(pk=response.json()["id"])
    assert experiment.owner == author and response.json()["status"] == "planned"
    event = AuditEvent.objects.filter(experiment=experiment).latest("id")
    assert event.detail["api_token"] == "ci-gate"


def test_an_authors_token_cannot_approve_and_an_approvers_can(analysed_experiment, author, approver) -> None:  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import Group

    author.groups.add(Group.objects.get(name="approver"))  # an approver, but the author
    url = f"/api/v1/experiments/{analysed_experiment.pk}/approve"
    refused = client_for(author).post(url, {"chosen_cell": "B0", "reason": "mine"}, format="json")
    assert refused.status_code == 403 and "author" in refused.json()["detail"]
    api = client_for(approver, name="release-bot")
    assert api.post(url, {"chosen_cell": "B0", "reason": ""}, format="json").status_code == 400
    # The manifest needs where B0 runs and where traffic goes: each missing one is named.
    for missing in ("deployment_revision", "route_target"):
        body = {
            "chosen_cell": "B0",
            "reason": "keep B0",
            "deployment_revision": "rel-7",
            "route_target": "svc/llm",
        }
        del body[missing]
        refused = api.post(url, body, format="json")
        assert refused.status_code == 400 and refused.json()["errors"][0]["field"] == missing
    ok = api.post(
        url,
        {"chosen_cell": "B0", "reason": "keep B0", "deployment_revision": "rel-7", "route_target": "svc/llm"},
        format="json",
    )
    assert ok.status_code == 201, ok.content
    manifest = api.get(f"/api/v1/experiments/{analysed_experiment.pk}/manifest.json")
    import hashlib

    assert manifest.status_code == 200
    assert hashlib.sha256(manifest.content).hexdigest() == manifest["X-Manifest-File-Sha256"]
    assert json.loads(manifest.content)["sha256"] == ok.json()["manifest_sha256"]
    event = AuditEvent.objects.get(experiment=analysed_experiment, action="experiment.approved")
    assert event.detail["api_token"] == "release-bot"


def test_report_and_records_paged_and_streamed(analysed_experiment, viewer) -> None:  # type: ignore[no-untyped-def]
    api = client_for(viewer)
    report = api.get(f"/api/v1/experiments/{analysed_experiment.pk}/report")
    assert (
        report.status_code == 200
        and report.json()["decision"]["outcome"] == analysed_experiment.decision.outcome
    )
    run = Run.objects.filter(experiment=analysed_experiment, status="done").first()
    n = RequestRecord.objects.filter(run=run).count()
    assert n > 2
    page = api.get(f"/api/v1/runs/{run.run_id}/records?page=2&page_size=2").json()
    assert (
        page["count"] == n
        and [r["index"] for r in page["records"]]
        == sorted(RequestRecord.objects.filter(run=run).values_list("index", flat=True))[2:4]
    )
    stream = api.get(f"/api/v1/runs/{run.run_id}/records?format=jsonl")
    assert stream["Content-Type"] == "application/x-ndjson"
    lines = b"".join(stream.streaming_content).decode().splitlines()  # type: ignore[attr-defined]
    assert [json.loads(line)["index"] for line in lines] == sorted(
        RequestRecord.objects.filter(run=run).values_list("index", flat=True)
    )
    bad = api.get(f"/api/v1/runs/{run.run_id}/records?page=zero")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "page"


def test_token_create_prints_it_once_and_stores_only_its_digest(author, capsys) -> None:  # type: ignore[no-untyped-def]
    call_command("token_create", author.username, "--name", "ci", "--expires", "30", "--scope", "read")
    plaintext = capsys.readouterr().out.strip()
    token = ApiToken.objects.get(user=author, name="ci")
    assert plaintext.startswith(f"tt_{token.pk}_") and plaintext.split("_", 2)[2] not in token.digest
    assert token.expires_at is not None
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert api.get("/api/v1/experiments").status_code == 200


def test_the_tokens_page_creates_shows_once_lists_and_revokes(client, author) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    created = client.post("/accounts/tokens/", {"name": "laptop", "scopes": ["read"], "expires_days": "7"})
    html = created.content.decode()
    assert created.status_code == 200 and 'id="new-token"' in html
    token = ApiToken.objects.get(user=author, name="laptop")
    assert client.get("/accounts/tokens/").content.decode().count("tt_") == 0  # never shown again
    client.post(f"/accounts/tokens/{token.pk}/revoke/")
    token.refresh_from_db()
    assert token.status == "revoked"
    assert client.post("/accounts/tokens/", {"name": ""}).status_code == 400


def test_a_trace_upload_is_imported_by_a_worker_and_a_bad_one_names_the_line(
    author, other_experimenter, tmp_path, monkeypatch, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from django.core.files.uploadedfile import SimpleUploadedFile

    from apps.lifecycle.trace_upload import trace_upload_import
    from apps.runs.dispatch import IMPORT_TRACE
    from apps.workloads.models import Trace
    from tests.dispatch_support import hold_tasks
    from workers.engine.tinymodel import build_tokenizer

    held = hold_tasks(monkeypatch, IMPORT_TRACE)
    model_dir = build_tokenizer(tmp_path / "tok")
    api = client_for(author)
    fixture = Path(__file__).resolve().parents[1] / "workloads" / "fixtures" / "azure_2024.csv"
    form = {
        "format": "azure",
        "model_dir": str(model_dir),
        "tokenizer_revision": "tiny-v1",
        "max_model_len": "2048",
        "classes": "short:1024,long",
    }
    with django_capture_on_commit_callbacks(execute=True):
        ok = api.post(
            "/api/v1/traces",
            {**form, "file": SimpleUploadedFile("azure.csv", fixture.read_bytes())},
            format="multipart",
        )
    # The request only stored the file: nothing parsed, the import queued for a worker.
    assert ok.status_code == 202, ok.content
    body = ok.json()
    assert body["status"] == "queued" and ok["Location"] == body["url"] and "sha256" not in body
    assert Trace.objects.count() == 0 and [h[1] for h in held] == [{"upload_pk": body["upload"]}]
    assert api.get(body["url"]).json()["status"] == "queued"
    uploaded = AuditEvent.objects.get(action="trace.uploaded")
    assert uploaded.actor == author and uploaded.detail["api_token"] == "test"
    assert client_for(other_experimenter, name="other").get(body["url"]).status_code == 404  # not theirs
    assert trace_upload_import(upload_pk=body["upload"]) == "done"
    done = api.get(body["url"]).json()
    assert done["status"] == "done" and done["requests"] == 3
    assert Trace.objects.filter(sha256=done["sha256"]).exists()
    assert AuditEvent.objects.filter(action="trace.stored", target=done["sha256"]).exists()

    bad_file = b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,12,x\n"
    with django_capture_on_commit_callbacks(execute=True):
        bad = api.post(
            "/api/v1/traces", {**form, "file": SimpleUploadedFile("bad.csv", bad_file)}, format="multipart"
        )
    assert bad.status_code == 202
    assert trace_upload_import(upload_pk=bad.json()["upload"]) == "failed"
    failed = api.get(bad.json()["url"]).json()
    assert failed["status"] == "failed" and failed["errors"][0]["field"] == "file"
    assert "line 2" in failed["errors"][0]["message"]

    missing = api.post("/api/v1/traces", {"format": "nope"}, format="multipart")
    assert {e["field"] for e in missing.json()["errors"]} == {
        "file", "format", "max_model_len", "model_dir", "tokenizer_revision", "classes"
    }  # fmt: skip
    infinite = api.post(
        "/api/v1/traces",
        {**form, "max_model_len": "inf", "file": SimpleUploadedFile("a.csv", fixture.read_bytes())},
        format="multipart",
    )
    assert infinite.status_code == 400 and infinite.json()["errors"][0]["field"] == "max_model_len"
    nowhere = api.post(
        "/api/v1/traces",
        {**form, "model_dir": str(tmp_path / "none"), "file": SimpleUploadedFile("a.csv", b"x")},
        format="multipart",
    )
    assert nowhere.status_code == 400 and nowhere.json()["errors"][0]["field"] == "model_dir"
    assert Trace.objects.count() == 1 and len(held) == 2


def test_a_trace_over_the_upload_cap_is_named_as_such(author, settings) -> None:  # type: ignore[no-untyped-def]
    from django.core.files.uploadedfile import SimpleUploadedFile

    settings.TAILTUNE_MAX_UPLOAD_BYTES = 10
    api = client_for(author)
    big = api.post(
        "/api/v1/traces",
        {"format": "tailtune", "file": SimpleUploadedFile("t.jsonl", b"x" * 100)},
        format="multipart",
    )
    assert big.status_code == 400
    assert {"field": "file", "message": "the file is larger than the upload limit of 10 bytes "
            "(TAILTUNE_MAX_UPLOAD_BYTES)"} in big.json()["errors"]  # fmt: skip


def test_hostile_input_is_a_field_error_never_a_500(analysed_experiment, approver, author, settings) -> None:  # type: ignore[no-untyped-def]
    odd = APIClient()
    odd.credentials(HTTP_AUTHORIZATION="Bearer tt_\u00b9_x")  # a digit to isdigit(), not to int()
    assert odd.get("/api/v1/experiments").status_code == 401
    viewer_api = client_for(approver)
    run = Run.objects.filter(experiment=analysed_experiment).first()
    for query in ("page=\u00b2", "page=" + "9" * 5000, "page_size=0"):
        assert viewer_api.get(f"/api/v1/runs/{run.run_id}/records?{query}").status_code == 400
    url = f"/api/v1/experiments/{analysed_experiment.pk}/approve"
    assert viewer_api.post(url, ["not", "an", "object"], format="json").status_code == 400
    nul = viewer_api.post(url, {"chosen_cell": "B0", "reason": "a\x00b"}, format="json")
    assert nul.status_code == 400 and nul.json()["errors"][0]["field"] == "reason"
    deep = "[" * 100_000 + "]" * 100_000
    response = client_for(author, name="deep").post(
        "/api/v1/experiments", deep, content_type="application/json"
    )
    assert response.status_code == 400
    assert Experiment.objects.count() == 1


def test_a_valid_token_is_never_throttled_by_others_guesses(settings, author) -> None:  # type: ignore[no-untyped-def]
    settings.API_AUTH_FAILURE_LIMIT = 2
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Bearer tt_9_guess")
    assert [wrong.get("/api/v1/experiments").status_code for _ in range(3)] == [401, 401, 429]
    assert client_for(author).get("/api/v1/experiments").status_code == 200  # same address, real token


def test_a_canonical_trace_upload_is_stored_as_sent(
    author, monkeypatch, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    from django.core.files.uploadedfile import SimpleUploadedFile

    from apps.lifecycle.trace_upload import trace_upload_import
    from apps.runs.dispatch import IMPORT_TRACE
    from apps.workloads.tracefile import Trace, TraceRequest, trace_dumps, trace_sha256
    from tests.dispatch_support import hold_tasks

    hold_tasks(monkeypatch, IMPORT_TRACE)
    trace = Trace(
        meta={"warmup_s": 0.0},
        requests=[TraceRequest(0, 0.5, "short", 3, 4, 0, False, prompt_token_ids=[7, 8, 9])],
    )
    api = client_for(author)
    with django_capture_on_commit_callbacks(execute=True):
        sent = api.post(
            "/api/v1/traces",
            {"format": "tailtune", "label": "one", "file": SimpleUploadedFile("t.jsonl", trace_dumps(trace))},
            format="multipart",
        )
    assert sent.status_code == 202, sent.content
    assert trace_upload_import(upload_pk=sent.json()["upload"]) == "done"
    done = api.get(sent.json()["url"]).json()
    assert done["sha256"] == trace_sha256(trace_dumps(trace)) and done["requests"] == 1


def test_a_request_log_upload_stores_its_redacted_prompts_as_the_traces_corpus(
    author, tmp_path, monkeypatch, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    import gzip

    from django.core.files.uploadedfile import SimpleUploadedFile

    from apps.experiments.models import TraceUpload
    from apps.lifecycle.trace_upload import trace_upload_import
    from apps.runs.dispatch import IMPORT_TRACE
    from apps.workloads.models import Corpus, Trace
    from tests.dispatch_support import hold_tasks
    from tests.workloads.test_requestlog import EXAMPLE
    from workers.engine.tinymodel import build_tokenizer

    hold_tasks(monkeypatch, IMPORT_TRACE)
    model_dir = build_tokenizer(tmp_path / "tok")
    api = client_for(author)
    form = {
        "format": "openai-log",
        "model_dir": str(model_dir),
        "tokenizer_revision": "tiny-v1",
        "max_model_len": "4096",
        "classes": "short:100,long",
    }

    def post(**fields: str) -> Any:
        with django_capture_on_commit_callbacks(execute=True):
            return api.post(
                "/api/v1/traces",
                {**form, **fields, "file": SimpleUploadedFile("log.jsonl", EXAMPLE.read_bytes())},
                format="multipart",
            )

    # The redaction must be named (or "none" said); a rule it does not know is named as such.
    assert [e["field"] for e in post().json()["errors"]] == ["redact"]
    unknown = post(redact="phone").json()["errors"][0]
    assert unknown["field"] == "redact" and "unknown redaction rule" in unknown["message"]
    too_many = post(redact="none", redact_terms="\n".join(f"t{i}" for i in range(101))).json()["errors"]
    assert [e["field"] for e in too_many] == ["redact_terms"]

    # Literal terms, even ones that look like a regular expression, are matched as written.
    ok = post(redact="email,key,number", redact_terms="Robin\nAlex\n(a+)+$")
    assert ok.status_code == 202, ok.content
    upload = ok.json()["upload"]
    assert trace_upload_import(upload_pk=upload) == "done"
    done = api.get(ok.json()["url"]).json()
    trace = Trace.objects.get(sha256=done["sha256"])
    assert trace.meta["source_format"] == "openai-log" and len(trace.meta["redaction"]["pattern_sha256"]) == 3
    corpus = Corpus.objects.get(sha256=trace.corpus_sha256)
    stored = gzip.decompress(bytes(corpus.content_gz)) + gzip.decompress(bytes(trace.content_gz))
    for secret in (b"Robin", b"Alex", b"@example.org", b"sk-demo", b"555-01"):
        assert secret not in stored
    # Once imported, the upload keeps the terms only as their sha256 (they spell what they hide).
    options = TraceUpload.objects.get(pk=upload).options
    assert "redact_terms" not in options and len(options["redact_terms_sha256"]) == 3
