"""A real trace uploaded (with a new experiment, or alone through the API): stored by the web
request, imported by a worker.

The web request only streams the file to disk (Django writes every upload to a temporary
file: ``config/uploadhandlers.py`` caps its size while it arrives), checks the spec, stores the
file under ``TAILTUNE_DATA/uploads/`` and saves a :class:`TraceUpload`; the page then shows
"importing…". The ``tailtune.import_trace`` task runs :func:`trace_upload_import` on a worker:
parse strictly (every error names its line), cut the busiest window, build the prompts and
create the experiment (or, for a trace uploaded alone, store it and keep its sha256 for the
API to answer), in one transaction. So the web process never holds a whole trace in
memory (bench/results/upload_memory.md measures it), and a bad file leaves only its errors.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.audit.services import audit_record
from apps.experiments.models import TraceUpload
from apps.experiments.services import spec_limits
from apps.experiments.spec import SpecError, validate_spec
from apps.lifecycle.creation import experiment_create_with_trace
from apps.runs import dispatch
from apps.workloads.requestlog import FORMAT as REQUEST_LOG

log = logging.getLogger(__name__)

# An import still "importing" after this long lost its worker; a redelivered task takes it over.
IMPORT_LOST_AFTER = timedelta(minutes=30)


def uploads_dir() -> Path:
    folder = Path(settings.DATA_DIR) / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _store(upload: UploadedFile) -> Path:
    """Move (or stream, chunk by chunk) the upload to its own file under uploads_dir()."""
    dest = uploads_dir() / f"{uuid.uuid4().hex}.upload"
    temporary = getattr(upload, "temporary_file_path", None)
    if temporary is not None:
        shutil.move(temporary(), dest)
        upload.close()  # Django's temporary file was moved: closing it deletes nothing
    else:
        with dest.open("wb") as out:
            for chunk in upload.chunks():
                out.write(chunk)
    return dest


def trace_upload_queue(
    *,
    spec: Mapping[str, Any],
    owner: Any,
    upload: UploadedFile,
    trace_format: str,
    thresholds: list[tuple[str, int | None]],
    busiest_s: float | None,
) -> TraceUpload:
    """Check the spec, store the file and queue its import (sent once this transaction commits).

    Raises SpecError for a spec error (nothing is stored then).
    """
    spec = validate_spec(spec, limits=spec_limits())
    return upload_queue(
        kind=TraceUpload.Kind.EXPERIMENT,
        owner=owner,
        upload=upload,
        spec=spec,
        trace_format=trace_format,
        thresholds=thresholds,
        busiest_s=busiest_s,
    )


def upload_queue(
    *,
    kind: str,
    owner: Any,
    upload: UploadedFile,
    trace_format: str,
    thresholds: Sequence[tuple[str, int | None]] = (),
    **fields: Any,
) -> TraceUpload:
    """Store the file and save its :class:`TraceUpload` of ``kind``; the import task is sent
    once this transaction commits. The caller has checked every field (a trace uploaded alone,
    ``POST /api/v1/traces``: ``options`` holds its label, and for an imported format its
    model_dir, tokenizer_revision and max_model_len)."""
    path = _store(upload)
    try:
        with transaction.atomic():
            row = TraceUpload.objects.create(
                kind=kind,
                owner=owner,
                trace_format=trace_format,
                file_name=(upload.name or "trace")[:255],
                path=str(path),
                size_bytes=path.stat().st_size,
                thresholds=[list(t) for t in thresholds],
                **fields,
            )
            dispatch.send_on_commit(
                dispatch.IMPORT_TRACE, kwargs={"upload_pk": row.pk}, queue=settings.CELERY_TASK_DEFAULT_QUEUE
            )
    except Exception:
        path.unlink(missing_ok=True)
        raise
    return row


class ImportRefused(Exception):
    """What an importer refuses that is not the file's fault, with the field that names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# An importer makes what its kind of upload asks for from the file's bytes, inside the import's
# transaction, and returns the fields to save on the upload with it (experiment, trace_sha256).
Importer = Callable[[TraceUpload, bytes], dict[str, Any]]

# The field a bad file's error names, per kind: the create page's, the trace API's, the gate's.
FILE_FIELD: dict[str, str] = {
    TraceUpload.Kind.EXPERIMENT: "trace_file",
    TraceUpload.Kind.TRACE: "file",
    TraceUpload.Kind.GATE: "trace",
}


