"""onnxruntime's decoder contrib operators, as q4 LLM exports write them (optimum, transformers.js,
onnxruntime-genai's model builder): MatMulNBits, SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization
and RotaryEmbedding.

Semantics from onnxruntime's docs/ContribOperators.md, checked against its CPU kernels (the tests' oracle).
All but SimplifiedLayerNormalization are in domain ``com.microsoft``; onnxruntime registers that one in the
default domain (since opset 1). Packed weights stay packed: ``MatMulNBits`` maps onto Kiln's primitive of the
same name (:mod:`kiln.ir.ops_quant`), the rest decompose like the decoder blocks of :mod:`kiln.frontend.decoder`.
"""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.errors import ConstantInputError, KilnError, ShapeError
from kiln.frontend import decoder
from kiln.frontend.onnx.ops.attention import rotary_embedding
from kiln.frontend.onnx.ops.common import norm_axis
from kiln.frontend.onnx.ops.norm import _scalar
from kiln.frontend.onnx.registry import onnx_op
from kiln.frontend.shapes import reshape
from kiln.ir.graph import Builder, Value

MS = "com.microsoft"


# ----------------------------------------------------------------------------- MatMulNBits

def _const(v: Value, op: str, what: str) -> np.ndarray:
    if not v.is_const:
        raise ConstantInputError(f"{op}: input {what} (%{v.name}) must be a constant initializer, not computed at "
                                 "run time", v.name)
    return np.asarray(v.const)


