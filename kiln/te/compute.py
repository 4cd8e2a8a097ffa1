"""Tensors of the expression language: placeholders, computed tensors and inlining.

``compute(shape, f)`` defines a tensor elementwise by ``f(*axes) -> Expr``; a
placeholder stands for a buffer the kernel reads. :func:`inline` substitutes
computed producers into their consumer, which is how operator fusion happens at
the expression level: ``clip(conv(x, w) + b)`` becomes one expression whose
reduction lowering hoists into a loop.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from kiln.arith.expr import Expr, Load, Var, as_expr, transform
from kiln.arith.symbolic import simplify

_ids = itertools.count()


@dataclass(eq=False)
class Tensor:
    """A tensor of the expression language.

    Attributes:
        name: for generated code.
        shape: concrete dims.
        dtype: element type (``float32``, ``int32``).
        axes: one variable per dim (computed tensors only).
        body: the value at ``axes`` (``None`` for placeholders).
        attrs: free-form notes for codegen (for example the IR value a placeholder binds to).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    axes: tuple[Var, ...] = ()
    body: Expr | None = None
    attrs: dict = field(default_factory=dict)

    @property
    def is_placeholder(self) -> bool:
        """True for input buffers."""
        return self.body is None

    @property
    def size(self) -> int | Expr:
        """Number of elements (a size expression when a dim is one)."""
        n = 1
        for d in self.shape:
            n *= d
        if isinstance(n, Expr):
            return simplify(n)
        return n

    def __getitem__(self, idx) -> Load:
        if not isinstance(idx, tuple):
            idx = (idx,)
        if len(idx) != len(self.shape):
            raise IndexError(f"{self.name}: {len(idx)} indices for rank {len(self.shape)}")
        return Load(self, tuple(as_expr(i, "int32") for i in idx), self.dtype)

    def __repr__(self) -> str:
        return f"Tensor({self.name}, {list(self.shape)}, {self.dtype})"


def _dims(shape) -> tuple:
    """Dims as ints, or size expressions of run-time dims (:mod:`kiln.arith.symbolic`)."""
    return tuple(d if isinstance(d, Expr) else int(d) for d in shape)


def placeholder(shape: tuple[int, ...], dtype: str = "float32", name: str = "in") -> Tensor:
    """An input buffer of ``shape`` (ints or size expressions) and ``dtype``."""
    return Tensor(name, _dims(shape), dtype)


def compute(shape: tuple[int, ...], fcompute: Callable[..., Expr], name: str = "out") -> Tensor:
    """A tensor whose element at ``axes`` is ``fcompute(*axes)``."""
    n = next(_ids)
    axes = tuple(Var(f"i{k}_{n}") for k in range(len(shape)))
    body = as_expr(fcompute(*axes))
    return Tensor(name, _dims(shape), body.dtype, axes, body)


def scan(shape: tuple[int, ...], axis: int, dtype: str, fcompute: Callable[..., Expr], name: str = "scan",
         triangular: tuple[Var, ...] = ()) -> Tensor:
    """A tensor computed serially along ``axis``: its element at ``axes`` is ``fcompute(*axes, state)``, where
    ``state`` (a placeholder of the tensor's own shape and ``dtype``) reads elements computed before it along
    ``axis`` (TVM's ``te.scan`` in spirit). Lowering gives each invocation one line along ``axis`` and loops over
    it in order, reading ``state`` from the output buffer (:func:`kiln.te.lower.lower`); the tensor is a kernel of
    its own (never inlined into a consumer). Reads of ``state`` at or after the current element read undefined
    values: guard them. Reduction axes in ``triangular`` (of the scan axis's extent, their body guarded to the elements
    before the current one) loop only up to the current element.

    Raises:
        TypeError: ``fcompute`` returns a value of another dtype than ``dtype``.
    """
    state = placeholder(shape, dtype, f"{name}_state")
    n = next(_ids)
    axes = tuple(Var(f"i{k}_{n}") for k in range(len(shape)))
    body = as_expr(fcompute(*axes, state))
    if body.dtype != dtype:
        raise TypeError(f"scan {name}: the body is {body.dtype}, the tensor {dtype}")
    return Tensor(name, _dims(shape), dtype, axes, body, {"scan": (axis, state, tuple(triangular))})


def inline(t: Tensor) -> Tensor:
    """``t`` with every computed tensor it reads (transitively) substituted into its body."""

    def sub(x):
        if isinstance(x, Load) and not x.tensor.is_placeholder:
            src = inline(x.tensor)
            at = dict(zip(src.axes, (transform(i, sub) for i in x.indices)))  # (indices may read computed tensors)
            return transform(src.body, lambda y: at.get(y) if isinstance(y, Var) else None)
        return None

    if t.is_placeholder:
        return t
    return Tensor(t.name, t.shape, t.dtype, t.axes, transform(t.body, sub), t.attrs)


def placeholders(t: Tensor) -> list[Tensor]:
    """The placeholders ``t``'s body reads, in first-read order."""
    seen: dict[int, Tensor] = {}

    def visit(x):
        if isinstance(x, Load) and x.tensor.is_placeholder:
            seen.setdefault(id(x.tensor), x.tensor)

    transform(t.body, visit)
    return list(seen.values())
