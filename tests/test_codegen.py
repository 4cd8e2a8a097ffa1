"""Tensor expressions, lowering and WGSL rendering, read as source; every shader validated by naga."""

from __future__ import annotations

import numpy as np

from kiln.arith.expr import Const, Var, binop, call, const
from kiln.codegen.webgpu import wgsl
from kiln.codegen.webgpu.validate import validate_wgsl
from kiln.kernels import elementwise, nn
from kiln.te.compute import compute, inline, placeholder
from kiln.te.lower import lower


def test_builders_fold_constants_and_identities():
    i = Var("i")
    assert binop("+", i, 0) is i
    assert binop("*", 1, i) is i
    assert binop("*", i, 0) == const(0, "int32")
    assert binop("+", const(2, "int32"), const(3, "int32")) == const(5, "int32")
    assert call("max", 1.0, 2.0) == const(2.0, "float32")


def test_fusion_inlines_elementwise_into_reduction_epilogue():
    x = placeholder((1, 4, 6, 6), name="x")
    w = placeholder((8, 4, 3, 3), name="w")
    b = placeholder((8, 1, 1), name="b")
    y = nn.conv(x, w, (1, 1), (1, 1), (1, 1, 1, 1), 1, (1, 8, 6, 6))
    y = elementwise.binary("Add", y, b, (1, 8, 6, 6))
    y = elementwise.unary("Clip", y, {"min": 0.0, "max": 6.0})
    k = lower(inline(y), name="conv_add_clip")
    src = wgsl.render(k)
    assert src.count("for (var") == 3  # rc, kh, kw: one accumulation loop nest
    assert "min(max((acc0 + v" in src and " = in2[i1];" in src  # bias and clip fused in the epilogue
    assert "select(0.0f" in src and "min(u32(" in src  # padding guarded, clamped load
    assert [p.access for p in k.params] == ["read", "read", "read", "read_write"]
    validate_wgsl(src, "conv_add_clip")


def test_depthwise_conv_has_no_channel_loop():
    x = placeholder((1, 8, 5, 5), name="x")
    w = placeholder((8, 1, 3, 3), name="w")
    src = wgsl.render(lower(inline(nn.conv(x, w, (1, 1), (1, 1), (1, 1, 1, 1), 8, (1, 8, 5, 5)))))
    assert src.count("for (var") == 2
    validate_wgsl(src, "depthwise")


def test_large_dispatch_wraps_into_y():
    x = placeholder((70000 * 64 + 5,), name="x")
    k = lower(compute(x.shape, lambda i: x[i] * 2.0))
    assert k.dispatch[1] > 1 and k.dispatch[0] <= 65535
    assert k.dispatch[0] * k.dispatch[1] * 64 >= x.size


def test_literals_render_exactly():
    assert wgsl.literal(float("-inf"), "float32") == "kiln_neg_inf"
    assert wgsl.literal(0.1, "float32") == f"{float(np.float32(0.1))!r}f"
    assert wgsl.literal(-3, "int32") == "-3i"
    assert isinstance(const(1.5, "float32"), Const)


def test_reduction_max_starts_from_negative_infinity():
    x = placeholder((3, 5), name="x")
    k = lower(inline(nn.reduction("ReduceMax", x, (1,), 0, (3,))))
    src = wgsl.render(k)
    assert "let kiln_neg_inf = bitcast<f32>(kiln_neg_inf_bits);" in src and "= kiln_neg_inf;" in src
    assert "max(acc0," in src
    validate_wgsl(src, "reduce_max")


