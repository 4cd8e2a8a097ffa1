"""Primitive ops of indexing and data movement: their shape rules and numpy semantics.

Registered into :mod:`kiln.ir.registry` (importing that module imports this one). Attributes are
normalised by the frontend: axes are non-negative, one entry per input dim where a list
is per-dim (``Slice``'s ``starts``/``ends``/``steps``, ``Pad``'s ``pads``).

Kinds: ``gather`` (data-dependent reads), ``layout`` (index remapping), ``argreduce``.
"""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.arith.expr import call, const
from kiln.errors import ShapeError
from kiln.ir.registry import broadcast_shapes, register


# ----------------------------------------------------------------------------- Gather, GatherElements
def _gather_infer(ts, a):
    (dx, sx), (di, si) = ts
    ax = a["axis"]
    if di not in ("int32", "int64") or not 0 <= ax < len(sx):
        raise ShapeError(f"Gather: needs integer indices and an axis inside rank {len(sx)}, got {di}, axis {ax}")
    return [(dx, (*sx[:ax], *si, *sx[ax + 1:]))]


def _gather_eval(xs, a):
    x, idx = xs
    ax = a["axis"]
    return [np.take(x, np.where(idx < 0, idx + x.shape[ax], idx), axis=ax)]


register("Gather", "gather", _gather_infer, _gather_eval)


def _gather_elements_infer(ts, a):
    (dx, sx), (di, si) = ts
    if len(sx) != len(si) or di not in ("int32", "int64"):
        raise ShapeError(f"GatherElements: data {list(sx)} and indices {list(si)} ({di}) do not fit")
    return [(dx, tuple(si))]


def _gather_elements_eval(xs, a):
    x, idx = xs
    ax = a["axis"]
    return [np.take_along_axis(x, np.where(idx < 0, idx + x.shape[ax], idx), axis=ax)]


register("GatherElements", "gather", _gather_elements_infer, _gather_elements_eval)


