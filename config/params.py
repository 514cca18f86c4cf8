"""Values from a request's path, query and form, before anything uses them.

A hostile value must be a refusal that names its field, never a 500:

- ``parse_id`` reads an id the way the database stores one: ASCII digits only (``"²".isdigit()``
  is true and ``int("²")`` raises; ``int("١٢")`` is 12 although nobody typed 12), no sign, at
  most the largest bigint; anything else is None, for the caller to refuse naming its field.
- ``RefuseNulCharacters`` answers 400 to a NUL character in the path, in a query parameter or in
  a page's form field: PostgreSQL's text cannot hold one, so the first query that compares it
  would raise. The API's JSON bodies are read by DRF, whose fields refuse NUL themselves.
- ``declared_length`` reads a Content-Length header the same way, bounded before ``int()``.
- ``BadValue`` is the 400 a view raises with a message that names the field; ``bad_request``
  (``handler400`` in config/urls.py) shows that message, and only that one: Django's own 400s
  (a suspicious host, a broken cookie) keep their generic page.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import BadRequest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

# The largest value of a bigint (BigAutoField, the project's DEFAULT_AUTO_FIELD).
MAX_ID = 2**63 - 1
_MAX_ID_DIGITS = len(str(MAX_ID))
API_PREFIX = "/api/"


class BadValue(BadRequest):
    """A request value its field cannot take; shown as is, so it says nothing but that."""

    def __init__(self, field: str, message: str) -> None:
        field = field if len(field) <= 100 else field[:100] + "…"
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def parse_id(raw: str | None) -> int | None:
    """The id ``raw`` spells in ASCII digits, from 1 to MAX_ID; None for anything else."""
    if raw is None or not 1 <= len(raw) <= _MAX_ID_DIGITS or not (raw.isascii() and raw.isdigit()):
        return None
    value = int(raw)
    return value if 1 <= value <= MAX_ID else None


def declared_length(raw: object) -> int:
    """A request's declared Content-Length: 0 when absent or not ASCII digits (as Django reads it),
    MAX_ID when longer than any bigint (``int()`` of 4,300 digits or more raises, and such a body
    is past every limit anyway), else its value."""
    text = str(raw or "")
    if not (text.isascii() and text.isdigit()):
        return 0
    return int(text) if len(text) <= _MAX_ID_DIGITS else MAX_ID


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler400: the page, with the message of a BadValue (never of Django's own 400s)."""
    ours = exception if isinstance(exception, BadValue) else None
    if request.path.startswith(API_PREFIX):
        error = (
            {"field": ours.field, "message": ours.message}
            if ours
            else {"field": "", "message": "bad request"}
        )
        return JsonResponse({"errors": [error]}, status=400)
    return render(request, "400.html", {"message": str(ours) if ours else ""}, status=400)


def _nul_in(values: Any) -> BadValue | None:
    for key, items in values.lists():
        if "\x00" in key:
            return BadValue("", "a parameter's name holds a NUL character")
        if any(isinstance(item, str) and "\x00" in item for item in items):
            return BadValue(key, "holds a NUL character, which no field takes")
    return None


class RefuseNulCharacters:
    """400, naming the parameter, for a NUL character in the path, the query or a page's form."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        problem = BadValue("", "the path holds a NUL character") if "\x00" in request.path else None
        problem = problem or _nul_in(request.GET)
        return bad_request(request, problem) if problem else self.get_response(request)

    def process_view(self, request: HttpRequest, view: Callable[..., Any], *args: Any) -> HttpResponse | None:
        # A page's form was parsed already by the CSRF check; the API (exempt from it, bearer
        # tokens only) reads its bodies through DRF, which refuses NUL per field.
        if request.method != "POST" or getattr(view, "csrf_exempt", False):
            return None
        problem = _nul_in(request.POST)
        return bad_request(request, problem) if problem else None
