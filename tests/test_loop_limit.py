"""Mesa llvmpipe's loop limit (issue 19; docs/reliability.md, *Limits*).

On llvmpipe (lavapipe: wgpu-py's Vulkan driver without a GPU, as here), a shader invocation ends after 65535 loop
iterations in all, silently. The compiler records each WebGPU kernel's iterations per invocation
(``kiln.te.loops.loop_iterations``, manifest ``loop_iterations``) and the native runtime refuses, on such an adapter,
a kernel over the limit (``kiln.runtime.loop_limit``) instead of returning wrong numbers.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from test_data_dependent import nms_inputs, nms_model

import kiln
from kiln.arith.expr import SizeVar, Var
from kiln.arith.symbolic import to_json
from kiln.runtime import gpu
from kiln.runtime.loop_limit import LLVMPIPE_LOOP_LIMIT, adapter_loop_limit
from kiln.te.loops import For, If, loop_iterations

ON_LLVMPIPE = adapter_loop_limit(dict(gpu.adapter().info)) is not None


def test_loop_iterations_counts_every_loop_with_the_loops_around_it():
    i, j, k = Var("i"), Var("j"), Var("k")
    assert loop_iterations([For(i, 10, [For(j, 7)])]) == 10 + 70
    assert loop_iterations([For(i, 10, [If(None, [For(j, 7)])]), For(k, 3)]) == 10 + 70 + 3
    assert loop_iterations([For(i, 1, [For(j, 7)])]) == 7  # (one trip: no loop)
    assert loop_iterations([For(i, 300, [For(j, i)])]) == 300 + 300 * 299 // 2  # triangular: exact
    a = Var("a", 50)
    assert loop_iterations([For(i, 4, [For(j, a + 1)])]) == 4 + 4 * 51  # an axis variable: at its extent
    n = SizeVar("n", 0, 1, 100, 1)
    assert to_json(loop_iterations([For(i, n, [For(j, 3)])])) == ["*", "n", 4]
    assert loop_iterations([For(i, 10, [For(j, i + 1)])]) == 10 + 10 * 11  # i at its loop's trips: a bound
    assert loop_iterations([For(i, 10, [For(j, i, [For(k, j)])])]) == 10 + 45 + 45 * 9 // 2  # nested triangles
    with pytest.raises(kiln.KilnError, match="cannot bound the loop iterations"):
        loop_iterations([For(j, Var("free") + 1)])


def _run_loops(outer: int, inner: int) -> int:
    """A WGSL kernel counting the trips of two nested loops, run on the process's adapter."""
    src = (f"@group(0) @binding(0) var<storage, read_write> out: array<u32>;\n@compute @workgroup_size(1) fn main() "
           f"{{ var c: u32 = 0u; for (var i = 0; i < {outer}; i++) {{ for (var j = 0; j < {inner}; j++) "
           "{ c = c + 1u; } } out[0] = c; }")
    return int(gpu.run_words(gpu.shared_device(), src, 1)[0])


@pytest.mark.skipif(not ON_LLVMPIPE, reason="the adapter is not llvmpipe")
def test_llvmpipe_cuts_invocations_past_the_limit():
    """The premise: 65535 trips in all come back whole, more are cut without an error (so the guard is needed while
    this test passes, and the limit is right)."""
    assert _run_loops(2, 32000) == 64000  # 2 + 64000 iterations
    assert _run_loops(2, 32767) < 65534  # 2 + 65534 > 65535: cut
    assert _run_loops(1, 70000) == LLVMPIPE_LOOP_LIMIT


def _loop_counts(pkg) -> list:
    return [k.get("loop_iterations", 0) for k in
            json.loads((pkg / "manifest.json").read_text())["targets"]["webgpu"]["kernels"]]