def trace_upload_import(*, upload_pk: int, importers: Mapping[str, Importer] | None = None) -> str:
    """The task's work: import the stored file and make what its kind asks for; returns the status.

    ``importers`` adds the importers of kinds an upper layer owns (the gate's: the worker's
    task passes it). Runs once: a row no longer queued (imported, failed, or being imported) is
    left alone, unless its import started over ``IMPORT_LOST_AFTER`` ago (the worker died: the
    task's message is delivered again, acks_late). A bad file or a spec the trace does not fit
    ends ``failed`` with its errors and nothing else saved; an unexpected error too, with its
    reason, never silently.
    """
    known: dict[str, Importer] = {
        TraceUpload.Kind.EXPERIMENT: _import_with_experiment,
        TraceUpload.Kind.TRACE: _import_alone,
        **(importers or {}),
    }
    now = timezone.now()
    # Queued, or importing on a worker that died long enough ago (its message came back).
    takeable = Q(status=TraceUpload.Status.QUEUED) | Q(
        status=TraceUpload.Status.IMPORTING, updated_at__lt=now - IMPORT_LOST_AFTER
    )
    taken = TraceUpload.objects.filter(takeable, pk=upload_pk).update(
        status=TraceUpload.Status.IMPORTING, updated_at=now
    )
    row = TraceUpload.objects.select_related("owner").get(pk=upload_pk)
    if not taken:
        return row.status
    path = Path(row.path)
    errors: list[str] = []
    done = False
    try:
        importer = known.get(row.kind)
        if importer is None:
            raise RuntimeError(f"no importer for an upload of kind {row.kind!r} on this worker")
        data = path.read_bytes()
        # What the upload makes and the upload marked done, or none of them: a worker that
        # dies in between leaves the upload to be imported again, never twice.
        with transaction.atomic():
            made = importer(row, data)
            forgotten = _forget_terms(row.options)
            if forgotten is not None:
                made = {**made, "options": forgotten}
            TraceUpload.objects.filter(pk=row.pk).update(
                status=TraceUpload.Status.DONE, updated_at=timezone.now(), **made
            )
        done = True
    except SpecError as exc:
        errors = [f"{e.path}: {e.message}" for e in exc.errors]
    except ImportRefused as exc:
        errors = [f"{exc.field}: {exc}"[:2000]]
    except (ValueError, OSError) as exc:  # a bad trace file: the importer names the line
        errors = [f"{FILE_FIELD.get(row.kind, 'file')}: {exc}"[:2000]]
    except Exception as exc:  # a bug must still end the upload with its reason
        log.exception("trace upload %s failed", upload_pk)
        errors = [
            f"{FILE_FIELD.get(row.kind, 'file')}: the import failed: {type(exc).__name__}: {exc}"[:2000]
        ]
    if not done:
        forgotten = _forget_terms(row.options)
        TraceUpload.objects.filter(pk=row.pk).update(
            status=TraceUpload.Status.FAILED,
            errors=list(dict.fromkeys(errors)),
            updated_at=timezone.now(),
            **({} if forgotten is None else {"options": forgotten}),
        )
    path.unlink(missing_ok=True)
    return TraceUpload.Status.DONE if done else TraceUpload.Status.FAILED


def _thresholds(row: TraceUpload) -> list[tuple[str, int | None]]:
    return [(str(name), None if limit is None else int(limit)) for name, limit in row.thresholds]


def _import_with_experiment(row: TraceUpload, data: bytes) -> dict[str, Any]:
    assert row.spec is not None
    experiment = experiment_create_with_trace(
        spec=row.spec,
        owner=row.owner,
        trace_data=data,
        trace_format=row.trace_format,
        thresholds=_thresholds(row),
        busiest_s=row.busiest_s,
    )
    audit_record(
        action="experiment.trace_imported",
        actor=row.owner,
        experiment=experiment,
        detail={"upload": row.pk, "file": row.file_name, "bytes": row.size_bytes},
    )
    return {"experiment": experiment}


def _import_alone(row: TraceUpload, data: bytes) -> dict[str, Any]:
    from apps.experiments.model_roots import model_path_error
    from apps.workloads.services import tokenizer_dir, trace_import, trace_store_bytes

    options = row.options or {}
    label = str(options.get("label") or row.file_name)[:200]
    if row.trace_format == "tailtune":
        trace = trace_store_bytes(data=data, label=label)
    else:
        try:
            outside = model_path_error(str(options["model_dir"]))  # the roots may have changed since
            if outside is not None:
                raise ImportRefused("model_dir", outside)
            tokenizer = tokenizer_dir(str(options["model_dir"]))
            if not (tokenizer / "tokenizer.json").is_file():  # gone since the upload was checked
                raise ImportRefused("model_dir", f"no tokenizer.json in {tokenizer}")
            if row.trace_format == REQUEST_LOG:
                trace = _import_request_log(row, data, tokenizer, label)
            else:
                trace = trace_import(
                    data=data,
                    fmt=row.trace_format,
                    tokenizer_dir=tokenizer,
                    tokenizer_revision=str(options["tokenizer_revision"]),
                    thresholds=_thresholds(row),
                    max_model_len=int(options["max_model_len"]),
                    busiest_s=row.busiest_s,
                    label=label,
                )
        except (ValueError, OSError, ImportRefused):
            raise  # the file's own errors, with their line
        except Exception as exc:  # a tokenizer that cannot be read, and the like
            raise ImportRefused("model_dir", f"{type(exc).__name__}: {exc}") from None
    audit_record(
        action="trace.stored",
        actor=row.owner,
        target=trace.sha256,
        detail={"format": row.trace_format, "label": label, "upload": row.pk, "bytes": row.size_bytes},
    )
    return {"trace_sha256": trace.sha256}


def _import_request_log(row: TraceUpload, data: bytes, tokenizer: Path, label: str) -> Any:
    """A request log uploaded through the API: its prompts, redacted by the upload's rules and
    literal terms, stored as the trace's corpus (apps/workloads/corpus_store.py)."""
    from apps.workloads.corpus_store import request_log_import
    from apps.workloads.redaction import redactor

    options = row.options or {}
    redact = redactor(
        rules=list(options.get("redact") or []),
        patterns=[re.escape(str(term)) for term in options.get("redact_terms") or []],
    )
    trace, _corpus = request_log_import(
        data=data,
        model_dir=tokenizer,
        tokenizer_revision=str(options["tokenizer_revision"]),
        thresholds=_thresholds(row),
        max_model_len=int(options["max_model_len"]),
        redact=redact,
        busiest_s=row.busiest_s,
        default_output_tokens=options.get("output_tokens"),
        label=label,
    )
    return trace


def _forget_terms(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The upload's options without its literal redaction terms (they spell what they hide):
    kept only as their sha256 once the import has ended, whatever its outcome."""
    if not options or "redact_terms" not in options:
        return None
    kept = {k: v for k, v in options.items() if k != "redact_terms"}
    kept["redact_terms_sha256"] = [
        hashlib.sha256(str(t).encode("utf-8")).hexdigest() for t in options["redact_terms"]
    ]
    return kept
