"""Comparison and logic ONNX operators: Equal, Less, Greater(OrEqual), LessOrEqual, And, Or, Xor, Not, Where, bitwise ops."""

from __future__ import annotations

from kiln.errors import KilnError
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value


def _binary(op: str, since: int):
    def convert(b: Builder, x: Value, y: Value) -> Value:
        return b.op(op, [x, y])

    convert.__doc__ = (f"ONNX {op}-{since}+: elementwise with multidirectional (numpy) broadcasting. "
                       "Raises ShapeError if the operands' dtypes differ or their shapes do not broadcast.")
    return convert


for _op, _since in (("Equal", 7), ("Less", 7), ("Greater", 7), ("LessOrEqual", 12), ("GreaterOrEqual", 12),
                    ("And", 7), ("Or", 7), ("Xor", 7), ("BitwiseAnd", 18), ("BitwiseOr", 18), ("BitwiseXor", 18)):
    onnx_op(_op, since=_since)(_binary(_op, _since))


@onnx_op("Not", since=1)
def logical_not(b: Builder, x: Value) -> Value:
    """ONNX Not-1: elementwise logical negation of a bool tensor."""
    return b.op("Not", [x])


@onnx_op("BitwiseNot", since=18)
def bitwise_not(b: Builder, x: Value) -> Value:
    """ONNX BitwiseNot-18: ``~x`` on integers (computed in 32 bits, wrapped to 8-bit types when stored)."""
    return b.op("BitwiseNot", [x])


@onnx_op("Where", since=9)
def where(b: Builder, cond: Value, x: Value, y: Value) -> Value:
    """ONNX Where-9/16: ``x`` where ``cond`` else ``y``, all three broadcast together.

    Raises ShapeError if ``cond`` is not bool, ``x`` and ``y`` differ in dtype, or the shapes do not broadcast.
    """
    return b.op("Where", [cond, x, y])


@onnx_op("BitShift", since=11)
def bit_shift(b: Builder, x: Value, y: Value, *, direction: str) -> Value:
    """ONNX BitShift-11: ``x << y`` or ``x >> y`` on unsigned integers (computed in 32 bits, wrapped when stored).

    Raises KilnError for an unknown ``direction``.
    """
    if direction not in ("LEFT", "RIGHT"):
        raise KilnError(f"BitShift: direction must be LEFT or RIGHT, got {direction!r}")
    return b.op("BitShiftLeft" if direction == "LEFT" else "BitShiftRight", [x, y])
