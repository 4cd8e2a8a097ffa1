"""Helpers shared by the converters."""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.errors import ConstantInputError, KilnError
from kiln.ir.graph import Value


def const_value(v: Value | None, what: str) -> np.ndarray:
    """The data of constant input ``v``.

    Raises:
        KilnError: ``v`` is missing.
        ConstantInputError: ``v`` is computed at run time (names ``what`` and the value).
    """
    if v is None:
        raise KilnError(f"missing required input {what}")
    if not v.is_const:
        raise ConstantInputError(f"input {what} (%{v.name}) must be a constant (computed at run time is not "
                                 "supported yet)", v.name)
    return v.const


def norm_axis(axis: int, rank: int) -> int:
    """Normalise a possibly negative ONNX axis to ``[0, rank)`` (KilnError if out of range or not an integer)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise KilnError(f"axis {axis!r} is not an integer")
    axis = int(axis)
    if not -rank <= axis < max(rank, 1):
        raise KilnError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def dims_of(values) -> tuple:
    """Shape entries from a constant's ``tolist()``: ints, or size expressions of run-time dims
    (:mod:`kiln.arith.symbolic`), simplified."""
    return tuple(symbolic.simplify(d) for d in values)


def shape_array(dims) -> np.ndarray:
    """A shape as an int64 array, or an object array when a dim is a size expression."""
    if symbolic.is_static(dims):
        return np.array([int(d) for d in dims], np.int64)
    out = np.empty(len(dims), object)
    out[:] = list(dims)
    return out
