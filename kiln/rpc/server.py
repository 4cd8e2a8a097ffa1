"""The Kiln RPC server (``kiln serve --rpc``): browser tabs join as devices, Python programs drive them.

One asyncio server (the ``websockets`` library) on one port answers:

- ``GET /`` (the join page), ``/rpc.js``, ``/kiln.js`` and the runtime's other modules: plain HTTP, no token needed (they hold no secret);
- ``/device?token=...``: the WebSocket a joining tab opens; it sends ``hello`` and then answers requests;
- ``/client?token=...``: the WebSocket a Python program (:mod:`kiln.rpc.client`) drives devices through.

The server relays each client request to the device it names and the device's reply back, checking
both on the way (docs/rpc-protocol.md). A wrong token is refused at the handshake (HTTP 403); a
malformed or out-of-limits message closes only the connection that sent it, with a logged reason.
Like the other runtimes, this module reads packages only: it never imports the compiler.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import itertools
import logging
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from kiln.errors import PackageError, ProtocolError, RpcError
from kiln.package.format import (
    MANIFEST,
    MANIFEST_DIGEST,
    check_file,
    check_manifest_digest,
    has_integrity,
    parse_manifest,
)
from kiln.rpc import protocol
from kiln.rpc.protocol import Message, decode, encode

log = logging.getLogger("kiln.rpc")

#: default TCP port of ``kiln serve --rpc``
DEFAULT_PORT = 9090
#: seconds a joining tab has to send ``hello``
HELLO_TIMEOUT_S = 30.0
#: default seconds a device has to answer one request (a large package loads slowly on a CPU adapter)
DEFAULT_REQUEST_TIMEOUT_S = 600.0
#: most devices, clients and packages per client at once
MAX_DEVICES = 64
MAX_CLIENTS = 16
MAX_PACKAGES_PER_CLIENT = 32
#: failed token attempts an address may make within TOKEN_FAILURE_WINDOW_S before all its handshakes are refused
#: (HTTP 429) until the window ends: a 32-character token cannot be guessed, and this keeps trying slow
MAX_TOKEN_FAILURES = 10
TOKEN_FAILURE_WINDOW_S = 60.0
#: connections still in their opening handshake at once (each may take OPEN_TIMEOUT_S), in all and from one address;
#: more are dropped at once (so one address cannot hold every slot)
MAX_HANDSHAKES = 64
MAX_HANDSHAKES_PER_ADDRESS = 16
#: seconds a connection has to complete its opening handshake (HTTP upgrade)
OPEN_TIMEOUT_S = 10.0
#: close codes (RFC 6455): policy violation (malformed or hostile message), server going away
CLOSE_POLICY = 1008
CLOSE_GOING_AWAY = 1001

_JS = Path(__file__).resolve().parents[1] / "js"
#: the files the server answers plain HTTP GETs with: URL path -> (file in kiln/js, content type)
PAGES = {
    "/": ("rpc.html", "text/html; charset=utf-8"),
    "/index.html": ("rpc.html", "text/html; charset=utf-8"),
    # rpc.js, kiln.js and the runtime's other ES modules (kiln.js imports them)
    **{f"/{f.name}": (f.name, "text/javascript; charset=utf-8") for f in sorted(_JS.glob("*.js"))},
    "/kiln.css": ("kiln.css", "text/css; charset=utf-8"),  # the pages' shared style sheet
    # the JSON Schema validator package.js imports (vendored from npm)
    **{f"/vendor/json-schema/{f.name}": (f"vendor/json-schema/{f.name}", "text/javascript; charset=utf-8")
       for f in sorted((_JS / "vendor" / "json-schema").glob("*.js"))},
}
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


class _Refused(Exception):
    """A request the server answers with an ``error`` reply (the connection stays open)."""

    def __init__(self, message: str, kind: str = "RpcError", source: str = "server"):
        super().__init__(message)
        self.kind = kind
        self.source = source


@dataclass
class _Device:
    id: int
    conn: ServerConnection
    info: dict[str, Any]
    pending: dict[int, asyncio.Future] = field(default_factory=dict)
    packages: dict[int, int] = field(default_factory=dict)  # package id -> client id


@dataclass
class _Client:
    id: int
    conn: ServerConnection
    packages: dict[int, int] = field(default_factory=dict)  # package id -> device id


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _host_name(host_header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:9090`` -> ``::1``)."""
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rpartition(":")[0] if host_header.count(":") == 1 else host_header


