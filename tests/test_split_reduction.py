"""Split reduction (:mod:`kiln.passes.split_reduction`): long reductions of few outputs become reductions of their
parts, then of the parts' results, on the webgpu target's gpu schedules only, with onnxruntime's numbers.

The arg max is checked where ties decide: the largest value is planted twice, in two parts (the first part's index
wins) and twice in one part (its first index wins), and in the padded last part of an axis that is no multiple of
:data:`~kiln.passes.split_reduction.CHUNK`. Outputs are poisoned before each run, so an element no kernel writes
shows as NaN or garbage.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.passes.split_reduction import CHUNK, MIN_LENGTH

#: (rows, length) of the ArgMax inputs: a length of whole parts, and one whose last part is padded
SHAPES = [(1, 49152), (3, 10000)]


def _model() -> onnx.ModelProto:
    nodes, inputs, outputs = [], [], []
    for i, (rows, n) in enumerate(SHAPES):
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [rows, n]))
        nodes += [helper.make_node("ArgMax", [f"x{i}"], [f"arg{i}"], axis=-1, keepdims=i),
                  helper.make_node("ReduceMax", [f"x{i}", "axis"], [f"max{i}"], keepdims=0),
                  helper.make_node("ReduceMin", [f"x{i}", "last_axis"], [f"min{i}"], keepdims=1),
                  helper.make_node("ReduceSum", [f"x{i}", "axis"], [f"sum{i}"], keepdims=0),
                  helper.make_node("ArgMax", [f"x{i}"], [f"last{i}"], axis=1, select_last_index=1)]
        kept, flat = [rows, 1], [rows]
        outputs += [helper.make_tensor_value_info(f"arg{i}", TensorProto.INT64, kept if i else flat),
                    *(helper.make_tensor_value_info(f"{r}{i}", TensorProto.FLOAT, shape)
                      for r, shape in (("max", flat), ("min", kept), ("sum", flat))),
                    helper.make_tensor_value_info(f"last{i}", TensorProto.INT64, kept)]
    axes = [helper.make_tensor("axis", TensorProto.INT64, [1], [1]),
            helper.make_tensor("last_axis", TensorProto.INT64, [1], [-1])]
    graph = helper.make_graph(nodes, "split_reduction", inputs, outputs, axes)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def _feeds(rng) -> dict[str, np.ndarray]:
    feeds = {}
    for i, (rows, n) in enumerate(SHAPES):
        x = rng.standard_normal((rows, n)).astype(np.float32)
        top = np.float32(10.0003)  # (no f16 value: a maximum rounded to f16 would equal no element)
        x[0, [7 * CHUNK + 3, 30 * CHUNK + 1]] = top  # a tie across parts: the first part's wins
        if rows > 1:
            x[1, [2 * CHUNK + 200, 2 * CHUNK + 5]] = top  # a tie inside one part: its first index wins
            x[2, n - 1] = top  # the largest in the padded last part
        feeds[f"x{i}"] = x
    return feeds


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_split_reductions_match_onnxruntime(tmp_path, rng, precision):
    """With ``--precision fp16`` the inputs stay f32 (model inputs) and the maxima the arg maxes compare with too
    (:func:`kiln.passes.memory_plan.plan_memory`: rounded to f16, they would equal no element)."""
    model = _model()
    onnx.save(model, str(tmp_path / "m.onnx"))
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", precision=precision)
    kernels = json.loads((pkg / "manifest.json").read_text())["targets"]["webgpu"]["kernels"]
    # every reduction of the whole axis is split but the last-index arg maxes: no other kernel walks
    # MIN_LENGTH / 256 elements a lane; each split arg max gathers its part's index
    long = [k["ops"] for k in kernels if k.get("loop_iterations", 0) >= MIN_LENGTH // 256]
    assert long == [["ArgMax"]] * len(SHAPES), long
    assert len([k for k in kernels if "GatherElements" in k["ops"]]) == len(SHAPES)
    feeds = _feeds(rng)
    got = kiln.load(pkg, poison=True).run(feeds)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    for name, want in zip(names, ref.run(names, feeds)):
        if want.dtype == np.int64:
            np.testing.assert_array_equal(got[name], want, err_msg=name)
        else:
            tol = 1e-5 if precision == "fp32" or not name.startswith("sum") else 2e-3  # (f16 partial sums)
            np.testing.assert_allclose(got[name], want, rtol=tol, atol=1e-3 if precision == "fp32" else 0.5,
                                       err_msg=name)


@pytest.mark.parametrize("options", [{"device_class": "cpu"}, {"target": "webgpu,wasm"}])
def test_not_split_without_a_gpu_schedule(tmp_path, options):
    """SwiftShader and lavapipe (``device_class="cpu"``) and packages with a C target keep reductions whole."""
    onnx.save(_model(), str(tmp_path / "m.onnx"))
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", **options)
    for section in json.loads((pkg / "manifest.json").read_text())["targets"].values():
        assert not [k for k in section.get("kernels", []) if "GatherElements" in k.get("ops", [])]
