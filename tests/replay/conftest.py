from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.replay.mockserver import Behaviour, MockConfig, MockServer


@pytest.fixture
def mock_config() -> MockConfig:
    # Short timings keep the suite quick; the tests assert on counts and order, never on durations.
    return MockConfig(model="mock", default=Behaviour(ttft_s=0.01, itl_s=0.002))


@pytest.fixture
def mock_server(mock_config: MockConfig) -> Iterator[MockServer]:
    with MockServer(mock_config) as server:
        yield server
