"""Every schedule the compiler or the tuner can choose computes the same numbers.

Kernels of the reduction primitives (and a fused epilogue) are lowered under a spread of
schedules: register tiles over one or two axes, factors that do and do not divide the
extent, contiguous and strided splits, unrolled reduction loops, other workgroup sizes,
and :func:`~kiln.te.schedule.default_schedule`. Each runs natively with a NaN-poisoned
output and is compared with the primitive's numpy semantics (:mod:`kiln.ir.ops`).
"""

from __future__ import annotations

import numpy as np
import pytest

from kiln.codegen.webgpu import wgsl
from kiln.codegen.webgpu.validate import validate_wgsl
from kiln.ir import ops
from kiln.kernels import elementwise, library
from kiln.runtime.kernel import KernelRunner
from kiln.te import schedule as schedule_module
from kiln.te.compute import inline, placeholder
from kiln.te.lower import lower
from kiln.te.schedule import Schedule, Split, default_schedule

CONV = {"strides": (1, 1), "dilations": (1, 1), "pads": (1, 1, 1, 1), "group": 1}
POOL = {"kernel_shape": (3, 3), "strides": (2, 2), "dilations": (1, 1), "pads": (1, 1, 1, 1), "ceil_mode": 0,
        "count_include_pad": 0}

#: name -> (primitive, input shapes, attrs)
CASES = {
    "conv3x3": ("Conv", [(1, 6, 9, 7), (10, 6, 3, 3)], CONV),
    "conv_stride2_asym_pad": ("Conv", [(2, 3, 11, 10), (8, 3, 3, 3)],
                              {**CONV, "strides": (2, 2), "pads": (0, 0, 1, 1)}),
    "conv1x1": ("Conv", [(1, 12, 5, 6), (7, 12, 1, 1)], {**CONV, "pads": (0, 0, 0, 0)}),
    "conv_depthwise": ("Conv", [(1, 9, 8, 7), (9, 1, 3, 3)], {**CONV, "group": 9}),
    "conv_grouped_dilated": ("Conv", [(1, 8, 9, 9), (6, 4, 3, 3)], {**CONV, "group": 2, "dilations": (2, 2)}),
    "conv1d": ("Conv", [(1, 5, 17), (6, 5, 5)], {"strides": (1,), "dilations": (1,), "pads": (2, 2), "group": 1}),
    "conv3d": ("Conv", [(1, 3, 5, 4, 6), (4, 3, 3, 3, 3)],
               {"strides": (1, 1, 1), "dilations": (1, 1, 1), "pads": (1, 1, 1, 1, 1, 1), "group": 1}),
    "matmul": ("MatMul", [(13, 21), (21, 19)], {}),
    "matmul_batched_broadcast": ("MatMul", [(2, 1, 5, 17), (3, 17, 9)], {}),
    "maxpool": ("MaxPool", [(1, 5, 9, 8)], POOL),
    "avgpool": ("AveragePool", [(1, 5, 9, 8)], POOL),
    "reducesum": ("ReduceSum", [(3, 37, 5)], {"axes": (1,), "keepdims": 1}),
    "reducemax_two_axes": ("ReduceMax", [(6, 7, 8)], {"axes": (0, 2), "keepdims": 0}),
}


