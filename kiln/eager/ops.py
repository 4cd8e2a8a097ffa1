"""Eager reductions, layout ops, indexing and matrix products, each with its gradient.

Kernels are the compiler's expressions (:mod:`kiln.kernels.nn` ``reduction``/``matmul``,
:mod:`kiln.kernels.layout` ``transpose``/``concat``, :mod:`kiln.kernels.index` ``slice_``/
``expand``/``argreduce``), specialised per call signature. ``reshape`` and its relatives share
their input's buffer (no kernel). The functions are also bound as :class:`Tensor` methods at the
bottom of this module.
"""

from __future__ import annotations

import builtins

from kiln.arith.expr import Expr, binop, const, reduce, reduce_axis, select
from kiln.eager import autograd, kernels
from kiln.eager.tensors import Tensor, as_tensor, unbroadcast, zeros
from kiln.errors import ShapeError
from kiln.kernels import index as index_k
from kiln.kernels import layout as layout_k
from kiln.kernels import nn as nn_k
from kiln.te.compute import compute


def _op(name: str, key, build, inputs: list[Tensor], out_dtype: str | None = None) -> Tensor:
    buf, shape, dtype = kernels.run(name, key, build, inputs, out_dtype)
    return Tensor(buf, shape, dtype)


def _axes(axis, ndim: int) -> tuple[int, ...]:
    """Normalised, sorted reduction axes (``None``: all)."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < builtins.max(ndim, 1):
            raise ShapeError(f"axis {a} is out of range for a tensor of rank {ndim}")
        out.append(a % ndim if ndim else 0)
    return tuple(sorted(set(out)))


def _reduced_shape(shape, axes, keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def _reduce(op: str, x: Tensor, axis, keepdims: bool) -> tuple[Tensor, tuple[int, ...]]:
    if x.dtype == "bool":
        x = x.to("int32")
    axes = _axes(axis, x.ndim)
    if not x.shape:
        return x, axes
    out_shape = _reduced_shape(x.shape, axes, keepdims)
    out = _op(op, (axes, keepdims), lambda p: nn_k.reduction(op, p, axes, int(keepdims), out_shape, op), [x])
    return out, axes


def sum(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """Sum over ``axis`` (int, tuple, or None for all) (ONNX ReduceSum); the gradient is broadcast back."""
    out, axes = _reduce("ReduceSum", x, axis, keepdims)
    kept = _reduced_shape(x.shape, axes, True)
    return autograd.attach(out, "Sum", (x,), lambda g: (expand(reshape(g, kept), x.shape),))


def mean(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """Mean over ``axis`` (float32)."""
    if x.dtype != "float32":
        x = x.to("float32")
    axes = _axes(axis, x.ndim)
    n = 1
    for a in axes:
        n *= x.shape[a] if x.shape else 1
    return sum(x, axis, keepdims) * (1.0 / n if n else float("nan"))  # numpy: the mean of nothing is NaN


def _extreme(op: str, x: Tensor, axis, keepdims: bool) -> Tensor:
    out, axes = _reduce(op, x, axis, keepdims)
    kept = _reduced_shape(x.shape, axes, True)

    def grad(g):
        hit = (x == reshape(out, kept)).to("float32")  # ties share the gradient (PyTorch's amax/amin)
        return (hit * reshape(g, kept) / sum(hit, axes, keepdims=True),)

    return autograd.attach(out, op[6:], (x,), grad)


def max(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """Largest element over ``axis`` (values, like ``torch.amax``; ties share the gradient)."""
    return _extreme("ReduceMax", x, axis, keepdims)


def min(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """Smallest element over ``axis`` (like ``torch.amin``)."""
    return _extreme("ReduceMin", x, axis, keepdims)


def argmax(x: Tensor, axis: int = -1, keepdims: bool = False) -> Tensor:
    """Index (int32) of the first largest element along ``axis`` (ONNX ArgMax)."""
    return _arg("ArgMax", x, axis, keepdims)


def argmin(x: Tensor, axis: int = -1, keepdims: bool = False) -> Tensor:
    """Index (int32) of the first smallest element along ``axis`` (ONNX ArgMin)."""
    return _arg("ArgMin", x, axis, keepdims)


def _arg(op: str, x: Tensor, axis: int, keepdims: bool) -> Tensor:
    (a,) = _axes(axis, x.ndim)
    best, _ = _reduce("ReduceMax" if op == "ArgMax" else "ReduceMin", x, a, True)
    shape = _reduced_shape(x.shape, (a,), keepdims)
    return _op(op, (a, keepdims), lambda p, b: index_k.argreduce(op, p, b, a, int(keepdims), 0, shape, op),
               [x.detach(), best])


# ---------------------------------------------------------------------- views and layout
def reshape(x: Tensor, *shape) -> Tensor:
    """The same elements (the same buffer) in ``shape`` (one dim may be -1)."""
    shape = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else tuple(shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: more than one -1 in {shape}")
    if -1 in shape:
        known = 1
        for d in shape:
            known *= d if d != -1 else 1
        if known == 0 or x.size % known:
            raise ShapeError(f"reshape: cannot infer -1 in {shape} for {x.size} elements")
        shape = tuple(x.size // known if d == -1 else d for d in shape)
    n = 1
    for d in shape:
        n *= d
    if n != x.size:
        raise ShapeError(f"reshape: cannot view {x.size} elements of shape {x.shape} as {shape}")
    if shape == x.shape:
        return x
    out = Tensor(x.buf, shape, x.dtype)
    return autograd.attach(out, "Reshape", (x,), lambda g: (reshape(g, x.shape),))


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Dims ``start_dim..end_dim`` merged into one."""
    if x.ndim == 0:
        return reshape(x, (1,))
    s, e = start_dim % x.ndim, end_dim % x.ndim
    n = 1
    for d in x.shape[s:e + 1]:
        n *= d
    return reshape(x, (*x.shape[:s], n, *x.shape[e + 1:]))


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    """A size-1 dim inserted at ``dim``."""
    dim = dim % (x.ndim + 1)
    return reshape(x, (*x.shape[:dim], 1, *x.shape[dim:]))


