"""ONNX Einsum-12 decomposed into ReduceSum, Transpose, Reshape and MatMul (one or two operands)."""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.nn import _reshape, transpose
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value

_SPARE = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _parse(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Operand and output subscripts with ``...`` expanded into spare upper-case letters."""
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ShapeError(f"Einsum: {equation!r} has {len(terms)} operands, got {len(ranks)}")
    ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    dots = _SPARE[:ell]
    out_terms = []
    for t, r in zip(terms, ranks):
        k = r - len(t.replace("...", "")) if "..." in t else 0
        out_terms.append(t.replace("...", dots[ell - k:]))
        if len(out_terms[-1]) != r:
            raise ShapeError(f"Einsum: subscripts {t!r} do not fit rank {r}")
    if "->" in eq:
        out = rhs.replace("...", dots)
    else:  # implicit: ellipsis dims, then letters seen once, alphabetically
        letters = "".join(out_terms)
        out = dots + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in dots))
    return out_terms, out


def _diagonals(b: Builder, x: Value, sub: str) -> tuple[Value, str]:
    """Take the diagonal for every subscript repeated within one operand (``ii -> i``)."""
    while len(set(sub)) != len(sub):
        ch = next(c for c in sub if sub.count(c) > 1)
        i, j = sub.index(ch), sub.index(ch, sub.index(ch) + 1)
        n = x.shape[i]
        rest = "".join(c for k, c in enumerate(sub) if k not in (i, j))
        x = transpose(b, x, tuple(k for k in range(len(sub)) if k not in (i, j)) + (i, j))
        x = _reshape(b, x, (*x.shape[:-2], n * n))
        x = b.op("Gather", [x, b.const(np.arange(n, dtype=np.int64) * (n + 1))], axis=len(x.shape) - 1)
        sub = rest + ch
    return x, sub


def _sum_out(b: Builder, x: Value, sub: str, keep: set[str]) -> tuple[Value, str]:
    axes = tuple(i for i, c in enumerate(sub) if c not in keep)
    if not axes:
        return x, sub
    return b.op("ReduceSum", [x], axes=axes, keepdims=0), "".join(c for c in sub if c in keep)


def _permute(b: Builder, x: Value, sub: str, order: str) -> Value:
    return transpose(b, x, tuple(sub.index(c) for c in order))


@onnx_op("Einsum", since=12)
def einsum(b: Builder, *xs: Value, equation: str) -> Value:
    """ONNX Einsum-12 for one or two operands (diagonals, sums, transposes, batched contractions).

    Raises KilnError for more than two operands.
    """
    subs, out = _parse(equation, [len(x.shape) for x in xs])
    if len(xs) > 2:
        raise KilnError(f"Einsum: {equation!r} has more than two operands, which is not supported")
    xs = list(xs)
    for k in range(len(xs)):
        xs[k], subs[k] = _diagonals(b, xs[k], subs[k])
    dims = {}
    for x, s in zip(xs, subs):
        for c, d in zip(s, x.shape):
            if dims.setdefault(c, d) != d and d != 1 and dims[c] != 1:
                raise ShapeError(f"Einsum: subscript {c!r} is {dims[c]} and {d}")
            dims[c] = max(dims[c], d)
    if len(xs) == 1:
        y, s = _sum_out(b, xs[0], subs[0], set(out))
        return _permute(b, y, s, out)
    a, c = xs
    sa, sc = subs
    a, sa = _sum_out(b, a, sa, set(out) | set(sc))
    c, sc = _sum_out(b, c, sc, set(out) | set(sa))
    batch = [ch for ch in out if ch in sa and ch in sc]
    contract = [ch for ch in sa if ch in sc and ch not in out]
    left = [ch for ch in sa if ch not in sc]
    right = [ch for ch in sc if ch not in sa]

    def size(chs):
        return int(np.prod([dims[ch] for ch in chs], dtype=np.int64))

    a3 = _reshape(b, _permute(b, a, sa, "".join(batch + left + contract)),
                  (*[a.shape[sa.index(ch)] for ch in batch], size(left), size(contract)))
    c3 = _reshape(b, _permute(b, c, sc, "".join(batch + contract + right)),
                  (*[c.shape[sc.index(ch)] for ch in batch], size(contract), size(right)))
    y = b.op("MatMul", [a3, c3])
    ys = batch + left + right
    y = _reshape(b, y, tuple(list(y.shape[:len(batch)]) + [dims[ch] for ch in left + right]))
    return _permute(b, y, "".join(ys), out)
