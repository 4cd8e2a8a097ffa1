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
