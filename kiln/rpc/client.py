"""The Python side of Kiln RPC: drive browser devices joined to a ``kiln serve --rpc`` server.

::

    import kiln.rpc
    remote = kiln.rpc.connect("ws://127.0.0.1:9090", token)     # the token `kiln serve --rpc` printed
    remote.wait_for_devices(1)                                   # a tab opened the join page
    remote.select(remote.devices()[0].id)
    remote.load("build/mobilenet_v2")                            # upload; the tab loads it on WebGPU
    logits = remote.run({"input": x})["logits"]                  # like kiln.load(...).run
    timing = remote.time({"input": x}, repeat=10)                # per-run device milliseconds

The connection is synchronous (``websockets.sync``) and carries one request at a time; use one
:class:`Remote` per thread. Tensors travel as raw little-endian bytes (docs/rpc-protocol.md).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time as _time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from kiln.errors import AuthError, KilnError, PackageError, ProtocolError, RemoteError, RpcError
from kiln.package.format import MANIFEST, MANIFEST_DIGEST, read_manifest, sha256_file, verify_weights
from kiln.rpc import protocol
from kiln.runtime.dynamic import bind_dims
from kiln.runtime.feeds import check_feeds

#: seconds to wait for the server to accept a connection
CONNECT_TIMEOUT_S = 10.0
#: default seconds to wait for one reply (loading a large package on a CPU adapter is slow)
REQUEST_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Device:
    """A browser tab joined to the server.

    Attributes:
        id: the server's number for it (positive; never reused while the server runs).
        adapter: the WebGPU adapter's ``vendor``, ``architecture``, ``device`` and ``description``
            as the browser reports them (empty strings where it hides them).
        features: the adapter's WebGPU features, sorted (``"timestamp-query"`` among them if it times runs).
        limits: the adapter's WebGPU limits that matter to Kiln packages, by spec name.
        user_agent: the browser's ``navigator.userAgent``.
    """

    id: int
    adapter: dict[str, str]
    features: tuple[str, ...]
    limits: dict[str, float]
    user_agent: str

    def describe(self) -> str:
        """One line: id, adapter and browser."""
        adapter = " ".join(v for v in self.adapter.values() if v) or "unknown adapter"
        return f"device {self.id}: {adapter} ({self.user_agent or 'unknown browser'})"


@dataclass(frozen=True)
class Measured:
    """One kernel candidate measured on a device, from :meth:`Remote.measure`.

    Attributes:
        ms: median milliseconds per dispatch on ``clock`` (``None`` if the candidate failed).
        sample: float32 output elements at ``floor(j * n / m)``, ``j < m`` (``None`` if it failed).
        total: sum of the whole output (NaN if an element was NaN, e.g. never written).
        abs_total: sum of the absolute values of the whole output.
        error: the device's error (shader compilation, validation) for a failed candidate.
        clock: ``"timestamp-query"`` or ``"wall"``.
    """

    ms: float | None
    sample: np.ndarray | None
    total: float
    abs_total: float
    error: str | None
    clock: str


@dataclass(frozen=True)
class Timing:
    """Per-run times of a model on a device, from :meth:`Remote.time`.

    Attributes:
        clock: ``"timestamp-query"`` (GPU timestamps around the compute pass, written by the device)
            or ``"wall"`` (the page's wall clock from submit until the device reports the work done).
        times_ms: milliseconds per timed run on ``clock``, in run order.
        wall_ms: wall-clock milliseconds of the same runs (equal to ``times_ms`` when ``clock`` is ``"wall"``).
    """

    clock: str
    times_ms: list[float]
    wall_ms: list[float]

    @property
    def median_ms(self) -> float:
        """The median of :attr:`times_ms`."""
        return statistics.median(self.times_ms)


def connect(url: str, token: str | None = None, *, timeout: float = CONNECT_TIMEOUT_S,
            request_timeout: float = REQUEST_TIMEOUT_S,
            max_message_bytes: int = protocol.DEFAULT_MAX_MESSAGE_BYTES) -> Remote:
    """Connect to a Kiln RPC server as a client.

    Args:
        url: the server, ``ws://HOST:PORT`` (``http://`` is accepted and the join page URL too, whose
            ``#token=`` fragment then supplies the token).
        token: the token the server printed at start.
        timeout: seconds to wait for the connection.
        request_timeout: seconds to wait for each reply.
        max_message_bytes: the largest reply accepted (keep it at least the server's limit).

    Returns:
        A connected :class:`Remote`.

    Raises:
        AuthError: the server refused the token.
        RpcError: no token, a bad URL, or no server answering there.
    """
    parts = urllib.parse.urlsplit(url)
    if token is None:
        token = urllib.parse.parse_qs(parts.fragment).get("token", [None])[0]
    if not token:
        raise RpcError("no token: pass the one `kiln serve --rpc` printed")
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss") or not parts.netloc:
        raise RpcError(f"{url!r} is not a ws:// (or http://) server address")
    address = f"{scheme}://{parts.netloc}/client?" + urllib.parse.urlencode({"token": token})
    shown = f"{scheme}://{parts.netloc}"
    stack = contextlib.ExitStack()
    try:
        ws = stack.enter_context(ws_connect(address, open_timeout=timeout, max_size=max_message_bytes,
                                            compression=None, close_timeout=5))
    except InvalidStatus as e:
        if e.response.status_code == 403:
            body = e.response.body.decode(errors="replace").strip() if e.response.body else "forbidden"
            raise AuthError(f"{shown} refused the connection: {body}") from None
        if e.response.status_code == 429:
            body = e.response.body.decode(errors="replace").strip() if e.response.body else "too many requests"
            raise RpcError(f"{shown} refused the connection: {body}") from None
        raise RpcError(f"{shown} refused the connection: HTTP {e.response.status_code}") from None
    except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as e:
        raise RpcError(f"cannot connect to a Kiln RPC server at {shown}: {e}") from None
    except ConnectionClosed as e:  # (the server dropped the connection mid-handshake: too many at once)
        raise RpcError(f"cannot connect to a Kiln RPC server at {shown}: the server closed the connection during the "
                       f"handshake ({e}); try again") from None
    return Remote(ws, stack, shown, request_timeout)


class RemotePackage:
    """A package loaded on one device, from :meth:`Remote.load`.

    Attributes:
        id: the server's number for it.
        device: the :class:`Device` it is loaded on.
        manifest: the package's manifest.
        timestamp_query: whether the device times runs with GPU timestamps.
    """

    def __init__(self, remote: Remote, package_id: int, device: Device, manifest: dict[str, Any],
                 timestamp_query: bool):
        self.id = package_id
        self.device = device
        self.manifest = manifest
        self.timestamp_query = timestamp_query
        self._remote = remote

    @property
    def inputs(self) -> list[dict[str, Any]]:
        """Input descriptions from the manifest: name, dtype, shape, symbolic_shape."""
        return self.manifest["inputs"]

    @property
    def outputs(self) -> list[dict[str, Any]]:
        """Output descriptions from the manifest."""
        return self.manifest["outputs"]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on the device, like :meth:`kiln.runtime.native.Session.run`.

        Args:
            feeds: input name -> array of the manifest's dtype and shape.

        Returns:
            Output name -> a new numpy array of the manifest's dtype and shape.

        Raises:
            ShapeError: an unknown, missing, wrongly typed or wrongly shaped input (checked before sending).
            RemoteError: the device failed (its error's class name is in ``kind``).
            RpcError: the device left, timed out, or the connection closed.
        """
        specs, blobs = protocol.arrays_to_blobs(self._feeds(feeds))
        reply = self._remote._request({"type": "run", "device": self.device.id, "package": self.id,
                                       "inputs": specs}, blobs, "result")
        outputs = protocol.blobs_to_arrays(protocol.tensor_specs(reply.header, "outputs", reply.blobs), reply.blobs)
        expected = {o["name"]: (o["dtype"], list(o["shape"])) for o in self.outputs}
        got = {k: (str(v.dtype), list(v.shape)) for k, v in outputs.items()}
        if got != expected:
            raise ProtocolError(f"device {self.device.id} returned outputs {got}; the manifest says {expected}")
        return outputs

    def time(self, feeds: dict[str, np.ndarray], repeat: int = 10, warmup: int = 1, clock: str = "auto") -> Timing:
        """Time the model's compute on the device (inputs written once; no uploads or readbacks timed).

        Args:
            feeds: as for :meth:`run`.
            repeat: timed runs, 1 to 1000.
            warmup: untimed runs first, 0 to 100.
            clock: ``"auto"`` (GPU timestamps when the device has ``timestamp-query``, else the wall
                clock) or ``"wall"``.

        Returns:
            A :class:`Timing`: ``repeat`` times in milliseconds and the clock that measured them.

        Raises:
            KilnError: ``repeat``, ``warmup`` or ``clock`` out of range.
            ShapeError, RemoteError, RpcError: as for :meth:`run`.
        """
        if not 1 <= repeat <= protocol.MAX_REPEAT or not 0 <= warmup <= protocol.MAX_WARMUP:
            raise KilnError(f"time: repeat must be in [1, {protocol.MAX_REPEAT}] and warmup in "
                            f"[0, {protocol.MAX_WARMUP}]; got {repeat} and {warmup}")
        if clock not in ("auto", "wall"):
            raise KilnError(f"time: clock must be 'auto' or 'wall', not {clock!r}")
        specs, blobs = protocol.arrays_to_blobs(self._feeds(feeds))
        reply = self._remote._request({"type": "time", "device": self.device.id, "package": self.id,
                                       "inputs": specs, "repeat": int(repeat), "warmup": int(warmup),
                                       "clock": clock}, blobs, "timing")
        return Timing(*protocol.timing(reply.header, repeat))

    def adapter_info(self) -> dict[str, Any]:
        """The device's adapter: see :meth:`Remote.adapter_info`."""
        return _adapter_info(self.device)

    def unload(self) -> None:
        """Free the package on the device (the connection's other packages stay loaded).

        Raises:
            RpcError: the server no longer knows the package, or the connection closed.
        """
        self._remote._request({"type": "unload", "device": self.device.id, "package": self.id}, [], "unloaded")
        if self._remote._current is self:
            self._remote._current = None

    def _feeds(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        checked = {spec["name"]: array for spec, array in check_feeds(self.inputs, feeds)}
        if self.manifest.get("dynamic_dims"):  # run-time dims: their bounds and agreement, before sending
            bind_dims(self.manifest, checked)
        return checked


class Remote:
    """A connection to a Kiln RPC server, used like a session: pick a device, load, run, time.

    Make it with :func:`connect`. :meth:`load` uploads a package to the selected device and makes
    it current; :meth:`run`, :meth:`time` and :meth:`adapter_info` act on the current package (or
    keep the :class:`RemotePackage` that :meth:`load` returns to use several). Closing the connection
    (:meth:`close`, or leaving a ``with`` block) frees its packages on the devices.
    """

    def __init__(self, ws: ClientConnection, stack: contextlib.ExitStack, url: str, request_timeout: float):
        self.url = url
        self.request_timeout = request_timeout
        self._ws = ws
        self._stack = stack
        self._ids = 0
        self._lock = threading.Lock()
        self._selected: Device | None = None
        self._current: RemotePackage | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; the server unloads this connection's packages."""
        self._stack.close()

    # ------------------------------------------------------------------ devices
    def devices(self) -> list[Device]:
        """The devices joined now, in the order they joined.

        Raises:
            RpcError: the connection closed.
        """
        reply = self._request({"type": "devices"}, [], "devices")
        entries = protocol.field(reply.header, "devices", list)
        try:
            return [Device(int(d["id"]), dict(d["adapter"]), tuple(d["features"]), dict(d["limits"]),
                           str(d["user_agent"])) for d in entries]
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"malformed device list from the server ({e})") from None

    def wait_for_devices(self, count: int = 1, timeout: float = 60.0) -> list[Device]:
        """Wait until at least ``count`` devices have joined; returns them all.

        Raises:
            RpcError: fewer than ``count`` joined within ``timeout`` seconds.
        """
        deadline = _time.monotonic() + timeout
        while True:
            devices = self.devices()
            if len(devices) >= count:
                return devices
            if _time.monotonic() > deadline:
                raise RpcError(f"{len(devices)} device(s) joined {self.url} within {timeout:g} s; waited for {count} "
                               "(open the join page that `kiln serve --rpc` printed in a browser with WebGPU)")
            _time.sleep(0.2)

    def select(self, device: int | Device) -> Device:
        """Send later :meth:`load` calls to ``device`` (an id or a :class:`Device`); returns it.

        Raises:
            RpcError: no such device is joined.
        """
        self._selected = self._find(device)
        return self._selected

    def _find(self, device: int | Device) -> Device:
        wanted = device.id if isinstance(device, Device) else int(device)
        for d in self.devices():
            if d.id == wanted:
                return d
        raise RpcError(f"no device {wanted} is joined to {self.url}")

    @property
    def selected(self) -> Device:
        """The selected device; with none selected and exactly one joined, that one.

        Raises:
            RpcError: none selected and zero or several devices joined.
        """
        if self._selected is None:
            devices = self.devices()
            if len(devices) != 1:
                raise RpcError(f"{len(devices)} devices are joined to {self.url}; choose one with select(id)"
                               if devices else f"no device is joined to {self.url}; open the join page in a browser")
            self._selected = devices[0]
        return self._selected

    def adapter_info(self) -> dict[str, Any]:
        """The selected device's adapter as the browser reports it.

        Returns:
            ``vendor``, ``architecture``, ``device``, ``description`` (str), ``features`` (list of
            str), ``limits`` (dict), ``user_agent`` (str) and ``backend_type`` (``"WebGPU (browser)"``).
        """
        device = self._current.device if self._current is not None else self.selected
        return _adapter_info(device)

    # ------------------------------------------------------------------ packages
    def load(self, package: str | os.PathLike, device: int | Device | None = None,
             verify: bool = True) -> RemotePackage:
        """Upload a package directory to a device, which loads it on WebGPU; it becomes the current package.

        Sends ``manifest.json`` (and ``manifest.sha256``, format 1.8), the weights files and the kernel sources, each
        with its SHA-256; the server checks them, and the manifest and kernels against the manifest's digest and
        ``files`` table, and the page checks them against the manifest again.

        Args:
            package: a package directory made by ``kiln compile``.
            device: where to load it (an id or a :class:`Device`; default: :attr:`selected`, which this
                does not change).
            verify: check the weights' SHA-256 against the manifest before sending.

        Returns:
            The :class:`RemotePackage`.

        Raises:
            PackageError: not a package, a file missing, or corrupted weights (locally or as uploaded).
            RemoteError: the device could not load it (e.g. ``DeviceError``: a limit its adapter lacks).
            RpcError: the upload exceeds the server's message limit, the device left, or it timed out.
        """
        root = Path(package)
        manifest = read_manifest(root)
        if verify:
            verify_weights(root, manifest)
        target = manifest["targets"].get("webgpu")
        if target is None:
            raise PackageError(f"{root}: package has no 'webgpu' target")
        paths = [MANIFEST, *([MANIFEST_DIGEST] if (root / MANIFEST_DIGEST).exists() else []),
                 *(f["path"] for f in manifest["weights"]["files"]), *dict.fromkeys(k["source"] for k in target["kernels"])]
        files, blobs = [], []
        for path in paths:
            file = root / path
            try:
                data = file.read_bytes()
            except OSError as e:
                raise PackageError(f"{root}: cannot read {path} ({e.strerror})") from None
            files.append({"path": path, "sha256": sha256_file(file)})
            blobs.append(data)
        target_device = self._find(device) if device is not None else self.selected
        reply = self._request({"type": "load", "device": target_device.id, "files": files}, blobs, "loaded")
        package_id = protocol.integer(reply.header, "package", 1, 2**53 - 1)
        self._current = RemotePackage(self, package_id, target_device, manifest,
                                      reply.header.get("timestamp_query") is True)
        return self._current

    @property
    def current(self) -> RemotePackage:
        """The package the last :meth:`load` returned.

        Raises:
            RpcError: nothing loaded yet.
        """
        if self._current is None:
            raise RpcError("no package loaded on this connection; call load(package_dir) first")
        return self._current

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the current package: see :meth:`RemotePackage.run`."""
        return self.current.run(feeds)

    def time(self, feeds: dict[str, np.ndarray], repeat: int = 10, warmup: int = 1, clock: str = "auto") -> Timing:
        """Time the current package: see :meth:`RemotePackage.time`."""
        return self.current.time(feeds, repeat=repeat, warmup=warmup, clock=clock)

    # ------------------------------------------------------------------ kernels
    def measure(self, inputs: list[np.ndarray], out_elements: int, candidates: list, device: int | Device | None = None,
                batch: int = 1, repeat: int = 5, warmup: int = 1, sample: int = 4096) -> list[Measured]:
        """Measure candidates of one kernel on a device (the tuner's measuring call; no package needed).

        Each candidate is a WGSL compute shader with entry point ``main`` that reads storage buffers
        ``0..n-1`` (``inputs``) and writes buffer ``n`` (``out_elements`` float32). The device compiles
        each, runs it once into a NaN-filled output (whose sample and sums come back for the
        correctness check), then times ``repeat`` passes of ``batch`` dispatches after ``warmup``
        untimed passes, with GPU timestamps when it has ``timestamp-query``.

        Args:
            inputs: float32 arrays, uploaded once for all candidates.
            out_elements: float32 elements of the output buffer.
            candidates: objects with ``source`` (WGSL) and ``dispatch`` (``(x, y, z)`` workgroups).
            device: the device (default: the selected one).
            batch, repeat, warmup: dispatches per timed pass (1-1024), timed passes (1-100), untimed passes (0-10).
            sample: output elements returned per candidate (at most 65536).

        Returns:
            One :class:`Measured` per candidate, in order.

        Raises:
            KilnError: arguments out of range. RpcError, RemoteError: as for :meth:`RemotePackage.run`.
        """
        if not (1 <= batch <= protocol.MAX_BATCH and 1 <= repeat <= protocol.MAX_MEASURE_REPEAT
                and 0 <= warmup <= protocol.MAX_MEASURE_WARMUP and 1 <= sample <= protocol.MAX_SAMPLE):
            raise KilnError(f"measure: batch, repeat, warmup or sample out of range ({batch}, {repeat}, {warmup}, "
                            f"{sample})")
        target = self._find(device) if device is not None else self.selected
        specs, blobs = protocol.arrays_to_blobs({f"in{i}": np.asarray(a, np.float32) for i, a in enumerate(inputs)})
        sources = [c.source.encode() for c in candidates]
        reply = self._request({"type": "measure", "device": target.id, "inputs": specs,
                               "output": {"dtype": "float32", "elements": int(out_elements)},
                               "candidates": [{"dispatch": [int(d) for d in c.dispatch]} for c in candidates],
                               "batch": int(batch), "repeat": int(repeat), "warmup": int(warmup),
                               "sample": int(sample)}, [*blobs, *sources], "measured")
        clock, results = protocol.measured(reply.header, reply.blobs, len(candidates), min(sample, out_elements))
        nan = float("nan")
        return [Measured(r["ms"], np.frombuffer(b, "<f4").copy() if r["ms"] is not None else None,
                         nan if r.get("total") is None else float(r["total"]),
                         nan if r.get("abs_total") is None else float(r["abs_total"]), r.get("error"), clock)
                for r, b in zip(results, reply.blobs, strict=True)]

    # ------------------------------------------------------------------ transport
    def _request(self, header: dict[str, Any], blobs: list, expect: str) -> protocol.Message:
        """Send a request and return the reply of type ``expect``; raise on an ``error`` reply."""
        with self._lock:
            self._ids += 1
            request = self._ids
            data = protocol.encode({**header, "id": request}, blobs)
            try:
                self._ws.send(data)
                while True:
                    raw = self._ws.recv(timeout=self.request_timeout)
                    reply = protocol.decode(raw)
                    if reply.id == request:
                        break
            except TimeoutError:
                self._ws.close()
                raise RpcError(f"no reply to {header['type']!r} from {self.url} within {self.request_timeout:g} s; "
                               "the connection was closed") from None
            except ConnectionClosed as e:
                raise RpcError(_closed_text(self.url, e)) from None
        if reply.type == "error":
            kind, message = protocol.error_info(reply.header)
            if reply.header.get("source") == "device":
                raise RemoteError(f"device {header.get('device')}: {kind}: {message}", kind, header.get("device"))
            if kind == "PackageError":
                raise PackageError(message)
            raise RpcError(message)
        if reply.type != expect:
            raise ProtocolError(f"the server answered a {header['type']!r} request with {reply.type!r}")
        return reply


def _closed_text(url: str, error: ConnectionClosed) -> str:
    frame = error.rcvd
    if frame is None:
        return f"the connection to {url} was lost"
    if frame.code == 1009:
        return (f"{url} closed the connection: message too big (raise the server's limit with "
                "`kiln serve --rpc --max-message-mib N`)")
    return f"{url} closed the connection (code {frame.code}{': ' + frame.reason if frame.reason else ''})"


def _adapter_info(device: Device) -> dict[str, Any]:
    return {**device.adapter, "features": list(device.features), "limits": dict(device.limits),
            "user_agent": device.user_agent, "backend_type": "WebGPU (browser)"}
