"""Real models in headless Chromium on the WebGL2 target (SwiftShader through ANGLE) and on the wasm target
(kiln.js's WebAssembly backend, on Web Workers: the pages are cross-origin isolated), against onnxruntime.

Each model is compiled once for both targets and run once on each, on one input: SwiftShader's WebGL2 is
slow (MobileNetV2: about 20 s a run on 2 cores), and compiling the wasm module takes most of the rest.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from browser import CHROMIUM, close_shared_runner
from conftest import MOBILENET, SHARED_MODELS
from opcheck import TOLERANCE, run_in_browser

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)"),
]

TARGETS = ("webgl2", "browser:wasm")


@pytest.fixture(scope="module", autouse=True)
def _close_browser():
    yield
    close_shared_runner()


def _run(path, feeds, dims=None):
    """Each target's outputs (in the model's output order) and onnxruntime's."""
    model = onnx.load(str(path))
    got = run_in_browser(model, feeds, TARGETS, name=path.stem, dims=dims)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    return {t: [outs[o.name] for o in model.graph.output] for t, outs in got.items()}, expected


def test_mobilenet(reference_npz):
    got, (expected,) = _run(MOBILENET, {"input": reference_npz["chelsea_input"]})
    for target, (logits,) in got.items():
        assert np.abs(logits - expected).max() <= 1e-3 * TOLERANCE[target], target
        assert np.abs(logits - reference_npz["chelsea_logits"]).max() <= 1e-3 * TOLERANCE[target], target
        assert logits.argmax() == 285, target  # Egyptian cat


def test_minilm():
    with np.load(SHARED_MODELS / "reference" / "all_minilm_l6_v2_inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    batch, seq = feeds["input_ids"].shape
    got, (expected,) = _run(SHARED_MODELS / "all_minilm_l6_v2.onnx", feeds, {"batch": batch, "seq": seq})
    for target, (hidden,) in got.items():
        np.testing.assert_allclose(hidden, expected, atol=1e-4 * TOLERANCE[target], rtol=0, err_msg=target)


@pytest.mark.parametrize("name,shape,dims", [
    ("ch_ppocr_mobile_v2.0_cls_infer", (2, 3, 48, 192), {"x_dim0": 2, "x_dim2": 48, "x_dim3": 192}),
    ("ch_PP-OCRv4_rec_infer", (1, 3, 48, 160), {"p2o.DynamicDimension.0": 1, "x_dim2": 48,
                                                "p2o.DynamicDimension.1": 160}),
    ("ch_PP-OCRv4_det_infer", (1, 3, 64, 96), {"p2o.DynamicDimension.0": 1, "p2o.DynamicDimension.1": 64,
                                               "p2o.DynamicDimension.2": 96}),
])
def test_ppocr(rng, name, shape, dims):
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    got, expected = _run(SHARED_MODELS / f"{name}.onnx", {"x": x}, dims)
    for target, outs in got.items():
        for g, e in zip(outs, expected):
            np.testing.assert_allclose(g, e, atol=1e-4 * TOLERANCE[target], rtol=0, err_msg=target)
