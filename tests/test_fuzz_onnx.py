"""Fuzzing the ONNX importer and compiler (issue 19): whatever an ``.onnx`` file holds, ``kiln.compile`` ends in a
package (which then loads and runs) or a :class:`~kiln.errors.KilnError` with a one-line message: never another
exception, a hang, an allocation the file does not bound, or a file written outside the output directory.

Hypothesis (derandomized in the suite) mutates a small valid model structurally with ``onnx.helper``: an op
replaced by another, attributes of the wrong type or of extreme values, inputs dropped or dangling, duplicate
output names, cycles, initializers with negative, huge or inconsistent dims and ``raw_data`` of the wrong length,
element types changed, unknown domains and opsets, external data pointing outside the model's folder or to missing
files; and byte-wise (flips, cuts) on the serialized model. A campaign with fresh inputs:
``KILN_FUZZ_RANDOM=1 KILN_FUZZ_EXAMPLES=3000 pytest tests/test_fuzz_onnx.py --hypothesis-show-statistics``.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import KilnError

FUZZ = fuzz_settings(120)

OPS = ["Relu", "Add", "Mul", "MatMul", "Conv", "MaxPool", "Reshape", "Transpose", "Softmax", "Concat", "Gather",
       "Slice", "ReduceSum", "Gemm", "Cast", "Expand", "Tile", "Pad", "Resize", "Split", "Squeeze", "Unsqueeze",
       "ConstantOfShape", "Range", "Where", "TopK", "LSTM", "Einsum", "NoSuchOp", "If", "Loop", "Identity"]


def seed_model() -> onnx.ModelProto:
    """A small valid model: Conv, Relu, MaxPool, Reshape, MatMul, Add, Softmax, Concat, Gather."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "conv_w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "conv_b"),
             numpy_helper.from_array(np.array([1, 64], np.int64), "flat"),
             numpy_helper.from_array(rng.standard_normal((64, 5)).astype(np.float32), "fc_w"),
             numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "fc_b"),
             numpy_helper.from_array(np.array([0, 2], np.int64), "pick")]
    nodes = [helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "flat"], ["f"]),
             helper.make_node("MatMul", ["f", "fc_w"], ["m"]),
             helper.make_node("Add", ["m", "fc_b"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
             helper.make_node("Concat", ["logits", "probs"], ["both"], axis=1),
             helper.make_node("Gather", ["both", "pick"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "seed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


SEED = seed_model()
NAMES = ["x", "c", "r", "p", "f", "m", "logits", "probs", "both", "y", "conv_w", "flat", "pick", "nowhere", ""]
ATTRS = st.one_of(st.integers(-2**40, 2**40), st.sampled_from([0, -1, 1, 2, 3, 2**31, -2**31, 10**12]),
                  st.floats(allow_nan=True, allow_infinity=True, width=32),
                  st.lists(st.integers(-5, 2**33), max_size=6), st.text(max_size=8), st.binary(max_size=8),
                  st.lists(st.floats(width=32, allow_nan=False), max_size=4))
ATTR_NAMES = ["axis", "axes", "perm", "kernel_shape", "strides", "pads", "dilations", "group", "keepdims", "to",
              "mode", "value", "transA", "alpha", "shape", "split", "ceil_mode", "auto_pad", "direction", "hidden_size"]


@st.composite
def mutated_model(draw) -> tuple[onnx.ModelProto, dict[str, bytes]]:
    """The seed with 1 to 3 structural edits; returns the model and extra files to write next to it."""
    m = copy.deepcopy(SEED)
    g = m.graph
    extra: dict[str, bytes] = {}
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["op", "attr", "input", "dangling", "duplicate", "cycle", "dims", "raw",
                                     "elem", "opset", "domain", "external", "drop_node", "output_shape"]))
        node = g.node[draw(st.integers(0, len(g.node) - 1))] if len(g.node) else None
        init = g.initializer[draw(st.integers(0, len(g.initializer) - 1))] if len(g.initializer) else None
        if kind == "op" and node is not None:
            node.op_type = draw(st.sampled_from(OPS))
        elif kind == "attr" and node is not None:
            name = draw(st.sampled_from(ATTR_NAMES))
            value = draw(ATTRS)
            try:
                attr = helper.make_attribute(name, value)
            except (ValueError, TypeError):
                continue
            kept = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend([*kept, attr])
        elif kind == "input" and node is not None and node.input:
            del node.input[draw(st.integers(0, len(node.input) - 1))]
        elif kind == "dangling" and node is not None:
            node.input.append(draw(st.sampled_from(NAMES)))
        elif kind == "duplicate" and node is not None:
            node.output[0] = draw(st.sampled_from(NAMES))
        elif kind == "cycle" and len(g.node) > 2:
            g.node[0].input[0] = g.node[-1].output[0]
        elif kind == "dims" and init is not None:
            dims = draw(st.lists(st.sampled_from([-1, 0, 1, 3, 64, 2**31, 2**40]), min_size=0, max_size=4))
            del init.dims[:]
            init.dims.extend(dims)
        elif kind == "raw" and init is not None:
            raw = bytes(init.raw_data) if init.HasField("raw_data") else (
                np.asarray(list(init.float_data), np.float32).tobytes()
                + np.asarray(list(init.int64_data), np.int64).tobytes())
            cut = draw(st.integers(0, len(raw)))
            init.ClearField("float_data")
            init.ClearField("int64_data")
            init.raw_data = raw[:cut] + draw(st.binary(max_size=8))
        elif kind == "elem" and init is not None:
            init.data_type = draw(st.sampled_from([0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 16, 17, 21, 23, 99]))
        elif kind == "opset":
            m.opset_import[0].version = draw(st.sampled_from([1, 6, 11, 13, 17, 21, 24, 25, 99, -1]))
        elif kind == "domain" and node is not None:
            node.domain = draw(st.sampled_from(["com.microsoft", "ai.onnx.ml", "org.example", "com.microsoft.nchwc"]))
        elif kind == "external" and init is not None:
            init.ClearField("raw_data")
            init.ClearField("float_data")
            init.ClearField("int64_data")
            init.data_location = TensorProto.EXTERNAL
            where = draw(st.sampled_from(["../outside.bin", "/etc/hostname", "missing.bin", "data.bin", "sub/../data.bin",
                                          ""]))
            del init.external_data[:]
            for key, value in (("location", where), ("offset", str(draw(st.sampled_from([0, 4, 2**40])))),
                               ("length", str(draw(st.sampled_from([0, 16, 4096, 2**40]))))):
                entry = init.external_data.add()
                entry.key, entry.value = key, value
            extra["data.bin"] = draw(st.binary(min_size=0, max_size=64))
        elif kind == "drop_node" and len(g.node) > 1:
            del g.node[draw(st.integers(0, len(g.node) - 1))]
        elif kind == "output_shape":
            dim = g.output[0].type.tensor_type.shape.dim[draw(st.integers(0, 1))]
            dim.dim_value = draw(st.sampled_from([0, 1, 7, 2**31]))
    return m, extra


def _compile(folder: Path, model_bytes: bytes, extra: dict[str, bytes]) -> None:
    """Write the model (and its extra files) to ``folder`` and compile it; a package runs, or a one-line KilnError.
    Nothing may appear outside ``folder``'s ``out``."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    (folder / "model.onnx").write_bytes(model_bytes)
    for name, data in extra.items():
        (folder / name).write_bytes(data)
    before = set(folder.parent.iterdir())
    try:
        out = kiln.compile(str(folder / "model.onnx"), str(folder / "out"), validate=False, device_class="cpu")
        session = kiln.load(out)
        feeds = {i["name"]: np.zeros(i["shape"], np.dtype(i["dtype"]) if i["dtype"] != "bool" else bool)
                 for i in session.inputs}
        session.run(feeds)
    except KilnError as e:
        assert str(e) and "\n" not in str(e), repr(e)
        OUTCOMES[type(e).__name__] = OUTCOMES.get(type(e).__name__, 0) + 1
    else:
        OUTCOMES["ran"] = OUTCOMES.get("ran", 0) + 1
    assert set(folder.parent.iterdir()) == before  # nothing written beside the folder
    assert {p.name for p in folder.iterdir()} <= {"model.onnx", "out", *extra}


#: how the inputs ended (error class or "ran"), printed at the end of a campaign (pytest -s)
OUTCOMES: dict[str, int] = {}


def teardown_module():
    if os.environ.get("KILN_FUZZ_RANDOM"):
        print("outcomes:", dict(sorted(OUTCOMES.items())))


def test_the_seed_model_compiles_and_runs(tmp_path):
    _compile(tmp_path / "m", SEED.SerializeToString(), {})
    assert (tmp_path / "m" / "out" / "manifest.json").exists()


@FUZZ
@given(case=mutated_model())
def test_mutated_models_end_in_kiln_errors(tmp_path, case):
    model, extra = case
    _compile(tmp_path / "m", model.SerializeToString(), extra)


@FUZZ
@given(data=st.data())
def test_mutated_model_bytes_end_in_kiln_errors(tmp_path, data):
    raw = bytearray(SEED.SerializeToString())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        if data.draw(st.booleans()):
            raw[at] ^= 1 << data.draw(st.integers(0, 7))
        else:
            del raw[at:at + data.draw(st.integers(1, 16))]
    _compile(tmp_path / "m", bytes(raw), {})
