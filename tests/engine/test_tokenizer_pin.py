"""A trace is replayed only against the tokenizer its prompts were made with (workers/engine/tokenizer_pin.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from workers.engine.tokenizer_pin import tokenizer_mismatch, tokenizer_sha256


def _model(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "tokenizer.json").write_text(text)
    return folder


def test_the_same_tokenizer_passes_and_another_is_named_with_both_digests(tmp_path: Path) -> None:
    model = _model(tmp_path, '{"version": "1"}')
    pinned = hashlib.sha256(b'{"version": "1"}').hexdigest()
    assert tokenizer_sha256(model) == pinned
    assert tokenizer_mismatch({"tokenizer_sha256": pinned}, model) is None
    (model / "tokenizer.json").write_text('{"version": "2"}')
    # A rewrite moves the file's mtime or size: the cached digest is not reused.
    os.utime(model / "tokenizer.json", ns=(1, 1))
    why = tokenizer_mismatch({"tokenizer_sha256": pinned}, model)
    assert (
        why is not None and pinned[:16] in why and hashlib.sha256(b'{"version": "2"}').hexdigest()[:16] in why
    )


def test_a_trace_that_pins_nothing_is_not_refused_and_a_missing_tokenizer_is(tmp_path: Path) -> None:
    assert tokenizer_mismatch({}, tmp_path) is None
    why = tokenizer_mismatch({"tokenizer_sha256": "ab" * 32}, tmp_path)
    assert why is not None and "no tokenizer.json" in why
