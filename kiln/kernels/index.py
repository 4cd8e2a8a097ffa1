"""Tensor expressions of indexing and data movement: Gather, GatherElements, GatherND, Slice, Expand, Tile,
Pad, Trilu, ArgMax/ArgMin, CumSum, CumProd, OneHot, ScatterElements, ScatterND, TopK (semantics in
:mod:`kiln.ir.ops_data`)."""

from __future__ import annotations

from kiln.arith.expr import Expr, binop, call, cast, const, highest, lowest, reduce, reduce_axis, select
from kiln.kernels.elementwise import bcast_load
from kiln.kernels.layout import ravel
from kiln.te.compute import Tensor, compute, scan


def _wrap_index(i: Expr, dim: int) -> Expr:
    """A run-time index into an axis of ``dim``: negative counts from the end; clamped into range."""
    i = cast(i, "int32")
    top = call("max", dim - 1, 0) if isinstance(dim, Expr) else max(dim - 1, 0)
    return call("clamp", select(binop("<", i, 0), i + dim, i), 0, top)


def gather(x: Tensor, idx: Tensor, axis: int, out_shape, name: str = "gather") -> Tensor:
    """ONNX Gather-13: ``out[a, j..., b] = x[a, idx[j...], b]`` along ``axis``."""
    r = len(idx.shape)

    def body(*o):
        j = _wrap_index(idx[tuple(o[axis:axis + r])], x.shape[axis])
        return x[(*o[:axis], j, *o[axis + r:])]

    return compute(out_shape, body, name)


def gather_elements(x: Tensor, idx: Tensor, axis: int, out_shape, name: str = "gather_elements") -> Tensor:
    """ONNX GatherElements-13: ``out[i] = x[i with i[axis] replaced by idx[i]]``."""

    def body(*o):
        j = _wrap_index(idx[o], x.shape[axis])
        return x[tuple(j if d == axis else o[d] for d in range(len(o)))]

    return compute(out_shape, body, name)


def slice_(x: Tensor, starts, steps, out_shape, name: str = "slice") -> Tensor:
    """ONNX Slice-13 with normalised per-dim ``starts`` and ``steps``: ``out[i] = x[start + i * step]``."""
    return compute(out_shape, lambda *o: x[tuple(s + i * st for i, s, st in zip(o, starts, steps))], name)


def expand(x: Tensor, out_shape, name: str = "expand") -> Tensor:
    """ONNX Expand-13: ``x`` broadcast to ``out_shape``."""
    return compute(out_shape, lambda *o: bcast_load(x, o), name)


def tile(x: Tensor, out_shape, name: str = "tile") -> Tensor:
    """ONNX Tile-13: ``out[i] = x[i mod x.shape]``."""
    return compute(out_shape, lambda *o: x[tuple(i % d if d != 1 else 0 for i, d in zip(o, x.shape))], name)


def pad(x: Tensor, pads, mode: str, value, out_shape, name: str = "pad") -> Tensor:
    """ONNX Pad-2/11/13/18/19: ``constant``, ``reflect``, ``edge`` or ``wrap`` padding (negative pads crop)."""
    n = len(x.shape)

    def body(*o):
        src = [o[d] - pads[d] for d in range(n)]
        inside: Expr = const(True, "bool")
        idx = []
        for d, (s, size) in enumerate(zip(src, x.shape)):
            if pads[d] <= 0 and pads[n + d] <= 0:
                idx.append(s)
                continue
            if mode == "constant":
                inside = inside & binop(">=", s, 0) & binop("<", s, size)
                idx.append(s)
            elif mode == "edge":
                idx.append(call("clamp", s, 0, size - 1))
            elif mode == "wrap":
                idx.append(((s % size) + size) % size)
            else:  # reflect: period 2 (size - 1), mirrored about both ends
                period = max(2 * (size - 1), 1) if isinstance(size, int) else call("max", 2 * (size - 1), 1)
                m = ((s % period) + period) % period
                idx.append(select(binop("<", m, size), m, period - m))
        v = x[tuple(idx)]
        return select(inside, v, value) if mode == "constant" else v

    return compute(out_shape, body, name)


def trilu(x: Tensor, upper: int, k: int, name: str = "trilu") -> Tensor:
    """ONNX Trilu-14: keep the upper (``j - i >= k``) or lower (``j - i <= k``) triangle of the last two dims."""

    def body(*o):
        if len(o) < 2:
            return x[o]
        d = o[-1] - o[-2]
        keep = binop(">=", d, k) if upper else binop("<=", d, k)
        return select(keep, x[o], const(0, x.dtype))

    return compute(x.shape, body, name)