def _unpack(raw: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The ``bits``-wide unsigned fields of the bytes ``raw [..., m]`` (lowest bits first), ``[..., count]``."""
    per = 8 // bits
    q = (raw[..., None] >> (np.arange(per, dtype=np.uint8) * bits)) & np.uint8((1 << bits) - 1)
    return q.reshape(*raw.shape[:-1], raw.shape[-1] * per)[..., :count]


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`_unpack`: ``q [..., m * 8 / bits]`` (fields < 2^bits) as bytes ``[..., m]``."""
    per = 8 // bits
    q = q.astype(np.uint8).reshape(*q.shape[:-1], -1, per)
    return np.bitwise_or.reduce(q << (np.arange(per, dtype=np.uint8) * bits), axis=-1).astype(np.uint8)


def _weights(b: Builder, v: Value, n: int, blocks: int, block: int, bits: int) -> tuple[Value, int]:
    """B ``[N, k_blocks, blob]`` (uint8) as the primitive's int32 words ``[N, K' * bits' / 32]`` and ``bits'``.

    The bytes viewed as little-endian uint32 words are already in the primitive's element order; 2-bit
    weights are widened to 4-bit fields (the primitive has 4- and 8-bit kernels).
    """
    raw = _const(v, "MatMulNBits", "B")
    if raw.dtype != np.uint8 or raw.size != n * blocks * block * bits // 8:
        raise ShapeError(f"MatMulNBits: B must be uint8 [{n}, {blocks}, {block * bits // 8}], got "
                         f"{raw.dtype}{list(raw.shape)}")
    raw = np.ascontiguousarray(raw).reshape(n, blocks * block * bits // 8)
    if bits == 2:
        raw, bits = _pack(_unpack(raw, 2, blocks * block), 4), 4
    return b.const(raw.view("<i4").astype(np.int32), name=f"{v.name}_words"), bits


def _zero_points(zp: Value | None, n: int, blocks: int, bits: int) -> np.ndarray:
    """The zero points as float32 ``[N, k_blocks]``: default ``2^(bits-1)``, packed uint8 ``[N, ceil(k_blocks *
    bits / 8)]`` (each row padded to whole bytes) or float ``[N, k_blocks]``."""
    if zp is None:
        return np.full((n, blocks), 2 ** (bits - 1), np.float32)
    z = _const(zp, "MatMulNBits", "zero_points")
    if z.dtype == np.uint8:
        per_row = -(-blocks * bits // 8)
        if z.size != n * per_row:
            raise ShapeError(f"MatMulNBits: packed zero_points must be uint8 [{n}, {per_row}], got {list(z.shape)}")
        return _unpack(z.reshape(n, per_row), bits, blocks).astype(np.float32)
    if z.dtype.kind != "f" or z.size != n * blocks:
        raise ShapeError(f"MatMulNBits: zero_points must be packed uint8 or float [{n}, {blocks}], got "
                         f"{z.dtype}{list(z.shape)}")
    return z.reshape(n, blocks).astype(np.float32)


@onnx_op("MatMulNBits", since=1, domain=MS)
def matmul_nbits(b: Builder, a: Value, weights: Value, scales: Value, zero_points: Value | None = None,
                 g_idx: Value | None = None, bias: Value | None = None, *, K: int, N: int, bits: int = 4,
                 block_size: int, accuracy_level: int = 0, weight_prepacked: int = 0) -> Value:
    """com.microsoft MatMulNBits-1 (ContribOperators.md): ``Y [..., N] = A [..., K] @ W.T (+ bias)`` with ``W [N, K]``
    dequantized per block of ``block_size`` along K as ``(q - zero_point) * scale``.

    B is uint8 ``[N, k_blocks, block_size * bits / 8]`` (fields lowest bits first), scales float ``[N, k_blocks]``
    (or flat), zero_points packed uint8 or float ``[N, k_blocks]`` (default ``2^(bits-1)``), bias ``[N]``; B,
    scales and zero points must be initializers. Kiln keeps B packed: the primitive ``MatMulNBits`` with f32
    scales and offsets ``-zero_point * scale``. bits 2, 4 or 8. When K is not a multiple of ``block_size``, A is
    zero-padded to the last block's end. ``accuracy_level`` is ignored: Kiln computes in float32.

    Raises:
        KilnError: g_idx given, a prepacked or empty B, or unsupported bits.
        ConstantInputError: B, scales or zero points computed at run time.
    """
    if g_idx is not None:
        raise KilnError("MatMulNBits: the g_idx input (act-order group indices, deprecated) is not supported")
    if weight_prepacked:
        raise KilnError(f"MatMulNBits: weight_prepacked={weight_prepacked} (an EP-specific layout) is not supported")
    if bits not in (2, 4, 8):
        raise KilnError(f"MatMulNBits: bits={bits} is not supported (2, 4 or 8)")
    if block_size < 16 or block_size & (block_size - 1):
        raise KilnError(f"MatMulNBits: block_size={block_size} must be a power of two >= 16")
    if not a.shape or a.shape[-1] != K:
        raise ShapeError(f"MatMulNBits: input A {list(a.shape)} must end in K={K}")
    if weights.is_const and 0 in weights.const.shape:
        raise KilnError("MatMulNBits: an empty B (an omitted projection) is not supported")
    blocks = -(-K // block_size)
    packed, wbits = _weights(b, weights, N, blocks, block_size, bits)
    s = _const(scales, "MatMulNBits", "scales")
    if s.size != N * blocks:
        raise ShapeError(f"MatMulNBits: scales must be [{N}, {blocks}], got {list(s.shape)}")
    s = s.reshape(N, blocks).astype(np.float32)
    offsets = (-_zero_points(zero_points, N, blocks, bits) * s).astype(np.float32)
    w = decoder.Packed(packed, b.const(s, name=f"{scales.name}_f32"), b.const(offsets, name=f"{scales.name}_offsets"),
                       {"K": blocks * block_size, "N": N, "bits": wbits, "block_size": block_size, "scale_format": "f32"})
    dtype = a.dtype
    if dtype != "float32":
        a = b.op("Cast", [a], to="float32")
    if blocks * block_size != K:
        rank = len(a.shape)
        a = b.op("Pad", [a], pads=(0,) * (2 * rank - 1) + (blocks * block_size - K,), mode="constant", value=0.0)
    if bias is not None and bias.dtype != "float32":
        bias = b.op("Cast", [bias], to="float32")
    y = decoder.linear(b, a, w, bias)
    return y if dtype == "float32" else b.op("Cast", [y], to=dtype)


# ----------------------------------------------------------------------------- RMS norms

@onnx_op("SimplifiedLayerNormalization", since=1)
def simplified_layer_norm(b: Builder, x: Value, scale: Value, *, axis: int = -1, epsilon: float = 1e-5,
                          stash_type: int = 1, _nout: int = 1) -> list[Value]:
    """onnxruntime's SimplifiedLayerNormalization (default domain, since 1; RMSNorm): ``Y = x / sqrt(mean(x^2) +
    eps) * scale`` over the dims from ``axis`` on; the optional output inv_std_var ``1 / sqrt(mean(x^2) + eps)``
    keeps those dims as size 1."""
    rank = len(x.shape)
    inv = decoder.inv_rms(b, x, tuple(range(norm_axis(axis, rank), rank)), epsilon)
    y = b.op("Mul", [b.op("Mul", [x, inv]), scale])
    return [y, inv][:max(_nout, 1)]


@onnx_op("SkipSimplifiedLayerNormalization", since=1, domain=MS)
def skip_simplified_layer_norm(b: Builder, x: Value, skip: Value, gamma: Value, bias: Value | None = None, *,
                               epsilon: float = 1e-12, _nout: int = 1) -> list[Value]:
    """com.microsoft SkipSimplifiedLayerNormalization-1 (ContribOperators.md): RMSNorm of ``s = input + skip
    (+ bias)`` over the last axis, ``s / sqrt(mean(s^2) + eps) * gamma``.

    input ``[B, S, hidden]`` or ``[tokens, hidden]``, skip the same or broadcastable, gamma and bias
    ``[hidden]``. Outputs: output; mean (zeros, as onnxruntime writes: RMSNorm does not centre) and
    inv_std_var (``[..., 1]``); input_skip_bias_sum ``s``.
    """
    s = b.op("Add", [x, skip])
    if bias is not None:
        s = b.op("Add", [s, bias])
    inv = decoder.inv_rms(b, s, (len(s.shape) - 1,), epsilon)
    y = b.op("Mul", [b.op("Mul", [s, inv]), gamma])
    if _nout <= 1:
        return [y]
    if symbolic.is_static(inv.shape):
        mean = b.const(np.zeros(inv.shape), dtype=inv.dtype)
    else:
        mean = b.op("Mul", [inv, _scalar(b, 0.0, inv)])
    return [y, mean, inv, s][:_nout]


# ----------------------------------------------------------------------------- RotaryEmbedding

def _positions(b: Builder, start: Value, seq) -> Value:
    """``[1, seq]``: the positions ``start .. start + seq - 1`` of a one-element ``position_ids``."""
    start = reshape(b, start, (1, 1))
    if symbolic.is_static((seq,)):
        steps = b.const(np.arange(int(seq)).reshape(1, -1), dtype=start.dtype)
    else:
        steps = reshape(b, b.op("Iota", [], shape=(seq,), start=0, delta=1, dtype=start.dtype), (1, seq))
    return b.op("Add", [start, steps])


@onnx_op("RotaryEmbedding", since=1, domain=MS)
def ms_rotary_embedding(b: Builder, x: Value, position_ids: Value, cos_cache: Value, sin_cache: Value, *,
                        interleaved: int = 0, num_heads: int = 0, rotary_embedding_dim: int = 0, scale: float = 1.0,
                        is_packed_batching: int = 0) -> Value:
    """com.microsoft RotaryEmbedding-1 (ContribOperators.md): RoPE on input ``[B, S, hidden]`` or ``[B, heads, S,
    head_size]``, the first ``rotary_embedding_dim`` features of each head rotated (halves, or even/odd pairs
    when ``interleaved``), the rest passed through.

    position_ids: int64 ``[B, S]``, or one element ``[1]``: the start position, tokens at ``start .. start + S -
    1``. cos_cache, sin_cache: ``[max_pos, rotary_dim / 2]``. With rank 3 and no ``num_heads``, the head size
    is ``2 * cos_cache.shape[1]``. ``scale`` only matters to onnxruntime's GPU cache update and is ignored, as
    its CPU kernel does.
    """
    if is_packed_batching:
        raise KilnError("RotaryEmbedding: is_packed_batching=1 (ragged batches) is not supported")
    if len(cos_cache.shape) != 2 or cos_cache.shape != sin_cache.shape:
        raise ShapeError(f"RotaryEmbedding: cos_cache {list(cos_cache.shape)} and sin_cache {list(sin_cache.shape)} "
                         "must be the same 2-D shape")
    if rotary_embedding_dim and not num_heads:
        raise KilnError("RotaryEmbedding: num_heads must be given with rotary_embedding_dim")
    rank = len(x.shape)
    if rank == 3:
        seq = x.shape[1]
        heads = num_heads or x.shape[2] // (2 * cos_cache.shape[1])
        head_size = x.shape[2] // heads
    elif rank == 4:
        seq, heads, head_size = x.shape[2], x.shape[1], x.shape[3]
    else:
        raise ShapeError(f"RotaryEmbedding: input {list(x.shape)} must be [B, S, hidden] or [B, heads, S, head]")
    rd = rotary_embedding_dim or head_size
    if rd > head_size or rd % 2 or cos_cache.shape[1] != rd // 2:
        raise ShapeError(f"RotaryEmbedding: rotary dim {rd} does not fit head size {head_size} and cos_cache "
                         f"{list(cos_cache.shape)}")
    if len(position_ids.shape) <= 1 and tuple(position_ids.shape) in ((), (1,)):
        position_ids = _positions(b, position_ids, seq)
    elif len(position_ids.shape) != 2:
        raise ShapeError(f"RotaryEmbedding: position_ids {list(position_ids.shape)} must be [B, S] or [1]")
    return rotary_embedding(b, x, cos_cache, sin_cache, position_ids, interleaved=interleaved, num_heads=heads,
                            rotary_embedding_dim=rd)
