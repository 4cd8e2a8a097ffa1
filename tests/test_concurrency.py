"""Sessions used from several Python threads at once (issue 19): several sessions of two packages on one shared
device, and one session shared by several threads, each run with fresh inputs of a run-time batch checked against
onnxruntime. ``bench/soak.py`` is the long-running counterpart (memory over 10,000 runs)."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import kiln

THREADS, RUNS = 4, 25


def _mlp(path, rng):
    """softmax(relu(x @ w1 + b1) @ w2) over a run-time batch N; x: float32[N, 16]."""
    w1, b1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((16, 32), (32,), (32, 8)))
    graph = h.make_graph(
        [h.make_node("MatMul", ["x", "w1"], ["a"]), h.make_node("Add", ["a", "b1"], ["b"]),
         h.make_node("Relu", ["b"], ["c"]), h.make_node("MatMul", ["c", "w2"], ["d"]),
         h.make_node("Softmax", ["d"], ["y"], axis=-1)], "mlp",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 16])], [h.make_tensor_value_info("y", T.FLOAT, ["N", 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "w2")])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def packages(tmp_path_factory, rng_module):
    root = tmp_path_factory.mktemp("threads")
    out = []
    for name in ("a", "b"):
        model = _mlp(root / f"{name}.onnx", rng_module)
        pkg = kiln.compile(model, root / name, target="webgpu,wasm,cpu", dims={"N": "1..8"}, device_class="cpu")
        out.append((pkg, ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])))
    return out


@pytest.fixture(scope="module")
def rng_module():
    return np.random.default_rng(19)


def _hammer(jobs: list[tuple], seed: int) -> None:
    """Run each ``(session, reference)`` of ``jobs`` on its own thread, RUNS times with fresh inputs of a random batch,
    all threads starting together; raises the first failure of any thread."""
    start = threading.Barrier(len(jobs))
    failures: list[BaseException] = []

    def work(session, ref, k):
        rng = np.random.default_rng(seed + k)
        start.wait()
        try:
            for _ in range(RUNS):
                x = rng.standard_normal((int(rng.integers(1, 9)), 16)).astype(np.float32)
                np.testing.assert_allclose(session.run({"x": x})["y"], ref.run(None, {"x": x})[0], rtol=1e-4,
                                           atol=1e-5)
        except BaseException as e:  # noqa: BLE001  (handed to the main thread)
            failures.append(e)

    threads = [threading.Thread(target=work, args=(s, r, k)) for k, (s, r) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if failures:
        raise failures[0]


@pytest.mark.parametrize("target", ["webgpu", "wasm", "cpu"])
def test_sessions_of_two_packages_from_threads(packages, target):
    """Four sessions (two of each package; natively on webgpu they share the process's device), a thread each."""
    jobs = [(kiln.load(pkg, target=target), ref) for pkg, ref in packages for _ in range(2)]
    _hammer(jobs, 100)


@pytest.mark.parametrize("target", ["webgpu", "wasm", "cpu"])
def test_one_session_from_threads(packages, target):
    """One session run by four threads at once: its runs take turns, each with its own inputs and outputs."""
    (pkg, ref), _ = packages
    session = kiln.load(pkg, target=target)
    _hammer([(session, ref)] * THREADS, 200)
