"""Tensor expressions of convolution, matrix multiplication and reductions."""

from __future__ import annotations

from kiln.arith.expr import Expr, binop, call, cast, const, highest, lowest, reduce, reduce_axis, select
from kiln.te.compute import Tensor, compute


def conv(x: Tensor, w: Tensor, strides, dilations, pads, group: int, out_shape: tuple[int, ...],
         name: str = "conv") -> Tensor:
    """N-d grouped convolution (ONNX Conv-11 semantics, cross-correlation), NC[spatial] layout.

    ``out[n, co, o...] = sum_{ci, k...} x[n, g*Cg + ci, o*s - p + k*d] * w[co, ci, k...]``
    with ``g = co // (Cout / group)`` and zero padding outside the input.
    """
    nsp = len(x.shape) - 2
    cin_g = w.shape[1]
    cout_g = w.shape[0] // group
    rc = reduce_axis(cin_g, "rc")
    rk = [reduce_axis(w.shape[2 + i], "rk") for i in range(nsp)]

    def body(n, co, *o):
        ci = rc if group == 1 else (co // cout_g) * cin_g + rc
        pos = [o[i] * strides[i] - pads[i] + rk[i] * dilations[i] for i in range(nsp)]
        inside: Expr = const(True, "bool")
        for i in range(nsp):
            if pads[i] > 0:
                inside = inside & binop(">=", pos[i], 0)
            if pads[nsp + i] > 0 or isinstance(x.shape[2 + i], Expr) or isinstance(out_shape[2 + i], Expr) \
                    or (out_shape[2 + i] - 1) * strides[i] - pads[i] + (w.shape[2 + i] - 1) * dilations[i] >= x.shape[2 + i]:
                inside = inside & binop("<", pos[i], x.shape[2 + i])
        val = select(inside, x[(n, ci, *pos)], 0.0)
        return reduce("sum", val * w[(co, rc, *rk)], [rc, *rk])

    return compute(out_shape, body, name)


def matmul(a: Tensor, b: Tensor, out_shape: tuple[int, ...], name: str = "matmul") -> Tensor:
    """Batched matrix product with numpy broadcasting of the batch dims: ``out[..., i, j] = sum_k a[..., i, k] b[..., k, j]``."""
    k = reduce_axis(a.shape[-1], "rk")
    nb = len(out_shape) - 2

    def batch(t: Tensor, idx):
        off = nb - (len(t.shape) - 2)
        return tuple(0 if d == 1 else idx[off + q] for q, d in enumerate(t.shape[:-2]))

    def body(*idx):
        i, j = idx[-2], idx[-1]
        return reduce("sum", a[(*batch(a, idx), i, k)] * b[(*batch(b, idx), k, j)], [k])

    return compute(out_shape, body, name)


def reduction(op: str, x: Tensor, axes: tuple[int, ...], keepdims: int, out_shape: tuple[int, ...],
              name: str = "reduce") -> Tensor:
    """ReduceSum / ReduceMean / ReduceMax / ReduceMin / ReduceProd over ``axes`` (ONNX Reduce*-13/18).

    Integer means divide in integer arithmetic (truncating), as onnxruntime does.
    """
    raxes = {a: reduce_axis(x.shape[a], "rr") for a in axes}
    count = 1
    for a in axes:
        count *= x.shape[a]

    def body(*o):
        idx, j = [], 0
        for d in range(len(x.shape)):
            if d in raxes:
                idx.append(raxes[d])
                j += 1 if keepdims else 0
            else:
                idx.append(o[j])
                j += 1
        kind = {"ReduceSum": "sum", "ReduceMean": "sum", "ReduceMax": "max", "ReduceMin": "min",
                "ReduceProd": "prod"}[op]
        r = reduce(kind, x[tuple(idx)], list(raxes.values()))
        if isinstance(count, Expr):  # a run-time extent (ONNX: a mean over no elements is NaN, as 0 / 0)
            return r / cast(count, "float32") if op == "ReduceMean" and x.dtype == "float32" else \
                (r // count if op == "ReduceMean" else r)
        if count == 0:
            return const({"sum": 0.0, "max": lowest(x.dtype), "min": highest(x.dtype), "prod": 1}[kind], x.dtype)
        if op == "ReduceMean":
            return r / (float(count) if x.dtype == "float32" else count)
        return r

    return compute(out_shape, body, name)


def pool(op: str, x: Tensor, kernel, strides, dilations, pads, count_include_pad: int, out_shape: tuple[int, ...],
         name: str = "pool") -> Tensor:
    """MaxPool / AveragePool over the spatial axes of an NC[spatial] tensor (ONNX MaxPool-12, AveragePool-19).

    Elements outside the input never win a max; an average divides by the number of window
    elements inside the input, or inside input plus padding when ``count_include_pad``
    (a ceil-mode window's part beyond the end padding never counts).
    """
    nsp = len(x.shape) - 2
    rk = [reduce_axis(kernel[i], "rk") for i in range(nsp)]

    def body(n, c, *o):
        pos = [o[i] * strides[i] - pads[i] + rk[i] * dilations[i] for i in range(nsp)]
        inside: Expr = const(True, "bool")
        padded: Expr = const(True, "bool")
        for i in range(nsp):
            inside = inside & binop(">=", pos[i], 0) & binop("<", pos[i], x.shape[2 + i])
            padded = padded & binop("<", pos[i], x.shape[2 + i] + pads[nsp + i])
        if op == "MaxPool":
            return reduce("max", select(inside, x[(n, c, *pos)], lowest(x.dtype)), rk)
        total = reduce("sum", select(inside, x[(n, c, *pos)], 0.0), rk)
        count = reduce("sum", select(padded if count_include_pad else inside, 1.0, 0.0), rk)
        return total / call("max", count, 1.0)

    return compute(out_shape, body, name)
