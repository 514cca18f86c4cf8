"""A stand-in for a vLLM server, for process-lifecycle tests (no model, starts in milliseconds).

Reads --port from the vLLM-style argv it is given and ignores the rest. Like
vLLM it runs a child process (its "engine core"). FAKE_SERVER_MODE chooses:
ok (serve /health), die (log an error and exit 1), hang (never listen),
stubborn (ignore SIGTERM, as must be SIGKILLed, child too).
"""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import time


def main() -> int:
    mode = os.environ.get("FAKE_SERVER_MODE", "ok")
    port = next(int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--port="))
    child_code = "import signal, time\n"
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child_code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    child = subprocess.Popen([sys.executable, "-c", child_code + "time.sleep(600)"])
    print(f"fake server pid {os.getpid()} child {child.pid}", flush=True)
    if mode == "die":
        time.sleep(0.3)
        print("Traceback (most recent call last):", flush=True)
        print("ValueError: fake engine refuses max_num_seqs (0)", flush=True)
        child.kill()
        return 1
    if mode == "hang":
        time.sleep(600)
        return 0

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