def _short(text: str, limit: int = 120) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes (WebSocket close reasons hold 123)."""
    data = text.encode()
    return text if len(data) <= limit else data[:limit - 3].decode(errors="ignore") + "..."


def _hello_info(header: dict[str, Any]) -> dict[str, Any]:
    """Check a device's ``hello`` and keep its description: adapter, features, limits, user agent."""
    version = protocol.field(header, "protocol", int)
    if version != protocol.PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version}; this server speaks {protocol.PROTOCOL_VERSION}")
    adapter = protocol.field(header, "adapter", dict)
    keys = ("vendor", "architecture", "device", "description")
    if not all(isinstance(adapter.get(k, ""), str) and len(adapter.get(k, "")) <= protocol.MAX_NAME_CHARS
               for k in keys):
        raise ProtocolError("'hello' message: adapter fields must be strings")
    features = protocol.field(header, "features", list)
    if len(features) > 128 or not all(isinstance(f, str) and len(f) <= 64 for f in features):
        raise ProtocolError("'hello' message: features must be at most 128 short strings")
    limits = protocol.field(header, "limits", dict)
    if len(limits) > 128 or not all(isinstance(k, str) and len(k) <= 64 and type(v) in (int, float)
                                    for k, v in limits.items()):
        raise ProtocolError("'hello' message: limits must be at most 128 numbers")
    agent = header.get("user_agent", "")
    if not isinstance(agent, str):
        raise ProtocolError("'hello' message: user_agent must be a string")
    return {"adapter": {k: adapter.get(k, "") for k in keys}, "features": sorted(features),
            "limits": dict(limits), "user_agent": agent[:512]}


def check_upload(files: list[dict[str, str]], blobs: list[memoryview]) -> dict[str, Any]:
    """Check an uploaded package: every file's SHA-256, the manifest, and the files it names.

    Args:
        files: ``[{path, sha256}]`` as the client sent them (checked by :func:`protocol.file_specs`).
        blobs: the files' bytes, in the same order.

    Returns:
        The parsed manifest.

    Raises:
        _Refused: a file whose bytes do not match its SHA-256, no or a bad ``manifest.json`` (format 1.8: one
            whose SHA-256 differs from ``manifest.sha256``, or no such file), or a weights file or kernel source that
            is missing or differs from what the manifest records.
    """
    digests = {}
    for entry, blob in zip(files, blobs, strict=True):
        digest = hashlib.sha256(blob).hexdigest()
        if digest != entry["sha256"]:
            raise _Refused(f"uploaded file {entry['path']}: SHA-256 mismatch (the bytes received differ from "
                           "the digest sent with them)", "PackageError")
        digests[entry["path"]] = (digest, blob.nbytes)
    if MANIFEST not in digests:
        raise _Refused(f"the upload has no {MANIFEST}", "PackageError")
    files_by_path = {f["path"]: blob for f, blob in zip(files, blobs, strict=True)}
    manifest_blob = files_by_path[MANIFEST]
    try:
        manifest = parse_manifest(bytes(manifest_blob), MANIFEST, "uploaded package")
        listed = {f["path"]: f for f in manifest.get("files", [])}
        if has_integrity(manifest):  # format 1.8: the manifest's own digest, and every kernel against the table
            digest = files_by_path.get(MANIFEST_DIGEST)
            check_manifest_digest(bytes(manifest_blob), None if digest is None else bytes(digest), "uploaded package")
        weights = manifest["weights"]["files"]
        kernels = manifest["targets"]["webgpu"]["kernels"]
        for w in weights:
            got = digests.get(w["path"])
            if got is None:
                raise PackageError(f"uploaded package: weights file {w['path']} is missing")
            if got != (w["sha256"], w["bytes"]):
                raise PackageError(f"uploaded package: weights file {w['path']} differs from the manifest's "
                                   "size or SHA-256 (corrupted or edited weights)")
        for k in kernels:
            if k["source"] not in digests:
                raise PackageError(f"uploaded package: kernel source {k['source']} is missing")
            if has_integrity(manifest):
                check_file(bytes(files_by_path[k["source"]]), listed.get(k["source"]),
                           f"uploaded package: kernel source {k['source']}")
    except PackageError as e:
        raise _Refused(str(e), "PackageError") from None
    except (KeyError, TypeError) as e:
        raise _Refused(f"uploaded package: malformed manifest (no or bad {e})", "PackageError") from None
    return manifest


