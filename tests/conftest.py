"""Shared test fixtures: paths to the repo's and the shared real models, fresh random generators."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_MODELS = (ROOT / ".." / "shared" / "models").resolve()
MOBILENET = ROOT / "models" / "mobilenet_v2_imagenet.onnx"
CHELSEA = ROOT / "models" / "chelsea.png"

#: (model, input shape, dims to bind) of the PP-OCR models as the per-target model tests run them
PPOCR_CASES = [
    ("ch_ppocr_mobile_v2.0_cls_infer", (2, 3, 48, 192), {"x_dim0": 2, "x_dim2": 48, "x_dim3": 192}),
    ("ch_PP-OCRv4_rec_infer", (1, 3, 48, 160), {"p2o.DynamicDimension.0": 1, "x_dim2": 48,
                                                "p2o.DynamicDimension.1": 160}),
    ("ch_PP-OCRv4_det_infer", (1, 3, 64, 96), {"p2o.DynamicDimension.0": 1, "p2o.DynamicDimension.1": 64,
                                               "p2o.DynamicDimension.2": 96}),

]

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")


def pytest_addoption(parser):
    parser.addoption("--extended", action="store_true",
                     help="also run the acceptance cases too slow for CI (marked 'extended': minutes each on SwiftShader)")


def pytest_collection_modifyitems(config, items):
    """Skip the cases marked ``extended`` unless ``--extended`` is given."""
    if config.getoption("--extended"):
        return
    skip = pytest.mark.skip(reason="an extended acceptance case (minutes on SwiftShader): run with --extended")
    for item in items:
        if "extended" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    return f"kiln test seed base: {SEED} (set KILN_TEST_SEED to replay)"


#: a fresh seed per session unless KILN_TEST_SEED pins one; failures print it. Set in the environment, so that
#: pytest-xdist's workers (started after this module is imported in the controller) draw from the same seed
SEED = int(os.environ.setdefault("KILN_TEST_SEED", str(secrets.randbits(32))))


def save_tiny_relu_matmul(path: Path, w: np.ndarray) -> Path:
    """Write ``y = relu(x @ w)`` (x float32 ``[1, K]``, ``w`` ``[K, N]``) as an ONNX file at ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, w.shape[1]])], [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A random generator freshly seeded per test (seed = session seed + test name), reported on failure."""
    seed = (SEED + sum(map(ord, request.node.nodeid))) % 2**32
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def reference_npz() -> dict[str, np.ndarray]:
    """onnxruntime's MobileNetV2 logits for four real images (from ../shared/models/reference)."""
    path = SHARED_MODELS / "reference" / "mobilenet_v2_imagenet.npz"
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="session")
def smollm2_chat_package(tmp_path_factory) -> Path:
    """SmolLM2 as ``kiln compile model.gguf --max-context 192 --device-class cpu --target webgpu,wasm,cpu`` makes it
    (last-row logits, on-device arg max), compiled once for test_gguf.py and test_llm_browser.py (tests copy it
    before adding files)."""
    from click.testing import CliRunner

    from kiln.cli import main

    out = tmp_path_factory.mktemp("chat") / "smollm2"
    done = CliRunner().invoke(main, ["compile", str(ROOT / "models" / "zoo" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
                                     "-o", str(out), "--max-context", "192", "--device-class", "cpu", "--no-validate",
                                     "--target", "webgpu,wasm,cpu"])
    assert done.exit_code == 0, done.output
    return out


@pytest.fixture(scope="session")
def mobilenet_package(tmp_path_factory) -> Path:
    """MobileNetV2 compiled once per test session for webgpu and wasm (with kiln.js and index.html); tests must
    not modify it."""
    import kiln

    return kiln.compile(str(MOBILENET), str(tmp_path_factory.mktemp("mobilenet") / "mobilenet_v2"), force=True,
                        device_class="cpu", target="webgpu,wasm")  # run in SwiftShader (RPC tests)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        seeds = [v for k, v in item.user_properties if k == "seed"]
        if seeds:
            rep.sections.append(("random seed", f"test seed {seeds[0]} (session KILN_TEST_SEED={SEED})"))


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium with WebGPU, shared by the module's tests."""
    from browser import launch_chromium, sync_playwright_alone

    with sync_playwright_alone() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()


def pytest_sessionfinish(session, exitstatus):
    """Stop the shared browser of check_op's browser targets (tests/browser.py), if a test started it."""
    from browser import close_shared_runner

    close_shared_runner()


@pytest.fixture(scope="module")
def seed_package(tmp_path_factory) -> Path:
    """``y = relu(x @ W) + b`` compiled for webgpu, wasm and cpu: what the package fuzzers' mutations start from
    (tests/test_fuzz_package.py, tests/test_fuzz_browser.py)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import kiln

    w = np.array([[1.0, -2.0, 0.5], [0.25, 1.0, -1.0]], np.float32)
    b = np.array([0.5, 0.25, -0.125], np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Add", ["r", "b"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    folder = tmp_path_factory.mktemp("fuzz_package")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "tiny.onnx")
    return kiln.compile(str(folder / "tiny.onnx"), str(folder / "seed"), target="webgpu,wasm,cpu",
                        device_class="cpu")


@contextlib.contextmanager
def sigint_for_children():
    """Children started inside get SIGINT's default action: a suite started in the background (``nohup ... &``)
    ignores SIGINT, children inherit an ignored signal, and Python then raises no KeyboardInterrupt in them (tests
    that interrupt a child need it)."""
    import signal

    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
