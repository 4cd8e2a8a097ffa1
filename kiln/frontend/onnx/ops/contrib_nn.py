"""onnxruntime's fused layer contrib operators (domain ``com.microsoft``) that its graph optimizers write into
saved models (``SessionOptions.optimized_model_filepath``): FusedConv.

Semantics from onnxruntime's ContribOperators.md and its CPU kernel (``contrib_ops/cpu/fused_conv.cc``).
"""

from __future__ import annotations

from kiln.errors import KilnError
from kiln.frontend.onnx.ops.nn import conv
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value

MS = "com.microsoft"


def _activation(b: Builder, y: Value, name: str, params: list[float]) -> Value:
    """``name`` (onnxruntime's MLAS activation names) applied to ``y`` with ``params``."""
    if name == "Relu":
        return b.op("Relu", [y])
    if name == "Tanh":
        return b.op("Tanh", [y])
    if name == "Sigmoid":
        return b.op("Sigmoid", [y])
    if name == "LeakyRelu":
        return b.op("LeakyRelu", [y], alpha=float(params[0]) if params else 0.01)
    if name == "Clip":
        lo = params[0] if params else float("-inf")
        hi = params[1] if len(params) > 1 else float("inf")
        return b.op("Clip", [y], min=lo, max=hi)
    if name == "HardSigmoid":
        return b.op("HardSigmoid", [y], alpha=params[0] if params else 0.2, beta=params[1] if len(params) > 1 else 0.5)
    raise KilnError(f"FusedConv: activation {name!r} is not supported (Relu, Tanh, Sigmoid, LeakyRelu, Clip, "
                    "HardSigmoid)")


@onnx_op("FusedConv", since=1, domain=MS)
def fused_conv(b: Builder, x: Value, w: Value, bias: Value | None = None, z: Value | None = None, *,
               activation: str = "", activation_params=None, auto_pad: str = "NOTSET", dilations=None,
               group: int = 1, kernel_shape=None, pads=None, strides=None) -> Value:
    """com.microsoft FusedConv-1: ONNX Conv, plus ``Z`` (a tensor of the output's shape, the residual) when given,
    then ``activation`` (Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid with ``activation_params``; none when
    empty).

    Raises:
        KilnError: another activation.
    """
    y = conv(b, x, w, bias, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
             pads=pads, strides=strides)
    if z is not None:
        y = b.op("Add", [y, z])
    name = activation.decode() if isinstance(activation, bytes) else activation
    return _activation(b, y, name, [float(p) for p in activation_params or ()]) if name else y
