from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from apps.runs.models import Host
from workers.replay.records import GapHistogram, RequestRecord


def make_host(name: str = "h1", *, alive: bool = True, **fields: Any) -> Host:
    beat = timezone.now() if alive else timezone.now() - timedelta(hours=1)
    return Host.objects.create(
        name=name, queue=f"host.{name}", vllm_command=["vllm", "serve"], last_heartbeat=beat, **fields
    )


def observed(
    run_id: str, index: int, *, cls: str = "short", ttft_ms: float = 50.0, tokens: int = 8
) -> RequestRecord:
    planned = index * 100_000_000
    gaps = GapHistogram()
    gaps.add(20_000, tokens - 1)
    return RequestRecord(
        run_id=run_id,
        index=index,
        request_class=cls,
        warmup=False,
        input_tokens=64,
        expected_output_tokens=tokens,
        planned_ns=planned,
        sent_ns=planned + 100_000,
        admission_delay_ns=0,
        first_token_ns=planned + int(ttft_ms * 1e6),
        last_token_ns=planned + int(ttft_ms * 1e6) + 20_000_000 * (tokens - 1),
        end_ns=planned + int(ttft_ms * 1e6) + 20_000_000 * (tokens - 1) + 1000,
        output_tokens=tokens,
        prompt_tokens=64,
        chunks=tokens,
        max_gap_ns=20_000_000,
        chunk_gaps=gaps,
        token_gaps=gaps,
        http_status=200,
        finish_reason="length",
    )
