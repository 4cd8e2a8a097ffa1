"""The registry of graph-IR primitives: each op's kind, shape rule and numpy semantics.

:mod:`kiln.ir.ops` and its companions (``ops_data``, ``ops_control``, ``ops_grad``, ``ops_resample``,
``ops_dynamic``) fill it with :func:`register`; everything else reads it through :mod:`kiln.ir.ops`
(which imports all of them, so every primitive is registered once ``kiln.ir.ops`` is imported).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.arith import symbolic
from kiln.errors import ShapeError

Type = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class OpSpec:
    """Shape rule and reference semantics of one primitive op."""

    name: str
    kind: str
    infer: Callable[[list[Type], dict[str, Any]], list[Type]]
    evaluate: Callable[[list[np.ndarray], dict[str, Any]], list[np.ndarray]]


_SPECS: dict[str, OpSpec] = {}


def get(name: str) -> OpSpec:
    """The spec of primitive ``name`` (KeyError if there is none)."""
    return _SPECS[name]


def kind(name: str) -> str:
    """The kind of primitive ``name`` (``elementwise``, ``binary``, ``reduce``, ...)."""
    return _SPECS[name].kind


def register(name: str, kind: str, infer, evaluate) -> None:
    """Add primitive ``name`` of ``kind`` with its shape rule ``infer`` and numpy semantics ``evaluate``."""
    _SPECS[name] = OpSpec(name, kind, infer, evaluate)


def is_symbolic(*shapes) -> bool:
    """Whether any dim of ``shapes`` is a run-time size expression rather than an int."""
    return any(not isinstance(d, (int, np.integer)) for s in shapes for d in s)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy/ONNX multidirectional broadcast of ``shapes`` (raises ShapeError if they do not fit); run-time
    dims broadcast only against 1 or an equal dim (:func:`kiln.arith.symbolic.broadcast_shapes`)."""
    if is_symbolic(*shapes):
        return symbolic.broadcast_shapes(*shapes)
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"shapes {' and '.join(str(list(s)) for s in shapes)} do not broadcast") from None
