"""A favicon, and a refused request logged as one line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from django.conf import settings

from config.logfilters import ClientErrorsOneLine


def test_the_favicon_is_served_without_a_login(client) -> None:  # type: ignore[no-untyped-def]
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"].endswith("favicon.svg")
    assert (Path(settings.BASE_DIR) / "static" / "favicon.svg").read_text().startswith("<svg")


@pytest.mark.django_db
def test_a_403_is_one_log_line_without_a_traceback(client, caplog, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    with caplog.at_level(logging.WARNING, logger="django.request"):
        assert client.get(f"/experiments/{analysed_experiment.pk}/approve/").status_code == 403
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    # Django logs a 403 with the exception attached; the console handler's filter (which sees the
    # record before pytest's) dropped it.
    assert record.exc_info is None and record.status_code == 403
    formatted = logging.Formatter().format(record)
    assert "\n" not in formatted and formatted.startswith("Forbidden")
    handler_filters = settings.LOGGING["handlers"]["console"]["filters"]
    assert handler_filters == ["client_errors_one_line"]


def test_the_filter_keeps_a_5xx_traceback() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        info = (type(exc), exc, exc.__traceback__)
    for status, kept in ((403, False), (404, False), (500, True)):
        record = logging.LogRecord("django.request", logging.WARNING, __file__, 1, "x", (), info)
        record.status_code = status
        assert ClientErrorsOneLine().filter(record)
        assert (record.exc_info is not None) is kept
