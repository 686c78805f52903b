"""Debian's Chromium, driven headless by Playwright, for the browser tests.

No ``playwright install``: the tests use the system's /usr/bin/chromium. They skip, with
the reason, only when that browser or the ``playwright`` package is missing; any other
failure to start is an error.

    with chromium() as browser:            # once per module or session
        with recorded_page(browser) as page:   # once per test
            page.load(html)
            ...
            page.assert_quiet()

A RecordedPage writes down every request, page error, console error and dialog, so a
test can assert that a page fetched nothing and ran cleanly.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is not installed (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package 'playwright' is not installed"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium Browser; skips the calling test(s) when it is absent."""
    reason = missing_browser()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class RecordedPage:
    """A Playwright page with what it asked for and what went wrong written down."""

    page: Any
    requests: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def load(self, html: str) -> None:
        """Put ``html`` in the page directly, so not even the document is fetched."""
        self.page.set_content(html, wait_until="load")

    def assert_quiet(self) -> None:
        assert self.requests == [], f"the page made requests: {self.requests[:5]}"
        assert self.page_errors == [], f"page errors: {self.page_errors[:5]}"
        assert self.console_errors == [], f"console errors: {self.console_errors[:5]}"
        assert self.dialogs == [], f"dialogs opened: {self.dialogs[:5]}"

    def __getattr__(self, name: str) -> Any:
        # Everything else is the Playwright page's own API (click, locator, keyboard ...).
        if name == "page":
            raise AttributeError(name)
        return getattr(self.page, name)


@contextmanager
def recorded_page(browser: Any, **context_options: Any) -> Iterator[RecordedPage]:
    """A fresh page (in its own context) that records requests, errors and dialogs."""
    context = browser.new_context(**context_options)
    try:
        recorded = RecordedPage(context.new_page())
        page = recorded.page
        page.on("request", lambda request: recorded.requests.append(f"{request.method} {request.url}"))
        page.on("pageerror", lambda error: recorded.page_errors.append(str(error)))
        page.on(
            "console",
            lambda message: recorded.console_errors.append(message.text) if message.type == "error" else None,
        )

        def on_dialog(dialog: Any) -> None:
            recorded.dialogs.append(f"{dialog.type}: {dialog.message}")
            dialog.dismiss()

        page.on("dialog", on_dialog)
        yield recorded
    finally:
        context.close()
