from __future__ import annotations

from pathlib import Path

import pytest

from apps.workloads.prompts import PromptTokenizer
from workers.engine.tinymodel import build_tokenizer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Shipped in the repository (CC-BY-4.0, credit in examples/traces/README.md): a plain clone has it.
REPO = Path(__file__).resolve().parents[2]
AZURE_CONV = REPO / "examples" / "traces" / "AzureLLMInferenceTrace_conv.csv"


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path) -> PromptTokenizer:
    return PromptTokenizer(tokenizer_dir)


@pytest.fixture
def azure_conv() -> Path:
    assert AZURE_CONV.is_file(), f"the shipped Azure trace is missing: {AZURE_CONV}"
    return AZURE_CONV