def schedules(rank: int) -> dict[str, Schedule]:
    """Schedules worth checking for an output of ``rank`` (axis 1 is channels, the last is innermost)."""
    last = rank - 1
    return {
        "flat": Schedule(),
        "unroll9": Schedule(unroll=9),
        "channels4": Schedule(splits=(Split(min(1, last), 4, contiguous=True),)),
        "inner3_strided_unroll4": Schedule(splits=(Split(last, 3),), unroll=4),
        "tile2x4_contiguous_wg32": Schedule(workgroup_size=32, splits=(Split(min(1, last), 2), Split(last, 4, True)),
                                            unroll=16),
        "tile4x4_unroll27_wg128": Schedule(workgroup_size=128, splits=(Split(0, 4, True), Split(last, 4)), unroll=27),
        "lanes4": Schedule(reduce_lanes=4),
        "partial_unroll4": Schedule(splits=(Split(last, 2),), unroll=4),
        "tile2x2_lanes16_wg32": Schedule(workgroup_size=32, splits=(Split(min(1, last), 2), Split(last, 2)), unroll=9,
                                         reduce_lanes=16),
        "lanes64_wg64": Schedule(workgroup_size=64, splits=(Split(last, 3, True),), reduce_lanes=64),
        # shared operand tiles (kiln.te.tiles); kernels that are no contraction over these axes fall back
        "shared4x4_k8_wg64_vec4": Schedule(workgroup_size=64, splits=(Split(1 if rank > 2 else 0, 4, True),
                                                                      Split(last, 4)), unroll=4, shared_k=8, vector_width=4),
        "shared2x3_k4_wg32": Schedule(workgroup_size=32, splits=(Split(1 if rank > 2 else 0, 2), Split(last, 3, True)),
                                      unroll=1, shared_k=4),
    }


def _kernel(name: str, rng):
    op, shapes, attrs = CASES[name]
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    (_, out_shape), = ops.get(op).infer([("float32", s) for s in shapes], attrs)
    tensors = [placeholder(s, name=f"x{i}") for i, s in enumerate(shapes)]
    expected = ops.get(op).evaluate(arrays, attrs)[0]
    t = library.build(op, tensors, attrs, out_shape, name)
    if op == "Conv":  # a fused epilogue: per-channel bias and ReLU, as fusion makes them
        bias = rng.standard_normal((out_shape[1],) + (1,) * (len(out_shape) - 2)).astype(np.float32)
        t = elementwise.unary("Relu", elementwise.binary("Add", t, placeholder(bias.shape, name="b"), out_shape), {})
        arrays.append(bias)
        expected = np.maximum(expected + bias, 0)
    return inline(t), arrays, expected


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_schedule_matches_numpy(case, rng):
    t, arrays, expected = _kernel(case, rng)
    candidates = {**schedules(len(t.shape)), "default": default_schedule(t, min_invocations=1)}
    for sname, sched in candidates.items():
        k = lower(t, sched, name=case)
        src = wgsl.render(k)
        validate_wgsl(src, f"{case}/{sname}")
        got = KernelRunner(src, arrays, k.params[-1].size, k.dispatch).run().reshape(expected.shape)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=f"{case} under {sname}: {sched}")


def test_default_schedule_tiles_reuse_axes():
    x, w = placeholder((1, 64, 28, 28)), placeholder((128, 64, 1, 1))
    t = inline(library.build("Conv", [x, w], {**CONV, "pads": (0, 0, 0, 0)}, (1, 128, 28, 28), "pw"))
    s = default_schedule(t)
    assert {sp.axis: sp.factor for sp in s.splits} == {1: 4, 3: 4}  # output channels x columns
    k = lower(t, s)
    loads = wgsl.render(k).count("= in")
    assert loads == 8  # 4 input pixels + 4 weights feed 16 accumulators per reduction step
    dw = inline(library.build("Conv", [placeholder((1, 32, 56, 56)), placeholder((32, 1, 3, 3))],
                              {**CONV, "group": 32}, (1, 32, 56, 56), "dw"))
    assert [sp.axis for sp in default_schedule(dw).splits] == [2, 3]  # depthwise: no reuse across channels
    assert default_schedule(inline(elementwise.unary("Relu", x, {}))) == Schedule()
    gemm = inline(library.build("MatMul", [placeholder((4096, 4096)), placeholder((4096, 4096))], {}, (4096, 4096),
                                "gemm"))
    if schedule_module.DEFAULT_SHARED_TILES == "off":
        assert default_schedule(gemm) == Schedule(splits=(Split(0, 8, True), Split(1, 8)), unroll=16)
    else:  # large GEMMs stage their operands through workgroup memory: 8 x 8 tiles, columns in vec4 groups
        assert default_schedule(gemm) == Schedule(workgroup_size=128, splits=(Split(0, 8, True), Split(1, 8, group=4)),
                                                  unroll=8, shared_k=8, vector_width=4, prefetch=True)
    assert default_schedule(gemm, device_class="cpu").shared_k == 0