@pytest.mark.skipif(not ON_LLVMPIPE, reason="the adapter is not llvmpipe")
def test_a_kernel_over_the_limit_is_refused_at_load(tmp_path, rng):
    """NonMaxSuppression over 400 boxes of a class scans them in one invocation (80,200 iterations): refused on
    llvmpipe at load, naming the kernel and the limit; the package's wasm target runs it right."""
    onnx.save(nms_model(1, 2, 400, limit=None), tmp_path / "m.onnx")
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", target=["webgpu", "wasm"])
    assert max(c for c in _loop_counts(pkg) if isinstance(c, int)) == 400 + 400 * 399 // 2
    with pytest.raises(kiln.DeviceError, match=r"kernel k\d+_nmsselect runs 80200 loop iterations in one invocation; "
                                               r"this adapter \(llvmpipe.*\) ends an invocation after 65535"):
        kiln.load(pkg)
    boxes, scores = nms_inputs(rng, 1, 2, 400)
    feeds = {"boxes": boxes, "scores": scores, "max_out": np.array([50], np.int64), "iou": np.array([0.5], np.float32),
             "score": np.array([0.1], np.float32)}
    ref = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(kiln.load(pkg, target="wasm").run(feeds)["selected"], ref.run(None, feeds)[0])


@pytest.mark.skipif(not ON_LLVMPIPE, reason="the adapter is not llvmpipe")
def test_run_time_dims_over_the_limit_are_refused_when_bound(tmp_path, rng):
    """A reduction whose row is a run-time dim (one invocation a row under the cpu device class's schedule): right up
    to the limit, a DeviceError beyond it, and the session still runs after."""
    x = h.make_tensor_value_info("x", T.FLOAT, [2, "n"])
    model = h.make_model(h.make_graph([h.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)], "g", [x],
                                      [h.make_tensor_value_info("y", T.FLOAT, [2, 1])],
                                      [h.make_tensor("axes", T.INT64, [1], [1])]),
                         opset_imports=[h.make_opsetid("", 18)])
    onnx.save(model, tmp_path / "m.onnx")
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", dims={"n": "1..70000"}, device_class="cpu")
    assert _loop_counts(pkg) == ["n"]
    session = kiln.load(pkg)
    for n in (LLVMPIPE_LOOP_LIMIT, 5):
        xs = rng.integers(0, 4, (2, n)).astype(np.float32)  # (integers: the sums are exact in f32)
        np.testing.assert_array_equal(session.run({"x": xs})["y"], xs.sum(1, keepdims=True))
    with pytest.raises(kiln.DeviceError, match=r"runs 65536 loop iterations in one invocation at dims \{'n': 65536\}"):
        session.run({"x": np.ones((2, LLVMPIPE_LOOP_LIMIT + 1), np.float32)})
    np.testing.assert_array_equal(session.run({"x": np.ones((2, 9), np.float32)})["y"], [[9], [9]])


@pytest.mark.skipif(not ON_LLVMPIPE, reason="the adapter is not llvmpipe")
def test_data_dependent_dims_are_checked_once_counted(tmp_path):
    """A sum over ``x[x != 0]`` of a 300 x 300 input loops over the count in one invocation: at the count's bound
    (90,000) it would exceed the limit, so it is checked when the count is read back, not at its bound: a few
    nonzeros run, 70,000 are refused, and the session runs again after."""
    x = h.make_tensor_value_info("x", T.FLOAT, [300, 300])
    nodes = [h.make_node("NonZero", ["x"], ["nz"]), h.make_node("Transpose", ["nz"], ["nzt"], perm=[1, 0]),
             h.make_node("GatherND", ["x", "nzt"], ["kept"]), h.make_node("ReduceSum", ["kept"], ["y"], keepdims=0)]
    model = h.make_model(h.make_graph(nodes, "g", [x], [h.make_tensor_value_info("y", T.FLOAT, [])]),
                         opset_imports=[h.make_opsetid("", 18)])
    onnx.save(model, tmp_path / "m.onnx")
    session = kiln.load(kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", device_class="cpu"))
    few = np.zeros((300, 300), np.float32)
    few[[1, 7, 50], [2, 9, 299]] = [1, 2, 3]
    assert float(session.run({"x": few})["y"]) == 6
    many = np.zeros((300, 300), np.float32)
    many.reshape(-1)[:70000] = 1
    with pytest.raises(kiln.DeviceError, match=r"loop iterations in one invocation at dims .*NonZero"):
        session.run({"x": many})
    assert float(session.run({"x": few})["y"]) == 6
