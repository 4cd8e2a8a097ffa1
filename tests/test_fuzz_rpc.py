"""Fuzzing the RPC wire format and server (issue 19; docs/rpc-protocol.md): whatever bytes a client or a device sends,
the server answers with a well-formed reply or closes only that connection with code 1008 (policy) or 1009 (too
big), and keeps serving everyone else; the message decoder and its field checks end every input in a
:class:`~kiln.errors.ProtocolError` (a :class:`~kiln.errors.KilnError`) with a one-line message or a valid message.

Three harnesses over a real :class:`kiln.rpc.RpcServer` on a loopback port, with fake peers that are raw WebSocket
connections sending real bytes (a fake device stands in for a browser tab, so the device's replies can be anything):

- requests from a client: valid requests of every type, their JSON headers edited (any value anywhere, keys
  deleted or added) or their bytes mutated;
- replies from a device: the fake device answers the server's requests with edited or mutated replies;
- the decoder alone: mutated messages, arbitrary bytes and edited headers through :func:`kiln.rpc.protocol.decode`
  and every field check the server applies (many more inputs a second).

Hypothesis inputs are fixed in the suite; ``python -m tools.fuzz_campaign rpc`` runs fresh ones for a time.
"""

from __future__ import annotations

import copy
import hashlib
import threading
import urllib.parse

import numpy as np
import pytest
from conftest import save_tiny_relu_matmul
from fuzzing import fuzz_settings, mutated
from hypothesis import given
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

import kiln
import kiln.rpc
from kiln.errors import KilnError
from kiln.rpc import protocol, server
from kiln.rpc.protocol import decode, encode

FUZZ = fuzz_settings(40)
FAST = fuzz_settings(400)

