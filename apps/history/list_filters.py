"""The experiment list's filters, read from the URL's query so a reload or a shared link keeps
them (the page and ``GET /api/v1/experiments`` read the same ones). Pure.

A value a filter cannot take is a FilterError naming the query parameter; an empty one is no
filter. ``since`` and ``until`` are dates (UTC days, both included)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import asdict, dataclass

STATUSES = ("draft", "planned", "running", "analysed", "approved", "rejected", "revoked", "cancelled")
PAGE_SIZE = 25
MAX_TEXT = 200


class FilterError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ListFilters:
    status: str = ""
    owner: str = ""  # a username, exactly
    route: str = ""  # a route target, contained (case-insensitive)
    q: str = ""  # in the name or description, case-insensitive
    since: dt.date | None = None
    until: dt.date | None = None

    def query(self) -> dict[str, str]:
        """The filters set, as the query parameters that give them back (for the pager's links)."""
        out = {}
        for key, value in asdict(self).items():
            if value:
                out[key] = value.isoformat() if isinstance(value, dt.date) else str(value)
        return out

    @property
    def any(self) -> bool:
        return bool(self.query())


def _text(query: Mapping[str, str], name: str) -> str:
    value = (query.get(name) or "").strip()
    if len(value) > MAX_TEXT:
        raise FilterError(name, f"is at most {MAX_TEXT} characters")
    return value


def _date(query: Mapping[str, str], name: str) -> dt.date | None:
    raw = (query.get(name) or "").strip()
    if not raw:
        return None
    try:
        return dt.date.fromisoformat(raw)
    except ValueError:
        raise FilterError(name, f"{raw[:40]!r} is not a date (YYYY-MM-DD)") from None


def parse_list_filters(query: Mapping[str, str]) -> ListFilters:
    status = _text(query, "status")
    if status and status not in STATUSES:
        raise FilterError("status", f"{status[:40]!r} is not a status ({', '.join(STATUSES)})")
    since, until = _date(query, "since"), _date(query, "until")
    if since and until and since > until:
        raise FilterError("until", f"{until} is before since ({since})")
    return ListFilters(
        status=status,
        owner=_text(query, "owner"),
        route=_text(query, "route"),
        q=_text(query, "q"),
        since=since,
        until=until,
    )


def parse_page(raw: str | None, *, field: str = "page") -> int:
    """A page number from 1; empty is 1."""
    if raw is None or raw == "":
        return 1
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6 or int(raw) < 1:
        raise FilterError(field, f"{raw[:20]!r} is not a page number (1, 2, ...)")
    return int(raw)
