"""The wasm target in headless Chromium through kiln.js's WebAssembly backend (wasm.js), against onnxruntime.

The pages are cross-origin isolated (the test server sends COOP/COEP, as `kiln serve` does), so kiln.js
runs the threaded module on Web Workers over shared memory; tests/test_fallback.py also runs it on one
thread. A few per-op tests here (their own cases, check_op's targets set to ``browser:wasm``); the real
models are in tests/test_browser_models.py, and the wasm target's native numerics in tests/test_wasm.py.
"""

from __future__ import annotations

import opcheck
import pytest
import test_ops
import test_ops_breadth
from browser import CHROMIUM, close_shared_runner

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)"),
]

TARGET = "browser:wasm"


@pytest.fixture(scope="module", autouse=True)
def _on_browser_wasm():
    saved = opcheck.TARGETS
    opcheck.TARGETS = (TARGET,)
    yield
    opcheck.TARGETS = saved
    close_shared_runner()


@pytest.mark.parametrize("test,kwargs", [
    (test_ops.test_conv2d, {"case": test_ops.CONV_CASES[1]}),  # depthwise
    (test_ops.test_matmul, {"sa": (2, 3, 4), "sb": (4, 6)}),
    (test_ops.test_softmax_13, {"axis": 1}),
    (test_ops_breadth.test_gather_runtime_data_and_indices, {"axis": 1}),
    (test_ops_breadth.test_where_with_scalar_branch_and_int64, {}),
], ids=["conv_depthwise", "matmul", "softmax", "gather", "where_int64"])
def test_op_on_browser_wasm(rng, test, kwargs):
    test(rng, **kwargs)
