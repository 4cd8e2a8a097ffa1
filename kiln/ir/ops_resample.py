"""Primitive ops that resample space: Resize and ConvTranspose, with shape rules and numpy semantics.

Resize's sampling (coordinate transformation, nearest rounding, linear and cubic taps) is
written once in :func:`resize_taps` over a small math "backend", so the numpy semantics here
and the tensor expression in :mod:`kiln.kernels.resample` compute the same formulas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.arith import symbolic
from kiln.errors import ShapeError
from kiln.ir.registry import register

#: ONNX Resize-19 coordinate_transformation_mode values Kiln implements
COORD_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric")
#: nearest_mode values (``simple`` is Resize-10 / Upsample's: truncate, or ceil when downsampling)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


@dataclass(frozen=True)
class MathOps:
    """The few functions resize sampling needs, for numpy arrays or tensor expressions."""

    floor: Callable[[Any], Any]
    ceil: Callable[[Any], Any]
    where: Callable[[Any, Any, Any], Any]
    less: Callable[[Any, Any], Any]
    to_int: Callable[[Any], Any]
    clamp: Callable[[Any, Any, Any], Any]
    to_float: Callable[[Any], Any] = float
    logical_or: Callable[[Any, Any], Any] = None  # type: ignore[assignment]
    rint: Callable[[Any], Any] = None  # type: ignore[assignment]


NUMPY_OPS = MathOps(np.floor, np.ceil, np.where, np.less, lambda x: x.astype(np.int64),
                    lambda x, lo, hi: np.clip(x, lo, hi), lambda x: np.asarray(x, np.float64), np.logical_or,
                    np.rint)


def source_coord(x, mode: str, scale: float, size_in: int, size_out: int):
    """Where output coordinate ``x`` (float) samples the input along one axis (ONNX Resize-19).

    As in the spec, the "resized length" in pytorch_half_pixel and align_corners is ``scale * size_in``
    (not rounded), which differs from ``size_out`` when scales rather than sizes were given.
    """
    length = scale * size_in
    if mode == "half_pixel":
        return (x + 0.5) * (1 / scale) - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) * (1 / scale) - 0.5 if length > 1 else x * 0.0
    if mode == "align_corners":
        return x * 0.0 if length == 1 else x * ((size_in - 1) / (length - 1))
    if mode == "asymmetric":
        return x * (1 / scale)
    # half_pixel_symmetric
    adjustment = size_out / (scale * size_in)
    offset = size_in / 2 * (1 - adjustment)
    return offset + (x + 0.5) * (1 / scale) - 0.5


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating))


def source_coord_dynamic(m: MathOps, x, mode: str, scale, size_in, size_out):
    """:func:`source_coord` over size expressions (run-time dims, docs/dynamic-shapes.md): ``size_in`` and
    ``size_out`` may be int32 expressions and ``scale`` a float, or None for ``size_out / size_in`` computed in
    float32 at run time (as onnxruntime computes the scales of a Resize given ``sizes``). The conditions of
    pytorch_half_pixel and align_corners on the resized length become selects."""
    fin = m.to_float(size_in)
    if scale is None:
        scale = m.to_float(size_out) / fin
    inv = 1 / scale
    half = (x + 0.5) * inv - 0.5 if _is_number(inv) else (x + 0.5) / scale - 0.5
    length = fin * scale
    if mode == "half_pixel":
        return half
    if mode == "pytorch_half_pixel":
        return m.where(m.less(1.0, length), half, x * 0.0)
    if mode == "align_corners":
        one = m.logical_or(m.less(length, 1.0 - 1e-6), m.less(1.0 + 1e-6, length))  # length != 1
        return m.where(one, x * ((fin - 1.0) / (length - 1.0)), x * 0.0)
    if mode == "asymmetric":
        return x * inv if _is_number(inv) else x / scale
    # half_pixel_symmetric
    adjustment = m.to_float(size_out) / length
    offset = fin * 0.5 * (1.0 - adjustment)
    return offset + half


def _cubic_weights(t, a: float):
    """Keys' cubic convolution weights of the taps at offsets -1, 0, 1, 2 from floor (t = fraction)."""
    t1, t2, s1 = t + 1.0, 1.0 - t, 2.0 - t
    return [((t1 * a - 5 * a) * t1 + 8 * a) * t1 - 4 * a,
            ((t * (a + 2) - (a + 3)) * t) * t + 1.0,
            ((t2 * (a + 2) - (a + 3)) * t2) * t2 + 1.0,
            ((s1 * a - 5 * a) * s1 + 8 * a) * s1 - 4 * a]


