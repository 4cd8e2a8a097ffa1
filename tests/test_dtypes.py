"""Integer and boolean tensors in kernels: buffer storage, upload and readback conversions, range checks."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from opcheck import check_op

import kiln
from kiln.package.format import from_storage, to_storage

DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int32": TensorProto.INT32, "int64": TensorProto.INT64,
          "bool": TensorProto.BOOL, "uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


def sample(rng, dtype: str, shape) -> np.ndarray:
    if dtype in ("float32", "float16"):
        return rng.uniform(-200, 200, size=shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    lo, hi = {"int32": (-1000, 1000), "int64": (-1000, 1000), "uint8": (0, 256), "int8": (-128, 128)}[dtype]
    return rng.integers(lo, hi, size=shape).astype(dtype)


@pytest.mark.parametrize("src", list(DTYPES))
@pytest.mark.parametrize("dst", list(DTYPES))
def test_cast_between_kernel_dtypes(rng, src, dst):
    x = sample(rng, src, (3, 5))
    if dst in ("uint8", "int8") and src in ("float32", "float16"):
        x = rng.uniform(-100, 100, size=(3, 5)).astype(src)  # in range: out-of-range float->int is undefined
    check_op("Cast", {"x": x}, {"to": DTYPES[dst]})


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int64"])
def test_integer_arithmetic_wraps_like_onnxruntime(rng, dtype):
    a, b = sample(rng, dtype, (4, 6)), sample(rng, dtype, (6,))
    check_op("Add", {"a": a, "b": b})
    check_op("Mul", {"a": a, "b": b})


def _model(tmp_path, nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "m.onnx")
    return tmp_path / "m.onnx"


def test_int64_inputs_out_of_int32_range_are_refused(tmp_path):
    path = _model(tmp_path, [helper.make_node("Add", ["x", "x"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.INT64, [3])],
                  [helper.make_tensor_value_info("y", TensorProto.INT64, [3])])
    session = kiln.load(kiln.compile(path, tmp_path / "pkg"))
    out = session.run({"x": np.array([1, -2, 2**30 - 1], np.int64)})["y"]
    assert out.dtype == np.int64 and out.tolist() == [2, -4, 2**31 - 2]
    with pytest.raises(kiln.ShapeError, match=r"input 'x': int64 value 4294967296 at index \[1\] does not fit in int32"):
        session.run({"x": np.array([0, 2**32, 0], np.int64)})


def test_int64_constants_are_stored_as_int32_and_checked(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [3])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [3])
    ok = numpy_helper.from_array(np.array([5, -7, 9], np.int64), "c")
    pkg = kiln.compile(_model(tmp_path, [helper.make_node("Mul", ["x", "c"], ["y"])], [x], [y], [ok]), tmp_path / "p")
    manifest = json.loads((pkg / "manifest.json").read_text())
    assert manifest["inputs"][0]["dtype"] == "int64" and manifest["inputs"][0]["storage"] == "int32"
    weight = next(b for b in manifest["buffers"] if b["kind"] == "weight")
    assert weight["dtype"] == "int32" and weight["model_dtype"] == "int64" and weight["bytes"] == 12
    np.testing.assert_array_equal(kiln.load(pkg).run({"x": np.array([1, 2, 3], np.int64)})["y"], [5, -14, 27])
    big = numpy_helper.from_array(np.array([5, 2**40, 9], np.int64), "c")
    with pytest.raises(kiln.KilnError, match=r"constant %c: int64 value 1099511627776 .* does not fit in int32"):
        kiln.compile(_model(tmp_path, [helper.make_node("Mul", ["x", "c"], ["y"])], [x], [y], [big]), tmp_path / "q")


def test_storage_round_trip():
    for dtype, values in [("float16", [0.1, -65504.0]), ("bool", [True, False]), ("uint8", [0, 255]), ("int8", [-128, 127]),
                          ("int64", [-(2**31), 2**31 - 1]), ("float32", [1.5, -2.0])]:
        a = np.array(values, dtype=dtype)
        stored = to_storage(a, dtype, "t")
        assert stored.dtype.itemsize == 4
        back = from_storage(stored.tobytes(), dtype, a.shape)
        assert back.dtype == a.dtype and back.tolist() == a.tolist()


def test_float16_computes_in_float32_rounded_at_kernel_boundaries(rng):
    a, b = rng.uniform(-4, 4, (3, 7)).astype(np.float16), rng.uniform(0.5, 2, (7,)).astype(np.float16)
    check_op("Mul", {"a": a, "b": b}, rtol=1e-3)
    check_op("Softmax", {"x": a}, {"axis": -1}, rtol=2e-3, atol=1e-3)


def test_float16_intermediates_of_a_fused_kernel_are_rounded_as_onnx_does(tmp_path, rng):
    """A float16 chain that fusion makes one kernel still rounds each node's result to float16 (onnx's
    reference evaluator computes op by op in numpy float16): bit-exact, overflow to inf and NaN included."""
    f16 = TensorProto.FLOAT16
    consts = [numpy_helper.from_array(np.array(v, np.float16), n) for n, v in [("s", 4096.0), ("r", 2.0**-12)]]
    nodes = [helper.make_node("Mul", ["x", "s"], ["t1"]), helper.make_node("Add", ["t1", "y"], ["t2"]),
             helper.make_node("Mul", ["t2", "r"], ["t3"]), helper.make_node("Sub", ["t3", "x"], ["z"])]
    path = _model(tmp_path, nodes, [helper.make_tensor_value_info(n, f16, [64]) for n in "xy"],
                  [helper.make_tensor_value_info("z", f16, [64])], consts)
    pkg = kiln.compile(path, tmp_path / "pkg")
    assert len(json.loads((pkg / "manifest.json").read_text())["targets"]["webgpu"]["kernels"]) == 1
    x, y = rng.uniform(-4, 4, (2, 64)).astype(np.float16)
    x[:3] = [20.0, -17.0, np.nan]  # x * 4096 overflows float16 (z is +-inf), NaN propagates
    from onnx.reference import ReferenceEvaluator

    want = ReferenceEvaluator(str(path)).run(None, {"x": x, "y": y})[0]
    got = kiln.load(pkg).run({"x": x, "y": y})["z"]
    assert got.dtype == np.float16 and np.isinf(got[:2]).all() and np.isnan(got[2])
    np.testing.assert_array_equal(got, want)
