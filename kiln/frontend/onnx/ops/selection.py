"""Reordering ONNX operators decomposed into gathers: ReverseSequence (Compress: :mod:`.compaction`)."""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.common import const_value
from kiln.frontend.onnx.ops.nn import _reshape
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value


@onnx_op("ReverseSequence", since=10)
def reverse_sequence(b: Builder, x: Value, sequence_lens: Value, *, batch_axis: int = 1,
                     time_axis: int = 0) -> Value:
    """ONNX ReverseSequence-10: for each batch entry ``i``, the first ``sequence_lens[i]`` steps along
    ``time_axis`` reversed, the rest kept: a GatherElements whose indices are computed at run time,
    ``t < len ? len - 1 - t : t``."""
    if len(x.shape) < 2:
        raise ShapeError(f"ReverseSequence: input {list(x.shape)} must have rank >= 2")
    if {batch_axis, time_axis} != {0, 1}:
        raise KilnError(f"ReverseSequence: batch_axis and time_axis must be 0 and 1, got {batch_axis}, {time_axis}")
    steps, batch = x.shape[time_axis], x.shape[batch_axis]
    lens = sequence_lens if sequence_lens.dtype == "int64" else b.op("Cast", [sequence_lens], to="int64")
    lens_shape = [1] * len(x.shape)
    lens_shape[batch_axis] = batch
    lens = _reshape(b, lens, tuple(lens_shape))
    t_shape = [1] * len(x.shape)
    t_shape[time_axis] = steps
    t = b.const(np.arange(steps, dtype=np.int64).reshape(t_shape))
    rev = b.op("Sub", [b.op("Sub", [lens, b.const(np.array(1, np.int64))]), t])
    idx = b.op("Where", [b.op("Less", [t, lens]), rev, t])
    idx = b.op("Expand", [idx], shape=tuple(x.shape))
    return b.op("GatherElements", [x, idx], axis=time_axis)


@onnx_op("MaxUnpool", since=9)
def max_unpool(b: Builder, x: Value, indices: Value, output_shape: Value | None = None, *, kernel_shape,
               pads=None, strides=None) -> Value:
    """ONNX MaxUnpool-9/11/22: zeros of the unpooled shape with ``x``'s values written at ``indices`` (flat
    indices into the whole output, as MaxPool's Indices output gives them): one ScatterElements over the
    flattened output of shape ``(in - 1) * stride + kernel - pads``, zero-padded at the end to ``output_shape``
    (a constant) when that is given and larger.

    Raises ShapeError for an ``output_shape`` smaller than that or with other batch or channel dims.
    """
    nsp = len(x.shape) - 2
    s = list(strides or [1] * nsp)
    p = list(pads or [0] * (2 * nsp))
    inferred = (*x.shape[:2], *((x.shape[2 + i] - 1) * s[i] + kernel_shape[i] - p[i] - p[nsp + i]
                                for i in range(nsp)))
    shape = inferred
    if output_shape is not None:
        shape = tuple(int(v) for v in np.asarray(const_value(output_shape, "output_shape")).ravel())
    if len(shape) != len(x.shape) or tuple(shape[:2]) != tuple(x.shape[:2]) or min(
            o - i for o, i in zip(shape, inferred)) < 0:
        raise ShapeError(f"MaxUnpool: output shape {list(shape)} does not fit input {list(x.shape)}")
    if tuple(indices.shape) != tuple(x.shape):
        raise ShapeError(f"MaxUnpool: indices {list(indices.shape)} and input {list(x.shape)} differ in shape")
    total = int(np.prod(inferred))
    zeros = b.const(np.zeros(total, np.float32), dtype=x.dtype)
    flat = b.op("ScatterElements", [zeros, _reshape(b, indices, (x.size,)), _reshape(b, x, (x.size,))], axis=0,
                reduction="none")
    y = _reshape(b, flat, inferred)
    if shape == inferred:
        return y
    # a larger output_shape holds the unpooled tensor in its leading corner (onnx's reference MaxUnpool)
    return b.op("Pad", [y], pads=(0,) * len(shape) + tuple(o - i for o, i in zip(shape, inferred)),
                mode="constant", value=0.0)
