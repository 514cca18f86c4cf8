from __future__ import annotations

import pytest

from apps.workloads.prompts import PromptTokenizer
from apps.workloads.scenario_traces import ScenarioContext
from workers.engine.tinymodel import build_tokenizer

CLASSES = [
    {"name": "short", "input_tokens": 64, "output_tokens": 8, "priority": 0},
    {"name": "long", "input_tokens": 1024, "output_tokens": 8, "priority": 1},
]


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PromptTokenizer:
    return PromptTokenizer(build_tokenizer(tmp_path_factory.mktemp("scenario-tokenizer")))


@pytest.fixture
def context() -> ScenarioContext:
    return ScenarioContext(
        classes=CLASSES, max_model_len=2048, seed=7, tokenizer_revision="tiny-v1", kv_capacity_tokens=2048
    )