def argreduce(op: str, x: Tensor, best: Tensor, axis: int, keepdims: int, last: int, out_shape,
              name: str = "arg") -> Tensor:
    """ONNX ArgMax/ArgMin-13: the first (or last) index along ``axis`` where ``x`` equals ``best``.

    ``best`` is the ReduceMax/ReduceMin of ``x`` over ``axis`` with kept dims, computed by the
    kernel before, so this kernel is one pass over the axis.
    """
    n = x.shape[axis]
    r = reduce_axis(n, "ra")

    def body(*o):
        full = list(o) if keepdims else [*o[:axis], 0, *o[axis:]]
        xi = x[tuple(r if d == axis else full[d] for d in range(len(x.shape)))]
        b = best[tuple(0 if d == axis else full[d] for d in range(len(x.shape)))]
        hit = binop("==", xi, b)
        if last:
            return reduce("max", select(hit, r, -1), [r])
        return reduce("min", select(hit, r, n), [r])

    return compute(out_shape, body, name)


def cumulative(op: str, x: Tensor, axis: int, exclusive: int, reverse: int, name: str = "cumulative") -> Tensor:
    """ONNX CumSum-14 (``op="sum"``) and CumProd-26 (``op="prod"``): running sum or product along
    ``axis`` (one serial loop per output element)."""
    n = x.shape[axis]
    r = reduce_axis(n, "rc")
    identity = const(0 if op == "sum" else 1, x.dtype)

    def body(*o):
        i = o[axis]
        take = binop(">", r, i) if reverse else binop("<", r, i)
        if not exclusive:
            take = binop("||", take, binop("==", r, i))
        v = x[tuple(r if d == axis else o[d] for d in range(len(o)))]
        return reduce(op, select(take, v, identity), [r])

    return compute(x.shape, body, name)


def onehot(idx: Tensor, values: Tensor, depth: int, axis: int, out_shape, name: str = "onehot") -> Tensor:
    """ONNX OneHot-11: ``values[1]`` where ``out``'s ``axis`` index equals ``idx`` (negative from the end), else ``values[0]``."""

    def body(*o):
        i = cast(idx[tuple(o[:axis] + o[axis + 1:])], "int32")
        i = select(binop("<", i, 0), i + depth, i)
        return select(binop("==", o[axis], i), values[(1,)], values[(0,)])

    return compute(out_shape, body, name)


def gather_nd(x: Tensor, idx: Tensor, batch_dims: int, out_shape, name: str = "gather_nd") -> Tensor:
    """ONNX GatherND-13: ``out[b, j, rest] = x[b, idx[b, j, :], rest]`` (``batch_dims`` leading batch dims)."""
    k = idx.shape[-1]
    nj = len(idx.shape) - 1

    def body(*o):
        key = [_wrap_index(idx[(*o[:nj], q)], x.shape[batch_dims + q]) for q in range(k)]
        return x[(*o[:batch_dims], *key, *o[nj:])]

    return compute(out_shape, body, name)


def _scatter(x: Tensor, upd: Tensor, reduction: str, positions: list, match, load_update, name: str) -> Tensor:
    """Shared body of the scatters: ``positions`` are reduction axes over the update positions,
    ``match(o, r)`` says whether update ``r`` targets output ``o``, ``load_update(o, r)`` reads it."""

    def body(*o):
        base = x[o]
        hit = match(o, positions)
        if reduction == "none":  # the last matching update wins
            flat: Expr = const(0, "int32")
            for ax in positions:
                flat = flat * ax.extent + ax
            last = reduce("max", select(hit, flat, -1), positions)
            # decode the winning position back into reduction coordinates
            coords, rest = [], last
            for ax in reversed(positions):
                coords.append(rest % ax.extent)
                rest = rest // ax.extent
            coords = coords[::-1]
            return select(binop(">=", last, 0), load_update(o, coords), base)
        ident = {"add": 0, "mul": 1, "max": lowest(x.dtype), "min": highest(x.dtype)}[reduction]
        kind = {"add": "sum", "mul": "prod", "max": "max", "min": "min"}[reduction]
        found = reduce(kind, select(hit, load_update(o, positions), const(ident, x.dtype)), positions)
        if reduction == "add":
            return base + found
        if reduction == "mul":
            return base * found
        # max/min: untouched elements keep their value
        any_hit = reduce("max", select(hit, const(1, "int32"), const(0, "int32")), positions)
        return select(binop(">", any_hit, 0), call(reduction, base, found), base)

    return compute(x.shape, body, name)