# ----------------------------------------------------------------------------- Slice, Expand, Tile, Pad
def slice_len(start: int, end: int, step: int) -> int:
    """Elements of ``range(start, end, step)`` (``start``/``end`` already clamped; size expressions allowed)."""
    if not isinstance(start, (int, np.integer)) or not isinstance(end, (int, np.integer)):
        span = (end - start) if step > 0 else (start - end)
        n = symbolic.ceil_div(symbolic.simplify(call("max", span + const(0, "int32"), const(0, "int32"))), abs(step))
        return symbolic.simplify(n)
    return max(0, -(-(end - start) // step)) if step > 0 else max(0, -(-(start - end) // -step))


def _slice_infer(ts, a):
    (dt, _sh), = ts
    return [(dt, tuple(slice_len(s, e, st) for s, e, st in zip(a["starts"], a["ends"], a["steps"])))]


def _slice_eval(xs, a):
    x, = xs
    out_shape = _slice_infer([(None, x.shape)], a)[0][1]
    idx = tuple(np.arange(n) * st + s for n, s, st in zip(out_shape, a["starts"], a["steps"]))
    return [np.array(order="C", object=x[np.ix_(*idx)]) if x.ndim else x.copy()]


register("Slice", "layout", _slice_infer, _slice_eval)


def _expand_infer(ts, a):
    (dt, sh), = ts
    return [(dt, broadcast_shapes(sh, tuple(a["shape"])))]


register("Expand", "layout", _expand_infer,
         lambda xs, a: [np.array(order="C", object=np.broadcast_to(xs[0], _expand_infer([(None, xs[0].shape)], a)[0][1]))])


def _tile_infer(ts, a):
    (dt, sh), = ts
    if len(a["repeats"]) != len(sh):
        raise ShapeError(f"Tile: {len(a['repeats'])} repeats for rank {len(sh)}")
    return [(dt, tuple(d * r for d, r in zip(sh, a["repeats"])))]


register("Tile", "layout", _tile_infer, lambda xs, a: [np.tile(xs[0], a["repeats"])])

_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _pad_infer(ts, a):
    (dt, sh), = ts
    n = len(sh)
    p = a["pads"]
    out = tuple(d + p[i] + p[n + i] for i, d in enumerate(sh))
    if not all(isinstance(d, (int, np.integer)) for d in out):  # run-time dims: the smallest value decides
        out = symbolic.shape(out)
        if a["mode"] not in _PAD_MODES or min(symbolic.bounds(d)[0] for d in out) < 0:
            raise ShapeError(f"Pad: mode {a['mode']!r} and pads {list(p)} do not fit input {symbolic.format_shape(sh)} "
                             "for every run-time dim in bounds")
        return [(dt, out)]
    if a["mode"] not in _PAD_MODES or min(out, default=1) < 0:
        raise ShapeError(f"Pad: mode {a['mode']!r} and pads {list(p)} do not fit input {list(sh)}")
    return [(dt, out)]


def _pad_eval(xs, a):
    x, = xs
    n = x.ndim
    p = a["pads"]
    # negative pads crop
    crop = tuple(slice(max(0, -p[i]), x.shape[i] - max(0, -p[n + i])) for i in range(n))
    x = x[crop]
    widths = [(max(0, p[i]), max(0, p[n + i])) for i in range(n)]
    if a["mode"] == "constant":
        return [np.pad(x, widths, mode="constant", constant_values=np.asarray(a["value"]).astype(x.dtype))]
    return [np.pad(x, widths, mode=_PAD_MODES[a["mode"]])]


register("Pad", "layout", _pad_infer, _pad_eval)


def _trilu_eval(xs, a):
    x, = xs
    k = a["k"]
    if x.ndim < 2:
        return [x.copy()]
    return [np.triu(x, k) if a["upper"] else np.tril(x, k)]


register("Trilu", "layout", lambda ts, a: [ts[0]], _trilu_eval)


# ----------------------------------------------------------------------------- ArgMax, ArgMin, CumSum, OneHot
def _arg_infer(ts, a):
    (_dt, sh) = ts[0]
    ax = a["axis"]
    out = tuple(1 if i == ax else d for i, d in enumerate(sh)) if a["keepdims"] else sh[:ax] + sh[ax + 1:]
    return [("int64", out)]


def _arg_eval(name):
    def evaluate(xs, a):
        x = xs[0]
        ax = a["axis"]
        fn = np.argmax if name == "ArgMax" else np.argmin
        if a["select_last_index"]:
            r = x.shape[ax] - 1 - fn(np.flip(x, ax), axis=ax)
        else:
            r = fn(x, axis=ax)
        if a["keepdims"]:
            r = np.expand_dims(r, ax)
        return [r.astype(np.int64)]
    return evaluate


for _n in ("ArgMax", "ArgMin"):
    register(_n, "argreduce", _arg_infer, _arg_eval(_n))


def _cumsum_eval(xs, a):
    x = xs[0]
    ax = a["axis"]
    y = np.flip(x, ax) if a["reverse"] else x
    c = np.cumsum(y, axis=ax, dtype=x.dtype)
    if a["exclusive"]:
        c = c - y
    return [np.array(order="C", object=np.flip(c, ax) if a["reverse"] else c)]


register("CumSum", "layout", lambda ts, a: [ts[0]], _cumsum_eval)


def _onehot_infer(ts, a):
    (_di, si), (dv, _sv) = ts
    ax = a["axis"]
    return [(dv, (*si[:ax], a["depth"], *si[ax:]))]


def _onehot_eval(xs, a):
    idx, values = xs
    depth, ax = a["depth"], a["axis"]
    idx = np.where(idx < 0, idx + depth, idx)
    hot = np.expand_dims(idx, ax) == np.arange(depth).reshape([-1 if i == ax else 1 for i in range(idx.ndim + 1)])
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


register("OneHot", "gather", _onehot_infer, _onehot_eval)


register("CumProd", "layout", lambda ts, a: [ts[0]], lambda xs, a: [_cumprod_eval(xs[0], a)])


def _cumprod_eval(x: np.ndarray, a) -> np.ndarray:
    ax = a["axis"]
    y = np.flip(x, ax) if a["reverse"] else x
    c = np.cumprod(y, axis=ax, dtype=x.dtype)
    if a["exclusive"]:
        c = np.concatenate([np.ones_like(np.take(c, [0], axis=ax)), np.delete(c, -1, axis=ax)], axis=ax) \
            if x.shape[ax] else c
    return np.array(np.flip(c, ax) if a["reverse"] else c, order="C")


# ----------------------------------------------------------------------------- GatherND, scatters, TopK
def _gather_nd_infer(ts, a):
    (dx, sx), (di, si) = ts
    bd, k = a["batch_dims"], si[-1]
    if di not in ("int32", "int64") or bd + k > len(sx) or tuple(si[:bd]) != tuple(sx[:bd]):
        raise ShapeError(f"GatherND: data {list(sx)} and indices {list(si)} (batch_dims {bd}) do not fit")
    return [(dx, (*si[:-1], *sx[bd + k:]))]


def _gather_nd_eval(xs, a):
    x, idx = xs
    bd, _k = a["batch_dims"], idx.shape[-1]
    out = np.empty(_gather_nd_infer([(x.dtype, x.shape), (idx.dtype, idx.shape)], a)[0][1], x.dtype)
    for pos in np.ndindex(*idx.shape[:-1]):
        key = [int(v) + (x.shape[bd + q] if v < 0 else 0) for q, v in enumerate(idx[pos])]
        out[pos] = x[(*pos[:bd], *key)]
    return [out]


register("GatherND", "gather", _gather_nd_infer, _gather_nd_eval)

_SCATTER_REDUCE = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_elements_eval(xs, a):
    x, idx, upd = xs
    out = x.copy()
    ax, fn = a["axis"], _SCATTER_REDUCE[a["reduction"]]
    for pos in np.ndindex(*idx.shape):
        j = int(idx[pos])
        tgt = tuple(j + x.shape[ax] if (d == ax and j < 0) else (j if d == ax else p) for d, p in enumerate(pos))
        out[tgt] = upd[pos] if fn is None else fn(out[tgt], upd[pos])
    return [out]


def _scatter_infer(ts, a):
    (dx, sx), (di, _si), (du, _su) = ts
    if dx != du or di not in ("int32", "int64") or a["reduction"] not in _SCATTER_REDUCE:
        raise ShapeError(f"Scatter: data {dx}, indices {di}, updates {du}, reduction {a['reduction']!r} do not fit")
    return [(dx, sx)]


register("ScatterElements", "gather", _scatter_infer, _scatter_elements_eval)


def _scatter_nd_eval(xs, a):
    x, idx, upd = xs
    out = x.copy()
    fn = _SCATTER_REDUCE[a["reduction"]]
    for pos in np.ndindex(*idx.shape[:-1]):
        tgt = tuple(int(v) + (x.shape[q] if v < 0 else 0) for q, v in enumerate(idx[pos]))
        out[tgt] = upd[pos] if fn is None else fn(out[tgt], upd[pos])
    return [out]


register("ScatterND", "gather", _scatter_infer, _scatter_nd_eval)


def _topk_infer(ts, a):
    (_dt, sh), = ts
    ax, k = a["axis"], a["k"]
    if symbolic.is_static([k, sh[ax]]) and not 0 <= k <= sh[ax]:
        raise ShapeError(f"TopK: k={k} is outside [0, {sh[ax]}] for axis {ax} of {list(sh)}")
    return [("int64", tuple(k if d == ax else n for d, n in enumerate(sh)))]


def _topk_eval(xs, a):
    x, = xs
    ax, k = a["axis"], a["k"]
    keys = -x if a["largest"] else x
    order = np.argsort(keys, axis=ax, kind="stable")  # ties: the lower index first
    return [np.take(order, np.arange(k), axis=ax).astype(np.int64)]


register("TopKIndices", "gather", _topk_infer, _topk_eval)


# ----------------------------------------------------------------------------- NonMaxSuppression's greedy selection
def _nms_infer(ts, a):
    (bt, boxes), (ot, order), (kt, ok), (tt, thr) = ts
    if len(boxes) != 3 or boxes[2] != 4 or len(order) != 3 or order[0] != boxes[0] or order[2] != boxes[1] or \
            tuple(ok) != tuple(order) or tuple(thr) != () or (bt, ot, kt, tt) != ("float32", "int32", "int32", "float32"):
        raise ShapeError(f"NmsSelect: boxes float32 [B, N, 4], order and ok int32 [B, C, N], threshold float32 []; got "
                         f"{bt}{list(boxes)}, {ot}{list(order)}, {kt}{list(ok)}, {tt}{list(thr)}")
    return [("int32", tuple(order))]


def overlaps(box: np.ndarray, others: np.ndarray, threshold: np.float32) -> np.ndarray:
    """Whether ``box`` (float32 ``[4]``: ymin, xmin, ymax, xmax) overlaps each of ``others`` (``[k, 4]``) by an
    intersection over union above ``threshold``, as onnxruntime's NonMaxSuppression computes it (float32; boxes of no
    area, or that do not intersect, never overlap): bool ``[k]``."""
    lo, hi = np.maximum(box[:2], others[:, :2]), np.minimum(box[2:], others[:, 2:])
    inter = np.maximum(hi[:, 1] - lo[:, 1], np.float32(0)) * np.maximum(hi[:, 0] - lo[:, 0], np.float32(0))
    area = (box[3] - box[1]) * (box[2] - box[0])
    areas = (others[:, 3] - others[:, 1]) * (others[:, 2] - others[:, 0])
    union = area + areas - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return (inter > 0) & (area > 0) & (areas > 0) & (union > 0) & (inter / union > threshold)


def _nms_eval(xs, a):
    boxes, order, ok, thr = xs
    keep = np.zeros(order.shape, np.int32)
    for b, c in np.ndindex(*order.shape[:2]):
        kept: list[int] = []
        for r in range(order.shape[2]):
            i = order[b, c, r]
            if ok[b, c, r] and not overlaps(boxes[b, i], boxes[b, kept].reshape(-1, 4), np.float32(thr)).any():
                keep[b, c, r] = 1
                kept.append(i)
    return [keep]


# keep[b, c, r] = ok[b, c, r] and no kept box of rank s < r overlaps box order[b, c, r] by IoU > threshold: greedy
# non-maximum suppression in rank order (ONNX NonMaxSuppression-11; kiln.frontend.onnx.ops.detection), a scan
register("NmsSelect", "scan", _nms_infer, _nms_eval)


# ----------------------------------------------------------------------------- TensorScatter (KV cache update)
def _tensor_scatter_infer(ts, a):
    (dp, sp), (du, su) = ts[0], ts[1]
    ax = a["axis"]
    if dp != du or len(sp) != len(su) or not 1 <= ax < len(sp) or a["mode"] not in ("linear", "circular") or \
            any(p != u for d, (p, u) in enumerate(zip(sp, su)) if d not in (0, ax)) or not _fewer_rows(su[0], sp[0]) or \
            (len(ts) > 2 and (ts[2][0] not in ("int32", "int64") or tuple(ts[2][1]) != (su[0],))):
        raise ShapeError(f"TensorScatter: past_cache {dp}{list(sp)}, update {du}{list(su)}"
                         f"{f', write_indices {ts[2][0]}{list(ts[2][1])}' if len(ts) > 2 else ''}, axis {ax}, "
                         f"mode {a['mode']!r} do not fit")
    return [(dp, sp)]


def _fewer_rows(u, p) -> bool:
    """Whether an update's batch ``u`` fits the cache's ``p`` (equal, or at most ``p`` by its bounds)."""
    return u == p or symbolic.bounds(u)[1] <= symbolic.bounds(p)[0]


def _tensor_scatter_eval(xs, a):
    past, upd = xs[0], xs[1]
    ax, cap, n = a["axis"], past.shape[a["axis"]], upd.shape[a["axis"]]
    idx = xs[2].astype(np.int64) if len(xs) > 2 else np.zeros(upd.shape[0], np.int64)
    out = past.copy()
    for b in range(upd.shape[0]):
        rows = idx[b] + np.arange(n)
        if a["mode"] == "circular":
            rows %= cap
        elif n and not 0 <= idx[b] <= cap - n:
            raise ShapeError(f"TensorScatter: write index {idx[b]} + {n} rows exceeds the cache's {cap}")
        dst = np.moveaxis(out[b], ax - 1, 0)  # a view: writes land in ``out``
        dst[rows] = np.moveaxis(upd[b], ax - 1, 0)
    return [out]


# ONNX TensorScatter-24: ``past_cache`` with ``update``'s rows written from ``write_indices[b]`` along ``axis``
# (modulo the cache's length for ``circular``). Functional here; an in-place kernel when the cache is a state
# buffer (kiln.passes.memory_plan). Kiln's one extension: the update (and write_indices) may have fewer batch
# entries than the cache, which are written into its first ones (a cache of ``beams`` rows that a greedy
# step at batch 1 uses the first of; kiln.frontend.whisper).
register("TensorScatter", "gather", _tensor_scatter_infer, _tensor_scatter_eval)
