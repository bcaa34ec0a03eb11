"""Playwright driving Debian's headless Chromium against the live server, for the console's browser tests.

Chromium comes from Debian's `chromium` package (never `playwright install`). Screenshots go to
var/test-artifacts/browser/, and also to docs/images/ when DOC_SCREENSHOTS=1 (`make screenshots`):
the pictures in docs/operators-admin.md come from a test run.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager

import pytest

from tests.support.operators import PASSWORD, current_code
from tests.support.processes import ROOT, VAR_DIR

CHROMIUM = os.environ.get("CHROMIUM_BIN") or shutil.which("chromium") or next(
    (p for p in ("/usr/bin/chromium",) if os.path.exists(p)), None)
# What Chromium needs on this machine: no sandbox (containers, root), no GPU, nothing phoning home.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = VAR_DIR / "test-artifacts" / "browser"
DOC_IMAGES = ROOT / "docs" / "images"

needs_chromium = [
    pytest.mark.live,
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="browser tests skipped: Chromium not found. Install Debian's package "
                                                "(as root: apt-get update && apt-get install -y chromium) or set "
                                                "CHROMIUM_BIN to a Chromium binary"),
]


@contextmanager
def browser_page(width: int = 1400, height: int = 900):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for stale in ARTIFACTS.glob("failure.*"):
        stale.unlink()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": width, "height": height})
        page.set_default_timeout(30_000)
        try:
            yield page
        except Exception:
            shot(page, "failure")  # what the browser showed when the test failed
            (ARTIFACTS / "failure.html").write_text(page.content())
            raise
        finally:
            browser.close()


def shot(page, name: str, *, doc: bool = False) -> None:
    """A full-page screenshot; `doc`: one of the pictures docs/operators-admin.md shows."""
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if doc and os.environ.get("DOC_SCREENSHOTS") == "1":
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOC_IMAGES / f"{name}.png")


def code_for(username: str) -> str:
    """The code `username`'s authenticator shows now. Read in a thread of its own: Playwright's sync API
    runs an event loop in this one, where Django refuses database work."""
    from concurrent.futures import ThreadPoolExecutor

    from django.contrib.auth import get_user_model
    from django.db import connection

    def read() -> str:
        try:
            return current_code(get_user_model().objects.get(username=username))
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(read).result()


def log_in(page, base_url: str, username: str, next_path: str = "/admin/", *, second_factor: bool = True) -> None:
    """Log in with the password and, unless told not to, the code the user's authenticator shows now."""
    page.goto(f"{base_url}/admin/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    if second_factor:
        page.fill("#id_otp_token", code_for(username))
    page.click("input[type=submit]")
