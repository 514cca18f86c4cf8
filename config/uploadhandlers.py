"""Uploads stream to disk with a size cap, checked while the bytes arrive.

Every uploaded file goes to a temporary file (never into memory), under
``TAILTUNE_DATA/uploads/tmp`` so that keeping it is a rename. Past
``TAILTUNE_MAX_UPLOAD_BYTES``, or its view's lower cap on the field (``request.upload_limits``,
set by config/bodylimits.py from ``@upload_limits``), the file is dropped at once and the rest of its
bytes are read and discarded; the request records the field in
``request.uploads_too_large`` ({field: limit}) for the view to report as a
field error.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.files.uploadhandler import SkipFile, TemporaryFileUploadHandler


class CappedTemporaryFileUploadHandler(TemporaryFileUploadHandler):
    def new_file(self, *args: Any, **kwargs: Any) -> None:
        super().new_file(*args, **kwargs)
        self.received = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self.received += len(raw_data)
        limit = int(settings.TAILTUNE_MAX_UPLOAD_BYTES)
        # A view's own cap on this field (config/bodylimits.py upload_limits), when it is lower.
        own = (getattr(self.request, "upload_limits", None) or {}).get(self.field_name)
        if own is not None:
            limit = min(limit, int(own))
        if self.received > limit:
            self.file.close()  # a temporary file: closing deletes it
            too_large = getattr(self.request, "uploads_too_large", None) or {}
            too_large[self.field_name] = limit
            self.request.uploads_too_large = too_large  # type: ignore[union-attr]
            raise SkipFile(f"{self.field_name}: larger than {limit} bytes")
        return super().receive_data_chunk(raw_data, start)


def too_large_message(limit: int) -> str:
    if limit < int(settings.TAILTUNE_MAX_UPLOAD_BYTES):
        return f"the file is larger than this field's limit of {limit} bytes"
    return f"the file is larger than the upload limit of {limit} bytes (TAILTUNE_MAX_UPLOAD_BYTES)"
