from __future__ import annotations

from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.audit.models import AuditEvent
from apps.experiments.models import Experiment, TraceUpload
from apps.lifecycle.trace_upload import trace_upload_import
from apps.runs.dispatch import IMPORT_TRACE
from tests.dispatch_support import hold_tasks
from tests.ui.forms_data import form_data


@pytest.mark.django_db
def test_it_shows_the_empty_form_to_experimenters(client, author) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    response = client.get("/experiments/new/")
    assert response.status_code == 200
    assert b"Preview plan size" in response.content
    assert b'name="grid_max_num_batched_tokens"' in response.content


@pytest.mark.django_db
def test_it_previews_the_plan_size_without_saving(client, author) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    response = client.post("/experiments/new/", form_data())
    assert response.status_code == 200
    estimate = response.context["estimate"]
    # B0 + 2 x 2 grid cells = 5 cells, 1 mixture, 2 rates, 2 repeats.
    assert estimate.runs == 5 * 1 * 2 * 2
    # (2 warm-up + 10 observation + 20 drain) s per run, one 60 s server start per cell and
    # round (engine reuse: 5 cells x 2 repeats), plus the rollback rehearsal of the proposed
    # cell: the same windows and two server starts.
    assert estimate.seconds_per_run == 32 and estimate.starts == 10
    assert estimate.rehearsal_s == 32 + 120
    assert estimate.gpu_hours == pytest.approx((20 * 32 + 10 * 60 + 152) / 3600)
    assert b"10 server starts" in response.content
    assert b"20 runs" in response.content
    assert b"one rollback rehearsal of the proposed cell (about 152 s" in response.content
    assert Experiment.objects.count() == 0


@pytest.mark.django_db
def test_it_creates_the_cross_product_of_the_grid_and_opens_the_experiment(client, author) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    response = client.post("/experiments/new/", form_data(create="1"))
    experiment = Experiment.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/experiments/{experiment.pk}/"
    assert experiment.owner == author
    cells = {c.cell_id: c.args for c in experiment.cells.all()}
    assert cells["B0"] == {"max_num_batched_tokens": 2048, "max_num_seqs": 8}
    grid = sorted((a["max_num_batched_tokens"], a["max_num_seqs"]) for k, a in cells.items() if k != "B0")
    assert grid == [(512, 4), (512, 8), (1024, 4), (1024, 8)]
    assert all(a["enable_chunked_prefill"] is True for k, a in cells.items() if k != "B0")
    assert experiment.runs.count() == 20
    assert experiment.status == "planned"
    assert experiment.generation == {"temperature": 0.0}
    assert AuditEvent.objects.filter(
        experiment=experiment, action="experiment.created", actor=author
    ).exists()


@pytest.mark.django_db
def test_it_adds_cells_one_by_one_after_the_grid(client, author) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    data = form_data(
        create="1",
        grid_max_num_batched_tokens="",
        grid_max_num_seqs="",
        **{
            "cells-0-cell_id": "small-budget",
            "cells-0-max_num_batched_tokens": "256",
            "cells-0-scheduling_policy": "priority",
            "cells-1-max_num_seqs": "2",
        },
    )
    client.post("/experiments/new/", data)
    experiment = Experiment.objects.get()
    cells = {c.cell_id: c.args for c in experiment.cells.all()}
    assert cells == {
        "B0": {"max_num_batched_tokens": 2048, "max_num_seqs": 8},
        "small-budget": {"max_num_batched_tokens": 256, "scheduling_policy": "priority"},
        "C2": {"max_num_seqs": 2},
    }


@pytest.mark.django_db
def test_a_cell_ticked_as_control_is_an_aa_cell_and_a_control_unlike_b0_is_refused_beside_its_row(  # type: ignore[no-untyped-def]
    client, author
) -> None:
    client.force_login(author)
    page = client.get("/experiments/new/").content.decode()
    assert 'name="cells-0-control"' in page and "A/A control" in page
    b0_again = {
        "cells-0-cell_id": "AA",
        "cells-0-max_num_batched_tokens": "2048",
        "cells-0-max_num_seqs": "8",
    }
    data = form_data(create="1", grid_max_num_seqs="8", grid_max_num_batched_tokens="512")
    # Unticked, B0's config again is the same config twice: refused.
    response = client.post("/experiments/new/", {**data, **b0_again})
    assert response.status_code == 400 and not Experiment.objects.exists()
    assert "B0 twice" in response.content.decode()
    # Ticked, with other args, it is not B0's config: refused naming the control.
    other = {**b0_again, "cells-0-max_num_seqs": "4", "cells-0-control": "on"}
    response = client.post("/experiments/new/", {**data, **other})
    assert response.status_code == 400 and not Experiment.objects.exists()
    assert "An A/A control cell runs B0&#x27;s effective config exactly" in response.content.decode()
    # Ticked, B0's config: created as the A/A cell.
    client.post("/experiments/new/", {**data, **b0_again, "cells-0-control": "on"})
    experiment = Experiment.objects.get()
    assert {c.cell_id: c.control for c in experiment.cells.all()} == {"B0": False, "C1": False, "AA": True}
    assert experiment.spec["candidates"][-1] == {
        "id": "AA",
        "args": {"max_num_batched_tokens": 2048, "max_num_seqs": 8},
        "control": True,
    }


