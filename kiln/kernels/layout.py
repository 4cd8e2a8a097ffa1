"""Tensor expressions of data movement: reshape copies, transpose, concat."""

from __future__ import annotations

from kiln.arith.expr import Expr, binop, select
from kiln.te.compute import Tensor, compute


def ravel(idx, shape) -> Expr:
    """Row-major flat offset of ``idx`` in ``shape``."""
    flat = 0
    for i, d in zip(idx, shape):
        flat = flat * d + i
    return flat


def unravel(flat: Expr, shape) -> list[Expr]:
    """Row-major multi-index of ``flat`` in ``shape``."""
    out = []
    stride = 1
    for d in reversed(shape):
        out.append((flat // stride) % d if d != 1 else 0)
        stride *= d
    return out[::-1]


def reshape(x: Tensor, shape: tuple[int, ...], name: str = "reshape") -> Tensor:
    """A copy of ``x`` viewed with ``shape`` (used when a reshape cannot alias its input's buffer)."""
    return compute(shape, lambda *i: x[tuple(unravel(ravel(i, shape), x.shape))], name)


def transpose(x: Tensor, perm, out_shape, name: str = "transpose") -> Tensor:
    """``out[i] = x[i permuted back]`` (ONNX Transpose-13)."""
    inv = [perm.index(k) for k in range(len(perm))]
    return compute(out_shape, lambda *i: x[tuple(i[inv[k]] for k in range(len(perm)))], name)


def concat(xs: list[Tensor], axis: int, out_shape, name: str = "concat") -> Tensor:
    """Join ``xs`` along ``axis`` (ONNX Concat-13): a chain of selects on the axis index."""

    def body(*i):
        offs = []
        o = 0
        for x in xs:
            offs.append(o)
            o += x.shape[axis]
        val = None
        for x, off in reversed(list(zip(xs, offs))):
            idx = tuple(a - off if k == axis else a for k, a in enumerate(i))
            v = x[idx]
            val = v if val is None else select(binop("<", i[axis], off + x.shape[axis]), v, val)
        return val

    return compute(out_shape, body, name)
