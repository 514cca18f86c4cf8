"""A local HTTP server answering /v1/models, /metrics and /version as a vLLM 0.32 server does (its
/metrics recorded from one), for the tests of capturing B0 from a running server without one."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

METRICS = Path(__file__).resolve().parent / "engine" / "fixtures" / "vllm-0.32-metrics.txt"


@contextlib.contextmanager
def vllm_like_server() -> Iterator[tuple[str, list[str]]]:
    """(its base URL, the paths it was asked for, in order)."""
    pages = {
        "/v1/models": json.dumps(
            {"data": [{"id": "tiny", "root": "/m/tiny", "max_model_len": 4096}]}
        ).encode(),
        "/metrics": METRICS.read_bytes(),
        "/version": b'{"version": "0.32.0"}',
    }
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = pages.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()