def resize_taps(m: MathOps, x, size_in: int, size_out: int, scale: float, attrs: dict[str, Any]):
    """The input taps of output coordinate ``x`` (a float array or expression) along one axis.

    ``size_in``/``size_out`` may be size expressions of run-time dims and ``scale`` None (``size_out / size_in``
    at run time): see :func:`source_coord_dynamic`.

    Returns:
        ``[(index, weight), ...]``: integer input indices (inside ``[0, size_in)``) and weights
        (``None`` meaning 1) whose weighted sum is the resampled value.
    """
    static = _is_number(scale) and _is_number(size_in) and _is_number(size_out)
    xo = source_coord(x, attrs["coord"], scale, size_in, size_out) if static else \
        source_coord_dynamic(m, x, attrs["coord"], scale, size_in, size_out)
    mode = attrs["mode"]
    if mode == "nearest":
        nm = attrs["nearest_mode"]
        if nm == "round_prefer_floor":
            r = m.ceil(xo - 0.5)
        elif nm == "round_prefer_ceil":
            r = m.floor(xo + 0.5)
        elif nm == "floor" or (nm == "simple" and scale >= 1):
            r = m.floor(xo)
        else:
            r = m.ceil(xo)
        return [(m.clamp(m.to_int(r), 0, size_in - 1), None)]
    if mode == "linear":
        xc = m.clamp(xo, 0.0, float(size_in - 1) if static else m.to_float(size_in - 1))
        f = m.floor(xc)
        i0 = m.to_int(f)
        w = xc - f
        return [(i0, 1.0 - w), (m.clamp(i0 + 1, 0, size_in - 1), w)]
    # cubic
    f = m.floor(xo)
    i0 = m.to_int(f)
    ws = _cubic_weights(xo - f, attrs["cubic_coeff_a"])
    taps = []
    for k, w in zip((-1, 0, 1, 2), ws):
        idx = i0 + k
        if attrs["exclude_outside"]:
            inside = m.where(m.less(idx, 0), 0.0, m.where(m.less(idx, size_in), 1.0, 0.0))
            w = w * inside
        taps.append((m.clamp(idx, 0, size_in - 1), w))
    if attrs["exclude_outside"]:
        total = taps[0][1] + taps[1][1] + taps[2][1] + taps[3][1]
        taps = [(i, w / total) for i, w in taps]
    return taps


def _resize_infer(ts, a):
    (dt, sh), = ts
    if len(a["sizes"]) != len(sh) or len(a["scales"]) != len(sh):
        raise ShapeError(f"Resize: {len(a['sizes'])} sizes for rank {len(sh)}")
    if a["coord"] not in COORD_MODES or a["mode"] not in ("nearest", "linear", "cubic"):
        raise ShapeError(f"Resize: unsupported mode {a['mode']!r} / coordinate mode {a['coord']!r}")
    return [(dt, tuple(a["sizes"]))]


def resized_axes(shape, a) -> list[int]:
    """The axes Resize actually resamples (the others are copied); a scale of None is computed at run time."""
    return [d for d in range(len(shape)) if symbolic.simplify(a["sizes"][d]) != symbolic.simplify(shape[d])
            or a["scales"][d] != 1.0]


def _resize_eval(xs, a):
    x, = xs
    out = x.astype(np.float64) if x.dtype.kind == "f" else x
    for d in resized_axes(x.shape, a):  # separable: resample one axis at a time
        coords = np.arange(a["sizes"][d], dtype=np.float64)
        taps = resize_taps(NUMPY_OPS, coords, x.shape[d], a["sizes"][d], a["scales"][d], a)
        acc = None
        for idx, w in taps:
            v = np.take(out, idx, axis=d)
            if w is not None:
                shape = [1] * out.ndim
                shape[d] = -1
                v = v * np.asarray(w).reshape(shape)
            acc = v if acc is None else acc + v
        out = acc
    return [np.asarray(out).astype(x.dtype)]


register("Resize", "resample", _resize_infer, _resize_eval)


