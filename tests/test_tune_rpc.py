"""Tuning through Kiln RPC: headless Chromium tabs (WebGPU on SwiftShader) measure kernel candidates.

A real server on a free loopback port, two real tabs with the same adapter (so candidates are
measured on both in parallel), a small Conv + MatMul model tuned with a budget of a few
candidates per kernel through ``kiln tune --device ws://...``; the tuned package, compiled for the
``cpu`` device class, then runs on a tab and matches onnxruntime.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from browser import CHROMIUM, ConsoleLog
from click.testing import CliRunner
from test_tune import small_model

import kiln.rpc
from kiln.cli import main
from kiln.codegen.webgpu import wgsl
from kiln.errors import RpcError
from kiln.te.lower import lower
from kiln.tune.measure import Candidate, sample_indices

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)")]


@pytest.fixture(scope="module")
def server():
    rpc = kiln.rpc.RpcServer("127.0.0.1", 0, max_message_bytes=32 << 20, request_timeout_s=300).start_in_thread()
    yield rpc
    rpc.stop_thread()


@pytest.fixture(scope="module")
def tabs(browser, server):
    """Two tabs joined as devices."""
    logs = []
    for _ in range(2):
        page = browser.new_page()
        log = ConsoleLog(page)
        page.goto(server.join_url)
        log.wait_for("#status.joined, #status.error")
        assert page.get_attribute("#status", "class") == "joined", page.text_content("#status")
        logs.append(log)
    yield logs
    for log in logs:
        log.page.close()


def test_measure_request_checks_candidates_on_the_device(server, tabs, rng):
    from test_tune import matmul_expr

    t = matmul_expr(2, 24, 12)
    k = lower(t)
    inputs = [rng.standard_normal(p.shape).astype(np.float32) for p in k.inputs]
    good = Candidate(wgsl.render(k), k.dispatch)
    bad = Candidate("@compute @workgroup_size(64) fn main() { let x: f32 = 1u; }", (1, 1, 1))
    with kiln.rpc.connect(server.url, server.token) as remote:
        device = remote.devices()[0]
        got = remote.measure(inputs, 24, [good, bad], device=device, batch=2, repeat=2)
    assert got[0].error is None and got[0].ms >= 0 and got[0].clock in ("timestamp-query", "wall")
    expected = (inputs[0] @ inputs[1]).reshape(-1)
    np.testing.assert_allclose(got[0].sample, expected[sample_indices(24)], rtol=1e-5, atol=1e-5)
    assert abs(got[0].total - expected.sum()) < 1e-3
    assert got[1].ms is None and got[1].sample is None and got[1].error  # the shader's compile error
    with kiln.rpc.connect(server.url, server.token) as remote, pytest.raises(RpcError, match="1 to 256 candidates"):
        remote._request({"type": "measure", "device": device.id, "inputs": [], "candidates": [],
                         "output": {"dtype": "float32", "elements": 1}, "batch": 1, "repeat": 1, "warmup": 0,
                         "sample": 1}, [], "measured")


def test_tuning_over_rpc_end_to_end(server, tabs, tmp_path, rng):
    import onnxruntime as ort

    model = small_model(tmp_path / "small.onnx")
    db = tmp_path / "tuning.json"
    runner = CliRunner()
    out = runner.invoke(main, ["tune", str(model), "--device", server.join_url, "--db", str(db), "--trials", "3",
                               "--jobs", "1"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "2 device(s)" in text and "device class cpu" in text, out.output  # both tabs; a CPU adapter: no lanes
    records = json.loads(db.read_text())["records"]
    assert len(records) == 2 and all(r["trials"] == 3 for r in records)
    assert all(r["schedule"]["reduce_lanes"] == 1 for r in records)
    adapter = records[0]["adapter"]
    words = " ".join(v for v in (adapter["vendor"], adapter["architecture"]) if v)
    pkg = tmp_path / "pkg"
    out = runner.invoke(main, ["compile", str(model), "-o", str(pkg), "--tuning-db", str(db), "--adapter", words,
                               "--device-class", "cpu"])
    assert out.exit_code == 0 and "2 tuned" in out.output, out.output
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    expected = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with kiln.rpc.connect(server.join_url) as remote:
        remote.select(remote.devices()[0])
        remote.load(pkg)
        np.testing.assert_allclose(remote.run({"x": x})["y"], expected, rtol=1e-4, atol=1e-4)