def squeeze(x: Tensor, dim=None) -> Tensor:
    """Size-1 dims removed (all, or those in ``dim``)."""
    dims = _axes(dim, x.ndim) if dim is not None else tuple(d for d, n in enumerate(x.shape) if n == 1)
    return reshape(x, tuple(n for d, n in enumerate(x.shape) if not (d in dims and n == 1)))


def permute(x: Tensor, *dims) -> Tensor:
    """Dims reordered: ``out.shape[k] = x.shape[dims[k]]`` (ONNX Transpose)."""
    perm = tuple(dims[0]) if len(dims) == 1 and not isinstance(dims[0], int) else tuple(dims)
    perm = tuple(d % x.ndim for d in perm)
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"permute: {perm} is not a permutation of {x.ndim} dims")
    if perm == tuple(range(x.ndim)):
        return x
    shape = tuple(x.shape[d] for d in perm)
    out = _op("Transpose", perm, lambda p: layout_k.transpose(p, list(perm), shape, "transpose"), [x])
    inv = tuple(perm.index(k) for k in range(len(perm)))
    return autograd.attach(out, "Permute", (x,), lambda g: (permute(g, inv),))


def transpose(x: Tensor, dim0: int = -2, dim1: int = -1) -> Tensor:
    """Dims ``dim0`` and ``dim1`` swapped."""
    perm = list(range(x.ndim))
    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return permute(x, perm)


def expand(x: Tensor, shape) -> Tensor:
    """``x`` broadcast to ``shape`` (a copy; ONNX Expand); the gradient is summed back."""
    shape = tuple(shape)
    if kernels.broadcast_shapes(x.shape, shape) != shape:
        raise ShapeError(f"expand: {x.shape} does not broadcast to {shape}")
    if shape == x.shape:
        return x
    out = _op("Expand", shape, lambda p: index_k.expand(p, shape, "expand"), [x])
    return autograd.attach(out, "Expand", (x,), lambda g: (unbroadcast(g, x.shape),))


def _slice_grad(g: Tensor, shape, starts, steps) -> Tensor:
    """The gradient of a slice: ``g`` scattered into zeros of ``shape`` at ``start + i * step``."""
    def build(p):
        def body(*i):
            inside: Expr = const(True, "bool")
            idx = []
            for d, (s, st) in enumerate(zip(starts, steps)):
                t = i[d] - s
                q = t // st if st > 1 else t
                if s > 0:
                    inside = inside & binop(">=", t, 0)
                if st > 1:
                    inside = inside & binop("==", t % st, 0)
                if s + (p.shape[d] - 1) * st < shape[d] - 1:
                    inside = inside & binop("<", q, p.shape[d])
                idx.append(q)
            return select(inside, p[tuple(idx)], 0.0)

        return compute(shape, body, "slice_grad")

    out = _op("SliceGrad", (tuple(shape), tuple(starts), tuple(steps)), build, [g])
    return autograd.attach(out, "SliceGrad", (g,), lambda gg: (_slice(gg, starts, steps, g.shape),))