# ----------------------------------------------------------------------------- ConvTranspose
def conv_transpose_out_dim(size: int, k: int, stride: int, dilation: int, pad_begin: int, pad_end: int,
                           output_padding: int) -> int:
    """Output extent of one spatial axis of a transposed convolution (ONNX ConvTranspose-11)."""
    return stride * (size - 1) + output_padding + (k - 1) * dilation + 1 - pad_begin - pad_end


def _convt_infer(ts, a):
    (dx, sx), (_, sw) = ts[:2]
    nsp = len(sx) - 2
    g = a["group"]
    if len(sw) != len(sx) or sx[1] != sw[0]:
        raise ShapeError(f"ConvTranspose: input {list(sx)} and weight {list(sw)} do not fit")
    p, s, d, op = a["pads"], a["strides"], a["dilations"], a["output_padding"]
    out = [conv_transpose_out_dim(sx[2 + i], sw[2 + i], s[i], d[i], p[i], p[nsp + i], op[i]) for i in range(nsp)]
    if any(not _is_number(v) for v in out):  # run-time dims
        out = [symbolic.simplify(v) for v in out]
        if min(symbolic.bounds(v)[0] for v in out) < 1:
            raise ShapeError(f"ConvTranspose: output spatial shape {symbolic.format_shape(out)} is empty for some "
                             "run-time dims in bounds")
        return [(dx, (sx[0], sw[1] * g, *out))]
    if min(out) < 1:
        raise ShapeError(f"ConvTranspose: output spatial shape {out} is empty")
    return [(dx, (sx[0], sw[1] * g, *out))]


def _convt_eval(xs, a):
    x, w = xs[:2]
    nsp = x.ndim - 2
    g, s, d, p = a["group"], a["strides"], a["dilations"], a["pads"]
    cin_g, cout_g = x.shape[1] // g, w.shape[1]
    lo = [max(0, -p[i]) for i in range(nsp)]  # negative pads extend the output with zeros
    full = [(x.shape[2 + i] - 1) * s[i] + (w.shape[2 + i] - 1) * d[i] + 1 + a["output_padding"][i] + lo[i]
            + max(0, -p[nsp + i]) for i in range(nsp)]
    out = np.zeros((x.shape[0], cout_g * g, *full), np.float64)
    for gi in range(g):
        xg = x[:, gi * cin_g:(gi + 1) * cin_g].astype(np.float64)
        wg = w[gi * cin_g:(gi + 1) * cin_g].astype(np.float64)
        for offs in np.ndindex(*w.shape[2:]):
            contrib = np.einsum("nc...,co->no...", xg, wg[(slice(None), slice(None), *offs)])
            window = tuple(slice(lo[i] + offs[i] * d[i], lo[i] + offs[i] * d[i] + (x.shape[2 + i] - 1) * s[i] + 1, s[i])
                           for i in range(nsp))
            out[(slice(None), slice(gi * cout_g, (gi + 1) * cout_g), *window)] += contrib
    crop = tuple(slice(max(0, p[i]), full[i] - max(0, p[nsp + i])) for i in range(nsp))
    return [np.array(out[(slice(None), slice(None), *crop)], dtype=x.dtype, order="C")]


register("ConvTranspose", "conv", _convt_infer, _convt_eval)


# ----------------------------------------------------------------------------- GridSample
def _reflect(m: MathOps, x, lo: float, hi: float):
    """Fold ``x`` back into ``[lo, hi]`` by reflecting at the borders (onnx's reference ``_gs_reflect``)."""
    span = hi - lo
    if span <= 0:
        return x * 0.0 + lo

    def fold(dx, near: float, far: float):
        n = m.floor(dx * (1 / span))
        r = dx - n * span
        even = m.less(n - m.floor(n * 0.5) * 2.0, 0.5)
        return m.where(even, near + r * (1.0 if far > near else -1.0), far - r * (1.0 if far > near else -1.0))

    below = fold(lo - x, lo, hi)
    above = fold(x - hi, hi, lo)
    return m.where(m.less(x, lo), below, m.where(m.less(hi, x), above, x))


