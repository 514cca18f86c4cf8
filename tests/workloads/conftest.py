from __future__ import annotations

from pathlib import Path

import pytest

from apps.workloads.prompts import PromptTokenizer
from workers.engine.tinymodel import build_tokenizer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# CI checks the repository out next to the shared folder: <clone>/../shared/traces.
REPO = Path(__file__).resolve().parents[2]
AZURE_CONV = REPO.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path) -> PromptTokenizer:
    return PromptTokenizer(tokenizer_dir)


@pytest.fixture
def azure_conv() -> Path:
    if not AZURE_CONV.is_file():
        pytest.skip(f"shared Azure trace not found at {AZURE_CONV}")
    return AZURE_CONV
