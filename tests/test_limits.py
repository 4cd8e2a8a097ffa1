"""Limits (issue 19): a model too large for what it targets is refused when compiling, naming the limit, never a
device error at run time; a malformed model cannot make the compiler allocate more than a tensor's bound on the
host (constants it would fold: ConstantOfShape, Range, random draws, folded ops); a run of a wasm module that
never ends is stopped at its time limit."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
import wasmtime
from conftest import save_tiny_relu_matmul
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import KilnError
from kiln.package.format import read_manifest, sha256_file, write_manifest


def _save(tmp_path, nodes, inputs, outputs, inits, name="m"):
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _refused(path, out, match):
    with pytest.raises(KilnError, match=match) as info:
        kiln.compile(str(path), str(out), validate=False)
    assert "\n" not in str(info.value)
    assert not out.exists()
    return str(info.value)


def test_buffer_beyond_a_webgpu_binding_is_refused_at_compile_time(tmp_path):
    """An activation of 2.34 GiB (an Expand of a small input) is refused before any kernel is made, naming the
    tensor and maxStorageBufferBindingSize; the same model at a quarter of the size compiles."""
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])
    nodes = [helper.make_node("Expand", ["x", "s"], ["c"]), helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)]
    big = _save(tmp_path, nodes, [x], [y], [numpy_helper.from_array(np.array([600, 1024, 1024], np.int64), "s")])
    message = _refused(big, tmp_path / "big", "maxStorageBufferBindingSize")
    assert "2.34 GiB" in message and "beyond the 2 GiB" in message
    fits = _save(tmp_path, nodes, [x], [y], [numpy_helper.from_array(np.array([150, 1024, 1024], np.int64), "s")],
                 name="fits")
    assert (kiln.compile(str(fits), str(tmp_path / "fits"), validate=False) / "manifest.json").exists()


@pytest.mark.parametrize("kind", ["ConstantOfShape", "Range", "RandomNormal", "Tile"])
def test_huge_constants_are_refused_before_allocating(tmp_path, kind):
    """A constant the compiler would fold on the host beyond 2 GiB (here 373 GiB or more) is a one-line error naming
    the node, raised before anything is allocated (the test would run out of memory otherwise)."""
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    shape = np.array([100000, 100000, 10], np.int64)
    if kind == "ConstantOfShape":
        nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"],
                                  value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]))]
        inits = [numpy_helper.from_array(shape, "s")]
    elif kind == "Range":
        nodes = [helper.make_node("Range", ["a", "b", "d"], ["r"]), helper.make_node("Cast", ["r"], ["c"], to=1)]
        inits = [numpy_helper.from_array(np.array(v, np.int64), n) for v, n in ((0, "a"), (10**11, "b"), (1, "d"))]
    elif kind == "RandomNormal":
        nodes = [helper.make_node("RandomNormal", [], ["c"], shape=shape.tolist(), seed=1.0)]
        inits = []
    else:
        nodes = [helper.make_node("Tile", ["w", "s"], ["c"])]
        inits = [numpy_helper.from_array(np.ones((1, 1, 1), np.float32), "w"), numpy_helper.from_array(shape, "s")]
    nodes.append(helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0))
    path = _save(tmp_path, nodes, [], [y], inits, name=kind.lower())
    # (random draws are made on the device: refused for their buffer, before anything is allocated too)
    _refused(path, tmp_path / "out", "beyond the 2 GiB a WebGPU storage buffer" if kind == "RandomNormal"
             else "beyond the 2 GiB Kiln allows a tensor")


def test_an_endless_wasm_kernel_is_stopped_by_the_time_limit(tmp_path):
    """A package whose wasm module loops forever (a damaged or hostile module; its checksums made to match) ends its
    run in a KilnError naming the time limit, within a few ticks of it, run after run: never a hang."""
    save_tiny_relu_matmul(tmp_path / "m.onnx", np.ones((2, 3), np.float32))
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", target="webgpu,wasm")
    m = read_manifest(pkg)
    tgt = m["targets"]["wasm"]
    funcs = "".join(f'(func (export "{k["export"]}") {"(param i32) " * (k["params"] + 2)}(loop $l (br $l)))'
                    for k in tgt["kernels"])
    module = pkg / tgt["module"]
    module.write_bytes(wasmtime.wat2wasm(f'(module (memory (export "memory") {tgt["memory"]["pages"]}) {funcs})'))
    tgt["sha256"], tgt["bytes"] = sha256_file(module), module.stat().st_size
    for f in m["files"]:
        if f["path"] == tgt["module"]:
            f.update(bytes=module.stat().st_size, sha256=tgt["sha256"])
    write_manifest(pkg, m)
    session = kiln.load(pkg, target="wasm", timeout_s=0.5)
    for _ in range(2):
        start = time.perf_counter()
        with pytest.raises(KilnError, match=r"took longer than its time limit of 0.5 s and was stopped"):
            session.run({"x": np.ones((1, 2), np.float32)})
        assert time.perf_counter() - start < 5
    for bad in (0, float("inf"), "5"):
        with pytest.raises(KilnError, match="timeout_s must be a finite number of seconds above 0"):
            kiln.load(pkg, target="wasm", timeout_s=bad)
