"""A probe answer with a NUL character is kept storable (workers/quality_probe.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from apps.runs.models import Run
from tests.experiments.factories import make_experiment
from workers.quality_probe import run_probe


class _Completions(BaseHTTPRequestHandler):
    """A server that answers every completion with a NUL in its text, as the tiny CPU model did."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps(
            {"choices": [{"text": "ab\u0000cd", "token_ids": [5, 0, 7], "finish_reason": "length"}]}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.django_db
def test_an_answer_with_a_nul_is_stored_with_the_replacement_character_and_exact_token_ids() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        outputs = run_probe(
            base_url=f"http://127.0.0.1:{server.server_address[1]}",
            model="m",
            requests=[{"index": 0, "class": "short", "prompt_token_ids": [1, 2], "output_tokens": 3}],
        )
    finally:
        server.shutdown()
    assert outputs[0]["text"] == "ab\ufffdcd" and outputs[0]["token_ids"] == [5, 0, 7]
    # PostgreSQL takes it in a run's summary (a NUL made the worker's save fail: "\u0000 cannot
    # be converted to text", and the run stayed in draining).
    run = make_experiment().runs.first()
    Run.objects.filter(pk=run.pk).update(summary={"quality_probe": outputs})
    run.refresh_from_db()
    assert run.summary["quality_probe"][0]["text"] == "ab\ufffdcd"
