from __future__ import annotations

import pytest
from django.core.cache import cache


@pytest.fixture(autouse=True)
def fresh_failure_counts():  # type: ignore[no-untyped-def]
    """Failed authentications are counted per address in the cache: each test starts at zero."""
    cache.clear()
    yield
    cache.clear()
