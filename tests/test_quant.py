"""Quantized operators against onnxruntime on fresh random inputs.

Integer results (MatMulInteger, ConvInteger, QLinear*, QuantizeLinear, DynamicQuantizeLinear) must be
*exactly* equal: Kiln accumulates in int32 and requantizes with the same float32 operations in the
same order as onnxruntime's MLAS kernels (see kiln/frontend/onnx/ops/qlinear.py). DequantizeLinear's
float results are one float32 subtraction and multiplication of exact small integers, so they are
compared to 1 ulp-level tolerance (rtol 1e-6).
"""

from __future__ import annotations

import numpy as np
import pytest
from opcheck import check_op


def f32(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def q(rng, dtype, *shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)


EXACT = {"rtol": 0, "atol": 0}


# ----------------------------------------------------------------------------- QuantizeLinear / DequantizeLinear
@pytest.mark.parametrize("opset", [10, 13, 19, 21])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_quantize_linear_per_tensor(rng, opset, dtype):
    x = f32(rng, 2, 3, 5, lo=-4, hi=4)
    # values that land exactly on .5 after division exercise round-half-to-even; big ones saturate
    x.flat[:6] = [0.25, 0.75, -0.25, -0.75, 100.0, -100.0]
    scale = np.array(0.5, np.float32)
    zp = np.array(3 if dtype == np.int8 else 128, dtype)
    check_op("QuantizeLinear", {"x": x}, None, {"s": scale, "z": zp}, opset=opset, **EXACT)
    check_op("QuantizeLinear", {"x": x}, None, {"s": np.array(rng.uniform(0.01, 0.1), np.float32), "z": zp},
             opset=opset, **EXACT)


@pytest.mark.parametrize("opset", [13, 19, 21])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_linear_per_axis(rng, opset, axis):
    x = f32(rng, 3, 4, 5, lo=-3, hi=3)
    n = x.shape[axis]
    check_op("QuantizeLinear", {"x": x}, {"axis": axis},
             {"s": f32(rng, n, lo=0.01, hi=0.05), "z": q(rng, np.int8, n) // 8}, opset=opset, **EXACT)


def test_quantize_linear_blocked(rng):
    x = f32(rng, 4, 6, lo=-3, hi=3)
    check_op("QuantizeLinear", {"x": x}, {"axis": 1, "block_size": 3},
             {"s": f32(rng, 4, 2, lo=0.01, hi=0.05), "z": q(rng, np.uint8, 4, 2)}, opset=21, **EXACT)


def test_quantize_linear_no_zero_point_is_uint8(rng):
    check_op("QuantizeLinear", {"x": f32(rng, 7, lo=-2, hi=8)}, None, {"s": np.array(0.04, np.float32)},
             opset=13, **EXACT)


def test_quantize_linear_float16_input(rng):
    x = f32(rng, 3, 4, lo=-3, hi=3).astype(np.float16)
    check_op("QuantizeLinear", {"x": x}, None, {"s": np.array(0.03, np.float16), "z": np.array(-5, np.int8)},
             opset=19, **EXACT)


@pytest.mark.parametrize("opset", [10, 13, 19, 21])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_dequantize_linear(rng, opset, dtype):
    x = q(rng, dtype, 2, 3, 4)
    check_op("DequantizeLinear", {"x": x}, None, {"s": np.array(0.037, np.float32), "z": q(rng, dtype)},
             opset=opset, rtol=1e-6, atol=0)
    if opset >= 13:
        check_op("DequantizeLinear", {"x": x}, {"axis": 1}, {"s": f32(rng, 3, lo=0.01, hi=0.1), "z": q(rng, dtype, 3)},
                 opset=opset, rtol=1e-6, atol=0)


def test_dequantize_linear_int32(rng):
    x = rng.integers(-(2**20), 2**20, size=(4, 5)).astype(np.int32)
    check_op("DequantizeLinear", {"x": x}, None, {"s": np.array(0.001, np.float32)}, opset=13, rtol=1e-6, atol=0)


# ----------------------------------------------------------------------------- DynamicQuantizeLinear
def test_dynamic_quantize_linear_exact(rng):
    x = f32(rng, 4, 33, lo=-3, hi=7)
    check_op("DynamicQuantizeLinear", {"x": x}, n_outputs=3, **EXACT)


def test_dynamic_quantize_linear_spec():
    """The spec's rounding and saturation on a hand-made case: the range always includes 0, the zero point is
    round_half_even(-min / scale) saturated to uint8, y = saturate(round_half_even(x / scale) + zp)."""
    x = np.array([[0.0, 2.55, 1.275, 0.005, -0.0], [0.015, 0.025, 2.0, 1.0, 0.5]], np.float32)  # all >= 0: zp = 0
    y, scale, zp = check_op("DynamicQuantizeLinear", {"x": x}, n_outputs=3, **EXACT).values()
    assert zp == 0 and scale == np.float32(2.55) / np.float32(255)
    ref = np.clip(np.rint(x / scale), 0, 255).astype(np.uint8)  # np.rint rounds half to even
    np.testing.assert_array_equal(y, ref)
    neg = np.array([-1.0, -0.5, 0.0], np.float32)  # all <= 0: max is 0, zp saturates at 255
    y, scale, zp = check_op("DynamicQuantizeLinear", {"x": neg}, n_outputs=3, **EXACT).values()
    assert zp == 255 and list(y) == [0, 128, 255]


# ----------------------------------------------------------------------------- integer matmul and conv
#: onnxruntime's x86 kernels for uint8 activations with int8 weights (u8s8) on CPUs without AVX-VNNI sum pairs
#: of products in saturating int16 (pmaddubsw), so their results differ from exact integer arithmetic once
#: a pair passes 32767 (onnxruntime 1.32 on AVX2: MatMulInteger off by up to 22294). Those cases are checked
#: against onnx's reference evaluator, which computes exactly (the operator specs define exact products).
def u8s8_oracle(a_dt, b_dt) -> str:
    return "onnx" if (np.dtype(a_dt), np.dtype(b_dt)) == (np.dtype(np.uint8), np.dtype(np.int8)) else "onnxruntime"


@pytest.mark.parametrize("a_dt,b_dt", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
def test_matmul_integer(rng, a_dt, b_dt):
    a, b = q(rng, a_dt, 2, 5, 37), q(rng, b_dt, 37, 6)
    check_op("MatMulInteger", {"a": a, "b": b}, None, {"az": q(rng, a_dt), "bz": q(rng, b_dt)},
             oracle=u8s8_oracle(a_dt, b_dt), **EXACT)


def test_matmul_integer_per_row_and_column(rng):
    a, b = q(rng, np.uint8, 5, 16), q(rng, np.uint8, 16, 7)
    check_op("MatMulInteger", {"a": a, "b": b}, None, {"az": q(rng, np.uint8), "bz": q(rng, np.uint8, 7)}, **EXACT)
    # onnxruntime takes per-tensor zero points for A only: per-row ones (the spec's [M, 1] form) against onnx's
    # reference evaluator
    check_op("MatMulInteger", {"a": a, "b": b}, None, {"az": q(rng, np.uint8, 5, 1), "bz": q(rng, np.uint8, 7)},
             oracle="onnx", **EXACT)
    check_op("MatMulInteger", {"a": a, "b": b}, **EXACT)  # no zero points


def test_conv_integer(rng):
    x, w = q(rng, np.uint8, 1, 3, 7, 6), q(rng, np.uint8, 4, 3, 3, 3)
    check_op("ConvInteger", {"x": x, "w": w}, {"pads": [1, 1, 1, 1], "strides": [2, 1]},
             {"xz": np.array(131, np.uint8), "wz": np.array(120, np.uint8)}, **EXACT)
    check_op("ConvInteger", {"x": x}, {"group": 3}, {"w": q(rng, np.uint8, 6, 1, 2, 2)}, **EXACT)


@pytest.mark.parametrize("dt", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul(rng, dt, per_column):
    a, b = q(rng, dt, 2, 4, 29), q(rng, dt, 29, 5)
    n = 5 if per_column else 1
    b_scale = f32(rng, n, lo=0.002, hi=0.01).reshape(() if n == 1 else (n,))
    b_zp = (q(rng, dt, n) // 4).reshape(() if n == 1 else (n,)) if dt == np.uint8 else np.zeros(b_scale.shape, dt)
    consts = {"as": np.array(0.02, np.float32), "az": q(rng, dt) // 2, "bs": b_scale, "bz": b_zp,
              "ys": np.array(0.05, np.float32), "yz": q(rng, dt) // 4}
    check_op("QLinearMatMul", {"a": a, "b": b}, None, consts, input_order=["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
             **EXACT)


@pytest.mark.parametrize("dt", [np.int8, np.uint8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv(rng, dt, per_channel):
    x, w = q(rng, dt, 1, 4, 6, 7), q(rng, np.int8, 6, 2, 3, 3)
    m = 6 if per_channel else 1
    w_scale = f32(rng, m, lo=0.002, hi=0.01).reshape(() if m == 1 else (m,))
    consts = {"xs": np.array(0.03, np.float32), "xz": q(rng, dt) // 2, "w": w, "ws": w_scale,
              "wz": np.zeros(w_scale.shape, np.int8), "ys": np.array(0.04, np.float32), "yz": q(rng, dt) // 4,
              "bias": rng.integers(-500, 500, size=6).astype(np.int32)}
    check_op("QLinearConv", {"x": x}, {"pads": [1, 0, 1, 2], "strides": [1, 2], "group": 2}, consts,
             input_order=["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"], oracle=u8s8_oracle(dt, np.int8),
             **EXACT)
