"""Primitives of run-time shape values (docs/dynamic-shapes.md).

``SymConst`` is a small tensor of size expressions (a shape that folding could not finish at
compile time) written by a kernel from the dims uniform; ``Iota`` is ONNX Range of run-time length:
``out[i] = start + i * delta``, ``start`` possibly a size expression. Neither has inputs. Their numpy
semantics need the run-time dims, so the interpreter refuses them (KilnError).
"""

from __future__ import annotations

from kiln.errors import KilnError
from kiln.ir.registry import register


def _needs_dims(name):
    def evaluate(xs, a):
        raise KilnError(f"{name} needs the run-time dims; the numpy interpreter runs static graphs only")
    return evaluate


register("SymConst", "generator", lambda ts, a: [(a["dtype"], tuple(a["shape"]))], _needs_dims("SymConst"))
register("Iota", "generator", lambda ts, a: [(a["dtype"], tuple(a["shape"]))], _needs_dims("Iota"))
