"""plotly.js as a static file, from the installed plotly package (one version, no CDN, no copy
in the repository).

``PlotlyFinder`` offers the package's ``plotly.min.js`` to the static-file machinery under a
versioned name, ``vendor/plotly-<version>/plotly.min.js``: ``collectstatic`` writes it with
its gzip (and brotli) copies, and whitenoise serves it compressed with a cache of a year
(``WHITENOISE_IMMUTABLE_FILE_TEST`` matches the versioned folder: a new plotly is a new URL).
Before any ``collectstatic`` (tests, a fresh checkout) whitenoise finds it through this finder.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from django.contrib.staticfiles.finders import BaseFinder
from django.core.checks import CheckMessage
from django.core.files.storage import FileSystemStorage

FILE = "plotly.min.js"


@cache
def _package() -> tuple[Path, str]:
    import plotly

    return Path(plotly.__file__).parent / "package_data", str(plotly.__version__)


def plotly_prefix() -> str:
    return f"vendor/plotly-{_package()[1]}"


def plotly_static_name() -> str:
    """The bundle's static name (for ``{% static %}``)."""
    return f"{plotly_prefix()}/{FILE}"


class PlotlyFinder(BaseFinder):
    """Finds the one file ``plotly_static_name()`` in the plotly package."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        folder, _ = _package()
        self.storage = FileSystemStorage(location=str(folder))
        self.storage.prefix = plotly_prefix()  # type: ignore[attr-defined]

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        return []

    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> Any:
        find_all = find_all or bool(kwargs.get("all"))
        if path != plotly_static_name():
            return [] if find_all else None
        found = self.storage.path(FILE)
        return [found] if find_all else found

    def list(self, ignore_patterns: Any) -> Iterator[tuple[str, FileSystemStorage]]:
        yield FILE, self.storage