def grid_coord(m: MathOps, g, size: int, attrs: dict[str, Any]):
    """Where normalised grid coordinate ``g`` samples an axis of extent ``size`` (GridSample-22): denormalised,
    rounded (nearest mode), then clamped or reflected into the axis when outside it (border, reflection)."""
    align, mode, pad = attrs["align_corners"], attrs["mode"], attrs["padding_mode"]
    x = (g + 1.0) * (0.5 * (size - 1)) if align else ((g + 1.0) * size - 1.0) * 0.5
    lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    if mode == "nearest":
        x = m.rint(x)
    outside = m.logical_or(m.less(x, lo), m.less(hi, x))
    if pad == "border":
        x = m.where(outside, m.clamp(x, 0.0, size - 1.0), x)
    elif pad == "reflection":
        x = m.where(outside, _reflect(m, x, lo, hi), x)
    return x


def grid_taps(m: MathOps, x, size: int, attrs: dict[str, Any]):
    """Input taps of source coordinate ``x`` (from :func:`grid_coord`) along one axis of extent ``size``.

    Returns:
        ``[(index, weight, valid), ...]``: indices clamped into the axis, weights (``None`` = 1) and, for
        ``zeros`` padding, whether the tap is inside (``None`` = always).
    """
    mode, pad = attrs["mode"], attrs["padding_mode"]
    lo, hi = (0.0, size - 1.0) if attrs["align_corners"] else (-0.5, size - 0.5)
    if mode == "nearest":
        taps = [(m.to_int(x), None)]
    elif mode == "linear":
        f = m.floor(x)
        i0, t = m.to_int(f), x - f
        taps = [(i0, 1.0 - t), (i0 + 1, t)]
    else:
        f = m.floor(x)
        i0 = m.to_int(f)
        taps = list(zip((i0 - 1, i0, i0 + 1, i0 + 2), _cubic_weights(x - f, -0.75)))
    out = []
    for i, w in taps:
        valid = None
        if pad == "zeros":
            valid = m.where(m.less(i, 0), 0.0, m.where(m.less(i, size), 1.0, 0.0))
        elif pad == "reflection" and mode == "cubic":  # linear/nearest taps of a reflected coordinate are inside
            i = m.to_int(_reflect(m, m.to_float(i), lo, hi))
        out.append((m.clamp(i, 0, size - 1), w, valid))
    return out


def _gridcoords_infer(ts, a):
    (dg, sg), = ts
    if len(a["sizes"]) != sg[-1]:
        raise ShapeError(f"GridSample: grid {list(sg)} does not fit {len(a['sizes'])} spatial dims")
    return [(dg, tuple(sg))]


def _gridcoords_eval(xs, a):
    g, = xs
    n = g.shape[-1]
    cols = [grid_coord(NUMPY_OPS, g[..., n - 1 - d].astype(np.float64), a["sizes"][d], a) for d in range(n)]
    return [np.stack(cols, axis=-1).astype(g.dtype)]


register("GridCoords", "layout", _gridcoords_infer, _gridcoords_eval)


def _gridsample_infer(ts, a):
    (dx, sx), (_dg, sg) = ts
    nsp = len(sx) - 2
    if len(sg) != nsp + 2 or sg[-1] != nsp or sg[0] != sx[0]:
        raise ShapeError(f"GridSample: input {list(sx)} and coordinates {list(sg)} do not fit")
    return [(dx, (sx[0], sx[1], *sg[1:-1]))]


def _gridsample_eval(xs, a):
    x, coords = xs  # coords from GridCoords: source coordinates, spatial dims in input order
    nsp = x.ndim - 2
    out_sp = coords.shape[1:-1]
    per_axis = [grid_taps(NUMPY_OPS, coords[..., d].astype(np.float64), x.shape[2 + d], a) for d in range(nsp)]
    n_idx = np.arange(x.shape[0]).reshape((-1,) + (1,) * len(out_sp))
    total = np.zeros((x.shape[0], *out_sp, x.shape[1]))
    for combo in np.ndindex(*[len(t) for t in per_axis]):
        weight = 1.0
        idx = []
        for d, k in enumerate(combo):
            i, w, valid = per_axis[d][k]
            idx.append(i)
            weight = weight * (1.0 if w is None else w) * (1.0 if valid is None else valid)
        vals = x.transpose(0, *range(2, x.ndim), 1)[(n_idx, *idx)]  # [N, *out, C]
        total = total + vals * np.asarray(weight)[..., None]
    return [np.moveaxis(total, -1, 1).astype(x.dtype)]


register("GridSample", "resample", _gridsample_infer, _gridsample_eval)
