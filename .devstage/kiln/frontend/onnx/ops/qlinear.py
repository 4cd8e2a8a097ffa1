"""Integer and quantized-linear ONNX operators: MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv.

Each decomposes into primitives with exact int32 accumulation: the 8-bit operands are widened
to int32, their zero points subtracted, and the product (``MatMul``/``Conv`` primitives, whose
kernels accumulate in ``i32``) is exact for any realistic reduction length (|acc| < 2^31 needs
K * 255 * 255 < 2^31, i.e. K < 33025). The QLinear ops then requantize as onnxruntime's MLAS does
(``MlasRequantizeOutput``): ``saturate(round_half_even(float(acc) * (x_scale * w_scale / y_scale)) + y_zp)``
in float32, the multiplier computed in that order.
"""

from __future__ import annotations

from kiln.errors import ShapeError
from kiln.frontend.onnx.ops.nn import _matmul, _reshape, window_attrs
from kiln.frontend.onnx.ops.quant import _saturate_cast
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value


def _i32(b: Builder, v: Value) -> Value:
    return v if v.dtype == "int32" else b.op("Cast", [v], to="int32")


def _f32(b: Builder, v: Value) -> Value:
    return v if v.dtype == "float32" else b.op("Cast", [v], to="float32")


def _row_param(b: Builder, p: Value, a: Value) -> Value:
    """A per-tensor or per-row parameter of matrix operand ``a`` ([..., M, K]) shaped to broadcast against it:
    a 1-D ``[M]`` vector becomes ``[M, 1]``; scalars and N-D ``[..., M, 1]`` tensors are used as they are."""
    if p.size == 1:
        return _reshape(b, p, ())
    if len(p.shape) == 1 and len(a.shape) >= 2:
        return _reshape(b, p, (p.shape[0], 1))
    return p


def _col_param(b: Builder, p: Value) -> Value:
    """A per-tensor or per-column parameter of the right matrix operand ([..., K, N]): ``[N]`` broadcasts as is."""
    return _reshape(b, p, ()) if p.size == 1 else p


def _centred(b: Builder, x: Value, zp: Value | None) -> Value:
    """``int32(x) - int32(zp)`` (``zp`` already shaped to broadcast; None: no zero point)."""
    xi = _i32(b, x)
    return xi if zp is None else b.op("Sub", [xi, _i32(b, zp)])


def _matmul_int(b: Builder, a: Value, c: Value, a_zp: Value | None, b_zp: Value | None) -> Value:
    if len(a.shape) < 1 or len(c.shape) < 1:
        raise ShapeError(f"MatMulInteger: operands {list(a.shape)} and {list(c.shape)} must have rank >= 1")
    ac = _centred(b, a, None if a_zp is None else _row_param(b, a_zp, a))
    cc = _centred(b, c, None if b_zp is None else _col_param(b, b_zp))
    return _matmul(b, ac, cc)


@onnx_op("MatMulInteger", since=10)
def matmul_integer(b: Builder, a: Value, c: Value, a_zero_point: Value | None = None,
                   b_zero_point: Value | None = None) -> Value:
    """ONNX MatMulInteger-10: ``(int32(A) - a_zp) @ (int32(B) - b_zp)`` in int32 (numpy.matmul broadcasting);
    zero points per tensor, per row of A (``[M]``) or per column of B (``[N]``)."""
    return _matmul_int(b, a, c, a_zero_point, b_zero_point)


def _requantize(b: Builder, acc: Value, scale: Value, zp: Value | None, out_dtype: str) -> Value:
    """``saturate(round_half_even(float32(acc) * scale) + zp)`` as ``out_dtype``."""
    y = b.op("Round", [b.op("Mul", [_f32(b, acc), scale])])
    if zp is not None:
        y = b.op("Add", [y, _f32(b, zp)])
    return _saturate_cast(b, y, out_dtype)


