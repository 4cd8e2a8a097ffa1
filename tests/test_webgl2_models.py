"""Real models on the WebGL2 target in headless Chromium (SwiftShader through ANGLE) against onnxruntime.

SwiftShader's WebGL2 is slow (MobileNetV2: about 20 s a run on 2 cores), so each model runs once, on
one input, from a package compiled for webgl2 alone in the module's shared browser page.
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


@pytest.fixture(scope="module", autouse=True)
def _close_browser():
    yield
    close_shared_runner()


def _run(path, feeds, dims=None):
    model = onnx.load(str(path))
    got = run_in_browser(model, feeds, "webgl2", name=path.stem, dims=dims)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    return [got[o.name] for o in model.graph.output], expected


def test_mobilenet_on_webgl2(reference_npz):
    (logits,), (expected,) = _run(MOBILENET, {"input": reference_npz["chelsea_input"]})
    assert np.abs(logits - reference_npz["chelsea_logits"]).max() <= 1e-3 * TOLERANCE["webgl2"]
    assert np.abs(logits - expected).max() <= 1e-3 * TOLERANCE["webgl2"]
    assert logits.argmax() == 285  # Egyptian cat


def test_minilm_on_webgl2():
    with np.load(SHARED_MODELS / "reference" / "all_minilm_l6_v2_inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    batch, seq = feeds["input_ids"].shape
    (hidden,), (expected,) = _run(SHARED_MODELS / "all_minilm_l6_v2.onnx", feeds, {"batch": batch, "seq": seq})
    np.testing.assert_allclose(hidden, expected, atol=1e-4 * TOLERANCE["webgl2"], rtol=0)


@pytest.mark.parametrize("name,shape,dims", [
    ("ch_ppocr_mobile_v2.0_cls_infer", (2, 3, 48, 192), {"x_dim0": 2, "x_dim2": 48, "x_dim3": 192}),
    ("ch_PP-OCRv4_rec_infer", (1, 3, 48, 160), {"p2o.DynamicDimension.0": 1, "x_dim2": 48,
                                                "p2o.DynamicDimension.1": 160}),
    ("ch_PP-OCRv4_det_infer", (1, 3, 64, 96), {"p2o.DynamicDimension.0": 1, "p2o.DynamicDimension.1": 64,
                                               "p2o.DynamicDimension.2": 96}),
])
def test_ppocr_on_webgl2(rng, name, shape, dims):
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    got, expected = _run(SHARED_MODELS / f"{name}.onnx", {"x": x}, dims)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, atol=1e-4 * TOLERANCE["webgl2"], rtol=0)