def test_invariant_factors_leave_the_sum():
    """RMSNorm read by a 4-bit product (a decode step's projections): ``1 / rms(x)`` leaves the product's sum, so the
    statistic's sum and the product's run side by side and the scale is applied once a column; the result matches
    numpy."""
    from bench.gemv import q4_weights
    from kiln.arith.expr import Reduce, hoist_factors, reduce, reduce_axis
    from kiln.kernels import quant
    from kiln.runtime.kernel import KernelRunner
    from kiln.te.compute import Tensor

    k, n = 64, 40
    x, g = placeholder((1, k), name="x"), placeholder((k,), name="g")
    r = reduce_axis(k, "rk")
    sq = compute((1,), lambda i: reduce("sum", x[i, r] * x[i, r], [r]), "sq")
    a = compute((1, k), lambda i, j: x[i, j] * (1.0 / call("sqrt", sq[i] / float(k) + 1e-5)) * g[j], "norm")
    attrs = {"bits": 4, "block_size": 32, "K": k, "N": n, "scale_format": "f16x2"}
    t = inline(quant.matmul_nbits(a, placeholder((n, k // 8), "int32"), placeholder((n, k // 32), "int32"), None,
                                  attrs, (1, n), "gemv"))
    hoisted = Tensor(t.name, t.shape, t.dtype, t.axes, hoist_factors(t.body))
    top = hoisted.body
    assert not isinstance(top, Reduce)  # the product's sum is scaled after it
    sums = [e for e in (top.a, top.b) if isinstance(e, Reduce)]
    assert len(sums) == 1 and "sqrt" not in repr(sums[0])
    rng = np.random.default_rng()
    xs, gs = rng.standard_normal((1, k)).astype(np.float32), rng.standard_normal(k).astype(np.float32)
    packed, words, w = q4_weights(k, n, rng)
    xr = xs.astype(np.float64)
    expected = (xr / np.sqrt((xr ** 2).mean() + 1e-5) * gs) @ w.T
    for e in (t, hoisted):
        kern = lower(e)
        src = wgsl.render(kern)
        validate_wgsl(src, "gemv")
        got = KernelRunner(src, [xs, gs, packed, words], n, kern.dispatch).run()
        np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-4, atol=1e-4)


def test_hoisting_leaves_sums_that_may_be_empty_alone():
    """A sum over a run-time extent that may be 0 keeps its factors (it is 0 whatever they are, where ``0 * s / t``
    would be NaN for ``t`` 0); one whose extent is at least 1 by its bounds (as group_expr asks) moves them out, and
    without bounds to ask every run-time extent counts as possibly 0."""
    from kiln.arith import symbolic
    from kiln.arith.expr import SizeVar, hoist_factors, reduce, reduce_axis

    x, s = placeholder((4, 16), name="x"), placeholder((4,), name="s")
    i = Var("i")
    for lo, moved in ((0, False), (1, True)):
        r = reduce_axis(SizeVar("n", 0, lo, 16, 8), "k")
        e = reduce("sum", x[i, r] / s[i], [r])
        assert hoist_factors(e, lambda n: symbolic.bounds(n)[0] < 1) == \
            (reduce("sum", x[i, r], [r]) / s[i] if moved else e), lo
        assert hoist_factors(e) == e


def test_hoisting_leaves_other_sums_alone():
    """Sums whose every factor depends on their axis, or none does, max reductions and float16 sums keep their form."""
    from kiln.arith.expr import cast, hoist_factors, reduce, reduce_axis

    x = placeholder((4, 8), name="x")
    s = placeholder((4,), name="s")
    r = reduce_axis(8)
    plain = reduce("sum", x[Var("i"), r] * x[Var("i"), r], [r])
    assert hoist_factors(plain) == plain
    invariant = reduce("sum", s[Var("i")] * 2.0, [r])
    assert hoist_factors(invariant) == invariant
    peak = reduce("max", x[Var("i"), r] * s[Var("i")], [r])
    assert hoist_factors(peak) == peak
    half = reduce("sum", cast(x[Var("i"), r], "float16") * cast(s[Var("i")], "float16"), [r])
    assert hoist_factors(half) == half
    scaled = reduce("sum", x[Var("i"), r] / s[Var("i")], [r])
    assert hoist_factors(scaled) == reduce("sum", x[Var("i"), r], [r]) / s[Var("i")]


def test_a_nested_reduction_read_twice_is_reduced_once():
    """FlashDecoding's combine (kiln.passes.split_attention), ``sum_b exp(l_b - M) o_b / sum_b exp(l_b - M)`` with
    ``M = max_b l_b``: the maximum, nested in both sums (one value inlined twice), is one loop before them, not one
    each; the result matches numpy."""
    from kiln.arith.expr import reduce, reduce_axis
    from kiln.runtime.kernel import KernelRunner

    blocks, n = 9, 40
    lse, o = placeholder((blocks,), name="lse"), placeholder((blocks, n), name="o")
    m = reduce_axis(blocks, "m")
    peak = reduce("max", lse[m], [m])
    ra, rb = reduce_axis(blocks, "a"), reduce_axis(blocks, "b")
    t = compute((n,), lambda j: reduce("sum", call("exp", lse[ra] - peak) * o[ra, j], [ra]) /
                reduce("sum", call("exp", lse[rb] - peak), [rb]), "combine")
    k = lower(t)
    src = wgsl.render(k)
    validate_wgsl(src, "combine")
    assert src.count("for (var") == 3, src  # the maximum once, then the two sums
    rng = np.random.default_rng()
    ls, os_ = (rng.standard_normal(blocks) * 4).astype(np.float32), rng.standard_normal((blocks, n)).astype(np.float32)
    w = np.exp(ls.astype(np.float64) - ls.max())
    got = KernelRunner(src, [ls, os_], n, k.dispatch).run()
    np.testing.assert_allclose(got.reshape(n), (w[:, None] * os_).sum(0) / w.sum(), rtol=1e-5, atol=1e-6)


def test_groups_of_one_structure_are_lowered_once(rng):
    """``build_group`` with a memo (kiln.codegen.lowering; the WebGPU target keeps one a build): groups of the same
    structure (a decoder's layers) take the kernel lowered first, bound to their own values, rendered as a fresh
    lowering is; another scalar constant is another kernel."""
    from kiln.codegen.lowering import build_group, group_key
    from kiln.ir.graph import Builder, Graph, Value
    from kiln.passes.fusion import fuse

    g = Graph(name="layers")
    x = Value("x", "float32", (4, 8))
    g.inputs = [x]
    b = Builder(g)
    h = x
    for scale in (2.0, 2.0, 3.0):  # (the third layer's constant differs)
        w = b.const(rng.standard_normal((8, 8)).astype(np.float32))
        h = b.op("Tanh", [b.op("Mul", [b.op("MatMul", [h, w]), b.const(np.array(scale, np.float32))])])
    g.outputs = [h]
    groups = [gr for gr in fuse(g) if not gr.alias]
    assert len(groups) == 3, [[n.op for n in gr.nodes] for gr in groups]
    keys = [group_key(gr)[0] for gr in groups]
    assert keys[0] == keys[1] != keys[2]
    memo: dict = {}
    built = [build_group(gr, memo=memo) for gr in groups]
    assert built[1][0] is built[0][0] and built[2][0] is not built[0][0] and len(memo) == 2
    for gr, (k, ins) in zip(groups, built):
        fresh, fresh_ins = build_group(gr)
        assert [id(v) for v in ins] == [id(v) for v in fresh_ins]  # its own input and weight
        assert wgsl.render(k) == wgsl.render(fresh)


def _evaluate(e, env: dict[str, int]) -> int:
    """An integer index expression's value (floor ``//`` and ``%``: every value here is non-negative)."""
    if isinstance(e, int):
        return e
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, Const):
        return int(e.value)
    a, b = _evaluate(e.a, env), _evaluate(e.b, env)
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "//": lambda: a // b,
            "%": lambda: a % b}[e.op]()


