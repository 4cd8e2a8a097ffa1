"""Helpers for browser tests: serve a package and drive Debian's Chromium through Playwright.

Headless Chromium exposes WebGPU on SwiftShader (a CPU Vulkan implementation) with
:data:`CHROMIUM_ARGS`, so these tests need no GPU; they need a page served from a
secure context, which ``http://127.0.0.1`` is. Playwright cannot download browsers
here, so Chromium is always launched from :data:`CHROMIUM`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kiln.runtime.serve import make_server, server_url

#: Debian's Chromium (package ``chromium``)
CHROMIUM = Path("/usr/bin/chromium")

#: flags that give headless Chromium a WebGPU adapter on SwiftShader, and keep it off the network;
#: with Chromium 156 only ``--enable-unsafe-webgpu`` is strictly needed (headless=True and
#: ``--headless=new`` both work), the SwiftShader flags keep older and newer builds on the same path
CHROMIUM_ARGS = [
    "--enable-unsafe-webgpu",
    "--enable-unsafe-swiftshader",
    "--use-angle=swiftshader",
    "--enable-features=Vulkan",
    "--no-sandbox",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

#: milliseconds Playwright waits for page work; SwiftShader runs a MobileNetV2 in seconds, so be generous
TIMEOUT_MS = 120_000


@contextmanager
def serving(package_dir: str | os.PathLike) -> Iterator[str]:
    """Serve a package directory on a free loopback port for the duration of the ``with`` block.

    Yields:
        The package's base URL, ``http://127.0.0.1:PORT/``.

    Raises:
        kiln.errors.PackageError: ``package_dir`` is not a Kiln package.
    """
    server = make_server(package_dir)
    thread = threading.Thread(target=server.serve_forever, name="kiln-test-server", daemon=True)
    thread.start()
    try:
        yield server_url(server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def launch_chromium(playwright: Any):
    """Launch headless Chromium with WebGPU from a started ``sync_playwright()`` instance.

    Returns:
        A Playwright ``Browser``; close it when done.
    """
    return playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)


class ConsoleLog:
    """Record a page's console errors and warnings and its uncaught exceptions.

    Attach it right after creating the page; :meth:`evaluate` and :meth:`wait_for`
    add what it recorded to their failure messages.
    """

    def __init__(self, page: Any):
        self.page = page
        self.lines: list[str] = []
        page.on("console", self._on_console)
        page.on("pageerror", lambda error: self.lines.append(f"uncaught: {error}"))
        page.set_default_timeout(TIMEOUT_MS)

    def _on_console(self, message: Any) -> None:
        if message.type in ("error", "warning"):
            self.lines.append(f"console.{message.type}: {message.text}")

    def report(self) -> str:
        """The recorded lines, one per line, or ``(no console errors)``."""
        return "\n".join(self.lines) if self.lines else "(no console errors)"

    def evaluate(self, script: str, arg: Any = None) -> Any:
        """``page.evaluate(script, arg)``; a failure raises AssertionError carrying the console log."""
        from playwright.sync_api import Error

        try:
            return self.page.evaluate(script, arg)
        except Error as e:
            raise AssertionError(f"page script failed: {e.message}\n--- browser console ---\n{self.report()}") from None

    def wait_for(self, selector: str, **state: Any) -> Any:
        """``page.wait_for_selector(selector, **state)``; a timeout raises AssertionError with the console log."""
        from playwright.sync_api import Error

        try:
            return self.page.wait_for_selector(selector, **state)
        except Error as e:
            status = self.page.text_content("#status") if self.page.query_selector("#status") else "(none)"
            raise AssertionError(f"waiting for {selector} failed: {e.message}\n#status: {status}\n"
                                 f"--- browser console ---\n{self.report()}") from None
