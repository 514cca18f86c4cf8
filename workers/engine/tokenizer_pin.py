"""The tokenizer a trace was built with, checked against the one the server will load.

A trace's prompts are token ids (or texts whose lengths were counted) made with one
``tokenizer.json``, pinned by its sha256 in the trace's meta (``tokenizer_sha256``: the
generator's, the importers' and the request-log renderer's). A host whose model directory
holds another tokenizer (a re-download, a different revision under the same path) would
replay prompts whose lengths are not the trace's: every class's prefill cost would be wrong
and nothing in the latencies would say so. The worker refuses such a run before it starts a
server, naming both digests.

Pure: standard library only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# (path, size, mtime_ns) -> sha256: a worker hashes a model's tokenizer once, not per run.
_DIGESTS: dict[tuple[str, int, int], str] = {}


def tokenizer_sha256(model_dir: str | Path) -> str | None:
    """sha256 of ``model_dir``/tokenizer.json, or None when there is none."""
    path = Path(model_dir) / "tokenizer.json"
    try:
        stat = path.stat()
    except OSError:
        return None
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def tokenizer_mismatch(trace_meta: Mapping[str, Any], model_dir: str | Path) -> str | None:
    """Why the trace cannot be replayed against ``model_dir``'s tokenizer, or None when it can.

    A trace that pins no tokenizer (a canonical trace uploaded as it was made elsewhere) is
    not refused: there is nothing to compare."""
    pinned = str(trace_meta.get("tokenizer_sha256") or "")
    if not pinned:
        return None
    here = tokenizer_sha256(model_dir)
    if here is None:
        return f"the model directory {model_dir} holds no tokenizer.json to check the trace's against"
    if here != pinned:
        return (
            f"the trace's prompts were made with tokenizer.json sha256 {pinned[:16]}…, and this host's "
            f"model directory {model_dir} holds {here[:16]}…: its prompt lengths would not be the trace's"
        )
    return None
