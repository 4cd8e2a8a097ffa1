"""Primitive ops over block-quantized weights: ``MatMulNBits`` and ``GatherBlockQuantized``.

Weights stay packed (4 or 8 bits a weight plus one scale word per block) in the package and on the
device; the kernels dequantize inside the product or the lookup (:mod:`kiln.kernels.quant`). One packed
layout serves every source format (GGUF Q4_0, Q4_1, Q8_0; onnxruntime's ``MatMulNBits`` and
``GatherBlockQuantized``, ContribOperators.md):

- ``packed``: int32 ``[N, K * bits / 32]``, the bit pattern of little-endian uint32 words. Element ``k``
  of row ``n`` is the unsigned ``bits``-wide field at bit ``(k * bits) % 32`` of word ``(k * bits) // 32``
  (onnxruntime's nibble order: element ``2i`` in the low nibble of byte ``i``).
- ``scales``: with ``scale_format="f16x2"`` int32 ``[N, K / block_size]``, one word a block holding the
  block's scale (low half) and offset (high half) as IEEE half floats, exactly GGUF's ``d`` and ``m``
  (5 bits a weight for 4-bit blocks of 32); with ``scale_format="f32"`` float32 ``[N, K / block_size]``,
  and the offsets in a third input of the same shape (float32 scales of onnxruntime's quantizer kept exact).
- value: ``w[n, k] = q(n, k) * scale[n, k // block_size] + offset[n, k // block_size]``, so GGUF Q4_1 is
  ``d * q + m``, Q4_0 ``d * q - 8 d``, Q8_0 (int8 stored as ``q + 128``) ``d * q - 128 d`` and
  ``MatMulNBits`` with zero point ``z`` is ``s * q - z s``.

Attributes of both: ``K`` (elements a row), ``N`` (rows), ``bits`` (4 or 8), ``block_size`` (a power of
two >= 16 dividing ``K``), ``scale_format``.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import ShapeError
from kiln.ir.registry import register

SCALE_FORMATS = ("f16x2", "f32")


def _check_packed(op: str, ts, a) -> None:
    bits, block, k, n, fmt = a["bits"], a["block_size"], a["K"], a["N"], a["scale_format"]
    if bits not in (4, 8) or block < 16 or block & (block - 1) or k % block or fmt not in SCALE_FORMATS:
        raise ShapeError(f"{op}: unsupported bits={bits}, block_size={block}, K={k}, scale_format={fmt!r}")
    (dp, sp), (ds, ss) = ts[0], ts[1]
    want = (n, k * bits // 32)
    if dp != "int32" or tuple(sp) != want:
        raise ShapeError(f"{op}: packed weights must be int32 {list(want)}, got {dp}{list(sp)}")
    blocks = (n, k // block)
    if tuple(ss) != blocks or ds != ("int32" if fmt == "f16x2" else "float32"):
        raise ShapeError(f"{op}: scales must be {list(blocks)} of {fmt}, got {ds}{list(ss)}")
    if fmt == "f32" and (len(ts) != 3 or ts[2] != ("float32", blocks)):
        raise ShapeError(f"{op}: f32 scales need float32 offsets {list(blocks)}")


def dequantize(packed: np.ndarray, scales: np.ndarray, offsets: np.ndarray | None, a) -> np.ndarray:
    """The float32 ``[N, K]`` weights of a packed tensor (the numpy semantics both primitives share)."""
    bits, block, k, n = a["bits"], a["block_size"], a["K"], a["N"]
    words = np.ascontiguousarray(packed).view(np.uint32)
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint32) * bits)
    q = ((words[:, :, None] >> shifts) & ((1 << bits) - 1)).reshape(n, k).astype(np.float32)
    if a["scale_format"] == "f16x2":
        halves = np.ascontiguousarray(scales).view(np.uint32)
        s = (halves & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)
        o = (halves >> 16).astype(np.uint16).view(np.float16).astype(np.float32)
    else:
        s, o = scales.astype(np.float32), offsets.astype(np.float32)
    return (q * np.repeat(s, block, axis=1) + np.repeat(o, block, axis=1)).astype(np.float32)


def _matmul_infer(ts, a):
    _check_packed("MatMulNBits", ts[1:], a)
    da, sa = ts[0]
    if da != "float32" or not sa or sa[-1] != a["K"]:
        raise ShapeError(f"MatMulNBits: input A must be float32 [..., {a['K']}], got {da}{list(sa)}")
    return [("float32", (*sa[:-1], a["N"]))]


def _matmul_eval(xs, a):
    w = dequantize(xs[1], xs[2], xs[3] if len(xs) > 3 else None, a)
    return [np.matmul(xs[0].astype(np.float32), w.T).astype(np.float32)]


def _gather_infer(ts, a):
    di, si = ts[1]
    _check_packed("GatherBlockQuantized", [ts[0], *ts[2:]], a)
    if di not in ("int32", "int64"):
        raise ShapeError(f"GatherBlockQuantized: indices must be int32 or int64, got {di}")
    return [("float32", (*si, a["K"]))]


def _gather_eval(xs, a):
    packed, idx, scales = xs[0], xs[1], xs[2]
    idx = np.where(idx < 0, idx + a["N"], idx)
    rows = dequantize(packed[idx.reshape(-1)], scales[idx.reshape(-1)],
                      xs[3][idx.reshape(-1)] if len(xs) > 3 else None, {**a, "N": idx.size})
    return [rows.reshape(*idx.shape, a["K"])]


#: ``MatMulNBits(A, packed, scales[, offsets])``: ``A [..., K] @ W.T`` with ``W [N, K]`` dequantized in the kernel
register("MatMulNBits", "matmul_nbits", _matmul_infer, _matmul_eval)
#: ``GatherBlockQuantized(packed, indices, scales[, offsets])``: rows ``indices`` of ``W [N, K]``, ``[*indices, K]``
register("GatherBlockQuantized", "gather", _gather_infer, _gather_eval)
