"""Resampling ONNX operators: Resize, Upsample, ConvTranspose."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from kiln.arith import symbolic
from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.common import const_value, dims_of, norm_axis
from kiln.frontend.onnx.ops.nn import _reshape, transpose
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value
from kiln.ir.ops_resample import COORD_MODES, NEAREST_MODES


def _resize(b: Builder, x: Value, scales, sizes, *, mode: str, coord: str, nearest_mode: str,
            cubic_coeff_a: float = -0.75, exclude_outside: int = 0, axes=None, policy: str = "stretch",
            separable: dict | None = None) -> Value:
    rank = len(x.shape)
    axes = list(range(rank)) if axes is None else [norm_axis(int(a), rank) for a in axes]
    full_scales = [1.0] * rank
    full_sizes = list(x.shape)
    if not symbolic.is_static(x.shape) or sizes is not None and not symbolic.is_static(sizes):
        full_scales, full_sizes = _dynamic_sizes(x, scales, sizes, axes, policy)
    elif sizes is not None:
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
    if coord not in COORD_MODES and not (separable is not None and coord == "tf_crop_and_resize"):
        raise KilnError(f"Resize: coordinate_transformation_mode {coord!r} is not supported (supported: "
                        f"{', '.join(COORD_MODES)})")
    if nearest_mode not in NEAREST_MODES:
        raise KilnError(f"Resize: unknown nearest_mode {nearest_mode!r}")
    if separable is not None:
        return _resize_separable(b, x, full_scales, full_sizes, axes, mode=mode, coord=coord,
                                 cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside, **separable)
    if symbolic.shape(full_sizes) == symbolic.shape(x.shape) and all(s == 1.0 for s in full_scales):
        return b.op("Identity", [x])
    return b.op("Resize", [x], mode=mode, coord=coord, nearest_mode=nearest_mode, scales=tuple(full_scales),
                sizes=tuple(full_sizes), cubic_coeff_a=float(cubic_coeff_a), exclude_outside=int(exclude_outside))


def _rational(scale: float, what: str) -> tuple[int, int]:
    """``scale`` as ``p / q`` (small ``q``), so ``floor(size * scale)`` is ``size * p // q`` for a run-time size.

    Raises:
        KilnError: no fraction with ``q <= 1024`` rounds to ``scale`` in float32.
    """
    f = Fraction(scale).limit_denominator(1024)
    if f <= 0 or np.float32(f.numerator / f.denominator) != np.float32(scale):
        raise KilnError(f"Resize: scale {scale:.6g} along run-time dim {what} is not a simple fraction; bind the dim "
                        "statically with --dim NAME=SIZE")
    return f.numerator, f.denominator


def _dynamic_sizes(x: Value, scales, sizes, axes, policy: str) -> tuple[list, list]:
    """Resize's per-axis scales and output sizes when an input dim or a size is a size expression (run-time
    dims): with ``scales``, the output is ``floor(size * scale)`` (an exact fraction of the size expression); with
    ``sizes`` (constants or Shape arithmetic folded to size expressions), the scale is ``size_out / size_in``,
    None when that is only known at run time (the kernel computes it in float32, as onnxruntime does).

    Raises:
        KilnError: a keep_aspect_ratio_policy other than stretch, or a scale that is no simple fraction.
    """
    rank = len(x.shape)
    full_scales: list = [1.0] * rank
    full_sizes = list(x.shape)
    if sizes is not None:
        sizes = dims_of(sizes)
        if len(sizes) != len(axes):
            raise ShapeError(f"Resize: {len(sizes)} sizes for {len(axes)} axes")
        if policy != "stretch":
            raise KilnError(f"Resize: keep_aspect_ratio_policy={policy!r} over run-time dims is not supported; bind "
                            "them statically with --dim NAME=SIZE")
        for k, a in enumerate(axes):
            full_sizes[a] = sizes[k]
            n_in = symbolic.simplify(x.shape[a])
            if sizes[k] == n_in:
                full_scales[a] = 1.0
            elif symbolic.is_static((sizes[k], n_in)):
                full_scales[a] = sizes[k] / n_in
            else:
                full_scales[a] = None
    elif scales is not None:
        if len(scales) != len(axes):
            raise ShapeError(f"Resize: {len(scales)} scales for {len(axes)} axes")
        for k, a in enumerate(axes):
            full_scales[a] = float(np.float32(scales[k]))
            if symbolic.is_symbolic(x.shape[a]):
                p, q = _rational(full_scales[a], symbolic.to_text(x.shape[a]))
                full_sizes[a] = symbolic.simplify(x.shape[a] * p // q)
            else:
                full_sizes[a] = math.floor(x.shape[a] * full_scales[a] + 1e-9)
    else:
        raise KilnError("Resize: needs scales or sizes")
    return full_scales, full_sizes


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

    ``antialias=1`` and ``tf_crop_and_resize`` (constant ``roi``, ``extrapolation_value``) are computed as one
    matrix product per resized axis (:func:`resize_matrix`), for linear and cubic modes.

    Raises KilnError for antialiased or tf_crop_and_resize nearest resizing.
    """
    separable = None
    if antialias or coordinate_transformation_mode == "tf_crop_and_resize":
        if mode == "nearest":
            raise KilnError("Resize: antialias and tf_crop_and_resize are supported for linear and cubic modes")
        roi_values = _optional(roi, "roi") if coordinate_transformation_mode == "tf_crop_and_resize" else None
        separable = {"antialias": bool(antialias), "roi": roi_values, "extrapolation_value": float(extrapolation_value)}
    return _resize(b, x, _optional(scales, "scales"), _optional(sizes, "sizes"), mode=mode,
                   coord=coordinate_transformation_mode, nearest_mode=nearest_mode, cubic_coeff_a=cubic_coeff_a,
                   exclude_outside=exclude_outside, axes=axes, policy=keep_aspect_ratio_policy, separable=separable)


