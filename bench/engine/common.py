"""What the engine benches share: where the CPU engine and its tiny model live, and the
Markdown report each writes (a dated title, how it was run, one table)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINE_DIR = REPO / ".engine"
MODEL = ENGINE_DIR / "models" / "tiny-llama"


def write_report(
    title: str, intro: Sequence[str], columns: Sequence[str], rows: Sequence[str], out: Path | None
) -> str:
    """Print the report, and write it to ``out`` when one is given. ``rows`` are table rows,
    already formatted (``| a | b |``), as the benches print them while they run."""
    lines = [
        f"# {title}, {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}",
        "",
        *intro,
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *rows,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        out.write_text(text)
    return text