def test_schedule_json_round_trip():
    s = Schedule(workgroup_size=128, splits=(Split(1, 4, True), Split(3, 2)), unroll=9, reduce_lanes=8)
    assert Schedule.from_json(s.to_json()) == s
    assert all("group" not in sp for sp in s.to_json()["splits"])  # (records without groups read as before)
    g = Schedule(workgroup_size=128, splits=(Split(0, 8, True), Split(1, 8, group=4)), shared_k=8)
    assert Schedule.from_json(g.to_json()) == g
    with pytest.raises(ValueError, match="group"):
        Split(1, 8, group=3)
    with pytest.raises(ValueError, match="power of two"):
        Schedule(workgroup_size=64, reduce_lanes=3)


def test_small_outputs_with_long_reductions_get_reduce_lanes():
    fc = inline(library.build("MatMul", [placeholder((1, 2048)), placeholder((2048, 1000))], {}, (1, 1000), "fc"))
    s = default_schedule(fc)  # (250 tiles of 4 columns: few tiles, a workgroup of lanes each)
    assert s.reduce_lanes == 256 and s.workgroup_size == 256
    src = wgsl.render(lower(fc, s))
    assert "var<workgroup> red" in src and src.count("workgroupBarrier()") == 4  # 256 -> 32 -> 4 -> 1, then the final
    wide = inline(library.build("MatMul", [placeholder((1, 2048)), placeholder((2048, 8000))], {}, (1, 8000), "fc"))
    assert default_schedule(wide).reduce_lanes == 16  # (8000 tiles: 65536 invocations)
    assert "return;" not in src  # every invocation reaches the barriers


def test_cpu_device_class_uses_full_tiles_and_no_lanes():
    fc = inline(library.build("MatMul", [placeholder((1, 2048)), placeholder((2048, 1000))], {}, (1, 1000), "fc"))
    s = default_schedule(fc, device_class="cpu")
    assert s.reduce_lanes == 1 and [sp.factor for sp in s.splits] == [4]
    with pytest.raises(ValueError, match="device_class"):
        default_schedule(fc, device_class="tpu")


@pytest.mark.parametrize("shape", [(240000,), (1, 80, 3000)])
def test_cpu_schedule_splits_reductions_lavapipe_would_cut(shape, tmp_path, rng):
    """lavapipe ends an invocation's loops after 65535 iterations in all, silently: a whole-tensor ReduceMax over
    240000 elements in one invocation saw only the first 65535. The ``cpu`` default schedule gives such a
    reduction lanes; the maximum is found wherever it lies."""
    import kiln
    from kiln.compiler import compile_graph
    from kiln.ir.graph import Builder, Graph, Value
    from kiln.package.writer import write_package

    g = Graph(name="longmax")
    x = Value("x", "float32", shape)
    g.inputs.append(x)
    y = Builder(g).op("ReduceMax", [x], axes=tuple(range(len(shape))), keepdims=0)
    y.name = "y"
    g.outputs = [y]
    session = kiln.load(write_package(compile_graph(g, "webgpu", device_class="cpu"), tmp_path / "pkg"))
    a = rng.standard_normal(shape).astype(np.float32)
    for at in (0, a.size // 2, a.size - 1):
        b = a.copy().reshape(-1)
        b[at] = 100.0
        assert float(session.run({"x": b.reshape(shape)})["y"]) == 100.0
