"""Headless Chromium (Debian's, never a downloaded one) driven by Playwright against live_server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Playwright's sync API runs an event loop in this thread; the test body's ORM
# calls are still synchronous and never share a connection with that loop.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REPO = Path(__file__).resolve().parents[2]
PASSWORD = "pw-test-123"


def artifacts_dir() -> Path:
    path = Path(os.environ.get("TAILTUNE_ARTIFACTS") or REPO / "artifacts" / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


# Module scope, not session: Playwright's sync API keeps an asyncio loop running in the
# main thread while it is open, and code that runs its own loop (the replay client) cannot
# start one then. Closing it after each browser module leaves later tests a clean thread.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def new_page(browser: Any, live_server: Any) -> Iterator[Any]:
    """A fresh browser context per user (own cookies), closed after the test. Whatever the
    Content-Security-Policy blocks on any of its pages fails the test: the pages run with it."""
    contexts = []
    blocked: list[str] = []

    def watch(message: Any) -> None:
        if "Content Security Policy" in message.text:
            blocked.append(f"{message.location.get('url', '')}: {message.text}")

    def make() -> Any:
        ctx = browser.new_context(viewport={"width": 1360, "height": 900}, base_url=live_server.url)
        ctx.set_default_timeout(20_000)
        contexts.append(ctx)
        page = ctx.new_page()
        page.on("console", watch)
        return page

    yield make
    for ctx in contexts:
        ctx.close()
    assert not blocked, "the Content-Security-Policy blocked what a page needs:\n" + "\n".join(blocked)


def login(page: Any, username: str, password: str = PASSWORD) -> None:
    page.goto("/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url("**/")


def shot(page: Any, name: str) -> Path:
    path = artifacts_dir() / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
