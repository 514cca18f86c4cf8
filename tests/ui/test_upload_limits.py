"""The create page: a spec file is capped at the spec's own limit while it arrives, and a request
carries a bounded number of files (a 413 naming the limit, nothing saved)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.files.uploadhandler import TemporaryFileUploadHandler

from apps.experiments.models import Experiment, TraceUpload
from apps.experiments.spec import MAX_SPEC_BYTES
from tests.ui.forms_data import form_data

pytestmark = pytest.mark.django_db


def test_a_spec_file_stops_being_stored_at_the_spec_limit(client, author, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    stored = {"bytes": 0}
    keep = TemporaryFileUploadHandler.receive_data_chunk

    def counting(self: Any, raw_data: bytes, start: int) -> Any:
        stored["bytes"] += len(raw_data)
        return keep(self, raw_data, start)

    monkeypatch.setattr(TemporaryFileUploadHandler, "receive_data_chunk", counting)
    client.force_login(author)
    spec = SimpleUploadedFile("big.yaml", b"# padding\n" * (3 * MAX_SPEC_BYTES // 10))
    response = client.post("/experiments/new/", {**form_data(), "spec_file": spec, "create": "1"})
    assert response.status_code == 400
    assert stored["bytes"] <= MAX_SPEC_BYTES
    errors = response.context["form"].errors["spec_file"]
    assert any(str(MAX_SPEC_BYTES) in e for e in errors), errors
    assert Experiment.objects.count() == 0


def test_a_page_request_with_too_many_files_is_a_413(client, author, settings) -> None:  # type: ignore[no-untyped-def]
    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 2
    client.force_login(author)
    files = {f"extra{n}": SimpleUploadedFile(f"x{n}.csv", b"a,b\n") for n in range(3)}
    response = client.post("/experiments/new/", {**form_data(), **files, "create": "1"})
    assert response.status_code == 413
    assert "2" in response.content.decode() and "files" in response.content.decode()
    assert Experiment.objects.count() == 0 and TraceUpload.objects.count() == 0