@pytest.mark.django_db
def test_it_creates_from_an_uploaded_yaml_spec_owned_by_the_uploader(client, author, seed_spec_text) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    upload = SimpleUploadedFile("seed.yaml", seed_spec_text.encode(), content_type="text/yaml")
    preview = client.post("/experiments/new/", form_data(spec_file=upload))
    assert preview.context["estimate"].runs == 126
    # Before anything runs, the power each class's primary metric will have, from the planned counts.
    html = preview.content.decode()
    assert 'id="planned-power"' in html and "80% power" in html
    power = {(p.mixture, p.rate, p.cls): p for p in preview.context["estimate"].power}
    short = power[("80-20", "near_capacity", "short")]
    assert short.metric == "ttft_p99_ms" and short.requests == int(6.0 * 120 * 0.8) * 3
    assert 0 < short.detectable_rel < 1
    assert Experiment.objects.count() == 0
    upload = SimpleUploadedFile("seed.yaml", seed_spec_text.encode(), content_type="text/yaml")
    client.post("/experiments/new/", form_data(spec_file=upload, create="1"))
    experiment = Experiment.objects.get()
    assert experiment.name == "seed-sweep"
    assert experiment.owner == author  # the spec says admin; the uploader owns what they create
    assert experiment.runs.filter(kind="sweep").count() == 126


@pytest.mark.django_db
def test_it_accepts_a_bare_upload_without_the_typed_fields(client, author, seed_spec_text) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    upload = SimpleUploadedFile("seed.yaml", seed_spec_text.encode(), content_type="text/yaml")
    response = client.post("/experiments/new/", {"spec_file": upload, "create": "1"})
    assert response.status_code == 302
    assert Experiment.objects.get().runs.filter(kind="sweep").count() == 126


@pytest.fixture(autouse=True)
def upload_dirs(settings, tmp_path):  # type: ignore[no-untyped-def]
    """Uploads (and Django's temporary files) under this test's own folder."""
    settings.DATA_DIR = tmp_path / "data"
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path / "upload-tmp")
    Path(settings.FILE_UPLOAD_TEMP_DIR).mkdir()


AZURE_ROWS = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    + "".join(f"2023-11-16 18:15:{10 + i:02d}.0000000,{300 + 200 * (i % 4)},{8 + i % 3}\n" for i in range(20))
).encode()


def _post_trace(client, tmp_path, rows: bytes = AZURE_ROWS):  # type: ignore[no-untyped-def]
    """Create on the page with a real trace upload (a tokenizer of the tiny model's kind)."""
    from workers.engine.tinymodel import build_tokenizer

    model = build_tokenizer(tmp_path / "model")
    upload = SimpleUploadedFile("azure.csv", rows, content_type="text/csv")
    data = form_data(create="1", model_path=str(model), trace_file=upload, trace_format="azure")
    data["trace_classes"] = "short:600,long"
    return client.post("/experiments/new/", data)


