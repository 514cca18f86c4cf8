"""Time to first paint and weight of the results page for the seed sweep, in a real browser.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tailtune_bench_paint SECRET_KEY=bench \\
        .venv/bin/python bench/ui/results_page_paint.py [--records 100000] [--repeat 7] [--reuse]

1. Seeds the seed sweep (examples/seed-sweep.yaml: 7 cells x 3 mixtures x 2 rates x 3 repeats =
   126 runs) and runs the real analysis, through bench/ui/results_page_bench.py's ``seed``
   (the page draws from the stored report, so its size, not the record count, is what matters).
2. Serves the app from this process (Django's live-server thread, static files included).
3. Opens the results page ``--repeat`` times in Debian's Chromium driven by Playwright (a new
   context each time: cold cache) and reads the browser's own paint timings
   (``first-paint``, ``first-contentful-paint``) and the bytes of every response (Resource
   Timing ``encodedBodySize``: what came over the wire, ``decodedBodySize``: after gzip).
4. Then opens every evidence part, as a reader wanting all of it would, and counts the bytes
   again: that is what the page cost before evidence was collapsed and plotly.js lazy.

Playwright never downloads a browser here: it drives /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "ui"))
sys.path.insert(0, str(ROOT / "bench" / "analysis"))

import results_page_bench  # noqa: E402  (sets up Django)
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.contrib.staticfiles.handlers import StaticFilesHandler  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.testcases import LiveServerThread  # noqa: E402

from apps.experiments.models import Experiment  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WEIGHT_JS = """async () => {
  // Paint entries can land after the load event: wait for them (at most 5 s).
  if (!performance.getEntriesByName('first-contentful-paint').length) {
    await new Promise((resolve) => {
      new PerformanceObserver((list, obs) => { obs.disconnect(); resolve(); }).observe({type: 'paint', buffered: true});
      setTimeout(resolve, 5000);
    });
  }
  const nav = performance.getEntriesByType('navigation')[0];
  const res = performance.getEntriesByType('resource');
  const sum = (k) => nav[k] + res.reduce((a, r) => a + r[k], 0);
  const paint = Object.fromEntries(performance.getEntriesByType('paint').map(p => [p.name, p.startTime]));
  return {wire: sum('encodedBodySize'), decoded: sum('decodedBodySize'), html: nav.decodedBodySize,
          requests: 1 + res.length, fp: paint['first-paint'], fcp: paint['first-contentful-paint'],
          ttfb: nav.responseStart, dcl: nav.domContentLoadedEventEnd, load: nav.loadEventEnd};
}"""


def serve() -> LiveServerThread:
    settings.ALLOWED_HOSTS = ["*"]
    thread = LiveServerThread("127.0.0.1", StaticFilesHandler, port=0)
    thread.daemon = True
    thread.start()
    thread.is_ready.wait()
    if thread.error:
        raise thread.error
    return thread


def session_cookie(base: str) -> dict[str, Any]:
    user, _ = get_user_model().objects.get_or_create(username="bench-paint", is_superuser=True)
    client = Client()
    client.force_login(user)
    return {"name": settings.SESSION_COOKIE_NAME, "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
            "url": base}  # fmt: skip


def measure(browser: Any, base: str, url: str, cookie: dict[str, Any], *, open_all: bool) -> dict[str, float]:
    ctx = browser.new_context(viewport={"width": 1360, "height": 900}, base_url=base)
    ctx.add_cookies([cookie])
    try:
        page = ctx.new_page()
        response = page.goto(url, wait_until="load")
        assert response is not None and response.status == 200, url
        first = page.evaluate(WEIGHT_JS)
        if not open_all:
            return first
        page.evaluate("document.querySelectorAll('details.evidence').forEach(d => { d.open = true; })")
        page.wait_for_selector("div[data-chart='heat-goodput'] .main-svg")
        page.wait_for_load_state("networkidle")
        return {
            **first,
            **{k: v for k, v in page.evaluate(WEIGHT_JS).items() if k in ("wire", "decoded", "requests")},
        }
    finally:
        ctx.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="parse the arguments only (no browser)")
    args = parser.parse_args(argv)
    if args.dry_run:
        print(f"dry run: {args.records} records, {args.repeat} loads, chromium {CHROMIUM}")
        return
    call_command("migrate", verbosity=0)
    experiment = Experiment.objects.filter(name=results_page_bench.NAME).first() if args.reuse else None
    if experiment is None:
        experiment = results_page_bench.seed(args.records)
    thread = serve()
    base = f"http://127.0.0.1:{thread.port}"
    url = f"/experiments/{experiment.pk}/results/"
    cookie = session_cookie(base)

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        measure(browser, base, url, cookie, open_all=False)  # warm: templates compiled
        first = [measure(browser, base, url, cookie, open_all=False) for _ in range(args.repeat)]
        opened = [measure(browser, base, url, cookie, open_all=True) for _ in range(max(args.repeat // 2, 1))]
        browser.close()
    thread.terminate()

    def med(rows: list[dict[str, float]], key: str) -> float:
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    print(
        f"\n{experiment.runs.count()} runs; results page, Chromium 1360x900, cold cache, median of {args.repeat}"
    )
    print(f"first byte (server)       {med(first, 'ttfb'):8.0f} ms")
    print(f"first paint               {med(first, 'fp'):8.0f} ms")
    print(f"first contentful paint    {med(first, 'fcp'):8.0f} ms")
    print(f"DOMContentLoaded          {med(first, 'dcl'):8.0f} ms")
    print(f"load                      {med(first, 'load'):8.0f} ms")
    print(f"HTML                      {med(first, 'html') / 1024:8.0f} KiB")
    print(f"on load: {med(first, 'requests'):.0f} requests, {med(first, 'wire') / 1024:.0f} KiB over the wire, "
          f"{med(first, 'decoded') / 1024:.0f} KiB decoded")  # fmt: skip
    print(f"every part opened: {med(opened, 'requests'):.0f} requests, {med(opened, 'wire') / 1024:.0f} KiB over the "
          f"wire, {med(opened, 'decoded') / 1024:.0f} KiB decoded (plotly.js included)")  # fmt: skip


if __name__ == "__main__":
    main()
