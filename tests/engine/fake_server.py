"""A stand-in for a vLLM server, for process-lifecycle tests (no model, starts in milliseconds).

Reads --port from the vLLM-style argv it is given and ignores the rest. Like
vLLM it runs a child process (its "engine core"), logs a ``non-default args``
line and serves /health, /v1/models, /metrics (cache_config_info) and
/version. FAKE_SERVER_MODE chooses: ok, die (log an error and exit 1), hang
(never listen), stubborn (ignore SIGTERM, so must be SIGKILLed, child too),
liar (log a max_num_seqs one higher than asked), no-otel (refuse
--otlp-traces-endpoint as an engine build without OpenTelemetry does, else serve). In every
mode that serves, POST /v1/completions streams ``max_tokens`` tokens, 5 ms apart, as vLLM does
with usage stats; given --otlp-traces-endpoint, it then posts the request's ``llm_request`` span
there as vLLM's exporter does (OTLP/HTTP protobuf, id ``cmpl-<X-Request-Id>-0``), for every
request whose trace index is not a multiple of FAKE_SERVER_SPAN_SKIP (unset: every request).
"""

from __future__ import annotations

import http.server
import json
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
    endpoint = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--otlp-traces-endpoint=")), None)
    if mode == "no-otel" and endpoint is not None:
        # As vLLM's config check words it when the opentelemetry packages are missing.
        print("Value error, OpenTelemetry is not available. Unable to configure tracing.", flush=True)
        child.kill()
        return 1
    skip = int(os.environ.get("FAKE_SERVER_SPAN_SKIP", "0") or 0)

    args: dict[str, object] = {}
    for arg in sys.argv[1:]:
        if arg.startswith("--no-"):
            args[arg[5:].replace("-", "_")] = False
        elif arg.startswith("--"):
            key, _, value = arg[2:].partition("=")
            args[key.replace("-", "_")] = (int(value) if value.isdigit() else value) if value else True
    if mode == "liar" and "max_num_seqs" in args:
        args["max_num_seqs"] = int(args["max_num_seqs"]) + 1  # type: ignore[call-overload]
    served = str(args.get("served_model_name", args.get("model")))
    logged = {k: ([v] if k == "served_model_name" else v) for k, v in args.items()}
    print(f"(APIServer pid={os.getpid()}) INFO [api_utils.py:286] non-default args: {logged!r}", flush=True)
    pages = {
        "/health": ("text/plain", ""),
        "/version": ("application/json", json.dumps({"version": "0.0.0-fake"})),
        "/v1/models": (
            "application/json",
            json.dumps({"data": [{"id": served, "max_model_len": args.get("max_model_len", 2048)}]}),
        ),
        "/metrics": (
            "text/plain",
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="16",enable_prefix_caching="{args.get("enable_prefix_caching", True)}",'
            f'kv_cache_memory_bytes="{args.get("kv_cache_memory_bytes", "None")}",num_gpu_blocks="8"}} 1.0\n',
        ),
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            kind, body = pages.get(self.path, ("text/plain", None))
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", kind)
            self.end_headers()
            self.wfile.write((body or "").encode())

        def do_POST(self) -> None:
            # A streamed completion of max_tokens tokens, 5 ms apart, with usage on every frame.
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path != "/v1/completions":
                self.send_response(404)
                self.end_headers()
                return
            tokens = int(body.get("max_tokens") or 8)
            prompt = body.get("prompt") or []
            arrived = time.monotonic()
            arrived_wall_ns = time.time_ns()  # vLLM starts the request's span at its arrival
            first = None
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(1, tokens + 1):
                time.sleep(0.005)
                frame = {
                    "choices": [
                        {"index": 0, "text": "x", "finish_reason": "length" if i == tokens else None}
                    ],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": i},
                }
                self.wfile.write(f"data: {json.dumps(frame)}\n\n".encode())
                self.wfile.flush()
                first = first or time.monotonic()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            request_id = self.headers.get("X-Request-Id")
            index = request_id.rpartition("-")[2] if request_id else ""
            if endpoint and request_id and not (skip and index.isdigit() and int(index) % skip == 0):
                ended = time.monotonic()
                export_span(
                    endpoint,
                    f"cmpl-{request_id}-0",
                    {"queue": 0.0005, "ttft": (first or ended) - arrived, "e2e": ended - arrived},
                    len(prompt),
                    tokens,
                    start_unix_ns=arrived_wall_ns,
                )

        def log_message(self, *args: object) -> None:
            pass

    delay = float(os.environ.get("FAKE_SERVER_START_DELAY", "0") or 0)
    time.sleep(delay)  # a slow start, before it listens
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    return 0


def export_span(
    endpoint: str, request_id: str, times: dict[str, float], prompt: int, tokens: int, *, start_unix_ns: int
) -> None:
    """POST one llm_request span to ``endpoint`` as vLLM's OTLP/HTTP exporter would."""
    import urllib.request

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def attr(key: str, value: float | int | str) -> KeyValue:
        if isinstance(value, str):
            return KeyValue(key=key, value=AnyValue(string_value=value))
        if isinstance(value, int):
            return KeyValue(key=key, value=AnyValue(int_value=value))
        return KeyValue(key=key, value=AnyValue(double_value=value))

    prefill = max(0.0, times["ttft"] - times["queue"])
    body = ExportTraceServiceRequest()
    span = body.resource_spans.add().scope_spans.add().spans.add()
    span.name = "llm_request"
    span.start_time_unix_nano = start_unix_ns
    span.attributes.extend(
        [
            attr("gen_ai.request.id", request_id),
            attr("gen_ai.latency.time_in_queue", times["queue"]),
            attr("gen_ai.latency.time_in_model_prefill", prefill),
            attr("gen_ai.latency.time_in_model_decode", times["e2e"] - times["ttft"]),
            attr("gen_ai.latency.time_to_first_token", times["ttft"]),
            attr("gen_ai.latency.e2e", times["e2e"]),
            attr("gen_ai.usage.prompt_tokens", prompt),
            attr("gen_ai.usage.completion_tokens", tokens),
        ]
    )
    request = urllib.request.Request(
        endpoint, data=body.SerializeToString(), headers={"Content-Type": "application/x-protobuf"}
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        answer.read()


if __name__ == "__main__":
    sys.exit(main())