@pytest.mark.django_db
def test_it_creates_an_experiment_replaying_an_uploaded_real_trace(
    client, author, tmp_path, monkeypatch, settings, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    from apps.workloads.models import Trace

    held = hold_tasks(monkeypatch, IMPORT_TRACE)
    client.force_login(author)
    with django_capture_on_commit_callbacks(execute=True):
        response = _post_trace(client, tmp_path)
    # The web request stored the file and queued its import: nothing is parsed here.
    row = TraceUpload.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/experiments/uploads/{row.pk}/"
    assert held == [(IMPORT_TRACE, {"upload_pk": row.pk}, settings.CELERY_TASK_DEFAULT_QUEUE)]
    assert Experiment.objects.count() == 0 and Trace.objects.count() == 0
    assert Path(row.path).read_bytes() == AZURE_ROWS and row.size_bytes == len(AZURE_ROWS)
    page = client.get(response["Location"])
    assert page.status_code == 200 and "importing…" in page.content.decode()
    assert '<meta http-equiv="refresh"' in page.content.decode()

    assert trace_upload_import(upload_pk=row.pk) == "done"
    experiment = Experiment.objects.get()
    trace = Trace.objects.get(sha256=experiment.workload.imported_trace_sha256)
    assert experiment.workload.arrival_process == "trace" and trace.requests == 20
    assert experiment.owner == author and not Path(row.path).exists()
    # The page now opens the experiment; a second delivery of the task changes nothing.
    assert client.get(response["Location"])["Location"] == f"/experiments/{experiment.pk}/"
    assert trace_upload_import(upload_pk=row.pk) == "done" and Experiment.objects.count() == 1


@pytest.mark.django_db
def test_it_names_the_line_of_a_bad_trace_upload_and_saves_nothing(
    client, author, tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from apps.workloads.models import Trace

    hold_tasks(monkeypatch, IMPORT_TRACE)
    client.force_login(author)
    bad = AZURE_ROWS.replace(b",308,", b",-5,", 1) + b"2023-11-16 18:16:00.0000000,abc,3\n"
    response = _post_trace(client, tmp_path, bad)
    row = TraceUpload.objects.get()
    assert trace_upload_import(upload_pk=row.pk) == "failed"
    page = client.get(response["Location"])
    assert page.status_code == 400
    assert b"line 22" in page.content and b"The import failed" in page.content
    assert Experiment.objects.count() == 0 and Trace.objects.count() == 0 and not Path(row.path).exists()


@pytest.mark.django_db
def test_an_upload_over_the_cap_is_a_field_error_and_nothing_is_stored(
    client, author, tmp_path, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.TAILTUNE_MAX_UPLOAD_BYTES = 100
    client.force_login(author)
    response = _post_trace(client, tmp_path)
    assert response.status_code == 400
    assert "the file is larger than the upload limit of 100 bytes" in response.content.decode()
    assert TraceUpload.objects.count() == 0 and Experiment.objects.count() == 0
    assert not any(Path(settings.FILE_UPLOAD_TEMP_DIR).iterdir())


@pytest.mark.django_db
def test_only_its_author_follows_an_upload(client, author, approver, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    hold_tasks(monkeypatch, IMPORT_TRACE)
    client.force_login(author)
    response = _post_trace(client, tmp_path)
    client.force_login(approver)
    assert client.get(response["Location"]).status_code == 403


@pytest.mark.django_db
def test_a_preview_keeps_the_uploaded_spec_for_create(client, author, seed_spec_text) -> None:  # type: ignore[no-untyped-def]
    import html as html_lib
    import re

    client.force_login(author)
    upload = SimpleUploadedFile("seed.yaml", seed_spec_text.encode(), content_type="text/yaml")
    preview = client.post("/experiments/new/", {"spec_file": upload, "preview": "1"})
    page = preview.content.decode()
    assert preview.context["estimate"].runs == 126 and 'id="spec-kept"' in page
    kept = html_lib.unescape(re.search(r'name="spec_text" value="([^"]*)"', page, re.S).group(1))
    assert kept == seed_spec_text
    # The browser re-sends the hidden text, not the file: Create uses it.
    response = client.post("/experiments/new/", {"spec_text": kept, "create": "1"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Experiment.objects.get().runs.filter(kind="sweep").count() == 126


@pytest.mark.django_db
def test_each_error_is_listed_once(client, author) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    page = client.post(
        "/experiments/new/", {"spec_text": "name: x\nclasses: []\n", "create": "1"}
    ).content.decode()
    assert page.count("classes: must be a non-empty list") == 1, page
    assert Experiment.objects.count() == 0


@pytest.mark.django_db
def test_the_dispatch_lag_tolerance_is_explained_beside_its_field(client, author) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    page = client.get("/experiments/new/").content.decode()
    field = page.split('id="field-max_dispatch_lag_ms"', 1)[1].split("</div>", 1)[0]
    assert "How late the load generator may send a request" in field


@pytest.mark.django_db
def test_an_import_whose_worker_died_is_taken_over_once_and_a_live_one_is_left_alone(
    client, author, tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    import datetime

    from apps.lifecycle.trace_upload import IMPORT_LOST_AFTER

    hold_tasks(monkeypatch, IMPORT_TRACE)
    client.force_login(author)
    _post_trace(client, tmp_path)
    row = TraceUpload.objects.get()
    # Being imported right now (a second delivery of its message): left alone.
    TraceUpload.objects.filter(pk=row.pk).update(status="importing")
    assert trace_upload_import(upload_pk=row.pk) == "importing" and Experiment.objects.count() == 0
    # Its worker died long ago, and the message came back: taken over, imported once.
    stale = datetime.datetime.now(datetime.UTC) - IMPORT_LOST_AFTER - datetime.timedelta(minutes=1)
    TraceUpload.objects.filter(pk=row.pk).update(updated_at=stale)
    assert trace_upload_import(upload_pk=row.pk) == "done" and Experiment.objects.count() == 1
