"""Logging filters for the console handler."""

from __future__ import annotations

import logging


class ClientErrorsOneLine(logging.Filter):
    """Django logs a refused request (PermissionDenied, Http404, ...) with its traceback; for a
    4xx the line says all there is to say ("Forbidden (...): /path"), so the traceback goes."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500:
            record.exc_info = None
            record.exc_text = None
        return True