def _coeffs(mode: str, ratio: np.ndarray, scale: float, antialias: bool, a: float) -> np.ndarray:
    """Interpolation weights ``[len(ratio), taps]`` of the taps around each source coordinate (ONNX Resize-19's
    linear and cubic filters; antialiased, the filter is stretched by ``1 / scale`` when downsampling and
    normalised)."""
    r = ratio[:, None]
    if not antialias:
        if mode == "linear":
            return np.concatenate([1 - r, r], axis=1)
        return np.concatenate([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                               ((a + 2) * r - (a + 3)) * r * r + 1,
                               ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
                               ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a], axis=1)
    s = min(scale, 1.0)
    if mode == "linear":
        start = int(np.floor(-1 / s) + 1)
        args = (np.arange(start, 2 - start)[None, :] - r) * s
        c = np.clip(1 - np.abs(args), 0, 1)
    else:
        start = int(np.floor(-2 / s) + 1)
        ax = np.abs(s * (np.arange(start, 2 - start)[None, :] - r))
        c = np.where(ax <= 1, (a + 2) * ax**3 - (a + 3) * ax**2 + 1,
                     np.where(ax < 2, a * ax**3 - 5 * a * ax**2 + 8 * a * ax - 4 * a, 0.0))
    return c / c.sum(axis=1, keepdims=True)


