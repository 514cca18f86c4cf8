"""A small HTTP router of the tests' own (not a product feature): it forwards every request to
the backend it currently points at, streams the answer back, and names that backend in the
``X-Served-By`` header. ``POST /switch?to=NAME`` points it at another backend.

    python -m tests.support_router PORT candidate=http://127.0.0.1:8101 b0=http://127.0.0.1:8102

It prints "ready" once listening; the first backend named is the starting one.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator

import aiohttp
from aiohttp import web

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


def build_app(backends: dict[str, str], start: str) -> web.Application:
    state = {"current": start, "switches": 0}
    app = web.Application()

    async def switch(request: web.Request) -> web.Response:
        to = request.query.get("to", "")
        if to not in backends:
            return web.json_response({"error": f"unknown backend {to!r}"}, status=400)
        state["current"] = to
        state["switches"] += 1
        return web.json_response(state)

    async def status(request: web.Request) -> web.Response:
        return web.json_response(state)

    async def forward(request: web.Request) -> web.StreamResponse:
        name = state["current"]
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        session: aiohttp.ClientSession = app["session"]
        try:
            upstream = await session.request(
                request.method, backends[name] + request.path_qs, data=body, headers=headers
            )
        except aiohttp.ClientError as exc:
            return web.Response(
                status=502, text=f"backend {name} unreachable: {exc}", headers={"X-Served-By": name}
            )
        out = web.StreamResponse(status=upstream.status, headers={"X-Served-By": name})
        out.content_type = upstream.content_type
        await out.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
        finally:
            upstream.release()
        await out.write_eof()
        return out

    async def on_startup(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def on_cleanup(app: web.Application) -> None:
        await app["session"].close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/switch", switch)
    app.router.add_get("/router-status", status)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


@contextlib.contextmanager
def running_router(backends: dict[str, str]) -> Iterator[str]:
    """Start the router in its own process on a free port; yield its URL; stop it after."""
    from workers.engine.launcher import free_port

    port = free_port()
    args = [f"{name}={url}" for name, url in backends.items()]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support_router", str(port), *args], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(5)


def switch(url: str, to: str) -> int:
    """``python -m tests.support_router switch URL NAME``: the switch command a spec names."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(f"{url}/switch?to={to}", method="POST"), timeout=10)
    except urllib.error.HTTPError as exc:
        print(f"router refused the switch: {exc.read().decode()}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "switch":
        return switch(argv[1], argv[2])
    port = int(argv[0])
    backends = dict(item.split("=", 1) for item in argv[1:])
    app = build_app(backends, start=next(iter(backends)))

    async def serve() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
