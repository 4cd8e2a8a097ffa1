"""Resampling ONNX operators: Resize, Upsample, ConvTranspose."""

from __future__ import annotations

import math

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.common import const_value, norm_axis
from kiln.frontend.onnx.ops.nn import _reshape, transpose
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value
from kiln.ir.ops_resample import COORD_MODES, NEAREST_MODES


def _resize(b: Builder, x: Value, scales, sizes, *, mode: str, coord: str, nearest_mode: str,
            cubic_coeff_a: float = -0.75, exclude_outside: int = 0, axes=None, policy: str = "stretch") -> Value:
    rank = len(x.shape)
    axes = list(range(rank)) if axes is None else [norm_axis(int(a), rank) for a in axes]
    full_scales = [1.0] * rank
    full_sizes = list(x.shape)
    if sizes is not None:
        sizes = [int(v) for v in sizes]
        if len(sizes) != len(axes):
            raise ShapeError(f"Resize: {len(sizes)} sizes for {len(axes)} axes")
        if policy != "stretch":
            ratios = [sizes[k] / x.shape[a] for k, a in enumerate(axes)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            sizes = [math.floor(r * x.shape[a] + 0.5) for a in axes]
            for a in axes:
                full_scales[a] = r
        for k, a in enumerate(axes):
            full_sizes[a] = sizes[k]
            if policy == "stretch":
                full_scales[a] = sizes[k] / x.shape[a]
    elif scales is not None:
        if len(scales) != len(axes):
            raise ShapeError(f"Resize: {len(scales)} scales for {len(axes)} axes")
        for k, a in enumerate(axes):
            full_scales[a] = float(np.float32(scales[k]))
            full_sizes[a] = math.floor(x.shape[a] * full_scales[a] + 1e-9)
    else:
        raise KilnError("Resize: needs scales or sizes")
    if mode not in ("nearest", "linear", "cubic"):
        raise KilnError(f"Resize: unknown mode {mode!r}")
    if coord not in COORD_MODES:
        raise KilnError(f"Resize: coordinate_transformation_mode {coord!r} is not supported (supported: "
                        f"{', '.join(COORD_MODES)})")
    if nearest_mode not in NEAREST_MODES:
        raise KilnError(f"Resize: unknown nearest_mode {nearest_mode!r}")
    if tuple(full_sizes) == x.shape and all(s == 1.0 for s in full_scales):
        return b.op("Identity", [x])
    return b.op("Resize", [x], mode=mode, coord=coord, nearest_mode=nearest_mode, scales=tuple(full_scales),
                sizes=tuple(full_sizes), cubic_coeff_a=float(cubic_coeff_a), exclude_outside=int(exclude_outside))


def _optional(v: Value | None, what: str):
    if v is None or v.size == 0:
        return None
    return const_value(v, what).tolist()


@onnx_op("Upsample", since=7)
def upsample_7(b: Builder, x: Value, *, mode: str = "nearest", scales) -> Value:
    """ONNX Upsample-7: scales as an attribute (asymmetric coordinates; nearest truncates)."""
    return _resize(b, x, list(scales), None, mode="linear" if mode in ("linear", "bilinear") else mode,
                   coord="asymmetric", nearest_mode="simple")


@onnx_op("Upsample", since=9)
def upsample_9(b: Builder, x: Value, scales: Value, *, mode: str = "nearest") -> Value:
    """ONNX Upsample-9: scales as a constant input (asymmetric coordinates; nearest truncates)."""
    return _resize(b, x, const_value(scales, "scales").tolist(), None,
                   mode="linear" if mode in ("linear", "bilinear") else mode, coord="asymmetric", nearest_mode="simple")


@onnx_op("Resize", since=10)
def resize_10(b: Builder, x: Value, scales: Value, *, mode: str = "nearest") -> Value:
    """ONNX Resize-10: like Upsample-9 (asymmetric coordinates; nearest truncates, or rounds up when shrinking)."""
    return _resize(b, x, const_value(scales, "scales").tolist(), None, mode=mode, coord="asymmetric",
                   nearest_mode="simple")


@onnx_op("Resize", since=11)
def resize_11(b: Builder, x: Value, roi: Value | None = None, scales: Value | None = None, sizes: Value | None = None,
              *, coordinate_transformation_mode: str = "half_pixel", cubic_coeff_a: float = -0.75,
              exclude_outside: int = 0, extrapolation_value: float = 0.0, mode: str = "nearest",
              nearest_mode: str = "round_prefer_floor", antialias: int = 0, axes=None,
              keep_aspect_ratio_policy: str = "stretch") -> Value:
    """ONNX Resize-11/13/18/19: nearest, linear or cubic over constant ``scales`` or ``sizes``.

    Raises KilnError for ``tf_crop_and_resize`` (roi) and ``antialias=1``, which Kiln does not implement.
    """
    if antialias:
        raise KilnError("Resize: antialias=1 is not supported")
    return _resize(b, x, _optional(scales, "scales"), _optional(sizes, "sizes"), mode=mode,
                   coord=coordinate_transformation_mode, nearest_mode=nearest_mode, cubic_coeff_a=cubic_coeff_a,
                   exclude_outside=exclude_outside, axes=axes, policy=keep_aspect_ratio_policy)


@onnx_op("ConvTranspose", since=1)
def conv_transpose(b: Builder, x: Value, w: Value, bias: Value | None = None, *, auto_pad: str = "NOTSET",
                   dilations=None, group: int = 1, kernel_shape=None, output_padding=None, output_shape=None,
                   pads=None, strides=None) -> Value:
    """ONNX ConvTranspose-1/11: N-d transposed convolution; ``output_shape`` and ``auto_pad`` resolve to pads."""
    nsp = len(x.shape) - 2
    if nsp < 1 or len(w.shape) != nsp + 2:
        raise ShapeError(f"ConvTranspose: input {list(x.shape)} and weight {list(w.shape)} ranks do not fit")
    k = list(kernel_shape or w.shape[2:])
    s = list(strides or [1] * nsp)
    d = list(dilations or [1] * nsp)
    op = list(output_padding or [0] * nsp)
    sizes = x.shape[2:]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = list(output_shape)[-nsp:] if output_shape is not None else [sizes[i] * s[i] for i in range(nsp)]
        begins, ends = [], []
        for i in range(nsp):
            total = s[i] * (sizes[i] - 1) + op[i] + (k[i] - 1) * d[i] + 1 - target[i]
            small, big = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else big)
            ends.append(big if auto_pad == "SAME_UPPER" else small)
        p = begins + ends
    elif auto_pad == "VALID" or not pads:
        p = [0] * (2 * nsp)
    else:
        p = list(pads)
    y = b.op("ConvTranspose", [x, w], strides=tuple(s), dilations=tuple(d), pads=tuple(p), group=int(group),
             output_padding=tuple(op))
    if bias is not None:
        y = b.op("Add", [y, _reshape(b, bias, (bias.shape[0],) + (1,) * nsp)])
    return y


