"""Serve a package directory over HTTP for the browser runtime (``kiln.js``) and its demo page.

Browsers only expose WebGPU and ``crypto.subtle`` to secure contexts, which
include ``http://127.0.0.1`` and ``http://localhost``; this server binds to
127.0.0.1 by default for that reason. Every response carries the
cross-origin isolation headers (so that a future WebAssembly fallback can use
threads through ``SharedArrayBuffer``) and ``Cache-Control: no-cache`` (so a
recompiled package is never mixed with stale cached files).

Like the native runtime, this module reads packages only: it never imports
the compiler.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import webbrowser
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

from kiln.package.format import read_manifest

#: MIME types of the files a package holds; anything else falls back to :mod:`mimetypes`.
MIME_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".wgsl": "text/plain; charset=utf-8",
    ".glsl": "text/plain; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".safetensors": "application/octet-stream",
    ".wasm": "application/wasm",
}

#: headers added to every response
RESPONSE_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cache-Control": "no-cache",
}


class PackageRequestHandler(SimpleHTTPRequestHandler):
    """Static file handler for one package directory.

    Serves files with :data:`MIME_TYPES`, adds :data:`RESPONSE_HEADERS` to every
    response, and logs only failed requests (status 400 and above) to stderr.
    Bind the directory with ``functools.partial(PackageRequestHandler, directory=...)``.
    """

    extensions_map: ClassVar[dict[str, str]] = {**SimpleHTTPRequestHandler.extensions_map, **MIME_TYPES}
    #: keep connections open: a page loads the manifest, every kernel and the weights in a burst
    protocol_version = "HTTP/1.1"

    def end_headers(self) -> None:
        """Add the cross-origin isolation and caching headers, then end the header block."""
        for name, value in RESPONSE_HEADERS.items():
            self.send_header(name, value)
        super().end_headers()

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Log a request only if it failed (status 400 or above)."""
        status = code.value if isinstance(code, HTTPStatus) else code
        if isinstance(status, int) and status >= 400:
            super().log_request(code, size)

    def log_error(self, format: str, *args) -> None:
        """Drop the handler's own error lines; :meth:`log_request` already reports failed requests."""


def make_server(package_dir: str | os.PathLike, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Create (but do not start) an HTTP server for a package directory.

    Args:
        package_dir: a package directory made by ``kiln compile``.
        host: interface to bind; keep a loopback address so browsers treat the page as a secure context.
        port: TCP port; 0 picks a free one (read it back from ``server.server_address[1]``).

    Returns:
        A bound :class:`http.server.ThreadingHTTPServer`; call ``serve_forever()`` to serve and
        ``shutdown()`` then ``server_close()`` to stop it.

    Raises:
        kiln.errors.PackageError: ``package_dir`` is missing or is not a readable Kiln package.
        OSError: the address cannot be bound (for example, the port is in use).
    """
    root = Path(package_dir).resolve()
    if not (root / "speech.json").is_file():  # a speech package's parts are packages (kiln/package/speech.py)
        read_manifest(root)
    handler = functools.partial(PackageRequestHandler, directory=str(root))
    return ThreadingHTTPServer((host, port), handler)


def server_url(server: ThreadingHTTPServer) -> str:
    """The ``http://host:port/`` address of a server made by :func:`make_server` (IPv4 hosts)."""
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/"


def serve(package_dir: str | os.PathLike, host: str = "127.0.0.1", port: int = 8000,
          open_browser: bool = False) -> None:
    """Serve a package directory until interrupted (Ctrl-C), printing its URL first.

    Args:
        package_dir: a package directory made by ``kiln compile``.
        host: interface to bind (see :func:`make_server`).
        port: TCP port; 0 picks a free one.
        open_browser: also open the demo page in the default web browser.

    Raises:
        kiln.errors.PackageError: ``package_dir`` is not a Kiln package.
        OSError: the address cannot be bound.
    """
    server = make_server(package_dir, host, port)
    url = server_url(server)
    print(f"Serving {Path(package_dir)} at {url} (Ctrl-C to stop)", flush=True)
    if (Path(package_dir) / "chat.html").is_file():  # a language model: its chat page is the demo
        url += "chat.html"
        print(f"chat with the model at {url}", flush=True)
    elif (Path(package_dir) / "transcribe.html").is_file():  # a speech package
        url += "transcribe.html"
        print(f"transcribe audio at {url}", flush=True)
    elif not (Path(package_dir) / "index.html").is_file():
        print("note: this package has no demo page (index.html); recompile it with this version of Kiln",
              file=sys.stderr, flush=True)
    if open_browser:
        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
