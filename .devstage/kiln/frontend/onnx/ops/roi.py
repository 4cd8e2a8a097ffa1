"""Data-dependent sampling ONNX operators: RoiAlign and DeformConv, decomposed into index arithmetic, Gathers
from an NHWC table and reductions or matrix products, computed at run time (regions and offsets are data)."""

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


@onnx_op("DeformConv", since=19)
def deform_conv(b: Builder, x: Value, w: Value, offset: Value, bias: Value | None = None, mask: Value | None = None,
                *, dilations=None, group: int = 1, kernel_shape=None, offset_group: int = 1, pads=None,
                strides=None) -> Value:
    """ONNX DeformConv-19/22 (2-D): each kernel tap samples ``x`` bilinearly (zero outside, as GridSample with
    aligned corners) at its place shifted by ``offset`` (per offset group, tap and output position), scaled by
    ``mask``; the samples are contracted with ``w`` as a grouped convolution. The taps are gathered at run time
    from an NHWC table; the contraction is a MatMul per group.

    Raises:
        ShapeError: shapes that do not fit (2-D only). KilnError: channels not divisible by the groups.
    """
    if len(x.shape) != 4 or len(w.shape) != 4 or len(offset.shape) != 4:
        raise ShapeError(f"DeformConv: only 2-D inputs are supported, got {list(x.shape)}")
    n, c, h, wd = x.shape
    oc, cg = w.shape[0], w.shape[1]
    kh, kw = (int(v) for v in (kernel_shape or w.shape[2:]))
    sh, sw = (int(v) for v in (strides or (1, 1)))
    dh, dw = (int(v) for v in (dilations or (1, 1)))
    pt, pl = (int(v) for v in (pads or (0, 0, 0, 0))[:2])
    oh, ow = offset.shape[2:]
    og, k = int(offset_group), kh * kw
    if c != cg * group or oc % group or c % og or offset.shape[1] != og * 2 * k:
        raise KilnError(f"DeformConv: input {list(x.shape)}, weight {list(w.shape)}, offset {list(offset.shape)} "
                        f"do not fit group {group} and offset_group {og}")
    off = _reshape(b, offset, (n, og, k, 2, oh, ow))
    msk = None if mask is None else _reshape(b, mask, (n, og, k, oh, ow))
    ky, kx = np.meshgrid(np.arange(kh) * dh, np.arange(kw) * dw, indexing="ij")
    base_y = (ky.reshape(1, k, 1, 1) + (np.arange(oh) * sh - pt).reshape(1, 1, oh, 1)).astype(np.float32)
    base_x = (kx.reshape(1, k, 1, 1) + (np.arange(ow) * sw - pl).reshape(1, 1, 1, ow)).astype(np.float32)
    table = _reshape(b, transpose(b, x, (0, 2, 3, 1)), (n * h * wd, c))
    batch = _i(b, (np.arange(n) * h * wd).reshape(n, 1, 1, 1))
    cols = []
    per = c // og
    for gi in range(og):
        def part(i: int, gi: int = gi) -> Value:
            return _reshape(b, b.op("Slice", [off], starts=(0, gi, 0, i, 0, 0), ends=(n, gi + 1, k, i + 1, oh, ow),
                                    steps=(1,) * 6), (n, k, oh, ow))

        y = b.op("Add", [part(0), _f(b, base_y)])
        xx = b.op("Add", [part(1), _f(b, base_x)])
        y0f, x0f = b.op("Floor", [y]), b.op("Floor", [xx])
        wy1, wx1 = b.op("Sub", [y, y0f]), b.op("Sub", [xx, x0f])
        wy0, wx0 = b.op("Sub", [_f(b, 1.0), wy1]), b.op("Sub", [_f(b, 1.0), wx1])
        y0, x0 = b.op("Cast", [y0f], to="int64"), b.op("Cast", [x0f], to="int64")
        tab = table if og == 1 else b.op("Slice", [table], starts=(0, gi * per), ends=(n * h * wd, (gi + 1) * per),
                                         steps=(1, 1))
        total = None
        for dy, wy in ((0, wy0), (1, wy1)):
            for dx, wx in ((0, wx0), (1, wx1)):
                yy, xc = b.op("Add", [y0, _i(b, dy)]), b.op("Add", [x0, _i(b, dx)])
                ok = b.op("And", [b.op("And", [b.op("GreaterOrEqual", [yy, _i(b, 0)]), b.op("Less", [yy, _i(b, h)])]),
                                  b.op("And", [b.op("GreaterOrEqual", [xc, _i(b, 0)]), b.op("Less", [xc, _i(b, wd)])])])
                idx = b.op("Add", [batch, b.op("Add", [b.op("Mul", [yy, _i(b, wd)]), xc])])
                idx = b.op("Where", [ok, idx, _i(b, 0)])
                wt = b.op("Mul", [b.op("Mul", [wy, wx]), b.op("Cast", [ok], to="float32")])
                if msk is not None:
                    wt = b.op("Mul", [wt, _reshape(b, b.op("Slice", [msk], starts=(0, gi, 0, 0, 0),
                                                         ends=(n, gi + 1, k, oh, ow), steps=(1,) * 5), (n, k, oh, ow))])
                term = b.op("Mul", [b.op("Gather", [tab, idx], axis=0), _reshape(b, wt, (n, k, oh, ow, 1))])
                total = term if total is None else b.op("Add", [total, term])
        cols.append(total)  # [N, K, OH, OW, C / og]
    col = cols[0] if og == 1 else b.op("Concat", cols, axis=4)
    col = _reshape(b, transpose(b, col, (0, 2, 3, 4, 1)), (n, oh * ow, c * k))  # (channel, tap) order as w's
    outs = []
    for gi in range(group):
        cg_cols = col if group == 1 else b.op("Slice", [col], starts=(0, 0, gi * cg * k),
                                              ends=(n, oh * ow, (gi + 1) * cg * k), steps=(1, 1, 1))
        wg = w if group == 1 else b.op("Slice", [w], starts=(gi * (oc // group), 0, 0, 0),
                                       ends=((gi + 1) * (oc // group), cg, kh, kw), steps=(1,) * 4)
        wm = transpose(b, _reshape(b, wg, (wg.shape[0], cg * k)), (1, 0))
        outs.append(b.op("MatMul", [cg_cols, wm]))  # [N, OH*OW, OC / group]
    y = outs[0] if group == 1 else b.op("Concat", outs, axis=2)
    y = _reshape(b, transpose(b, y, (0, 2, 1)), (n, oc, oh, ow))
    if bias is not None:
        y = b.op("Add", [y, _reshape(b, bias, (oc, 1, 1))])
    return y
