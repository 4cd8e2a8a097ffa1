"""Tensor expressions of data movement: reshape copies, transpose, concat."""

from __future__ import annotations

import itertools

from kiln.arith.expr import Expr, binop, select
from kiln.arith.symbolic import prod, simplify
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
    """A copy of ``x`` viewed with ``shape`` (used when a reshape cannot alias its input's buffer, and inlined into the
    kernels that read a reshaped tensor)."""
    return compute(shape, lambda *i: x[reshape_index(i, shape, x.shape)], name)


def reshape_index(idx, shape, in_shape) -> tuple[Expr, ...]:
    """The index into ``in_shape`` of element ``idx`` of its row-major reshape to ``shape``.

    The dims are first split into runs of equal size in both shapes (where the products of the leading dims agree), so
    that each input index is computed from the output indices of its run only: reshaping ``[b, s, h * d]`` from
    ``[b, s, h, d]`` reads ``[i0, i1, i2 // d, i2 % d]``, not the unravelled flat offset (``((i0 * s + i1) * h * d +
    i2) // d % h`` and so on). The short form lets the shared-tile lowering see that a head-merged attention output
    is contiguous along the product's reduction (:func:`kiln.te.tiles.analyse`), and spares every kernel the
    arithmetic. The outermost input index of a run takes no ``%``: the run's flat index is below its size."""
    def prefixes(dims):
        out, n = [1], 1
        for d in dims:
            n = simplify(n * d)
            out.append(n)
        return out

    po, pi = prefixes(shape), prefixes(in_shape)
    cuts, c = [(0, 0)], 0
    for a in range(1, len(shape) + 1):  # each run's leading dims' product agrees: the runs' offsets line up
        cc = next((cc for cc in range(c + 1, len(in_shape) + 1) if _same(pi[cc], po[a])), None)
        if cc is not None:
            cuts.append((a, cc))
            c = cc
    end = (len(shape), len(in_shape))  # (dims of size 1 left over on either side join the last run)
    if len(cuts) > 1:
        cuts[-1] = end
    else:  # (a 0-d side, or sizes that never agree: one run of everything)
        cuts.append(end)
    out: list[Expr] = []
    for (a0, c0), (a1, c1) in itertools.pairwise(cuts):
        flat = ravel(idx[a0:a1], shape[a0:a1])
        run = unravel(flat, in_shape[c0:c1])
        first = next((j for j in range(c1 - c0) if not _same(in_shape[c0 + j], 1)), None)
        if first is not None:  # the run's outermost dim: its flat index is below the run's size, no modulo
            stride = prod(in_shape[c0 + first + 1:c1])
            run[first] = flat if _same(stride, 1) else flat // stride
        out += run
    return tuple(out)


def _same(a, b) -> bool:
    """Whether two sizes (ints or simplified size expressions) are equal."""
    return a == b if isinstance(a, int) == isinstance(b, int) else False


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
