"""Request bodies are bounded before anything reads them; a request carries a bounded number of files.

``BodyLimitsMiddleware`` (first after SecurityMiddleware) answers 413, naming the limit, when a
request's ``Content-Length`` is over what any request may send, before a byte is read:
``TAILTUNE_MAX_REQUEST_BYTES`` (``DATA_UPLOAD_MAX_MEMORY_SIZE``) for a body that is not
multipart, and that plus ``DATA_UPLOAD_MAX_NUMBER_FILES`` files of ``TAILTUNE_MAX_UPLOAD_BYTES``
for a multipart one. Inside those bounds Django and the upload handler
(config/uploadhandlers.py) hold each part while it arrives: form fields to
``DATA_UPLOAD_MAX_MEMORY_SIZE``, their number to ``DATA_UPLOAD_MAX_NUMBER_FIELDS``, files to
``DATA_UPLOAD_MAX_NUMBER_FILES`` (``TAILTUNE_MAX_REQUEST_FILES``), each file to the smaller of
``TAILTUNE_MAX_UPLOAD_BYTES`` and its view's own cap (``@upload_limits(spec_file=...)``, e.g. a
spec file at the spec's limit). A page's form body is parsed here, so too many files or fields
are a 413 page naming the limit; the API maps the same errors to a JSON 413 (apps/api/base.py).
The API's own parsers cap a spec body at the spec's limit, also before reading it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from config.params import declared_length

API_PREFIX = "/api/"
View = TypeVar("View", bound=Callable[..., Any])


def upload_limits(**limits: int) -> Callable[[View], View]:
    """A view's own caps on its file fields, in bytes (below TAILTUNE_MAX_UPLOAD_BYTES)."""

    def mark(view: View) -> View:
        view.upload_limits = dict(limits)  # type: ignore[attr-defined]
        return view

    return mark


def body_cap(content_type: str) -> tuple[int, str]:
    """The most bytes a request body of this type may declare, and the settings that make it up."""
    fields = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    if content_type.startswith("multipart/"):
        files = int(settings.DATA_UPLOAD_MAX_NUMBER_FILES) * int(settings.TAILTUNE_MAX_UPLOAD_BYTES)
        return fields + files, (
            "TAILTUNE_MAX_REQUEST_FILES files of TAILTUNE_MAX_UPLOAD_BYTES and TAILTUNE_MAX_REQUEST_BYTES of fields"
        )
    return fields, "TAILTUNE_MAX_REQUEST_BYTES"


def too_much_message(exc: BaseException) -> str | None:
    """What a request overstepped, naming the limit, for Django's own body errors; else None."""
    if isinstance(exc, TooManyFilesSent):
        return (
            f"the request carries more than {settings.DATA_UPLOAD_MAX_NUMBER_FILES} files "
            "(TAILTUNE_MAX_REQUEST_FILES)"
        )
    if isinstance(exc, TooManyFieldsSent):
        return f"the request carries more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} form fields"
    if isinstance(exc, RequestDataTooBig):
        return (
            f"the request's form fields are over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes "
            "(TAILTUNE_MAX_REQUEST_BYTES)"
        )
    return None


def too_large(request: HttpRequest, message: str) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return JsonResponse({"detail": message}, status=413)
    return render(request, "413.html", {"message": message}, status=413)


class BodyLimitsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        length = declared_length(request.META.get("CONTENT_LENGTH"))
        cap, names = body_cap(str(request.META.get("CONTENT_TYPE") or ""))
        if length > cap:
            return too_large(request, f"the request body is {length} bytes; at most {cap} ({names})")
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view_func: Callable[..., Any], args: Any, kwargs: Any
    ) -> HttpResponse | None:
        view = getattr(view_func, "view_class", view_func)
        request.upload_limits = dict(getattr(view, "upload_limits", None) or {})  # type: ignore[attr-defined]
        if request.method != "POST" or request.path.startswith(API_PREFIX):
            return None  # the API parses its own bodies (apps/api/base.py maps these errors)
        try:
            request.POST  # noqa: B018  (parsed now, before the CSRF check would, so errors are named)
            request.FILES  # noqa: B018
        except (RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent) as exc:
            return too_large(request, too_much_message(exc) or str(exc))
        return None
