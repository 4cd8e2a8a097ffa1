"""Kiln RPC end to end: headless Chromium tabs join a real server, Python drives them over WebSocket.

No mocks: the server is :class:`kiln.rpc.RpcServer` on a free loopback port, devices are pages
of headless Chromium (WebGPU on SwiftShader) running kiln/js/rpc.js, and misbehaving peers are
raw WebSocket connections sending real bytes.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.parse

import numpy as np
import onnx
import pytest
from browser import CHROMIUM, ConsoleLog
from conftest import ROOT, sigint_for_children
from onnx import TensorProto, helper, numpy_helper
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

import kiln
import kiln.rpc
from kiln.package.format import write_manifest
from kiln.rpc import protocol

needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)")

#: y = relu(x @ W), W of shape [2, 4]: a model that runs in milliseconds
WEIGHT = np.array([[1, -2, 3, -4], [-5, 6, -7, 8]], dtype=np.float32)


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory):
    """A two-op package (MatMul then Relu) with input x: float32[1, 2] and output y: float32[1, 4]."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(WEIGHT, "w")])
    root = tmp_path_factory.mktemp("rpc")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), root / "tiny.onnx")
    return kiln.compile(str(root / "tiny.onnx"), str(root / "tiny"), force=True)


@pytest.fixture(scope="module")
def server():
    """A running RPC server on a free loopback port, with a 32 MiB message limit."""
    rpc = kiln.rpc.RpcServer("127.0.0.1", 0, max_message_bytes=32 << 20, request_timeout_s=300).start_in_thread()
    yield rpc
    rpc.stop_thread()


def open_device(browser, url: str) -> ConsoleLog:
    """A new tab at ``url``, once its page says it joined (or failed)."""
    page = browser.new_page()
    log = ConsoleLog(page)
    page.goto(url)
    log.wait_for("#status.joined, #status.error")
    return log


@pytest.fixture(scope="module")
def device_page(browser, server):
    """One tab joined to the server as a device, for the whole module."""
    log = open_device(browser, server.join_url)
    assert log.page.get_attribute("#status", "class") == "joined", log.page.text_content("#status")
    yield log
    log.page.close()


@pytest.fixture
def remote(server, device_page):
    """A client connection with the module's device selected."""
    with kiln.rpc.connect(server.url, server.token) as connection:
        device_id = int(device_page.page.text_content("#device"))
        connection.select(device_id)
        yield connection


def raw_client(server, token: str | None = None):
    """A plain WebSocket to the server's client endpoint (for sending hand-made bytes)."""
    query = urllib.parse.urlencode({"token": token or server.token})
    return ws_connect(f"{server.url}/client?{query}", max_size=None, compression=None)


# ---------------------------------------------------------------------------------------------- browser devices
@needs_chromium
def test_mobilenet_over_rpc_matches_native(remote, mobilenet_package, reference_npz):
    feeds = {"input": reference_npz["chelsea_input"].astype(np.float32)}
    expected = kiln.load(mobilenet_package).run(feeds)["logits"]
    package = remote.load(mobilenet_package)
    got = remote.run(feeds)["logits"]
    assert got.dtype == np.float32 and got.shape == expected.shape == (1, 1000)
    error = float(np.abs(got - expected).max())
    assert error <= 1e-4, f"max abs difference {error:.3g} from the native run"
    info = remote.adapter_info()
    assert info["vendor"] or info["architecture"], info
    assert info["backend_type"] == "WebGPU (browser)" and isinstance(info["features"], list)
    # one timed run of a real model (seconds on SwiftShader): GPU timestamps where the adapter has them
    timing = remote.time(feeds, repeat=1, warmup=0)
    assert timing.clock == ("timestamp-query" if "timestamp-query" in info["features"] else "wall")
    assert timing.clock == ("timestamp-query" if package.timestamp_query else "wall")
    assert len(timing.times_ms) == len(timing.wall_ms) == 1
    assert 1.0 < timing.times_ms[0] < 120_000 and timing.wall_ms[0] >= 0.5 * timing.times_ms[0], timing
    package.unload()
    with pytest.raises(kiln.errors.RpcError, match="no package"):
        package.run(feeds)