def scatter_elements(x: Tensor, idx: Tensor, upd: Tensor, axis: int, reduction: str, name: str = "scatter") -> Tensor:
    """ONNX ScatterElements-18: ``out[.., idx[j], ..] (op)= upd[j]`` along ``axis``; each output element loops
    over the update positions that can target it (those equal to it off ``axis``)."""
    r = reduce_axis(idx.shape[axis], "rs")

    def inside(o):
        ok: Expr = const(True, "bool")
        for d, n in enumerate(idx.shape):
            if d != axis and n < x.shape[d]:
                ok = ok & binop("<", o[d], n)
        return ok

    def at(o, rr):
        return tuple(rr if d == axis else call("min", o[d], n - 1) for d, n in enumerate(idx.shape))

    def match(o, pos):
        j = _wrap_index(idx[at(o, pos[0])], x.shape[axis])
        return inside(o) & binop("==", j, o[axis])

    def load_update(o, pos):
        return upd[at(o, pos[0])]

    return _scatter(x, upd, reduction, [r], match, load_update, name)


def scatter_nd(x: Tensor, idx: Tensor, upd: Tensor, reduction: str, name: str = "scatter_nd") -> Tensor:
    """ONNX ScatterND-18: ``out[idx[j, :]] (op)= upd[j]``; each output element loops over all update positions."""
    k = idx.shape[-1]
    rs = [reduce_axis(n, "rs") for n in idx.shape[:-1]]

    def match(o, pos):
        ok: Expr = const(True, "bool")
        for q in range(k):
            ok = ok & binop("==", _wrap_index(idx[(*pos, q)], x.shape[q]), o[q])
        return ok

    def load_update(o, pos):
        return upd[(*pos, *o[k:])]

    return _scatter(x, upd, reduction, rs, match, load_update, name)


def topk_indices(x: Tensor, axis: int, k: int, largest: int, out_shape, name: str = "topk") -> Tensor:
    """ONNX TopK-11 indices: output ``q`` along ``axis`` is the element of rank ``q`` (ties: lower index first).

    Ranks are counted by comparison, O(n^2) per row: fine for the small ``axis`` extents TopK sees here.
    """
    n = x.shape[axis]
    e = reduce_axis(n, "re")
    f = reduce_axis(n, "rf")

    def body(*o):
        def at(i):
            return x[tuple(i if d == axis else o[d] for d in range(len(o)))]

        xe, xf = at(e), at(f)
        better = binop(">", xf, xe) if largest else binop("<", xf, xe)
        before = binop("||", better, binop("&&", binop("==", xf, xe), binop("<", f, e)))
        rank = reduce("sum", select(before, const(1, "int32"), const(0, "int32")), [f])
        return reduce("max", select(binop("==", rank, o[axis]), e, -1), [e])

    return compute(out_shape, body, name)


def sym_const(values, shape, dtype: str, name: str = "sym_const") -> Tensor:
    """A small tensor of size expressions (``SymConst``): element ``k`` (row-major) is ``values[k]``, read from
    the dims uniform at run time."""
    def body(*o):
        flat = ravel(o, shape)
        val = cast(values[-1] if isinstance(values[-1], Expr) else const(values[-1], "int32"), dtype)
        for k in range(len(values) - 2, -1, -1):
            v = values[k] if isinstance(values[k], Expr) else const(values[k], "int32")
            val = select(binop("==", flat, k), cast(v, dtype), val)
        return val

    return compute(shape, body, name)


def iota(shape, start, delta: int, dtype: str, name: str = "iota") -> Tensor:
    """ONNX Range of run-time length (``Iota``): ``out[i] = start + i * delta`` (``start`` may be a size expression)."""
    s = start if isinstance(start, Expr) else const(int(start), "int32")
    return compute(shape, lambda i: cast(s + i * delta, dtype), name)


