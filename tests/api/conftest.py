from __future__ import annotations

import pytest
from django.core.cache import cache

from apps.api.auth import FAILURES


def forget_failures() -> None:
    """Drop the failed-authentication counts only: the cache may be the broker's Redis database,
    which another lane's workers are using, so it is never flushed whole."""
    client = getattr(getattr(cache, "_cache", None), "get_client", None)
    if client is None:
        cache.clear()  # a cache of this machine's own (the folder, or memory)
        return
    redis = client(None, write=True)
    for key in redis.scan_iter(match=cache.make_key(f"{FAILURES}*")):
        redis.delete(key)


@pytest.fixture(autouse=True)
def fresh_failure_counts():  # type: ignore[no-untyped-def]
    """Failed authentications are counted per address in the shared cache: each test starts at zero."""
    forget_failures()
    yield
    forget_failures()
