"""Row kernels (kiln.te.rows): LayerNormalization and Softmax fused into one kernel, a workgroup per row,
checked against onnxruntime with NaN-poisoned buffers (tests/opcheck.py)."""

from __future__ import annotations

import numpy as np
import pytest
from opcheck import check_op, make_model

from kiln.compiler import compile_graph
from kiln.frontend.onnx.importer import import_model


@pytest.mark.parametrize("width", [7, 384, 1000])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_rows(rng, width, bias):
    x = (rng.standard_normal((3, 2, width)) * 3 + 1).astype(np.float32)
    inits = {"scale": rng.standard_normal(width).astype(np.float32)}
    if bias:
        inits["bias"] = rng.standard_normal(width).astype(np.float32)
    check_op("LayerNormalization", {"x": x}, {"axis": -1, "epsilon": 1e-3}, inits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("width", [7, 128, 1000])
def test_softmax_rows(rng, op, width):
    x = (rng.standard_normal((2, 3, width)) * 4).astype(np.float32)
    check_op(op, {"x": x}, {"axis": -1}, opset=13, rtol=1e-4, atol=1e-6)


def _kernels(model, **kw) -> list[list[str]]:
    return [k.ops for k in compile_graph(import_model(model), **kw).kernels]


def test_row_fusion_makes_one_kernel_per_op(rng):
    """LayerNormalization and Softmax each become one row kernel on gpu schedules; cpu schedules and the
    other targets keep the reductions in kernels of their own."""
    x = rng.standard_normal((4, 384)).astype(np.float32)
    ln = make_model("LayerNormalization", {"x": x}, {"axis": -1},
                    {"scale": np.ones(384, np.float32), "bias": np.zeros(384, np.float32)})
    sm = make_model("Softmax", {"x": x}, {"axis": -1}, opset=13)
    for model in (ln, sm):
        gpu = compile_graph(import_model(model))
        assert len(gpu.kernels) == 1, [k.ops for k in gpu.kernels]
        assert gpu.kernels[0].schedule.get("rows") and gpu.groups[-1].rows
        assert len(_kernels(model, precision="fp16")) == 1  # f16 storage and arithmetic: row kernels too
        assert len(_kernels(model, device_class="cpu")) == 3
        assert len(_kernels(model, target="webgpu,wasm")) == 3
    # a reduction whose result is also a graph output is not fused away
    assert len(_kernels(make_model("ReduceMax", {"x": x}, {"axes": [1], "keepdims": 1}, opset=13))) == 1


def test_row_kernel_in_the_browser(tmp_path, rng):
    """LayerNormalization then Softmax, one row kernel (workgroup barriers inside its row loops), through Chromium's
    shader compiler (stricter uniformity analysis than naga) and kiln.js (tests/browser.py's shared page, poisoned
    buffers), against onnxruntime."""
    import onnx
    import onnxruntime as ort
    from browser import close_shared_runner, shared_runner
    from onnx import TensorProto, helper, numpy_helper

    import kiln

    g = helper.make_graph([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5),
                           helper.make_node("Softmax", ["y"], ["z"], axis=-1)], "ln_softmax",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 200])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [6, 200])],
                          [numpy_helper.from_array(rng.standard_normal(200).astype(np.float32), "g"),
                           numpy_helper.from_array(rng.standard_normal(200).astype(np.float32), "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "ln.onnx")
    x = (rng.standard_normal((6, 200)) * 3).astype(np.float32)
    runner = shared_runner()
    try:
        pkg = kiln.compile(tmp_path / "ln.onnx", runner.package_dir("ln_softmax"))  # device class gpu: a row kernel
        assert len(list((pkg / "kernels").glob("*.wgsl"))) == 1
        got = runner.run(pkg, {"x": x}, "webgpu")["z"]
    finally:
        close_shared_runner()  # its Playwright must not overlap the browser fixture's in later modules
    want = ort.InferenceSession(str(tmp_path / "ln.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