@onnx_op("QLinearMatMul", since=10)
def qlinear_matmul(b: Builder, a: Value, a_scale: Value, a_zero_point: Value | None, c: Value, b_scale: Value,
                   b_zero_point: Value | None, y_scale: Value, y_zero_point: Value | None = None) -> Value:
    """ONNX QLinearMatMul-10/21: the int32 product of the centred operands requantized to y's type
    (y_zero_point's, else A's): ``saturate(round(acc * (a_scale * b_scale / y_scale)) + y_zp)``.

    Scales may be float32 or (opset 21) float16; the multiplier is computed in float32.
    """
    acc = _matmul_int(b, a, c, a_zero_point, b_zero_point)
    mult = b.op("Div", [b.op("Mul", [_f32(b, _row_param(b, a_scale, a)), _f32(b, _col_param(b, b_scale))]),
                        _f32(b, _col_param(b, y_scale))])
    out = y_zero_point.dtype if y_zero_point is not None else a.dtype
    return _requantize(b, acc, mult, y_zero_point if y_zero_point is None else _col_param(b, y_zero_point), out)


def _conv_int(b: Builder, x: Value, w: Value, x_zp: Value | None, w_zp: Value | None, bias: Value | None,
              auto_pad: str, dilations, group: int, kernel_shape, pads, strides, op: str) -> Value:
    nsp = len(x.shape) - 2
    if nsp < 1 or len(w.shape) != nsp + 2:
        raise ShapeError(f"{op}: input {list(x.shape)} and weight {list(w.shape)} ranks do not fit")
    xc = _centred(b, x, None if x_zp is None else _reshape(b, x_zp, ()))
    if w_zp is not None and w_zp.size > 1:
        w_zp = _reshape(b, w_zp, (w_zp.size,) + (1,) * (len(w.shape) - 1))
    elif w_zp is not None:
        w_zp = _reshape(b, w_zp, ())
    wc = _centred(b, w, w_zp)
    window = window_attrs(x, list(kernel_shape or w.shape[2:]), strides, dilations, pads, auto_pad)
    y = b.op("Conv", [xc, wc], **window, group=int(group))
    if bias is not None:
        y = b.op("Add", [y, _reshape(b, _i32(b, bias), (bias.shape[0],) + (1,) * nsp)])
    return y


@onnx_op("ConvInteger", since=10)
def conv_integer(b: Builder, x: Value, w: Value, x_zero_point: Value | None = None, w_zero_point: Value | None = None,
                 *, auto_pad: str = "NOTSET", dilations=None, group: int = 1, kernel_shape=None, pads=None,
                 strides=None) -> Value:
    """ONNX ConvInteger-10: Conv of ``int32(x) - x_zp`` and ``int32(w) - w_zp`` (per tensor, or per output
    channel for w) accumulated in int32; padding contributes zero (the zero point, centred)."""
    return _conv_int(b, x, w, x_zero_point, w_zero_point, None, auto_pad, dilations, group, kernel_shape, pads,
                     strides, "ConvInteger")


@onnx_op("QLinearConv", since=10)
def qlinear_conv(b: Builder, x: Value, x_scale: Value, x_zero_point: Value | None, w: Value, w_scale: Value,
                 w_zero_point: Value | None, y_scale: Value, y_zero_point: Value | None = None,
                 bias: Value | None = None, *, auto_pad: str = "NOTSET", dilations=None, group: int = 1,
                 kernel_shape=None, pads=None, strides=None) -> Value:
    """ONNX QLinearConv-10: ConvInteger plus the int32 bias, requantized to y's type (y_zero_point's, else x's):
    ``saturate(round(acc * (x_scale * w_scale / y_scale)) + y_zp)``; w_scale and w_zero_point per tensor or
    per output channel."""
    acc = _conv_int(b, x, w, x_zero_point, w_zero_point, bias, auto_pad, dilations, group, kernel_shape, pads,
                    strides, "QLinearConv")
    nsp = len(x.shape) - 2
    ws = _reshape(b, w_scale, (1, w_scale.size) + (1,) * nsp) if w_scale.size > 1 else _reshape(b, w_scale, ())
    mult = b.op("Div", [b.op("Mul", [_f32(b, _reshape(b, x_scale, ())), _f32(b, ws)]),
                        _f32(b, _reshape(b, y_scale, ()))])
    out = y_zero_point.dtype if y_zero_point is not None else x.dtype
    return _requantize(b, acc, mult, None if y_zero_point is None else _reshape(b, y_zero_point, ()), out)
