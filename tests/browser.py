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
from typing import Any, Self

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


def evaluate_in_package(browser: Any, package: str | os.PathLike, script: str, arg: Any = None) -> Any:
    """Serve ``package`` on loopback, open its ``manifest.json`` in a new page of ``browser`` (so that
    ``import('./kiln.js')`` resolves inside the package) and return ``script``'s result (:meth:`ConsoleLog.evaluate`);
    the page is closed afterwards."""
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        with serving(package) as url:
            page.goto(url + "manifest.json")
            return log.evaluate(script, arg)
    finally:
        page.close()


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


@contextmanager
def serving_tree(root: str | os.PathLike) -> Iterator[str]:
    """Serve a directory of packages (each in a subdirectory) like :func:`serving` serves one.

    Yields:
        The root's base URL, ``http://127.0.0.1:PORT/``.
    """
    import functools
    from http.server import ThreadingHTTPServer

    from kiln.runtime.serve import PackageRequestHandler

    handler = functools.partial(PackageRequestHandler, directory=str(Path(root).resolve()))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="kiln-test-tree-server", daemon=True)
    thread.start()
    try:
        yield server_url(server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


#: numpy dtype name -> (kiln.js Tensor type, numpy dtype of the bytes sent: float16 travels as its bits)
JS_TYPES = {"float32": ("float32", "float32"), "float16": ("float16", "uint16"), "int32": ("int32", "int32"),
            "int64": ("int64", "int64"), "bool": ("bool", "uint8"), "uint8": ("uint8", "uint8"),
            "int8": ("int8", "int8"), "uint16": ("uint16", "uint16"), "int16": ("int16", "int16")}

#: loads the package at ./{path}/ with {target, poison}, runs it on base64 feeds and returns base64 outputs
RUN_PACKAGE = """async ({path, target, feeds}) => {
  const kiln = await import(`./${path}/kiln.js`);
  const arrays = {float32: Float32Array, float16: Uint16Array, int32: Int32Array, int64: BigInt64Array, bool: Uint8Array,
                  uint8: Uint8Array, int8: Int8Array, uint16: Uint16Array, int16: Int16Array};
  const decode = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0)).buffer;
  const encode = (view) => {
    const raw = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
    let text = '';
    for (let i = 0; i < raw.length; i += 8192) text += String.fromCharCode(...raw.subarray(i, i + 8192));
    return btoa(text);
  };
  const session = await kiln.load(`./${path}/`, {target, poison: true});
  try {
    const inputs = {};
    for (const [name, {type, dims, data}] of Object.entries(feeds)) {
      let values = new arrays[type](decode(data));
      if (type === 'float16' && globalThis.Float16Array) values = new Float16Array(values.buffer);
      inputs[name] = new kiln.Tensor(type, values, dims);
    }
    const outputs = await session.run(inputs);
    const result = {target: session.target, outputs: {}};
    for (const [name, t] of Object.entries(outputs)) {
      let data = t.data;
      if (t.type === 'float16' && !(data instanceof Uint16Array)) data = new Uint16Array(data.buffer, data.byteOffset, data.length);
      result.outputs[name] = {type: t.type, dims: t.dims, data: encode(data)};
    }
    return result;
  } finally {
    session.destroy();
  }
}"""


class PackageRunner:
    """Run packages in one headless Chromium page on a chosen target (``webgpu`` or ``webgl2``).

    Packages are compiled into :attr:`root` (:meth:`package_dir`) and served from it; each
    :meth:`run` loads one with ``kiln.load(url, {target, poison: true})``, runs it and
    destroys the session. Use as a context manager; it owns its Playwright instance, so it must
    not overlap another sync Playwright in the same thread.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self._count = 0

    def __enter__(self) -> Self:
        from playwright.sync_api import sync_playwright

        self._serving = serving_tree(self.root)
        self.url = self._serving.__enter__()
        self._playwright = sync_playwright().start()
        self.browser = launch_chromium(self._playwright)
        self.page = self.browser.new_page()
        self.log = ConsoleLog(self.page)
        self.page.goto(self.url)
        return self

    def __exit__(self, *exc) -> None:
        self.browser.close()
        self._playwright.stop()
        self._serving.__exit__(*exc)

    def package_dir(self, name: str) -> Path:
        """A fresh directory path under the served root for a package (not created)."""
        self._count += 1
        return self.root / f"{self._count:04d}_{name}"

    def run(self, package: str | os.PathLike, inputs: dict[str, Any], target: str) -> dict[str, Any]:
        """Run ``package`` (a directory under :attr:`root`) on ``inputs`` (numpy arrays) with ``target``.

        Returns:
            Output name -> numpy array (dtype and shape as the page returned them).

        Raises:
            AssertionError: the page failed (with its console log), or ran another target.
        """
        import base64

        import numpy as np

        feeds = {}
        for name, array in inputs.items():
            a = np.array(array, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
            js_type, wire = JS_TYPES[a.dtype.name]
            feeds[name] = {"type": js_type, "dims": list(a.shape),
                           "data": base64.b64encode(a.view(wire).tobytes() if a.dtype.name == "float16"
                                                    else a.astype(wire).tobytes()).decode()}
        path = Path(package).resolve().relative_to(self.root.resolve()).as_posix()
        result = self.log.evaluate(RUN_PACKAGE, {"path": path, "target": target, "feeds": feeds})
        assert result["target"] == target, f"ran {result['target']}, not {target}"
        outputs = {}
        for name, out in result["outputs"].items():
            dtype = next(k for k, (js, _) in JS_TYPES.items() if js == out["type"])
            raw = np.frombuffer(base64.b64decode(out["data"]), dtype=JS_TYPES[dtype][1])
            arr = raw.view(np.float16) if dtype == "float16" else raw.astype(dtype)
            outputs[name] = arr.reshape(out["dims"])
        return outputs


_RUNNER: list[PackageRunner] = []


def shared_runner() -> PackageRunner:
    """The process's :class:`PackageRunner` (started on first use in a temporary directory; stop it
    with :func:`close_shared_runner`)."""
    if not _RUNNER:
        import tempfile

        root = tempfile.mkdtemp(prefix="kiln-browser-ops-")
        _RUNNER.append(PackageRunner(root).__enter__())
    return _RUNNER[0]


@contextmanager
def sync_playwright_alone():
    """A started sync Playwright (``with sync_playwright_alone() as playwright``), the shared runner's stopped first:
    two sync Playwright instances may not overlap in one thread ("using Playwright Sync API inside the asyncio
    loop"), and under pytest-xdist a worker runs its files in another order than a whole run does, so a runner
    that an earlier file's op checks started may still be up."""
    from playwright.sync_api import sync_playwright

    close_shared_runner()
    with sync_playwright() as playwright:
        yield playwright


def close_shared_runner() -> None:
    """Stop the shared runner, if one was started, and delete its packages."""
    import shutil

    while _RUNNER:
        runner = _RUNNER.pop()
        runner.__exit__(None, None, None)
        shutil.rmtree(runner.root, ignore_errors=True)
