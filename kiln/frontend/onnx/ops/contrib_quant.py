"""onnxruntime's quantized contrib operators (domain ``com.microsoft``) that ``onnxruntime.quantization``
writes in QOperator format: QLinearAdd, QLinearGlobalAveragePool, QGemm; and the dynamically quantized products
MatMulIntegerToFloat, DynamicQuantizeMatMul and DynamicQuantizeLSTM.

Semantics from onnxruntime's ContribOperators.md and its CPU kernels (MLAS): integer parts exact in
int32, requantization in float32 with round-half-to-even and saturation to the output's type.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.common import const_value
from kiln.frontend.onnx.ops.nn import _matmul, transpose
from kiln.frontend.onnx.ops.qlinear import _centred, _col_param, _f32, _i32, _requantize, _row_param
from kiln.frontend.onnx.ops.quant import _saturate_cast, dynamic_quantize_linear
from kiln.frontend.onnx.ops.rnn import lstm_like
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value

MS = "com.microsoft"


def _scalar(b: Builder, v: Value) -> Value:
    return v if v.shape == () else b.op("Reshape", [v], shape=()) if not v.is_const else b.const(
        v.const.reshape(()), name=v.name)


@onnx_op("QLinearAdd", since=1, domain=MS)
def qlinear_add(b: Builder, a: Value, a_scale: Value, a_zero_point: Value | None, c: Value, b_scale: Value,
                b_zero_point: Value | None, y_scale: Value, y_zero_point: Value | None = None) -> Value:
    """com.microsoft QLinearAdd-1: ``saturate(round((a_scale / y_scale) * (A - a_zp) + (b_scale / y_scale) *
    (B - b_zp)) + y_zp)`` with numpy broadcasting (MLAS ``MlasQLinearAdd``); per-tensor parameters."""
    ys = _f32(b, _scalar(b, y_scale))
    ra = b.op("Div", [_f32(b, _scalar(b, a_scale)), ys])
    rb = b.op("Div", [_f32(b, _scalar(b, b_scale)), ys])
    va = b.op("Mul", [_f32(b, _centred(b, a, None if a_zero_point is None else _scalar(b, a_zero_point))), ra])
    vb = b.op("Mul", [_f32(b, _centred(b, c, None if b_zero_point is None else _scalar(b, b_zero_point))), rb])
    y = b.op("Round", [b.op("Add", [va, vb])])
    if y_zero_point is not None:
        y = b.op("Add", [y, _f32(b, _scalar(b, y_zero_point))])
    return _saturate_cast(b, y, y_zero_point.dtype if y_zero_point is not None else a.dtype)


@onnx_op("QLinearGlobalAveragePool", since=1, domain=MS)
def qlinear_global_average_pool(b: Builder, x: Value, x_scale: Value, x_zero_point: Value | None, y_scale: Value,
                                y_zero_point: Value | None = None, *, channels_last: int = 0) -> Value:
    """com.microsoft QLinearGlobalAveragePool-1: the int32 sum of ``x - x_zp`` over the spatial axes
    requantized by ``x_scale / (y_scale * count)`` (NCHW, or NHWC with ``channels_last``), dims kept."""
    rank = len(x.shape)
    if rank < 3:
        raise ShapeError(f"QLinearGlobalAveragePool: input {list(x.shape)} has no spatial axes")
    axes = tuple(range(1, rank - 1)) if channels_last else tuple(range(2, rank))
    count = int(np.prod([x.shape[a] for a in axes]))
    acc = b.op("ReduceSum", [_centred(b, x, None if x_zero_point is None else _scalar(b, x_zero_point))],
               axes=axes, keepdims=1)
    denom = b.op("Mul", [_f32(b, _scalar(b, y_scale)), b.const(np.array(count, np.float32))])
    mult = b.op("Div", [_f32(b, _scalar(b, x_scale)), denom])
    out = y_zero_point.dtype if y_zero_point is not None else x.dtype
    return _requantize(b, acc, mult, None if y_zero_point is None else _scalar(b, y_zero_point), out)


@onnx_op("QGemm", since=1, domain=MS)
def qgemm(b: Builder, a: Value, a_scale: Value, a_zero_point: Value | None, c: Value, b_scale: Value,
          b_zero_point: Value | None, bias: Value | None = None, y_scale: Value | None = None,
          y_zero_point: Value | None = None, *, alpha: float = 1.0, transA: int = 0, transB: int = 0) -> Value:
    """com.microsoft QGemm-1: ``acc = (A' - a_zp) @ (B' - b_zp) + C`` in int32 (C quantized with scale
    ``a_scale * b_scale``), then ``alpha * a_scale * b_scale * acc`` as float32, or requantized by ``y_scale``
    and ``y_zero_point`` when given; b's scale and zero point per tensor or per column of B'."""
    if transA:
        a = transpose(b, a, (1, 0))
    if transB:
        c = transpose(b, c, (1, 0))
        if b_zero_point is not None and b_zero_point.size > 1:
            b_zero_point = _col_param(b, b_zero_point)
    ac = _centred(b, a, None if a_zero_point is None else _row_param(b, a_zero_point, a))
    cc = _centred(b, c, None if b_zero_point is None else _col_param(b, b_zero_point))
    acc = b.op("MatMul", [ac, cc])
    scale = b.op("Mul", [_f32(b, _scalar(b, a_scale)), _f32(b, _col_param(b, b_scale))])
    if alpha != 1.0:
        scale = b.op("Mul", [scale, b.const(np.array(alpha, np.float32))])
    if y_scale is None:
        y = b.op("Mul", [_f32(b, acc), scale])
        return y if bias is None else b.op("Add", [y, _f32(b, bias)])
    if bias is not None:
        acc = b.op("Add", [acc, _i32(b, bias)])
    mult = b.op("Div", [scale, _f32(b, _scalar(b, y_scale))])
    out = y_zero_point.dtype if y_zero_point is not None else a.dtype
    return _requantize(b, acc, mult, None if y_zero_point is None else _scalar(b, y_zero_point), out)


@onnx_op("MatMulIntegerToFloat", since=1, domain=MS)
def matmul_integer_to_float(b: Builder, a: Value, c: Value, a_scale: Value, b_scale: Value,
                            a_zero_point: Value | None = None, b_zero_point: Value | None = None,
                            bias: Value | None = None) -> Value:
    """com.microsoft MatMulIntegerToFloat-1: ``float32((A - a_zp) @ (B - b_zp)) * (a_scale * b_scale) (+ bias)``,
    the product exact in int32; A's scale and zero point per tensor, B's per tensor or per column ``[N]``.

    Raises:
        ShapeError: a per-element scale or zero point of A (onnxruntime's kernels take them per tensor).
    """
    if a_scale.size != 1 or (a_zero_point is not None and a_zero_point.size != 1):
        raise ShapeError("MatMulIntegerToFloat: a_scale and a_zero_point must be scalars")
    ac = _centred(b, a, None if a_zero_point is None else _scalar(b, a_zero_point))
    cc = _centred(b, c, None if b_zero_point is None else _col_param(b, b_zero_point))
    scale = b.op("Mul", [_f32(b, _scalar(b, a_scale)), _f32(b, _col_param(b, b_scale))])
    y = b.op("Mul", [_f32(b, _matmul(b, ac, cc)), scale])
    return y if bias is None else b.op("Add", [y, bias])


@onnx_op("DynamicQuantizeMatMul", since=1, domain=MS)
def dynamic_quantize_matmul(b: Builder, a: Value, c: Value, b_scale: Value, b_zero_point: Value | None = None,
                            bias: Value | None = None) -> Value:
    """com.microsoft DynamicQuantizeMatMul-1: A (float32) quantized to uint8 as ONNX DynamicQuantizeLinear does (its
    range with 0, scale ``range / 255``, zero point rounded half to even), then :func:`matmul_integer_to_float` with
    B (int8 or uint8), its scale and zero point (per tensor or per column), and the bias."""
    qa, a_scale, a_zp = dynamic_quantize_linear(b, a)
    return matmul_integer_to_float(b, qa, c, a_scale, b_scale, a_zp, b_zero_point, bias)


def _dequantized(v: Value, scale: Value, zero_point: Value | None, what: str) -> np.ndarray:
    """DynamicQuantizeLSTM's 8-bit weights ``[dirs, K, 4 * hidden]`` as float32 ``[dirs, 4 * hidden, K]`` (ONNX LSTM's
    layout), scale and zero point per direction ``[dirs]`` or per column ``[dirs, 4 * hidden]``.

    Raises:
        ConstantInputError: weights, scales or zero points computed at run time.
    """
    w = const_value(v, what).astype(np.float32)
    s = const_value(scale, what + "_scale").astype(np.float32)
    z = np.zeros_like(s) if zero_point is None else const_value(zero_point, what + "_zero_point").astype(np.float32)
    if s.ndim == 1:
        s, z = s[:, None], z[:, None]
    return np.ascontiguousarray(np.transpose((w - z[:, None, :]) * s[:, None, :], (0, 2, 1)))


@onnx_op("DynamicQuantizeLSTM", since=1, domain=MS)
def dynamic_quantize_lstm(b: Builder, x: Value, w: Value, r: Value, bias: Value | None = None,
                          seq_lens: Value | None = None, h0: Value | None = None, c0: Value | None = None,
                          p: Value | None = None, w_scale: Value | None = None, w_zero_point: Value | None = None,
                          r_scale: Value | None = None, r_zero_point: Value | None = None, *, _nout: int = 1,
                          **attrs) -> list[Value]:
    """com.microsoft DynamicQuantizeLSTM-1 (what ``quantize_dynamic`` makes of LSTM): ONNX LSTM with 8-bit weights
    ``W [dirs, input, 4 * hidden]`` and ``R [dirs, hidden, 4 * hidden]`` (note the transposed layout) and their
    scales and zero points per direction or per gate column. Kiln dequantizes the weights when compiling and runs
    the float LSTM (:mod:`kiln.frontend.onnx.ops.rnn`); onnxruntime also quantizes the activations (X and each
    step's hidden state, per tensor, to uint8), so results differ by that rounding (about 1e-2 on unit-scale
    activations).

    Raises:
        KilnError: missing scales; ConstantInputError: run-time weights; as ONNX LSTM otherwise.
    """
    if w_scale is None or r_scale is None:
        raise KilnError("DynamicQuantizeLSTM: W_scale and R_scale are required")
    wf = b.const(_dequantized(w, w_scale, w_zero_point, "W"), name=w.name + "_dequantized")
    rf = b.const(_dequantized(r, r_scale, r_zero_point, "R"), name=r.name + "_dequantized")
    return lstm_like(b, x, wf, rf, bias, seq_lens, h0, c0, p, _nout=_nout, **attrs)