#: JSON values of any shape, the extremes included
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.sampled_from([0, -1, 1, 2**31, 2**53, 2**63])
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12) | st.sampled_from(["..", "/", "a" * 300]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
EXTREMES = [0, 1, 7, 8, 0xFFFFFFFF, 0x7FFFFFFF, 1 << 20]
#: close codes a misbehaving peer may get: policy violation, message too big
CLOSES = (1008, 1009)


@st.composite
def edited(draw, header: dict) -> dict:
    """``header`` with 1 to 3 edits: a value anywhere (nested too) replaced by any JSON value, a key deleted or a
    key added."""
    h = copy.deepcopy(header)
    for _ in range(draw(st.integers(1, 3))):
        # a path to a container in the header, then an edit there
        node = h
        while True:
            children = [k for k, v in (node.items() if isinstance(node, dict) else enumerate(node))
                        if isinstance(v, (dict, list)) and v]
            if not children or draw(st.booleans()):
                break
            node = node[draw(st.sampled_from(children))]
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        kind = draw(st.sampled_from(["replace", "delete", "add"]))
        if kind == "replace" and keys:
            node[draw(st.sampled_from(keys))] = draw(JSON)
        elif kind == "delete" and keys:
            del node[draw(st.sampled_from(keys))]
        elif isinstance(node, dict):
            node[draw(st.text(max_size=8))] = draw(JSON)
        else:
            node.append(draw(JSON))
    return h


def frame(header: dict, blobs: list[bytes]) -> bytes:
    """``header`` and ``blobs`` framed even where the header is not what :func:`encode` accepts (it sets ``blobs``
    and refuses nothing JSON can hold)."""
    import json

    text = json.dumps({**header, "blobs": header.get("blobs", [len(b) for b in blobs])}).encode()
    parts = [protocol.MAGIC, len(text).to_bytes(4, "little"), text, bytes(protocol.align8(len(text)) - len(text))]
    for b in blobs:
        parts += [b, bytes(protocol.align8(len(b)) - len(b))]
    return b"".join(parts)


def message(valid: tuple[dict, list[bytes]]):
    """A message built from a valid ``(header, blobs)``: as it is, its header edited, or its bytes mutated."""
    header, blobs = valid
    return st.one_of(st.just(encode(header, blobs)),
                     edited(header).map(lambda h: frame(h, blobs)),
                     mutated(encode(header, blobs), "<I", EXTREMES))


# ------------------------------------------------------------------------------------------------ the live server
@pytest.fixture(scope="module")
def rpc():
    """A server with short limits: 1 MiB messages, 1 s for a device's answer (the fake device answers at once)."""
    s = kiln.rpc.RpcServer("127.0.0.1", 0, max_message_bytes=1 << 20, request_timeout_s=1).start_in_thread()
    yield s
    s.stop_thread()


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_rpc")
    save_tiny_relu_matmul(root / "tiny.onnx", np.array([[1, -2], [3, -4]], np.float32))
    pkg = kiln.compile(root / "tiny.onnx", root / "tiny", force=True)
    from kiln.package.format import MANIFEST, MANIFEST_DIGEST, read_manifest

    m = read_manifest(pkg)
    paths = [MANIFEST, MANIFEST_DIGEST, *(f["path"] for f in m["weights"]["files"]),
             *dict.fromkeys(k["source"] for k in m["targets"]["webgpu"]["kernels"])]
    blobs = [(pkg / p).read_bytes() for p in paths]
    return [{"path": p, "sha256": hashlib.sha256(b).hexdigest()} for p, b in zip(paths, blobs)], blobs


def _connect(rpc, role: str):
    """An open WebSocket to ``role``'s endpoint (entered: websockets wants its connections used as context
    managers; the fuzz peers outlive one block, so they are closed by hand)."""
    query = urllib.parse.urlencode({"token": rpc.token})
    return ws_connect(f"{rpc.url}/{role}?{query}", max_size=None, compression=None, open_timeout=10).__enter__()


HELLO = {"type": "hello", "id": 0, "protocol": protocol.PROTOCOL_VERSION,
         "adapter": {"vendor": "fake", "device": "fuzz"}, "features": ["shader-f16"],
         "limits": {"maxBufferSize": 1 << 28}, "user_agent": "fuzz"}


def _valid_reply(kind: str, h: dict, rid: int) -> tuple[dict, list[bytes]]:
    """What a well-behaved device answers a request of type ``kind``, header ``h`` and id ``rid`` with."""
    if kind == "load":
        return {"type": "loaded", "id": rid, "package": h["package"], "timestamp_query": False}, []
    if kind == "run":
        y = np.zeros((1, 2), np.float32).tobytes()
        return {"type": "result", "id": rid, "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 2]}]}, [y]
    if kind == "time":
        return {"type": "timing", "id": rid, "clock": "wall", "times_ms": [0.5] * h["repeat"],
                "wall_ms": [0.6] * h["repeat"]}, []
    if kind == "measure":
        n = min(h["sample"], h["output"]["elements"])
        return ({"type": "measured", "id": rid, "clock": "wall",
                 "results": [{"ms": 1.0, "error": None, "total": 0.0, "abs_total": 0.0} for _ in h["candidates"]]},
                [bytes(4 * n) for _ in h["candidates"]])
    if kind == "unload":
        return {"type": "unloaded", "id": rid, "package": h["package"]}, []
    return {"type": "error", "id": rid, "error": {"name": "Error", "message": "fake device"}}, []


#: placeholders for the ids a message is drawn before they are known (hypothesis draws must not depend on the
#: server's state): the request id of a device's reply, the fake device's id and the loaded package's id; each is
#: replaced by the id, padded with spaces (which JSON allows), where it survived the edits
ID_SLOT, DEVICE_SLOT, PACKAGE_SLOT = 999999999, 999999998, 999999997


def fill(data: bytes, slots: dict[int, int]) -> bytes:
    """``data`` with each placeholder of ``slots`` replaced by its id."""
    for slot, value in slots.items():
        data = data.replace(str(slot).encode(), str(value).ljust(len(str(slot))).encode())
    return data


def requests(package) -> dict[str, tuple[dict, list[bytes]]]:
    """A valid request of every type, uploading ``package`` (``(files, blobs)``), with placeholders for the device
    and the package (:func:`fill`)."""
    d, p = DEVICE_SLOT, PACKAGE_SLOT
    x = [{"name": "x", "dtype": "float32", "shape": [1, 2]}]
    xb = [np.ones((1, 2), np.float32).tobytes()]
    files, blobs = package
    return {
        "devices": ({"type": "devices", "id": 2}, []),
        "load": ({"type": "load", "id": 3, "device": d, "files": files}, blobs),
        "run": ({"type": "run", "id": 4, "device": d, "package": p, "inputs": x}, xb),
        "time": ({"type": "time", "id": 5, "device": d, "package": p, "inputs": x, "repeat": 3, "warmup": 1,
                  "clock": "auto"}, xb),
        "measure": ({"type": "measure", "id": 6, "device": d, "inputs": x, "candidates": [{"dispatch": [1, 1, 1]}],
                     "output": {"dtype": "float32", "elements": 4}, "batch": 1, "repeat": 1, "warmup": 0,
                     "sample": 4}, [*xb, b"@compute fn main() {}"]),
        "unload": ({"type": "unload", "id": 7, "device": d, "package": p}, []),
    }


class FakeDevice:
    """A device that joins with ``hello`` and answers every request from a thread: with :attr:`answer` when set
    (then cleared: one hostile reply; :data:`ID_SLOT` replaced by the request's id), else as a well-behaved device
    does."""

    def __init__(self, rpc):
        self.ws = _connect(rpc, "device")
        self.ws.send(encode(HELLO))
        self.id = decode(self.ws.recv(timeout=10)).header["device"]
        self.answer: bytes | None = None
        self.closed: int | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while True:
                request = decode(self.ws.recv())
                answer, self.answer = self.answer, None
                self.ws.send(fill(answer, {ID_SLOT: request.id}) if answer is not None
                             else encode(*_valid_reply(request.type, request.header, request.id)))
        except ConnectionClosed as e:
            self.closed = e.rcvd.code if e.rcvd else -1

    def close(self) -> None:
        self.ws.close()
        self.thread.join(10)


class Peers:
    """A fake device and a client with the tiny package loaded on it, made again when the server drops either."""

    def __init__(self, rpc, package):
        self.rpc, self.package = rpc, package
        self.device = self.client = None
        self.package_id = 0

    def ready(self):
        if self.device is None or self.device.closed is not None:
            self.device = FakeDevice(self.rpc)
            self.close_client()
        if self.client is None:
            self.client = _connect(self.rpc, "client")
            files, blobs = self.package
            reply = self.request(encode({"type": "load", "id": 1, "device": self.device.id, "files": files}, blobs))
            assert reply.type == "loaded", reply.header
            self.package_id = reply.header["package"]
        return self

    def request(self, data: bytes):
        """Send ``data`` from the client; the decoded reply, or None when the server closed the client (checked to
        be with 1008 or 1009)."""
        try:
            self.client.send(data)
            return decode(self.client.recv(timeout=30))
        except ConnectionClosed as e:
            assert e.rcvd is not None and e.rcvd.code in CLOSES, e
            assert e.rcvd.reason, "the close frame gives a reason"
            self.client = None
            return None

    def close_client(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def fill(self, data: bytes) -> bytes:
        """``data`` with the device's and the package's ids in their placeholders."""
        return fill(data, {DEVICE_SLOT: self.device.id, PACKAGE_SLOT: self.package_id})

    def alive(self) -> None:
        """The server still answers a fresh client (and the fake device, when joined, is listed)."""
        with _connect(self.rpc, "client") as ws:
            ws.send(encode({"type": "devices", "id": 1}))
            reply = decode(ws.recv(timeout=30))
        assert reply.type == "devices"
        if self.device is not None and self.device.closed is None:
            assert self.device.id in {d["id"] for d in reply.header["devices"]}


@pytest.fixture(scope="module")
def peers(rpc, package):
    p = Peers(rpc, package)
    yield p
    p.close_client()
    if p.device is not None:
        p.device.close()


REQUEST_TYPES = ["devices", "load", "run", "time", "measure", "unload"]
REPLIES = {"loaded", "result", "timing", "measured", "unloaded", "devices", "error"}


@FUZZ
@given(data=st.data(), kind=st.sampled_from(REQUEST_TYPES))
def test_fuzzed_client_requests(peers, data, kind):
    """A client's request of any shape gets a well-formed reply or closes that client alone (1008/1009)."""
    peers.ready()
    reply = peers.request(peers.fill(data.draw(message(requests(peers.package)[kind]), "request")))
    if reply is not None:
        assert reply.type in REPLIES, reply.header
        if reply.type == "error":
            protocol.error_info(reply.header)
        if kind in ("unload", "load"):  # (the package may be gone, or another loaded: start afresh)
            peers.close_client()
    peers.alive()


@FUZZ
@given(data=st.data(), kind=st.sampled_from(["run", "time", "measure", "unload"]))
def test_fuzzed_device_replies(peers, data, kind):
    """A device's reply of any shape reaches the client as a result or an error, never a hang or a dropped client;
    a malformed reply disconnects only that device (1008)."""
    peers.ready()
    request = requests(peers.package)[kind]
    peers.device.answer = peers.fill(data.draw(message(_valid_reply(kind, request[0], ID_SLOT)), "reply"))
    reply = peers.request(peers.fill(encode(*request)))
    assert reply is not None, "a valid request closed the client"
    assert reply.type in REPLIES, reply.header
    if reply.type == "error":
        protocol.error_info(reply.header)
    if kind == "unload":
        peers.close_client()
    peers.device.thread.join(0.2)
    if peers.device.closed is not None:
        assert peers.device.closed in CLOSES, peers.device.closed
    peers.alive()


@FUZZ
@given(data=st.data())
def test_fuzzed_hello(rpc, data):
    """A joining device's ``hello`` of any shape gets ``welcome`` or a close with 1008/1009."""
    with _connect(rpc, "device") as ws:
        try:
            ws.send(data.draw(message((HELLO, [])), "hello"))
            welcome = decode(ws.recv(timeout=30))
            assert welcome.type == "welcome"
        except ConnectionClosed as e:
            assert e.rcvd is not None and e.rcvd.code in CLOSES, e


# ------------------------------------------------------------------------------------------------ the decoder
def _checks(msg, repeat: int = 3, candidates: int = 1, sample: int = 4) -> None:
    """Every field check the server applies to a message of ``msg``'s type."""
    h, b = msg.header, msg.blobs
    checks = {
        "hello": lambda: server._hello_info(h),
        "load": lambda: server.check_upload(protocol.file_specs(h, b), b),
        "run": lambda: protocol.tensor_specs(h, "inputs", b),
        "time": lambda: (protocol.tensor_specs(h, "inputs", b), protocol.integer(h, "repeat", 1, protocol.MAX_REPEAT)),
        "measure": lambda: protocol.measure_request(h, b),
        "result": lambda: protocol.tensor_specs(h, "outputs", b),
        "timing": lambda: protocol.timing(h, repeat),
        "measured": lambda: protocol.measured(h, b, candidates, sample),
        "error": lambda: protocol.error_info(h),
    }
    if msg.type in checks:
        checks[msg.type]()


def _contract(data: bytes) -> None:
    try:
        _checks(decode(data))
    except (KilnError, server._Refused) as e:
        assert str(e) and "\n" not in str(e), repr(e)


@pytest.fixture(scope="module")
def valid_messages(package) -> list[tuple[dict, list[bytes]]]:
    x = [{"name": "x", "dtype": "float32", "shape": [1, 2]}]
    xb = [np.ones((1, 2), np.float32).tobytes()]
    return [(HELLO, []), *requests(package).values(),
            ({"type": "result", "id": 4, "outputs": x}, xb),
            ({"type": "timing", "id": 5, "clock": "wall", "times_ms": [1, 2, 3], "wall_ms": [1, 2, 3]}, []),
            ({"type": "measured", "id": 6, "clock": "wall",
              "results": [{"ms": 1.0, "error": None, "total": 0.0, "abs_total": 0.0}]}, [bytes(16)]),
            ({"type": "error", "id": 6, "error": {"name": "DeviceError", "message": "lost"}}, [])]


@FAST
@given(data=st.data())
def test_decoder_and_field_checks(valid_messages, data):
    """Mutated and edited messages of every type, through the decoder and the server's field checks."""
    valid = data.draw(st.sampled_from(valid_messages))
    _contract(data.draw(message(valid)))


@FAST
@given(st.binary(max_size=256) | st.binary(max_size=64).map(lambda b: protocol.MAGIC + b))
def test_decoder_arbitrary_bytes(data):
    _contract(data)