def resize_matrix(n_in: int, n_out: int, scale: float, *, mode: str, coord: str, antialias: bool = False,
                  roi: tuple[float, float] | None = None, cubic_coeff_a: float = -0.75,
                  exclude_outside: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The 1-D Resize of ``n_in`` samples to ``n_out`` as a matrix: ``(W [n_in, n_out] float64, extrapolated
    [n_out] bool)`` with ``out = in @ W`` except where ``extrapolated`` (tf_crop_and_resize outside the input).

    Coordinates and taps follow ONNX Resize-19 (the source coordinate of each output, the ``taps`` nearest
    samples preferring lower indices, edge samples repeated, ``exclude_outside`` renormalising).
    """
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in
    extrapolated = np.zeros(n_out, bool)
    if coord == "align_corners":
        x = np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    elif coord == "asymmetric":
        x = y / scale
    elif coord == "tf_crop_and_resize":
        lo, hi = roi if roi is not None else (0.0, 1.0)
        # the spec's length_resized is the output's (integer) length, as onnxruntime computes it (onnx's reference
        # evaluator uses scale * n_in, which differs when that is not an integer)
        x = np.full(n_out, (hi - lo) * (n_in - 1) / 2) if n_out == 1 else y * (hi - lo) * (n_in - 1) / (n_out - 1)
        x = x + lo * (n_in - 1)
        extrapolated = (x < 0) | (x > n_in - 1)
    elif coord == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif coord == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif coord == "half_pixel_symmetric":
        x = n_in / 2 * (1 - n_out / width) + (y + 0.5) / scale - 0.5
    else:
        raise KilnError(f"Resize: unknown coordinate_transformation_mode {coord!r}")
    base = np.floor(x)
    ratio = np.where(x == base, 1.0, x - base)
    c = _coeffs(mode, ratio, scale, antialias, cubic_coeff_a)
    taps = c.shape[1]
    pad = int(np.ceil(taps / 2))
    xp = x + pad
    p = np.floor(xp)
    frac = xp - p
    if taps % 2 == 0:
        off = np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        off = np.where(frac <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    idx = (p + off).astype(np.int64)[:, None] + np.arange(taps)[None, :] - pad
    if exclude_outside:
        c = np.where((idx < 0) | (idx >= n_in), 0.0, c)
        total = c.sum(axis=1, keepdims=True)
        c = c / np.where(total == 0, 1.0, total)
    w = np.zeros((n_in, n_out))
    np.add.at(w, (np.clip(idx, 0, n_in - 1), np.broadcast_to(np.arange(n_out)[:, None], idx.shape)), c)
    w[:, extrapolated] = 0.0
    return w, extrapolated


def _resize_separable(b: Builder, x: Value, scales, sizes, axes, *, mode: str, coord: str, cubic_coeff_a: float,
                      exclude_outside: int, antialias: bool, roi, extrapolation_value: float) -> Value:
    """Resize as one constant matrix product per resized axis, then the extrapolation value where any axis
    falls outside the input (tf_crop_and_resize)."""
    rank = len(x.shape)
    if x.dtype != "float32":
        raise KilnError(f"Resize: antialias and tf_crop_and_resize need float32 input, got {x.dtype}")
    mask = None
    for k, a in enumerate(axes):
        pair = None
        if roi is not None:
            pair = (roi[k], roi[k + len(axes)]) if len(roi) == 2 * len(axes) else (roi[a], roi[a + rank])
        if sizes[a] == x.shape[a] and scales[a] == 1.0 and (pair is None or tuple(pair) == (0.0, 1.0)):
            continue
        w, out = resize_matrix(x.shape[a], sizes[a], scales[a], mode=mode, coord=coord, antialias=antialias,
                               roi=pair, cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside)
        perm = [d for d in range(rank) if d != a] + [a]
        y = b.op("MatMul", [transpose(b, x, tuple(perm)), b.const(w.astype(np.float32))])
        x = transpose(b, y, tuple(int(i) for i in np.argsort(perm)))
        if out.any():
            m = out.reshape([sizes[a] if d == a else 1 for d in range(rank)])
            mask = m if mask is None else mask | m
    if mask is not None:
        x = b.op("Where", [b.const(np.broadcast_to(mask, x.shape).copy()),
                           b.const(np.array(extrapolation_value, np.float32)), x])
    return x


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


@onnx_op("Col2Im", since=18)
def col2im(b: Builder, x: Value, image_shape: Value, block_shape: Value, *, dilations=None, pads=None,
           strides=None) -> Value:
    """ONNX Col2Im-18: sum the sliding blocks of ``x`` ``[N, C * prod(block), L]`` back into an image
    ``[N, C, *image_shape]``: a grouped ConvTranspose (``C`` groups) of the blocks, laid out on their grid, with a
    one-hot weight per block position. ``image_shape`` and ``block_shape`` must be constants.

    Raises:
        ShapeError: ``x``'s channels or block count do not fit the image, block, strides, pads and dilations.
    """
    img = [int(v) for v in np.asarray(const_value(image_shape, "image_shape")).ravel()]
    blk = [int(v) for v in np.asarray(const_value(block_shape, "block_shape")).ravel()]
    nsp = len(img)
    s = list(strides or [1] * nsp)
    d = list(dilations or [1] * nsp)
    p = list(pads or [0] * (2 * nsp))
    if len(x.shape) != 3 or len(blk) != nsp:
        raise ShapeError(f"Col2Im: input {list(x.shape)}, image_shape {img} and block_shape {blk} do not fit")
    n, ck, length = x.shape
    k = int(np.prod(blk))
    counts = [(img[i] + p[i] + p[nsp + i] - ((blk[i] - 1) * d[i] + 1)) // s[i] + 1 for i in range(nsp)]
    if ck % k or int(np.prod(counts)) != length:
        raise ShapeError(f"Col2Im: input {list(x.shape)} does not hold blocks {blk} of image {img} "
                         f"({int(np.prod(counts))} per channel expected)")
    c = ck // k
    w = np.zeros((ck, 1, *blk), np.float32)
    for ch in range(c):
        for pos in range(k):
            w[(ch * k + pos, 0, *np.unravel_index(pos, blk))] = 1.0
    out_pad = [img[i] - ((counts[i] - 1) * s[i] - p[i] - p[nsp + i] + (blk[i] - 1) * d[i] + 1) for i in range(nsp)]
    return b.op("ConvTranspose", [_reshape(b, x, (n, ck, *counts)), b.const(w, dtype=x.dtype)], strides=tuple(s),
                dilations=tuple(d), pads=tuple(p), group=c, output_padding=tuple(out_pad))
