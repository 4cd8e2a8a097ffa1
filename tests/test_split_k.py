"""Split-K (:mod:`kiln.passes.split_k`): matrix products with few output blocks and a long reduction become partial
products and their sum, on the webgpu target's gpu schedules only, with the same numbers as onnxruntime.

The model holds the two shapes MiniLM at batch 1 splits: the FFN's second product (``[1, 128, 1536] @ [1536, 384]``
with its bias and residual) and the attention's output projection, whose activation is the heads' transpose and
reshape (read in place by the partial products: no transpose kernel of its own); their parts are summed by adds in
the epilogue's kernel. A third, 2-D, product (``[128, 1536]``) sums its parts with a reduction. Outputs are poisoned before each
run, so an element no kernel writes shows as NaN.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.passes.split_k import parts_for
from kiln.te.schedule import SHARED_SMALL


@pytest.mark.parametrize("mkn, parts", [((128, 1536, 384), 4), ((128, 384, 384), 4), ((128, 384, 1536), 1),
                                        ((4096, 1536, 384), 1), ((16, 1536, 384), 1), ((128, 200, 384), 1),
                                        ((64, 4096, 64), 8), ((128, 96, 384), 1)])
def test_parts(mkn, parts):
    assert parts_for(*mkn) == parts


def _model(rng) -> onnx.ModelProto:
    f = np.float32
    inits = [numpy_helper.from_array(rng.standard_normal((1536, 384)).astype(f) * f(0.03), "w1"),
             numpy_helper.from_array(rng.standard_normal(384).astype(f), "b1"),
             numpy_helper.from_array(rng.standard_normal((384, 384)).astype(f) * f(0.05), "w2"),
             numpy_helper.from_array(np.array([1, 128, 384], np.int64), "flat")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["p1"]), helper.make_node("Add", ["p1", "b1"], ["q1"]),
             helper.make_node("Add", ["q1", "r"], ["y1"]),
             helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["ht", "flat"], ["hf"]), helper.make_node("MatMul", ["hf", "w2"], ["p2"]),
             helper.make_node("Add", ["p2", "b1"], ["y2"]),
             helper.make_node("MatMul", ["z", "w1"], ["p3"]), helper.make_node("Add", ["p3", "b1"], ["y3"])]
    graph = helper.make_graph(nodes, "split_k", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 1536]),
        helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 128, 384]),
        helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 12, 128, 32]),
        helper.make_tensor_value_info("z", TensorProto.FLOAT, [128, 1536])],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, [1, 128, 384]),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 128, 384]),
         helper.make_tensor_value_info("y3", TensorProto.FLOAT, [128, 384])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _kernels(pkg) -> dict:
    return json.loads((pkg / "manifest.json").read_text())["targets"]


def _package(tmp_path, rng, out=None):
    model = _model(rng)
    onnx.save(model, str(tmp_path / "m.onnx"))
    feeds = {"x": rng.standard_normal((1, 128, 1536)).astype(np.float32),
             "r": rng.standard_normal((1, 128, 384)).astype(np.float32),
             "h": rng.standard_normal((1, 12, 128, 32)).astype(np.float32),
             "z": rng.standard_normal((128, 1536)).astype(np.float32)}
    return kiln.compile(tmp_path / "m.onnx", out or tmp_path / "pkg"), model, feeds


def _check(got, model, feeds):
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, want in zip(("y1", "y2", "y3"), ref.run(["y1", "y2", "y3"], feeds)):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4, err_msg=name)


def test_split_products_match_onnxruntime(tmp_path, rng):
    pkg, model, feeds = _package(tmp_path, rng)
    kernels = _kernels(pkg)["webgpu"]["kernels"]
    partials = [k for k in kernels if "MatMul" in k["ops"]]
    assert len(partials) == 2 and all(k["schedule"].get("shared_k") == SHARED_SMALL.shared_k and
                                      k["schedule"]["workgroup_size"] == SHARED_SMALL.workgroup_size for k in partials)
    # (the 2-D product's partials are the FFN's kernel again.) Batch 1's parts are slices summed by adds in the
    # epilogue's kernel; the 2-D product's a reduction
    assert [sorted(k["ops"]) for k in kernels if "MatMul" not in k["ops"]] == [
        ["Add"] * 5 + ["Slice"] * 4, ["Add"] * 4 + ["Slice"] * 4, ["Add", "ReduceSum"]]
    assert not [k for k in kernels if k["ops"] == ["Transpose"]]  # (the heads' transpose is read in place)
    _check(kiln.load(pkg, poison=True).run(feeds), model, feeds)


def test_split_products_in_the_browser(tmp_path, rng):
    """The same package through Chromium's shader compiler and kiln.js (SwiftShader; tests/browser.py's page)."""
    from browser import close_shared_runner, shared_runner

    runner = shared_runner()
    try:
        pkg, model, feeds = _package(tmp_path, rng, runner.package_dir("split_k"))
        got = runner.run(pkg, feeds, "webgpu")
    finally:
        close_shared_runner()  # its Playwright must not overlap the browser fixture's in later modules
    _check(got, model, feeds)


@pytest.mark.parametrize("options", [{"device_class": "cpu"}, {"target": "webgpu,wasm"}])
def test_not_split_without_a_gpu_schedule(tmp_path, rng, options):
    """SwiftShader and lavapipe (``device_class="cpu"``) and packages with a C target keep products whole."""
    onnx.save(_model(rng), str(tmp_path / "m.onnx"))
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", **options)
    for section in _kernels(pkg).values():
        assert not [k for k in section.get("kernels", []) if "ReduceSum" in k.get("ops", [])]