class RpcServer:
    """The RPC server: relays work from Python clients to browser devices.

    Args:
        host: interface to bind; loopback by default. Another address must be asked for explicitly;
            browsers only expose WebGPU to pages from ``https://`` or loopback addresses.
        port: TCP port; 0 picks a free one (read :attr:`port` after :meth:`start`).
        token: the secret clients and devices must present; a random 32-character one by default.
        max_message_bytes: the largest message accepted from any peer (bigger: closed with code 1009).
        request_timeout_s: seconds a device has to answer a request before the client gets an error.
        max_token_failures, token_failure_window_s: after this many handshakes with a wrong token from one
            address within the window, every handshake from it is refused (HTTP 429) until the window ends.
        max_handshakes, max_handshakes_per_address: connections allowed in their opening handshake at once, in all
            and from one address (each has OPEN_TIMEOUT_S to finish it); a TCP connection beyond them is dropped at
            once, so idle sockets cannot pile up, and one address cannot hold every slot.

    Use ``await start()`` then ``await stop()`` inside an event loop, or :meth:`start_in_thread`
    and :meth:`stop_thread` from synchronous code.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, token: str | None = None,
                 max_message_bytes: int = protocol.DEFAULT_MAX_MESSAGE_BYTES,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S, max_token_failures: int = MAX_TOKEN_FAILURES,
                 token_failure_window_s: float = TOKEN_FAILURE_WINDOW_S, max_handshakes: int = MAX_HANDSHAKES,
                 max_handshakes_per_address: int = MAX_HANDSHAKES_PER_ADDRESS):
        self.host = host
        self.max_handshakes = max_handshakes
        self.max_handshakes_per_address = max_handshakes_per_address
        self._handshakes: dict[str, int] = {}  # address -> its connections in their opening handshake now
        self.max_token_failures = max_token_failures
        self.token_failure_window_s = token_failure_window_s
        self._token_failures: dict[str, tuple[int, float]] = {}  # address -> (failures, when the window began)
        self.port = port
        self.token = token or secrets.token_urlsafe(24)
        self.max_message_bytes = max_message_bytes
        self.request_timeout_s = request_timeout_s
        self._loopback = _is_loopback(host)
        self._devices: dict[int, _Device] = {}
        self._clients: dict[int, _Client] = {}
        self._peer_ids = itertools.count(1)
        self._request_ids = itertools.count(1)
        self._package_ids = itertools.count(1)
        self._last_request = 0
        self._tasks: set[asyncio.Task] = set()  # unloads after a client leaves (kept referenced until done)
        self._server: Server | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ addresses
    @property
    def url(self) -> str:
        """The WebSocket base address clients connect to, ``ws://HOST:PORT``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port}"

    @property
    def join_url(self) -> str:
        """The page a browser tab opens to join, with the token in the fragment: ``http://HOST:PORT/#token=...``."""
        return "http" + self.url[2:] + "/#token=" + self.token

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> None:
        """Bind and start serving (returns once listening).

        Raises:
            OSError: the address cannot be bound (for example, the port is in use).
        """
        self._stopped = asyncio.Event()
        rpc = self

        class Connection(ServerConnection):
            """A connection that counts against :attr:`max_handshakes` until its opening handshake ends."""

            async def handshake(self, *args: Any, **kwargs: Any) -> None:
                address = self.remote_address[0] if self.remote_address else "?"
                pending, here = sum(rpc._handshakes.values()), rpc._handshakes.get(address, 0)
                if pending >= rpc.max_handshakes or here >= rpc.max_handshakes_per_address:
                    # (the handler then finds it not open and drops it)
                    log.warning("dropped a connection from %s: %d others (%d from there) are still in their "
                                "handshake", _peer(self), pending, here)
                    return
                rpc._handshakes[address] = here + 1
                try:
                    await super().handshake(*args, **kwargs)
                finally:
                    rpc._handshakes[address] -= 1
                    if not rpc._handshakes[address]:
                        del rpc._handshakes[address]

        self._server = await serve(
            self._handle, self.host, self.port, process_request=self._process_request,
            max_size=self.max_message_bytes, max_queue=4, compression=None, ping_interval=20, ping_timeout=60,
            open_timeout=OPEN_TIMEOUT_S, create_connection=Connection, logger=logging.getLogger("kiln.rpc.websockets"))
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close every connection (code 1001) and stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._stopped is not None:
            self._stopped.set()

    async def serve_forever(self) -> None:
        """Serve until :meth:`stop` is called or the task is cancelled (:meth:`start` first)."""
        assert self._stopped is not None, "call start() first"
        try:
            await self._stopped.wait()
        finally:
            await self.stop()

    def start_in_thread(self) -> RpcServer:
        """Start serving on an event loop in a daemon thread; returns once listening.

        Returns:
            ``self``, with :attr:`port` set.

        Raises:
            OSError: the address cannot be bound.
        """
        ready = threading.Event()
        failure: list[OSError] = []

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            try:
                await self.start()
            except OSError as e:
                failure.append(e)
                return
            finally:
                ready.set()
            await self.serve_forever()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), name="kiln-rpc-server", daemon=True)
        self._thread.start()
        ready.wait()
        if failure or self._server is None:
            self._thread.join()
            if failure:
                raise failure[0]
            raise RpcError("the RPC server failed to start (see the traceback above)")
        return self

    def stop_thread(self, timeout: float = 10.0) -> None:
        """Stop a server started with :meth:`start_in_thread` and wait for its thread."""
        if self._thread is None or self._loop is None or self._stopped is None:
            return
        self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout)
        self._thread = None

    # ------------------------------------------------------------------ handshake
    def _process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        """Answer plain HTTP (the join page and its scripts) and check WebSocket handshakes."""
        path, _, query = request.path.partition("?")
        host = request.headers.get("Host", "")
        peer = _peer(conn)
        if self._loopback and not _is_loopback(_host_name(host)):
            log.warning("refused %s from %s: Host %r is not a loopback name", path, peer, host[:80])
            return conn.respond(HTTPStatus.FORBIDDEN, "this server answers loopback addresses only\n")
        if path in PAGES:
            return _page(conn, *PAGES[path])
        if path not in ("/device", "/client"):
            return conn.respond(HTTPStatus.NOT_FOUND, "not found\n")
        role = path[1:]
        address = conn.remote_address[0] if conn.remote_address else "?"
        failures, since = self._token_failures.get(address, (0, 0.0))
        now = time.monotonic()
        if now - since > self.token_failure_window_s:
            failures, since = 0, now
        if failures >= self.max_token_failures:
            wait = self.token_failure_window_s - (now - since)
            log.warning("refused %s from %s: %d failed token attempts", role, peer, failures)
            return conn.respond(HTTPStatus.TOO_MANY_REQUESTS, f"too many failed token attempts from this address; "
                                f"try again in {wait:.0f} s\n")
        token = urllib.parse.parse_qs(query).get("token", [""])[0]
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            self._token_failures[address] = (failures + 1, since)
            if len(self._token_failures) > 4096:  # many addresses: forget the oldest windows
                oldest = sorted(self._token_failures, key=lambda a: self._token_failures[a][1])[:2048]
                for a in oldest:
                    del self._token_failures[a]
            log.warning("refused %s from %s: bad token", role, peer)
            return conn.respond(HTTPStatus.FORBIDDEN, "bad token\n")
        origin = request.headers.get("Origin")
        if role == "client" and origin is not None:
            log.warning("refused client from %s: sent by a web page (Origin %r)", peer, origin[:80])
            return conn.respond(HTTPStatus.FORBIDDEN, "clients are programs, not web pages\n")
        if role == "device" and origin is not None and origin not in (f"http://{host}", f"https://{host}"):
            log.warning("refused device from %s: page of another origin (%r)", peer, origin[:80])
            return conn.respond(HTTPStatus.FORBIDDEN, "join from this server's own page\n")
        count, limit = (len(self._devices), MAX_DEVICES) if role == "device" else (len(self._clients), MAX_CLIENTS)
        if count >= limit:
            log.warning("refused %s from %s: already %d connected", role, peer, count)
            return conn.respond(HTTPStatus.SERVICE_UNAVAILABLE, f"too many {role}s\n")
        return None

    async def _handle(self, conn: ServerConnection) -> None:
        try:
            if conn.request.path.startswith("/device"):
                await self._device_session(conn)
            else:
                await self._client_session(conn)
        except ProtocolError as e:
            await _close(conn, CLOSE_POLICY, str(e))
        except ConnectionClosed:
            pass

    # ------------------------------------------------------------------ devices
    async def _device_session(self, conn: ServerConnection) -> None:
        try:
            first = await asyncio.wait_for(conn.recv(), HELLO_TIMEOUT_S)
        except TimeoutError:
            await _close(conn, CLOSE_POLICY, f"no hello within {HELLO_TIMEOUT_S:g} s")
            return
        msg = decode(first)
        if msg.type != "hello":
            raise ProtocolError(f"a device's first message must be 'hello', not {msg.type!r}")
        device = _Device(next(self._peer_ids), conn, _hello_info(msg.header))
        self._devices[device.id] = device
        adapter = " ".join(v for v in device.info["adapter"].values() if v) or "unknown adapter"
        log.info("device %d joined from %s: %s", device.id, _peer(conn), adapter)
        try:
            await conn.send(encode({"type": "welcome", "id": 0, "device": device.id,
                                    "protocol": protocol.PROTOCOL_VERSION}))
            async for data in conn:
                msg = decode(data)
                future = device.pending.get(msg.id)
                if future is None:
                    if not 0 < msg.id <= self._last_request:
                        raise ProtocolError(f"reply to request {msg.id}, which was never sent")
                    log.info("device %d: late reply to request %d ignored", device.id, msg.id)
                elif not future.done():
                    future.set_result(msg)
        except ProtocolError as e:
            await _close(conn, CLOSE_POLICY, f"device {device.id}: {e}")
        finally:
            del self._devices[device.id]
            for future in device.pending.values():
                if not future.done():
                    future.set_exception(_Refused(f"device {device.id} left before answering"))
            for package, client in device.packages.items():
                if client in self._clients:
                    self._clients[client].packages.pop(package, None)
            log.info("device %d left (%s)", device.id, _close_text(conn))

    async def _ask(self, device: _Device, header: dict[str, Any], blobs: list[memoryview], expect: str) -> Message:
        """Send a request to a device and wait for its reply of type ``expect``.

        Raises:
            _Refused: the device left, timed out, answered with an error, or sent a malformed reply
                (it is then disconnected).
        """
        request = next(self._request_ids)
        self._last_request = request
        future = asyncio.get_running_loop().create_future()
        device.pending[request] = future
        try:
            await device.conn.send(encode({**header, "id": request}, blobs))
            reply = await asyncio.wait_for(future, self.request_timeout_s)
        except ConnectionClosed:
            raise _Refused(f"device {device.id} left before answering") from None
        except TimeoutError:
            raise _Refused(f"device {device.id} did not answer the {header['type']!r} request within "
                           f"{self.request_timeout_s:g} s") from None
        finally:
            device.pending.pop(request, None)
        try:
            if reply.type == "error":
                kind, message = protocol.error_info(reply.header)
                raise _Refused(message, kind, "device")
            if reply.type != expect:
                raise ProtocolError(f"answered a {header['type']!r} request with {reply.type!r}")
            if expect == "result":
                protocol.tensor_specs(reply.header, "outputs", reply.blobs)
            elif expect == "timing":
                protocol.timing(reply.header, header["repeat"])
            elif expect == "measured":
                protocol.measured(reply.header, reply.blobs, len(header["candidates"]),
                                  min(header["sample"], header["output"]["elements"]))
        except ProtocolError as e:
            await _close(device.conn, CLOSE_POLICY, f"device {device.id}: {e}")
            raise _Refused(f"device {device.id} sent a malformed reply and was disconnected ({e})") from None
        return reply

    # ------------------------------------------------------------------ clients
    async def _client_session(self, conn: ServerConnection) -> None:
        client = _Client(next(self._peer_ids), conn)
        self._clients[client.id] = client
        log.info("client %d connected from %s", client.id, _peer(conn))
        handlers = {"devices": self._on_devices, "load": self._on_load, "run": self._on_run,
                    "time": self._on_time, "unload": self._on_unload, "measure": self._on_measure}
        try:
            async for data in conn:
                msg = decode(data)
                handler = handlers.get(msg.type)
                if handler is None:
                    raise ProtocolError(f"unknown request type {msg.type!r}")
                try:
                    header, blobs = await handler(client, msg)
                except _Refused as e:
                    header, blobs = {"type": "error", "source": e.source,
                                     "error": {"name": e.kind, "message": str(e)}}, []
                await conn.send(encode({**header, "id": msg.id}, blobs))
        except ProtocolError as e:
            await _close(conn, CLOSE_POLICY, f"client {client.id}: {e}")
        finally:
            del self._clients[client.id]
            for package, device_id in client.packages.items():
                device = self._devices.get(device_id)
                if device is not None:
                    device.packages.pop(package, None)
                    task = asyncio.ensure_future(self._unload_quietly(device, package))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            log.info("client %d left (%s)", client.id, _close_text(conn))

    async def _unload_quietly(self, device: _Device, package: int) -> None:
        try:
            await self._ask(device, {"type": "unload", "package": package}, [], "unloaded")
        except _Refused as e:
            log.info("device %d: could not unload package %d (%s)", device.id, package, e)

    def _device_of(self, header: dict[str, Any]) -> _Device:
        """The device a request names (structure errors: ProtocolError; an unknown device: _Refused)."""
        device_id = protocol.integer(header, "device", 0, 2**53 - 1)
        device = self._devices.get(device_id)
        if device is None:
            raise _Refused(f"no device {device_id} (joined: {', '.join(map(str, self._devices)) or 'none'})")
        return device

    def _package_of(self, client: _Client, header: dict[str, Any]) -> tuple[_Device, int]:
        package = protocol.integer(header, "package", 0, 2**53 - 1)
        device = self._device_of(header)
        if client.packages.get(package) != device.id:
            raise _Refused(f"no package {package} of this client on device {device.id} (load it first)")
        return device, package

    async def _on_devices(self, client: _Client, msg: Message) -> tuple[dict, list]:
        return {"type": "devices", "devices": [{"id": d.id, **d.info} for d in self._devices.values()]}, []

    async def _on_load(self, client: _Client, msg: Message) -> tuple[dict, list]:
        files = protocol.file_specs(msg.header, msg.blobs)
        device = self._device_of(msg.header)
        if len(client.packages) >= MAX_PACKAGES_PER_CLIENT:
            raise _Refused(f"a client may keep at most {MAX_PACKAGES_PER_CLIENT} packages loaded; unload some")
        await asyncio.to_thread(check_upload, files, msg.blobs)
        package = next(self._package_ids)
        reply = await self._ask(device, {"type": "load", "package": package, "files": [f["path"] for f in files]},
                                msg.blobs, "loaded")
        if device.id not in self._devices or client.id not in self._clients:
            raise _Refused(f"device {device.id} left while loading")
        client.packages[package] = device.id
        device.packages[package] = client.id
        timestamps = reply.header.get("timestamp_query") is True
        log.info("client %d: package %d loaded on device %d", client.id, package, device.id)
        return {"type": "loaded", "device": device.id, "package": package, "timestamp_query": timestamps}, []

    async def _on_run(self, client: _Client, msg: Message) -> tuple[dict, list]:
        inputs = protocol.tensor_specs(msg.header, "inputs", msg.blobs)
        device, package = self._package_of(client, msg.header)
        reply = await self._ask(device, {"type": "run", "package": package, "inputs": inputs}, msg.blobs, "result")
        return {"type": "result", "outputs": reply.header["outputs"]}, reply.blobs

    async def _on_time(self, client: _Client, msg: Message) -> tuple[dict, list]:
        inputs = protocol.tensor_specs(msg.header, "inputs", msg.blobs)
        repeat = protocol.integer(msg.header, "repeat", 1, protocol.MAX_REPEAT)
        warmup = protocol.integer(msg.header, "warmup", 0, protocol.MAX_WARMUP)
        clock = protocol.field(msg.header, "clock", str)
        if clock not in ("auto", "wall"):
            raise ProtocolError(f"'time' message: clock must be 'auto' or 'wall', not {clock[:40]!r}")
        device, package = self._package_of(client, msg.header)
        reply = await self._ask(device, {"type": "time", "package": package, "inputs": inputs, "repeat": repeat,
                                         "warmup": warmup, "clock": clock}, msg.blobs, "timing")
        clock, times, wall = protocol.timing(reply.header, repeat)
        return {"type": "timing", "clock": clock, "times_ms": times, "wall_ms": wall}, []

    async def _on_measure(self, client: _Client, msg: Message) -> tuple[dict, list]:
        protocol.measure_request(msg.header, msg.blobs)
        device = self._device_of(msg.header)
        keys = ("inputs", "output", "candidates", "batch", "repeat", "warmup", "sample")
        reply = await self._ask(device, {"type": "measure", **{k: msg.header[k] for k in keys}}, msg.blobs, "measured")
        return {"type": "measured", "clock": reply.header["clock"], "results": reply.header["results"]}, reply.blobs

    async def _on_unload(self, client: _Client, msg: Message) -> tuple[dict, list]:
        device, package = self._package_of(client, msg.header)
        client.packages.pop(package, None)
        device.packages.pop(package, None)
        await self._ask(device, {"type": "unload", "package": package}, [], "unloaded")
        return {"type": "unloaded", "package": package}, []


def _peer(conn: ServerConnection) -> str:
    address = conn.remote_address
    return f"{address[0]}:{address[1]}" if address else "?"


def _close_text(conn: ServerConnection) -> str:
    code, reason = conn.close_code, conn.close_reason
    return f"code {code}" + (f": {reason}" if reason else "") if code is not None else "connection lost"


async def _close(conn: ServerConnection, code: int, reason: str) -> None:
    """Close a connection with a logged reason (cut to fit a close frame)."""
    log.warning("closing connection from %s: %s", _peer(conn), reason)
    await conn.close(code, _short(reason))


def _page(conn: ServerConnection, filename: str, content_type: str) -> Response:
    try:
        text = (_JS / filename).read_text()
    except OSError as e:
        raise RpcError(f"the RPC page {filename} is missing from this Kiln installation ({e})") from None
    response = conn.respond(HTTPStatus.OK, text)
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = content_type
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response
