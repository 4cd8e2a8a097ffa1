"""Horizontal fusion (kiln.te.horizontal): neighbouring independent kernels run as one WebGPU dispatch, each over its
own range of invocations; checked against onnxruntime natively and in Chromium, and against the same package with a
step per kernel."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.codegen.lowering import kernel_groups
from kiln.codegen.webgpu import wgsl
from kiln.codegen.webgpu.build import MAX_CONCAT_BUFFERS, _joins
from kiln.compiler import compile_graph
from kiln.frontend.onnx.importer import import_model
from kiln.package.writer import write_package
from kiln.te.compute import compute, placeholder
from kiln.te.horizontal import concat, concatenable, ride
from kiln.te.loops import Param
from kiln.te.lower import lower
from kiln.te.schedule import Schedule


def _branches(path, n: int = 48):
    """``x [2, n]`` -> gathered rows (``Gather`` on axis 0), sliced columns, and ``Tanh(x)`` with ``Sqrt(|x|)``:
    independent kernels, outputs of the graph."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Gather", ["x", "idx"], ["rows"], axis=0),
             helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["cols"]),
             helper.make_node("Tanh", ["x"], ["t"]),
             helper.make_node("Abs", ["x"], ["a"]),
             helper.make_node("Sqrt", ["a"], ["r"])]
    inits = [helper.make_tensor("idx", TensorProto.INT64, [3], [1, 0, 1]),
             helper.make_tensor("starts", TensorProto.INT64, [1], [5]),
             helper.make_tensor("ends", TensorProto.INT64, [1], [n - 3]),
             helper.make_tensor("axes", TensorProto.INT64, [1], [1])]
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", f, [2, n])],
                              [helper.make_tensor_value_info(o, f, shape) for o, shape in
                               (("rows", [3, n]), ("cols", [2, n - 8]), ("t", [2, n]), ("r", [2, n]))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_independent_kernels_run_as_one_step(tmp_path, rng):
    """Four independent kernels (a gather, a slice, two elementwise chains) become fewer plan steps than kernel
    groups, with a kernel writing several outputs; the outputs equal onnxruntime's and those of the same package
    built with a step per group (``concat_steps=False``), with NaN-poisoned buffers."""
    path = _branches(tmp_path / "branches.onnx")
    x = rng.standard_normal((2, 48)).astype(np.float32)
    want = dict(zip(("rows", "cols", "t", "r"),
                    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})))
    got = {}
    for merged in (True, False):
        compiled = compile_graph(import_model(onnx.load(path)), "webgpu", concat_steps=merged)
        plan = compiled.builds["webgpu"].section["plan"]
        groups = kernel_groups(compiled.groups)
        writers = [k for k in compiled.kernels if sum(a != "read" for a in k.access) > 1]
        if merged:
            assert len(plan) < len(groups) and writers, (len(plan), len(groups))
        else:
            assert len(plan) == len(groups) and not writers
        got[merged] = kiln.load(write_package(compiled, tmp_path / f"pkg{merged}"), poison=True).run({"x": x})
    for name, w in want.items():
        np.testing.assert_allclose(got[True][name], w, rtol=1e-6, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(got[True][name], got[False][name], err_msg=name)


def test_kernels_with_loops_keep_their_steps(rng):
    """Two independent matrix products lowered without reduce lanes (cpu schedules: a loop per invocation) stay two
    steps: a concatenated kernel's loop count would be their sum (llvmpipe's per-invocation limit)."""
    f = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("MatMul", ["z", "v"], ["u"])],
                              "two", [helper.make_tensor_value_info("x", f, [4, 64]),
                                      helper.make_tensor_value_info("z", f, [4, 64])],
                              [helper.make_tensor_value_info("y", f, [4, 8]), helper.make_tensor_value_info("u", f, [4, 8])],
                              [onnx.numpy_helper.from_array(rng.standard_normal((64, 8)).astype(np.float32), n)
                               for n in ("w", "v")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = compile_graph(import_model(model), "webgpu", device_class="cpu")
    assert len(compiled.builds["webgpu"].section["plan"]) == len(kernel_groups(compiled.groups)) == 2


def test_concatenated_kernels_in_the_browser(tmp_path, rng):
    """The same package through Chromium's shader compiler and kiln.js (poisoned buffers), against onnxruntime."""
    from browser import close_shared_runner, shared_runner

    path = _branches(tmp_path / "branches.onnx", n=300)
    x = rng.standard_normal((2, 300)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    runner = shared_runner()
    try:
        pkg = kiln.compile(path, runner.package_dir("branches"))
        manifest = kiln.load(pkg).manifest
        assert any(sum(b["access"] != "read" for b in k["bindings"]) > 1 for k in manifest["targets"]["webgpu"]["kernels"])
        got = runner.run(pkg, {"x": x}, "webgpu")
    finally:
        close_shared_runner()
    for name, w in zip(("rows", "cols", "t", "r"), want):
        np.testing.assert_allclose(got[name], w, rtol=1e-6, atol=1e-6, err_msg=name)


def _kernel(width: int = 64):
    x = placeholder((10,))
    return lower(compute(x.shape, lambda i: x[i] * 2.0, "double"), Schedule(workgroup_size=width))


def test_only_independent_kernels_of_one_workgroup_size_join():
    """A kernel joins a run only when it binds no buffer a kernel of the run writes, writes no buffer the run binds,
    has the run's workgroup size and keeps the step within WebGPU's storage buffer limit."""
    k = _kernel()
    run = [(None, k, [1, 2])]  # reads buffer 1, writes buffer 2
    assert _joins(run, k, [3, 4])
    assert not _joins([], k, [3, 4])  # (a run starts with the first kernel)
    assert not _joins(run, k, [2, 4])  # reads what the run writes
    assert not _joins(run, k, [3, 1])  # overwrites what the run reads
    assert not _joins(run, k, [3, 2])  # writes the run's output
    assert not _joins(run, _kernel(128), [3, 4])
    wide = [(None, k, [*range(100, 100 + MAX_CONCAT_BUFFERS - 2), 50])]
    assert not _joins(wide, k, [60, 61])
    assert _joins(wide, k, [100, 61])  # a buffer both read counts once


def test_concat_refuses_cooperative_kernels():
    """Kernels whose lanes share a reduction through workgroup memory cannot run over a part of a dispatch."""
    x = placeholder((4, 256))
    from kiln.arith.expr import reduce, reduce_axis

    r = reduce_axis(256, "r")
    summed = lower(compute((4,), lambda i: reduce("sum", x[i, r], [r]), "sum"),
                   Schedule(workgroup_size=64, reduce_lanes=64))
    assert not concatenable(summed) and concatenable(_kernel())
    with pytest.raises(ValueError, match="work alone"):
        concat([_kernel(), summed], [[1, 2], [1, 3]], "bad")
    k = _kernel()
    as_int = dataclasses.replace(k, params=[Param("in0", "int32", 10, "read"), k.params[1]])
    with pytest.raises(ValueError, match="read as float32 and as int32"):
        concat([k, as_int], [[1, 2], [1, 3]], "bad")


def test_ride_joins_a_rider_after_a_cooperative_kernels_workgroups():
    """``ride``: the cooperative host's workgroups first (its body under a condition on the workgroup index alone),
    then the rider's invocations; a buffer the host reads and the rider writes is bound once, read_write. A host that
    is not cooperative, a rider that is, or a rider binding the host's output is refused. (The numbers:
    tests/test_split_attention.py, where a decode step's KV-cache writes ride on its attention kernel.)"""
    x = placeholder((4, 256))
    from kiln.arith.expr import reduce, reduce_axis

    r = reduce_axis(256, "r")
    summed = lower(compute((4,), lambda i: reduce("sum", x[i, r], [r]), "sum"),
                   Schedule(workgroup_size=64, reduce_lanes=64))
    rider = _kernel(32)  # (a rider keeps its own invocations whatever the host's workgroup size)
    k, bufs = ride(summed, rider, [1, 2], [5, 1], "both")  # the rider writes what the host reads
    assert bufs == [5, 2, 1] and [p.access for p in k.params] == ["read", "read_write", "read_write"]
    assert k.groups == summed.groups + 1 and k.cooperative and k.shared == summed.shared
    source = wgsl.render(k)
    assert f"if ((wid < {summed.groups}i))" in source and "(wid >= 4i)" in source, source
    with pytest.raises(ValueError, match="must be cooperative"):
        ride(rider, rider, [1, 2], [3, 4], "bad")
    with pytest.raises(ValueError, match="must be cooperative"):
        ride(summed, summed, [1, 2], [3, 4], "bad")
    with pytest.raises(ValueError, match="rider binds the host's output"):
        ride(summed, rider, [1, 2], [2, 5], "bad")
