"""Region-of-interest ONNX operators: RoiAlign, decomposed into index arithmetic, Gathers and reductions
computed at run time (the regions are data)."""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.nn import _reshape, transpose
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value


def _f(b: Builder, v) -> Value:
    return b.const(np.asarray(v, np.float32))


def _i(b: Builder, v) -> Value:
    return b.const(np.asarray(v, np.int64))


def _axis_taps(b: Builder, start: Value, size: Value, bins: int, grid: int, extent: int):
    """Sample coordinates along one axis, ``[R, bins * grid]``: ``start + (p + (i + 0.5) / grid) * size / bins``,
    then onnx's bilinear taps: ``(low, high, weight of low, weight of high, inside)`` with coordinates below 0
    clamped to 0 and those at or past the last sample pinned to it; ``inside`` is false beyond ``[-1, extent]``."""
    offs = (np.arange(bins)[:, None] + (np.arange(grid)[None, :] + 0.5) / grid).reshape(1, -1)
    step = b.op("Div", [size, _f(b, float(bins))])
    pos = b.op("Add", [start, b.op("Mul", [_f(b, offs), step])])
    inside = b.op("And", [b.op("GreaterOrEqual", [pos, _f(b, -1.0)]), b.op("LessOrEqual", [pos, _f(b, float(extent))])])
    pos = b.op("Max", [pos, _f(b, 0.0)])
    low = b.op("Cast", [b.op("Floor", [pos])], to="int64")
    edge = b.op("GreaterOrEqual", [low, _i(b, extent - 1)])
    last = _i(b, extent - 1)
    low = b.op("Where", [edge, last, low])
    high = b.op("Where", [edge, last, b.op("Add", [low, _i(b, 1)])])
    pos = b.op("Where", [edge, _f(b, float(extent - 1)), pos])
    lw = b.op("Sub", [pos, b.op("Cast", [low], to="float32")])  # weight of the high tap
    hw = b.op("Sub", [_f(b, 1.0), lw])
    return low, high, hw, lw, inside


@onnx_op("RoiAlign", since=10)
def roi_align(b: Builder, x: Value, rois: Value, batch_indices: Value, *,
              coordinate_transformation_mode: str = "half_pixel", mode: str = "avg", output_height: int = 1,
              output_width: int = 1, sampling_ratio: int = 0, spatial_scale: float = 1.0, _opset: int = 16) -> Value:
    """ONNX RoiAlign-10/16/22: ``[R, C, output_height, output_width]`` bins of each region ``rois[r]``
    (``x1, y1, x2, y2``, scaled by ``spatial_scale``) of image ``batch_indices[r]``, each the average (or the
    maximum) of ``sampling_ratio^2`` bilinear samples; opset 10 uses ``output_half_pixel`` coordinates.

    Raises:
        KilnError: ``sampling_ratio`` 0 (adaptive: a grid size that depends on the regions), an unknown mode.
        ShapeError: inputs of the wrong rank.
    """
    if sampling_ratio <= 0:
        raise KilnError("RoiAlign: sampling_ratio=0 (adaptive, data-dependent grids) is not supported; give it > 0")
    if mode not in ("avg", "max"):
        raise KilnError(f"RoiAlign: unknown mode {mode!r}")
    if _opset < 16:
        coordinate_transformation_mode = "output_half_pixel"
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise KilnError(f"RoiAlign: unknown coordinate_transformation_mode {coordinate_transformation_mode!r}")
    if len(x.shape) != 4 or len(rois.shape) != 2 or rois.shape[1] != 4 or len(batch_indices.shape) != 1:
        raise ShapeError(f"RoiAlign: input {list(x.shape)}, rois {list(rois.shape)} and batch_indices "
                         f"{list(batch_indices.shape)} must be [N, C, H, W], [R, 4] and [R]")
    n, c, h, w = x.shape
    r = rois.shape[0]
    ph, pw, g = int(output_height), int(output_width), int(sampling_ratio)
    half = coordinate_transformation_mode == "half_pixel"
    boxes = rois if rois.dtype == "float32" else b.op("Cast", [rois], to="float32")
    boxes = b.op("Sub", [b.op("Mul", [boxes, _f(b, spatial_scale)]), _f(b, 0.5 if half else 0.0)])

    def col(i: int) -> Value:
        return b.op("Slice", [boxes], starts=(0, i), ends=(r, i + 1), steps=(1, 1))  # [R, 1]

    size_w, size_h = b.op("Sub", [col(2), col(0)]), b.op("Sub", [col(3), col(1)])
    if not half:
        size_w, size_h = b.op("Max", [size_w, _f(b, 1.0)]), b.op("Max", [size_h, _f(b, 1.0)])
    ylo, yhi, ywl, ywh, yin = _axis_taps(b, col(1), size_h, ph, g, h)  # [R, A], A = ph * g
    xlo, xhi, xwl, xwh, xin = _axis_taps(b, col(0), size_w, pw, g, w)  # [R, B], B = pw * g
    a_n, b_n = ph * g, pw * g
    bi = batch_indices if batch_indices.dtype == "int64" else b.op("Cast", [batch_indices], to="int64")
    base = _reshape(b, b.op("Mul", [bi, _i(b, h * w)]), (r, 1, 1))
    table = _reshape(b, transpose(b, x, (0, 2, 3, 1)), (n * h * w, c))
    inside = b.op("Cast", [b.op("And", [_reshape(b, yin, (r, a_n, 1)), _reshape(b, xin, (r, 1, b_n))])],
                  to="float32")
    taps = []
    for yi, yw in ((ylo, ywl), (yhi, ywh)):
        for xi, xw in ((xlo, xwl), (xhi, xwh)):
            flat = b.op("Add", [base, b.op("Add", [b.op("Mul", [_reshape(b, yi, (r, a_n, 1)), _i(b, w)]),
                                                   _reshape(b, xi, (r, 1, b_n))])])
            weight = b.op("Mul", [b.op("Mul", [_reshape(b, yw, (r, a_n, 1)), _reshape(b, xw, (r, 1, b_n))]), inside])
            vals = b.op("Gather", [table, flat], axis=0)  # [R, A, B, C]
            taps.append(b.op("Mul", [vals, _reshape(b, weight, (r, a_n, b_n, 1))]))
    if mode == "avg":
        v = b.op("Add", [b.op("Add", [taps[0], taps[1]]), b.op("Add", [taps[2], taps[3]])])
    else:
        v = b.op("Max", [b.op("Max", [taps[0], taps[1]]), b.op("Max", [taps[2], taps[3]])])
    v = _reshape(b, v, (r, ph, g, pw, g, c))
    if mode == "avg":
        v = b.op("Div", [b.op("ReduceSum", [v], axes=(2, 4), keepdims=0), _f(b, float(g * g))])
    else:
        v = b.op("ReduceMax", [v], axes=(2, 4), keepdims=0)
    return transpose(b, v, (0, 3, 1, 2))
