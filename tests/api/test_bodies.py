"""Request bodies are capped before they are read, and a request carries a bounded number of files:
too much is a 413 naming the limit, never a 500, and nothing is saved."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from apps.accounts.tokens import token_create
from apps.experiments.models import Experiment, TraceUpload
from apps.experiments.spec import MAX_SPEC_BYTES

pytestmark = pytest.mark.django_db


class Unread:
    """A request body that only counts how often it is read (a client still sending, say)."""

    def __init__(self) -> None:
        self.reads = 0

    def read(self, *args: Any) -> bytes:
        self.reads += 1
        return b""

    def readline(self, *args: Any) -> bytes:
        self.reads += 1
        return b""


def api_for(user) -> APIClient:  # type: ignore[no-untyped-def]
    _, plaintext = token_create(user=user, name="ci")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return api


def send(api: APIClient, path: str, *, content_type: str, length: int) -> tuple[Any, Unread]:
    body = Unread()
    response = api.generic(
        "POST", path, content_type=content_type, CONTENT_LENGTH=str(length), **{"wsgi.input": body}
    )
    return response, body


@pytest.mark.parametrize("content_type", ["application/yaml", "application/json"])
def test_a_spec_body_over_the_spec_limit_is_refused_before_it_is_read(author, content_type) -> None:  # type: ignore[no-untyped-def]
    response, body = send(
        api_for(author), "/api/v1/experiments", content_type=content_type, length=MAX_SPEC_BYTES + 1
    )
    assert response.status_code == 413
    assert str(MAX_SPEC_BYTES) in response.json()["detail"]
    assert body.reads == 0 and Experiment.objects.count() == 0


def test_a_body_over_the_request_cap_is_refused_before_the_view(author, settings) -> None:  # type: ignore[no-untyped-def]
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    response, body = send(api_for(author), "/api/v1/gates/1", content_type="application/json", length=4097)
    assert response.status_code == 413 and "4096" in response.json()["detail"]
    assert body.reads == 0


def test_a_page_body_over_the_request_cap_is_a_413(client, author, settings) -> None:  # type: ignore[no-untyped-def]
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    client.force_login(author)
    body = Unread()
    response = client.generic(
        "POST",
        "/experiments/new/",
        CONTENT_TYPE="application/x-www-form-urlencoded",
        CONTENT_LENGTH="4097",
        **{"wsgi.input": body},
    )
    assert response.status_code == 413 and "4096" in response.content.decode()
    assert body.reads == 0 and Experiment.objects.count() == 0


def test_a_multipart_body_over_every_file_the_request_may_carry_is_refused_unread(author, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TAILTUNE_MAX_UPLOAD_BYTES = 1000
    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 2
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    response, body = send(
        api_for(author),
        "/api/v1/traces",
        content_type="multipart/form-data; boundary=xyz",
        length=2 * 1000 + 4096 + 1,
    )
    assert response.status_code == 413 and body.reads == 0


def test_a_request_with_too_many_files_is_refused_and_nothing_is_saved(author, settings) -> None:  # type: ignore[no-untyped-def]
    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 2
    files = {f"file{n}": SimpleUploadedFile(f"t{n}.csv", b"a,b\n") for n in range(3)}
    response = api_for(author).post("/api/v1/traces", {"format": "tailtune", **files}, format="multipart")
    assert response.status_code == 413, response.content
    assert "2" in response.json()["detail"] and "files" in response.json()["detail"]
    assert TraceUpload.objects.count() == 0


def test_the_default_bounds_a_request_to_a_few_files(author) -> None:  # type: ignore[no-untyped-def]
    from django.conf import settings

    assert settings.DATA_UPLOAD_MAX_NUMBER_FILES <= 10
    files = {f"file{n}": SimpleUploadedFile(f"t{n}.csv", b"a,b\n") for n in range(11)}
    response = api_for(author).post("/api/v1/traces", {"format": "tailtune", **files}, format="multipart")
    assert response.status_code == 413 and TraceUpload.objects.count() == 0