def test_reshape_index_reads_each_run_of_dims_apart():
    """A reshape's input index is computed per run of dims of equal size (a head merge reads ``[i0, i1, i2 // d,
    i2 % d]``, not an unravelled flat offset), and is the row-major element for every element of every shape pair
    (size-1 dims on either side, no common runs at all)."""
    import itertools

    from kiln.kernels.layout import reshape_index

    merged = reshape_index([Var("i0"), Var("i1"), Var("i2")], (2, 3, 12), (2, 3, 4, 3))
    assert merged[:2] == (Var("i0"), Var("i1")) and [str(getattr(x, "op", "")) for x in merged[2:]] == ["//", "%"]
    for out_shape, in_shape in [((2, 3, 12), (2, 3, 4, 3)), ((2, 3, 4, 3), (2, 3, 12)), ((6, 4), (2, 3, 4)),
                                ((2, 12), (4, 6)), ((1, 5, 1, 6), (30,)), ((30,), (1, 5, 1, 6)), ((2, 1, 3), (2, 3, 1)),
                                ((4, 6), (6, 4)), ((2, 3, 1, 4), (6, 4)), ((1,), (1, 1)), ((6,), (2, 3)),
                                ((), (1, 1)), ((1, 1), ())]:
        idx = [Var(f"i{k}") for k in range(len(out_shape))]
        got = reshape_index(idx, out_shape, in_shape)
        for element in itertools.product(*(range(d) for d in out_shape)):
            env = {f"i{k}": v for k, v in enumerate(element)}
            want = np.unravel_index(np.ravel_multi_index(element, out_shape), in_shape)
            assert tuple(_evaluate(x, env) for x in got) == tuple(int(w) for w in want), (out_shape, in_shape, element)
