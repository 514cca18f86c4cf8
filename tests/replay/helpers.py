from __future__ import annotations

from typing import Any


def make_requests(
    count: int, *, spacing_s: float = 0.01, output_tokens: int = 8, start_s: float = 0.0
) -> list[dict[str, Any]]:
    return [
        {
            "index": i,
            "t_offset_s": round(start_s + i * spacing_s, 6),
            "class": "chat" if i % 2 else "batch",
            "input_tokens": 4,
            "output_tokens": output_tokens,
            "priority": 0,
            "warmup": False,
            "prompt_token_ids": [11, 12, 13, 14],
        }
        for i in range(count)
    ]