def tensor_scatter(past: Tensor, upd: Tensor, idx: Tensor | None, axis: int, mode: str, in_place: bool, out_shape,
                   name: str = "tensor_scatter") -> Tensor:
    """ONNX TensorScatter-24: ``past`` with the rows of ``upd`` written along ``axis`` from row ``idx[b]`` of each
    batch entry ``b`` (0 without ``idx``; modulo the cache's length in ``circular`` mode). ``upd`` may have fewer
    batch entries than ``past`` (Kiln's extension, kiln.ir.ops_data): they are written into its first ones.

    ``in_place`` (the cache's buffer is the result's, kiln.passes.memory_plan): one element per element of
    ``upd``, stored through ``attrs["store"]`` (the buffer's shape, each element's coordinates in it and the
    condition for storing it at all), so a decode step writes one row of the cache instead of copying all of it.
    Otherwise every element of the result is computed (the update where it lands, else the past).
    """
    cap = past.shape[axis]

    def start(b: Expr) -> Expr:
        return cast(idx[(b,)], "int32") if idx is not None else const(0, "int32")

    if in_place:
        t = compute(upd.shape, lambda *o: upd[o], name)
        row = start(t.axes[0]) + t.axes[axis]
        if mode == "circular":
            row = row % cap
        # rows past the cache are dropped (never written beyond it); runtimes refuse such dims (dim_limits)
        t.attrs["store"] = (tuple(past.shape), tuple(row if d == axis else a for d, a in enumerate(t.axes)),
                            binop("<", row, cap) & binop(">=", row, 0))
        return t

    fewer = upd.shape[0] != past.shape[0]  # fewer batch entries than the cache: its first ones are written

    def body(*o):
        b = call("min", o[0], upd.shape[0] - 1) if fewer else o[0]  # reads stay inside the update
        s = o[axis] - start(b)
        if mode == "circular":
            s = (s % cap + cap) % cap
        inside = binop(">=", s, 0) & binop("<", s, upd.shape[axis])
        if fewer:
            inside = inside & binop("<", o[0], upd.shape[0])
        at = tuple(s if d == axis else b if d == 0 else a for d, a in enumerate(o))
        return select(inside, upd[at], past[o])

    return compute(out_shape, body, name)


def compact(data: Tensor, keep: Tensor, pos: Tensor, axis: int, out_shape, name: str = "compact") -> Tensor:
    """Stream compaction (``Compact``, kiln.ir.ops_dynamic): one invocation per element of ``data``, stored through a
    store view (``attrs["store"]``) at ``pos[j]`` along ``axis`` when ``keep[j]`` is non-zero; ``out_shape``'s extent
    along ``axis`` is the run-time count; the kept ``pos`` are ``0 .. count - 1``, each once (an exclusive prefix count
    of ``keep``, or Unique's sorted places), so every element of the output is written exactly once."""
    t = compute(data.shape, lambda *o: data[o], name)
    j = t.axes[axis]
    coords = tuple(cast(pos[(j,)], "int32") if d == axis else a for d, a in enumerate(t.axes))
    t.attrs["store"] = (tuple(out_shape), coords, binop("!=", cast(keep[(j,)], "int32"), const(0, "int32")))
    return t


def nms_select(boxes: Tensor, order: Tensor, ok: Tensor, threshold: Tensor, out_shape, name: str = "nms") -> Tensor:
    """Greedy non-maximum suppression (``NmsSelect``, kiln.ir.ops_data) as a scan along the rank axis: one
    invocation per (batch, class) walks the boxes from the highest score down, keeping one when ``ok`` and no box it
    kept before overlaps it by an intersection over union above ``threshold`` (onnxruntime's NonMaxSuppression
    arithmetic: boxes of no area never overlap). N (N - 1) / 2 comparisons per (batch, class), each rank against
    every earlier one (the loop over them runs to the current rank)."""
    zero, one = const(0, "int32"), const(1, "int32")
    s = reduce_axis(out_shape[2], "rs")  # the ranks before r (a triangular loop)

    def body(b, c, r, state):
        def corners(i):
            return [boxes[b, i, k] for k in range(4)]  # ymin, xmin, ymax, xmax

        (y0, x0, y1, x1), (v0, u0, v1, u1) = corners(order[b, c, r]), corners(order[b, c, s])
        fzero = const(0.0, "float32")
        w = call("max", call("min", x1, u1) - call("max", x0, u0), fzero)
        h = call("max", call("min", y1, v1) - call("max", y0, v0), fzero)
        inter = w * h
        area, other = (x1 - x0) * (y1 - y0), (u1 - u0) * (v1 - v0)
        union = area + other - inter
        over = binop(">", inter, fzero) & binop(">", area, fzero) & binop(">", other, fzero) & \
            binop(">", union, fzero) & binop(">", inter / union, threshold[()])
        hit = binop("<", s, r) & binop("!=", state[b, c, s], zero) & over
        suppressed = reduce("max", select(hit, one, zero), [s])
        return select(binop("!=", ok[b, c, r], zero) & binop("<", suppressed, one), one, zero)  # (rank 0: no loop)

    return scan(tuple(out_shape), 2, "int32", body, name, triangular=(s,))