def _slice(x: Tensor, starts, steps, shape) -> Tensor:
    shape = tuple(shape)
    if shape == x.shape:
        return x
    out = _op("Slice", (tuple(starts), tuple(steps), shape),
              lambda p: index_k.slice_(p, list(starts), list(steps), shape, "slice"), [x])
    return autograd.attach(out, "Slice", (x,), lambda g: (_slice_grad(g, x.shape, starts, steps),))


def getitem(x: Tensor, key) -> Tensor:
    """Basic indexing: ints, slices with positive steps, ``None`` and ``...`` (a copy of the region).

    Raises:
        IndexError: an index out of range, a negative step, or an unsupported index (tensors, lists).
    """
    key = key if isinstance(key, tuple) else (key,)
    n_real = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > x.ndim:
        raise IndexError(f"too many indices ({n_real}) for a tensor of rank {x.ndim}")
    if Ellipsis in key:
        at = key.index(Ellipsis)
        key = key[:at] + (slice(None),) * (x.ndim - n_real) + key[at + 1:]
    else:
        key = key + (slice(None),) * (x.ndim - n_real)
    starts, steps, sizes, final = [], [], [], []
    d = 0
    for k in key:
        if k is None:
            final.append(1)
            continue
        n = x.shape[d]
        if isinstance(k, slice):
            s, e, st = k.indices(n)
            if st <= 0:
                raise IndexError("slice steps must be positive")
            size = builtins.max(0, -(-(e - s) // st))
            starts.append(s if size else 0)
            steps.append(st)
            sizes.append(size)
            final.append(size)
        elif isinstance(k, int) or hasattr(k, "__index__"):
            i = int(k)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of range for dim {d} of size {n}")
            starts.append(i % n)
            steps.append(1)
            sizes.append(1)
        else:
            raise IndexError(f"unsupported index {type(k).__name__} (ints, slices, None and ... are supported)")
        d += 1
    return reshape(_slice(x, starts, steps, sizes), tuple(final))


def cat(xs: list[Tensor], axis: int = 0) -> Tensor:
    """Join tensors of equal shapes except along ``axis`` (ONNX Concat); the gradient is sliced back."""
    xs = [as_tensor(x) for x in xs]
    if not xs:
        raise ShapeError("cat: no tensors")
    axis = axis % xs[0].ndim
    for x in xs[1:]:
        if x.ndim != xs[0].ndim or any(a != b for k, (a, b) in enumerate(zip(x.shape, xs[0].shape)) if k != axis):
            raise ShapeError(f"cat: shapes {[t.shape for t in xs]} differ outside axis {axis}")
    dtypes = {x.dtype for x in xs}
    if len(dtypes) > 1:
        raise ShapeError(f"cat: dtypes differ ({sorted(dtypes)})")
    shape = list(xs[0].shape)
    shape[axis] = builtins.sum(x.shape[axis] for x in xs)
    shape = tuple(shape)
    out = _op("Concat", (axis, len(xs)), lambda *ps: layout_k.concat(list(ps), axis, shape, "concat"), xs)

    def grad(g):
        res, off = [], 0
        for x in xs:
            key = [slice(None)] * g.ndim
            key[axis] = slice(off, off + x.shape[axis])
            res.append(getitem(g, tuple(key)))
            off += x.shape[axis]
        return tuple(res)

    return autograd.attach(out, "Cat", tuple(xs), grad)


def stack(xs: list[Tensor], axis: int = 0) -> Tensor:
    """Tensors of one shape joined along a new dim ``axis``."""
    xs = [as_tensor(x) for x in xs]
    return cat([unsqueeze(x, axis % (xs[0].ndim + 1)) for x in xs], axis % (xs[0].ndim + 1))


# ---------------------------------------------------------------------- gathers
def gather(x: Tensor, axis: int, index: Tensor) -> Tensor:
    """``torch.gather`` / ONNX GatherElements: ``out[i] = x[i with i[axis] = index[i]]`` (negative indices count
    from the end); the gradient scatter-adds into ``x``'s shape (ONNX ScatterElements with ``add``)."""
    index = as_tensor(index, "int32")
    if index.dtype != "int32" or index.ndim != x.ndim:
        raise ShapeError(f"gather: index must be int32 of x's rank {x.ndim}, not {index.dtype} {index.shape}")
    axis = axis % x.ndim
    shape = index.shape
    out = _op("GatherElements", axis, lambda p, i: index_k.gather_elements(p, i, axis, shape, "gather"), [x, index])

    def grad(g):
        base = zeros(x.shape)
        gx = _op("ScatterAdd", axis, lambda b, i, u: index_k.scatter_elements(b, i, u, axis, "add", "scatter_add"),
                 [base, index, g])
        return (autograd.attach(gx, "ScatterAdd", (g,), lambda gg: (gather(gg, axis, index),)),)

    return autograd.attach(out, "Gather", (x,), grad)


def take(x: Tensor, indices: Tensor, axis: int = 0) -> Tensor:
    """``numpy.take`` / ONNX Gather: slices of ``x`` along ``axis`` picked by int ``indices`` (any shape; an
    embedding lookup); the gradient sums ``g`` into the picked slices."""
    indices = as_tensor(indices, "int32")
    axis = axis % x.ndim
    shape = (*x.shape[:axis], *indices.shape, *x.shape[axis + 1:])
    out = _op("Gather", axis, lambda p, i: index_k.gather(p, i, axis, shape, "take"), [x, indices])

    def grad(g):
        m = indices.size
        lead = 1
        for d in x.shape[:axis]:
            lead *= d
        g3 = reshape(g, (lead, m, -1))
        flat = reshape(indices, (m,))
        n = x.shape[axis]

        def build(gp, ip):
            r = reduce_axis(m, "rt")
            def body(a, j, b):
                k = ip[r]
                k = select(binop("<", k, 0), k + n, k)
                return reduce("sum", select(binop("==", k, j), gp[a, r, b], 0.0), [r])
            return compute((lead, n, g3.shape[2]), body, "take_grad")

        gx = _op("TakeGrad", n, build, [g3, flat])
        gx = autograd.attach(gx, "TakeGrad", (g3,), lambda gg: (reshape(take(reshape(gg, x.shape), indices, axis),
                                                                            g3.shape),))
        return (reshape(gx, x.shape),)

    return autograd.attach(out, "Take", (x,), grad)


# ---------------------------------------------------------------------- matrix products
def matmul(a: Tensor, b: Tensor) -> Tensor:
    """numpy's ``matmul``: 1-D operands are promoted and squeezed, batch dims broadcast (ONNX MatMul)."""
    a, b = as_tensor(a), as_tensor(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("matmul: operands must have at least one dim")
    if a.dtype != "float32" or b.dtype != "float32":
        raise ShapeError(f"matmul needs float32 operands, not {a.dtype} and {b.dtype}")
    if a.ndim == 1:
        return squeeze(matmul(unsqueeze(a, 0), b), -2)
    if b.ndim == 1:
        return squeeze(matmul(a, unsqueeze(b, 1)), -1)
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: inner dims differ: {a.shape} @ {b.shape}")
    batch = kernels.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    shape = (*batch, a.shape[-2], b.shape[-1])
    out = _op("MatMul", shape, lambda p, q: nn_k.matmul(p, q, shape, "matmul"), [a, b])

    def grad(g):
        return (unbroadcast(matmul(g, transpose(b, -1, -2)), a.shape),
                unbroadcast(matmul(transpose(a, -1, -2), g), b.shape))

    return autograd.attach(out, "MatMul", (a, b), grad)


def _bind() -> None:
    """Bind these functions as Tensor methods and operators."""
    T = Tensor
    T.sum = lambda self, axis=None, keepdims=False: sum(self, axis, keepdims)
    T.mean = lambda self, axis=None, keepdims=False: mean(self, axis, keepdims)
    T.max = lambda self, axis=None, keepdims=False: max(self, axis, keepdims)
    T.min = lambda self, axis=None, keepdims=False: min(self, axis, keepdims)
    T.argmax = lambda self, axis=-1, keepdims=False: argmax(self, axis, keepdims)
    T.argmin = lambda self, axis=-1, keepdims=False: argmin(self, axis, keepdims)
    T.reshape = reshape
    T.view = reshape
    T.flatten = flatten
    T.unsqueeze = unsqueeze
    T.squeeze = squeeze
    T.permute = permute
    T.transpose = transpose
    T.expand = lambda self, *shape: expand(self, shape[0] if len(shape) == 1 and not isinstance(shape[0], int)
                                           else shape)
    T.T = property(lambda self: permute(self, tuple(reversed(range(self.ndim)))))
    T.mT = property(lambda self: transpose(self, -1, -2))
    T.__getitem__ = getitem
    T.__matmul__ = matmul
    T.__rmatmul__ = lambda self, o: matmul(o, self)
    T.matmul = matmul
    T.gather = gather


_bind()

__all__ = ["argmax", "argmin", "cat", "expand", "flatten", "gather", "getitem", "matmul", "max", "mean", "min", "permute",
           "reshape", "squeeze", "stack", "sum", "take", "transpose", "unsqueeze"]
