"""A gate started through the API (``POST /api/v1/gates``): its traffic window is imported by a
worker, not the web request.

The request checks the fields and that a host is alive, streams the file to disk and saves a
:class:`~apps.experiments.models.TraceUpload` of kind ``gate`` holding the fields; the
``tailtune.import_trace`` task then runs :func:`gate_window_import`: ``gate_create`` cuts the
window, builds B0 and the candidate on it and starts them, in the import's transaction. The
client polls the upload until it names the gate (``GET /api/v1/gates/uploads/<id>``), then the
gate's verdict, as before. ``manage.py gate`` has no web request to spare and calls
``gate_create`` itself.
"""

from __future__ import annotations

from typing import Any

from django.core.files.uploadedfile import UploadedFile

from apps.experiments.models import TraceUpload
from apps.gate.build import GateInput
from apps.gate.services import GateUnavailable, gate_create
from apps.lifecycle.trace_upload import ImportRefused, trace_upload_import, upload_queue


def gate_upload_queue(*, owner: Any, upload: UploadedFile, fields: dict[str, Any]) -> TraceUpload:
    """Store the window and queue the gate's start; ``fields`` are the request's, checked, as
    :meth:`GateInput.from_fields` takes them (JSON values only)."""
    return upload_queue(
        kind=TraceUpload.Kind.GATE,
        owner=owner,
        upload=upload,
        trace_format=str(fields["format"]),
        busiest_s=fields.get("busiest"),
        options=fields,
    )


def gate_window_import(row: TraceUpload, data: bytes) -> dict[str, Any]:
    """The importer of kind ``gate``: create and start the gate on the stored window."""
    try:
        experiment = gate_create(request=GateInput.from_fields(row.options), trace_data=data, owner=row.owner)
    except GateUnavailable as exc:  # the hosts went away since the request was checked
        raise ImportRefused("host", str(exc)) from None
    return {"experiment": experiment}


def gate_upload_import(*, upload_pk: int) -> str:
    """Import any upload, the gate's windows included (what the worker's task runs)."""
    return trace_upload_import(upload_pk=upload_pk, importers={TraceUpload.Kind.GATE: gate_window_import})
