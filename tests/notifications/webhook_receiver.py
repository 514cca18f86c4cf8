"""A real HTTP server in a thread that takes webhook POSTs, optionally refusing the first few."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Receiver:
    url: str
    fail_first: int
    received: list[dict[str, Any]] = field(default_factory=list)  # the bodies it accepted
    answers: list[int] = field(default_factory=list)  # every status it answered, in order


@contextmanager
def webhook_receiver(*, fail_first: int = 0) -> Iterator[Receiver]:
    box: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            rec = box["r"]
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            code = 503 if len(rec.answers) < rec.fail_first else 204
            rec.answers.append(code)
            if code == 204:
                rec.received.append(json.loads(body))
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    box["r"] = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/hook", fail_first=fail_first)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield box["r"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
