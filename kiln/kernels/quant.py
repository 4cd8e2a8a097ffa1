"""Tensor expressions over block-quantized weights (:mod:`kiln.ir.ops_quant`): the packed-block load is an
expression, so the dequantization is inlined into the product or the lookup and the weights stay packed.
"""

from __future__ import annotations

from kiln.arith.expr import Expr, binop, call, cast, reduce, reduce_axis, select
from kiln.te.compute import Tensor, compute


def half_to_float(h: Expr) -> Expr:
    """The float32 value of the IEEE half float whose bits are the low 16 bits of int32 ``h`` (each target's
    conversion: WGSL ``unpack2x16float``, GLSL ``unpackHalf2x16``, C ``_Float16``)."""
    return call("half_lo", h)


def weight(packed: Tensor, scales: Tensor, offsets: Tensor | None, attrs: dict, n: Expr, k: Expr) -> Expr:
    """The dequantized weight ``w[n, k]`` as an expression reading the packed words and the block's scale."""
    bits, block = attrs["bits"], attrs["block_size"]
    per = 32 // bits
    word = packed[n, k // per]
    q = binop("&", binop(">>", word, (k % per) * bits), (1 << bits) - 1)
    blk = k // block
    if attrs["scale_format"] == "f16x2":
        sw = scales[n, blk]
        scale, offset = half_to_float(sw), half_to_float(binop(">>", sw, 16))
    else:
        scale, offset = scales[n, blk], offsets[n, blk]
    return cast(q, "float32") * scale + offset


def matmul_nbits(a: Tensor, packed: Tensor, scales: Tensor, offsets: Tensor | None, attrs: dict,
                 out_shape: tuple, name: str = "matmul_nbits") -> Tensor:
    """``out[..., n] = sum_k a[..., k] * w[n, k]`` with ``w`` dequantized from its packed blocks in the loop.

    The reduction runs over packed words and the fields inside a word (``k = word * (32 / bits) + field``), so
    a word's load and its block's scale are the same expression for every field (hoisted out of the inner loop
    by the shader compiler). (The block-by-block form ``sum_b scale_b * sum_j a_j q_j + offset_b * sum_j a_j``
    needs nested reductions, which the tiled lowering does not get right today.)"""
    bits, block = attrs["bits"], attrs["block_size"]
    per = 32 // bits
    rw = reduce_axis(attrs["K"] // per, "rw")
    rf = reduce_axis(per, "rf")
    mask = (1 << bits) - 1

    def body(*idx):
        n = idx[-1]
        k = rw * per + rf
        q = cast(binop("&", binop(">>", packed[n, rw], rf * bits), mask), "float32")
        blk = rw // (block // per)
        if attrs["scale_format"] == "f16x2":
            sw = scales[n, blk]
            scale, offset = half_to_float(sw), half_to_float(binop(">>", sw, 16))
        else:
            scale, offset = scales[n, blk], offsets[n, blk]
        return reduce("sum", a[(*idx[:-1], k)] * (q * scale + offset), [rw, rf])

    return compute(out_shape, body, name)


def gather_block_quantized(packed: Tensor, indices: Tensor, scales: Tensor, offsets: Tensor | None, attrs: dict,
                           out_shape: tuple, name: str = "gather_blocks") -> Tensor:
    """``out[*i, k] = w[indices[*i], k]`` (negative indices count from the end), dequantized as it is read."""
    rank = len(indices.shape)

    def body(*idx):
        row = indices[idx[:rank]]
        row = select(binop("<", row, 0), row + attrs["N"], row)
        return weight(packed, scales, offsets, attrs, row, idx[rank])

    return compute(out_shape, body, name)