@onnx_op("GridSample", since=16)
def grid_sample(b: Builder, x: Value, grid: Value, *, align_corners: int = 0, mode: str = "linear",
                padding_mode: str = "zeros") -> Value:
    """ONNX GridSample-16/20/22: sample ``x`` at the normalised coordinates of ``grid`` ([-1, 1], last dim x, y, ...).

    Mode names of opset 16 (bilinear, bicubic) map to linear and cubic.
    """
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    if mode not in ("nearest", "linear", "cubic") or padding_mode not in ("zeros", "border", "reflection"):
        raise KilnError(f"GridSample: unsupported mode {mode!r} or padding_mode {padding_mode!r}")
    attrs = {"align_corners": int(align_corners), "mode": mode, "padding_mode": padding_mode}
    coords = b.op("GridCoords", [grid], sizes=tuple(x.shape[2:]), **attrs)
    return b.op("GridSample", [x, coords], **attrs)


@onnx_op("AffineGrid", since=20)
def affine_grid(b: Builder, theta: Value, size: Value, *, align_corners: int = 0) -> Value:
    """ONNX AffineGrid-20: the sampling grid ``base @ theta^T`` for 2-D ([N, 2, 3]) or 3-D ([N, 3, 4]) ``theta``."""
    dims = [int(d) for d in const_value(size, "size").tolist()]
    n, sp = dims[0], dims[2:]

    def axis(length: int) -> np.ndarray:
        if align_corners:
            return np.linspace(-1.0, 1.0, length) if length > 1 else np.zeros(1)
        return (2 * np.arange(length) + 1) / length - 1

    coords = np.meshgrid(*[axis(d) for d in sp], indexing="ij")  # per spatial dim, outermost first
    base = np.stack([*coords[::-1], np.ones(sp)], axis=-1).reshape(1, -1, len(sp) + 1).astype(np.float32)
    grid = b.op("MatMul", [b.const(base, dtype=theta.dtype), transpose(b, theta, (0, 2, 1))])
    return _reshape(b, grid, (n, *sp, len(sp)))