@needs_chromium
def test_time_on_either_clock(remote, tiny_package):
    package = remote.load(tiny_package)
    x = np.array([[0.5, -1.5]], dtype=np.float32)
    np.testing.assert_allclose(package.run({"x": x})["y"], np.maximum(x @ WEIGHT, 0), rtol=1e-6)
    auto = package.time({"x": x}, repeat=5, warmup=1)
    wall = package.time({"x": x}, repeat=3, warmup=0, clock="wall")
    assert auto.clock == ("timestamp-query" if package.timestamp_query else "wall")
    assert wall.clock == "wall" and wall.times_ms == wall.wall_ms
    for timing, n in ((auto, 5), (wall, 3)):
        assert len(timing.times_ms) == n and all(0 <= t < 10_000 for t in timing.times_ms), timing
        assert timing.median_ms == sorted(timing.times_ms)[n // 2]
    assert all(t > 0 for t in wall.times_ms)


@needs_chromium
def test_feeds_are_checked_before_sending(remote, tiny_package):
    remote.load(tiny_package)
    with pytest.raises(kiln.ShapeError, match=r"input 'x': expected shape \[1, 2\]"):
        remote.run({"x": np.zeros((1, 3), np.float32)})
    with pytest.raises(kiln.ShapeError, match="unknown input 'z'"):
        remote.run({"x": np.zeros((1, 2), np.float32), "z": np.zeros(1, np.float32)})


@needs_chromium
def test_device_errors_come_back_as_remote_errors(remote, tiny_package, tmp_path):
    needy = tmp_path / "needy"
    shutil.copytree(tiny_package, needy)
    manifest = json.loads((needy / "manifest.json").read_text())
    manifest["targets"]["webgpu"]["features"] = ["kiln-test-no-such-feature"]
    write_manifest(needy, manifest)
    with pytest.raises(kiln.errors.RemoteError, match="lacks WebGPU features kiln-test-no-such-feature") as info:
        remote.load(needy)
    assert info.value.kind == "DeviceError"


@needs_chromium
def test_corrupted_weights_are_refused(remote, tiny_package, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_package, broken)
    weights = broken / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(kiln.PackageError, match="checksum mismatch"):
        remote.load(broken)  # checked here first
    with pytest.raises(kiln.PackageError, match="differs from the manifest's size or SHA-256"):
        remote.load(broken, verify=False)  # then by the server


@needs_chromium
def test_tampered_kernel_or_manifest_is_refused(remote, tiny_package, tmp_path):
    """The server checks an upload's manifest against its manifest.sha256 and each kernel source against the
    manifest's files table (format 1.8) before anything reaches the page."""
    shader = tmp_path / "shader"
    shutil.copytree(tiny_package, shader)
    kernel = shader / json.loads((shader / "manifest.json").read_text())["targets"]["webgpu"]["kernels"][0]["source"]
    kernel.write_text(kernel.read_text() + "\n// edited\n")
    with pytest.raises(kiln.PackageError, match="kernel source kernels/.*SHA-256 checksum mismatch"):
        remote.load(shader)
    edited = tmp_path / "edited"
    shutil.copytree(tiny_package, edited)
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["name"] = "edited"
    (edited / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(kiln.PackageError, match="manifest.json SHA-256 checksum mismatch"):
        remote.load(edited)  # refused when read here
    request = {"type": "load", "device": remote.selected.id,
               "files": [{"path": "manifest.json", "sha256": hashlib.sha256(json.dumps(manifest).encode()).hexdigest()},
                         {"path": "manifest.sha256", "sha256": hashlib.sha256((tiny_package / "manifest.sha256")
                                                                              .read_bytes()).hexdigest()}]}
    with pytest.raises(kiln.PackageError, match="manifest.json SHA-256 checksum mismatch"):  # and by the server
        remote._request(request, [json.dumps(manifest).encode(), (tiny_package / "manifest.sha256").read_bytes()],
                        "loaded")


@needs_chromium
def test_several_devices_each_listed_and_chosen(browser, server, device_page, tiny_package):
    second = open_device(browser, server.join_url)
    try:
        first_id, second_id = int(device_page.page.text_content("#device")), int(second.page.text_content("#device"))
        with kiln.rpc.connect(server.url, server.token) as remote:
            devices = {d.id: d for d in remote.devices()}
            assert {first_id, second_id} <= set(devices)
            for d in devices.values():
                assert d.adapter["vendor"] or d.adapter["architecture"], d
                assert "HeadlessChrome" in d.user_agent and d.limits["maxBufferSize"] > 0
            with pytest.raises(kiln.errors.RpcError, match="choose one with select"):
                remote.load(tiny_package)
            before = int(device_page.page.text_content("#handled"))
            remote.load(tiny_package, device=second_id)
            x = np.array([[2.0, 1.0]], dtype=np.float32)
            np.testing.assert_allclose(remote.run({"x": x})["y"], np.maximum(x @ WEIGHT, 0), rtol=1e-6)
            assert remote.adapter_info()["user_agent"] == devices[second_id].user_agent
            assert second.page.text_content("#handled") == "2"  # load and run went to the chosen tab only
            assert int(device_page.page.text_content("#handled")) == before
        # leaving frees the connection's packages on the device
        second.page.wait_for_function("document.getElementById('log').textContent.includes('unloaded')")
    finally:
        second.page.close()
    with kiln.rpc.connect(server.url, server.token) as remote:
        deadline = time.monotonic() + 10
        while second_id in {d.id for d in remote.devices()} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [d.id for d in remote.devices()] == [first_id]


# ---------------------------------------------------------------------------------------------- security
def test_bad_token_is_refused(server):
    with pytest.raises(kiln.errors.AuthError, match="bad token"):
        kiln.rpc.connect(server.url, "not-the-token")
    with pytest.raises(kiln.errors.RpcError, match="no token"):
        kiln.rpc.connect(server.url, "")


def test_failed_token_attempts_are_limited_per_address():
    """After ``max_token_failures`` wrong tokens from an address within the window, every handshake from it (the
    right token too) is refused with HTTP 429 until the window ends; then the right token connects again."""
    rpc = kiln.rpc.RpcServer("127.0.0.1", 0, max_token_failures=3, token_failure_window_s=1.5).start_in_thread()
    try:
        for _ in range(3):
            with pytest.raises(kiln.errors.AuthError, match="bad token"):
                kiln.rpc.connect(rpc.url, "not-the-token")
        for token in ("not-the-token", rpc.token):
            with pytest.raises(kiln.errors.RpcError, match="too many failed token attempts from this address"):
                kiln.rpc.connect(rpc.url, token)
        time.sleep(1.6)
        with kiln.rpc.connect(rpc.url, rpc.token) as remote:
            assert remote.devices() == []
    finally:
        rpc.stop_thread()


def test_connections_in_their_handshake_are_capped():
    """Sockets that connect and send nothing hold a handshake slot each (until the open timeout); beyond
    ``max_handshakes`` of them a new connection is dropped at once; when they go, clients connect again."""
    import socket

    rpc = kiln.rpc.RpcServer("127.0.0.1", 0, max_handshakes=4).start_in_thread()
    idle = []
    try:
        for _ in range(4):
            idle.append(socket.create_connection(("127.0.0.1", rpc.port)))
        time.sleep(0.3)  # (the server accepts them)
        with pytest.raises(kiln.errors.RpcError):
            kiln.rpc.connect(rpc.url, rpc.token, timeout=5)
        for s in idle:
            s.close()
        time.sleep(0.3)
        with kiln.rpc.connect(rpc.url, rpc.token) as remote:
            assert remote.devices() == []
    finally:
        for s in idle:
            s.close()
        rpc.stop_thread()


@needs_chromium
def test_page_with_a_bad_token_does_not_join(browser, server, device_page):
    with kiln.rpc.connect(server.url, server.token) as remote:
        joined = len(remote.devices())
        page = open_device(browser, server.join_url.replace(server.token, "wrong"))
        try:
            assert "the server refused this device" in page.page.text_content("#status.error")
        finally:
            page.page.close()
        assert len(remote.devices()) == joined


def test_join_page_is_served_and_foreign_hosts_are_refused(server):
    host, port = server.host, server.port
    for path, content_type in (("/", "text/html; charset=utf-8"), ("/rpc.js", "text/javascript; charset=utf-8"),
                               ("/kiln.js", "text/javascript; charset=utf-8")):
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Content-Type") == content_type, path
        assert server.token not in response.read().decode()
        conn.close()
    for path, headers, status in (("/nope", {}, 404), ("/", {"Host": "evil.example:80"}, 403),
                                  ("/client", {"Host": f"{host}:{port}", "Origin": "http://evil.example"}, 403)):
        conn = http.client.HTTPConnection(host, port, timeout=10)
        query = "?" + urllib.parse.urlencode({"token": server.token}) if path == "/client" else ""
        conn.request("GET", path + query, headers={**headers, "Connection": "Upgrade", "Upgrade": "websocket",
                                                   "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                                                   "Sec-WebSocket-Version": "13"})
        assert conn.getresponse().status == status, (path, headers)
        conn.close()


# ---------------------------------------------------------------------------------------------- malformed messages
def frame(header_bytes: bytes, magic: bytes = b"KRPC", length: int | None = None) -> bytes:
    """A message with an arbitrary header (for hand-made malformed messages)."""
    size = len(header_bytes) if length is None else length
    return struct.pack("<4sI", magic, size) + header_bytes + bytes(protocol.align8(len(header_bytes)) -
                                                                   len(header_bytes))


MALFORMED = {
    "text message": "hello",
    "bad magic": frame(b'{"type":"devices","id":1}', magic=b"EVIL"),
    "truncated": b"KRP",
    "header length": frame(b'{"type":"devices","id":1}', length=1 << 30),
    "not json": frame(b"{not json"),
    "nested json": frame(b"[" * 100_000 + b"]" * 100_000),
    "unknown type": protocol.encode({"type": "rmrf", "id": 1}),
    "blob past the end": frame(b'{"type":"devices","id":1,"blobs":[64]}'),
    "tensor size": protocol.encode({"type": "run", "id": 1, "device": 1, "package": 1,
                                    "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 2]}]}, [b"\0" * 4]),
    "unsafe path": protocol.encode({"type": "load", "id": 1, "device": 1,
                                    "files": [{"path": "../etc/passwd", "sha256": "0" * 64}]}, [b"x"]),
    "repeat": protocol.encode({"type": "time", "id": 1, "device": 1, "package": 1, "inputs": [],
                               "repeat": 10**9, "warmup": 0, "clock": "auto"}),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_message_closes_only_that_connection(server, case):
    with kiln.rpc.connect(server.url, server.token) as bystander:
        before = bystander.devices()
        with raw_client(server) as ws, pytest.raises(ConnectionClosed) as closed:
            ws.send(MALFORMED[case])
            ws.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008, closed.value
        assert closed.value.rcvd.reason, "the close frame gives a reason"
        assert bystander.devices() == before  # the server and its other connections carry on
    with kiln.rpc.connect(server.url, server.token) as fresh:
        assert fresh.devices() == before


def test_oversized_message_is_refused(server):
    with raw_client(server) as ws, pytest.raises(ConnectionClosed) as closed:
        ws.send(protocol.encode({"type": "devices", "id": 1}, [bytes(33 << 20)]))
        ws.recv(timeout=30)
    assert closed.value.rcvd.code == 1009
    with kiln.rpc.connect(server.url, server.token) as fresh:
        fresh.devices()


def test_hostile_device_is_disconnected(server, tiny_package):
    """A fake device that answers a load with the wrong reply is dropped; the client gets an error, not a hang."""
    query = urllib.parse.urlencode({"token": server.token})
    closed: list[ConnectionClosed] = []

    def misbehave(fake) -> None:
        request = protocol.decode(fake.recv(timeout=60))
        assert request.type == "load" and "manifest.json" in request.header["files"]
        fake.send(protocol.encode({"type": "result", "id": request.id, "outputs": []}))  # wrong reply type
        try:
            fake.recv(timeout=30)
        except ConnectionClosed as e:
            closed.append(e)

    with ws_connect(f"{server.url}/device?{query}", compression=None, max_size=None) as fake:
        fake.send(protocol.encode({"type": "hello", "id": 0, "protocol": protocol.PROTOCOL_VERSION,
                                   "adapter": {"vendor": "fake"}, "features": [], "limits": {},
                                   "user_agent": "test"}))
        welcome = protocol.decode(fake.recv(timeout=10))
        assert welcome.type == "welcome"
        fake_id = welcome.header["device"]
        thread = threading.Thread(target=misbehave, args=(fake,))
        thread.start()
        with kiln.rpc.connect(server.url, server.token) as remote:
            with pytest.raises(kiln.errors.RpcError, match="malformed reply and was disconnected"):
                remote.load(tiny_package, device=fake_id)
            thread.join(30)
            assert closed and closed[0].rcvd.code == 1008
            assert fake_id not in {d.id for d in remote.devices()}


# ---------------------------------------------------------------------------------------------- wire format
def test_frames_round_trip_with_aligned_blobs():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    specs, blobs = protocol.arrays_to_blobs({"x": x, "i": np.array([7], dtype=">i4")})
    data = protocol.encode({"type": "run", "id": 5, "inputs": specs}, [*blobs, b"abc"])
    message = protocol.decode(data)
    assert message.type == "run" and message.id == 5 and message.header["blobs"] == [24, 4, 3]
    assert len(data) % 8 == 0
    arrays = protocol.blobs_to_arrays(protocol.tensor_specs(message.header, "inputs", message.blobs[:2]),
                                      message.blobs[:2])
    np.testing.assert_array_equal(arrays["x"], x)
    assert arrays["i"].tolist() == [7] and arrays["i"].dtype == np.dtype("<i4")
    assert bytes(message.blobs[2]) == b"abc"
    with pytest.raises(kiln.errors.ProtocolError, match="cannot be sent"):
        protocol.arrays_to_blobs({"z": np.zeros(2, np.float64)})
    with pytest.raises(kiln.errors.ProtocolError, match="implies"):
        protocol.decode(data + bytes(8))


# ---------------------------------------------------------------------------------------------- command line
def test_cli_serve_rpc_prints_a_token_and_serves():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with sigint_for_children():  # (the test stops it with SIGINT)
        proc = subprocess.Popen([sys.executable, "-c", "from kiln.cli import run; run()", "serve", "--rpc", "--port",
                                 "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        fields = dict(line.split(":", 1) for line in lines[1:3])
        token, join = fields["token"].strip(), fields["join"].split()[0]
        assert lines[0].startswith("Kiln RPC server at ws://127.0.0.1:"), lines
        assert join.startswith("http://127.0.0.1:") and join.endswith(f"/#token={token}"), lines
        assert len(token) >= 32
        with kiln.rpc.connect(join) as remote:  # the token from the join URL's fragment
            assert remote.devices() == []
        with pytest.raises(kiln.errors.AuthError):
            kiln.rpc.connect(join.split("#")[0], token[::-1])
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "bad token" in err and "client 1 connected" in err, err


def test_cli_serve_arguments_are_checked(tiny_package):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args, needle in ((["serve"], "give a PACKAGE"), (["serve", "--rpc", str(tiny_package)], "--rpc serves no package")):
        proc = subprocess.run([sys.executable, "-c", "from kiln.cli import run; run()", *args],
                              check=False, capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


def test_rpc_does_not_import_the_compiler():
    compiler = ("kiln.frontend", "kiln.passes", "kiln.codegen", "kiln.te", "kiln.compiler")
    script = f"import sys, kiln.rpc; print([m for m in sys.modules if m.startswith({compiler!r})])"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.strip() == "[]", result.stdout
