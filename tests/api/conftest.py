from __future__ import annotations

import copy
import os

import pytest
from django.core.cache import cache

from apps.api.auth import FAILURES


def forget_failures() -> None:
    """Drop this process's failed-authentication counts only: the cache may be the broker's Redis
    database, which another lane's workers are using, so it is never flushed whole."""
    client = getattr(getattr(cache, "_cache", None), "get_client", None)
    if client is None:
        cache.clear()  # a cache of this machine's own (the folder, or memory)
        return
    redis = client(None, write=True)
    for key in redis.scan_iter(match=cache.make_key(f"{FAILURES}*")):
        redis.delete(key)


@pytest.fixture(autouse=True)
def fresh_failure_counts(settings):  # type: ignore[no-untyped-def]
    """Failed authentications are counted per address in the shared cache: each test starts at
    zero, under a key prefix of this test process's own, so two lanes never count together."""
    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["KEY_PREFIX"] = f"tailtune-test-{os.getpid()}"
    settings.CACHES = caches
    forget_failures()
    yield
    forget_failures()
