"""Check one ONNX operator through Kiln against onnxruntime (CPU) and Kiln's own interpreter."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend.onnx.importer import import_model
from kiln.ir import interp

_ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}


def make_model(op_type: str, inputs: dict[str, np.ndarray], attrs: dict | None = None,
               initializers: dict[str, np.ndarray] | None = None, n_outputs: int = 1, opset: int = 17,
               input_order: list[str] | None = None) -> onnx.ModelProto:
    """A one-node model: runtime ``inputs`` and constant ``initializers`` feed ``op_type`` in ``input_order``."""
    initializers = initializers or {}
    order = input_order or list(inputs) + list(initializers)
    node = helper.make_node(op_type, [n for n in order], [f"y{i}" for i in range(n_outputs)], name=f"{op_type}_0",
                            **(attrs or {}))
    graph = helper.make_graph(
        [node], f"{op_type.lower()}_test",
        [helper.make_tensor_value_info(k, _ONNX_TYPES[v.dtype], list(v.shape)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(n_outputs)],
        [numpy_helper.from_array(v, k) for k, v in initializers.items() if k]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def check_op(op_type: str, inputs: dict[str, np.ndarray], attrs: dict | None = None,
             initializers: dict[str, np.ndarray] | None = None, *, opset: int = 17, rtol: float = 1e-4,
             atol: float = 1e-5, input_order: list[str] | None = None) -> dict[str, np.ndarray]:
    """Compile a one-node model with Kiln, run it natively on WebGPU with poisoned buffers, and compare
    every output with onnxruntime (and the IR interpreter with onnxruntime). Returns Kiln's outputs."""
    model = make_model(op_type, inputs, attrs, initializers, opset=opset, input_order=input_order)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    spec = interp.run(import_model(model), inputs)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(model, path)
        pkg = kiln.compile(path, Path(tmp) / "pkg")
        got = kiln.load(pkg, poison=True).run(inputs)
    for i, exp in enumerate(expected):
        name = f"y{i}"
        for what, arr in (("interpreter", spec[name]), ("webgpu", got[name])):
            assert arr.shape == exp.shape, f"{op_type} {what}: shape {arr.shape} != onnxruntime {exp.shape}"
            np.testing.assert_allclose(arr, exp, rtol=rtol, atol=atol, err_msg=f"{op_type} {what} vs onnxruntime")
    return got
