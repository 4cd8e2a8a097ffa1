"""Building blocks of transformer decoders with a KV cache, on the graph IR's primitives.

Shared by the GGUF frontend (:mod:`kiln.frontend.gguf`) and by onnxruntime's decoder contrib operators
(``SimplifiedLayerNormalization``, ``RotaryEmbedding``, ``GroupQueryAttention``, ``MatMulNBits``), so a Llama
from either source becomes the same kernels. Every block decomposes into primitives that already have
kernels on every target (reductions, elementwise chains, MatMul, Concat, Gather); ``MatMulNBits`` and
``GatherBlockQuantized`` (:mod:`kiln.ir.ops_quant`) keep weights packed.

Shapes follow the decoder's cache convention (optimum, transformers.js): activations ``[B, T, D]``, the
cache of one layer ``[B, KV, P, hd]`` (``KV`` key/value heads, ``P`` past tokens), ``P`` and ``T`` run-time
dims. Sources: RMSNorm (Zhang and Sennrich 2019), RoPE (Su et al. 2021; llama.cpp's adjacent-pair layout and
HF's half-split layout), grouped-query attention (Ainslie et al. 2023), SwiGLU (Shazeer 2020).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kiln.arith import symbolic
from kiln.frontend.shapes import reshape, transpose
from kiln.ir.graph import Builder, Value


def inv_rms(b: Builder, x: Value, axes: tuple[int, ...], eps: float) -> Value:
    """``1 / sqrt(mean(x^2) + eps)`` over ``axes``, kept as size-1 dims (RMSNorm's scale; ONNX RMSNormalization,
    onnxruntime's SimplifiedLayerNormalization and its Skip variant all use it)."""
    ms = b.op("ReduceMean", [b.op("Mul", [x, x])], axes=axes, keepdims=1)
    return b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [ms, b.const(np.array(eps), dtype=ms.dtype)])])])


def rms_norm(b: Builder, x: Value, weight: Value, eps: float, axes: tuple[int, ...] | None = None) -> Value:
    """``x / sqrt(mean(x^2) + eps) * weight`` over ``axes`` (default the last)."""
    inv = inv_rms(b, x, axes if axes is not None else (len(x.shape) - 1,), eps)
    return b.op("Mul", [b.op("Mul", [x, inv]), weight])


def layer_norm(b: Builder, x: Value, gamma: Value, beta: Value | None, eps: float,
               axes: tuple[int, ...] | None = None) -> Value:
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` over ``axes`` (default the last; Ba et al. 2016, ONNX
    LayerNormalization-17), the variance as ``mean((x - mean)^2)``."""
    axes = axes if axes is not None else (len(x.shape) - 1,)
    mean = b.op("ReduceMean", [x], axes=axes, keepdims=1)
    d = b.op("Sub", [x, mean])
    var = b.op("ReduceMean", [b.op("Mul", [d, d])], axes=axes, keepdims=1)
    inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [var, b.const(np.array(eps), dtype=var.dtype)])])])
    y = b.op("Mul", [b.op("Mul", [d, inv]), gamma])
    return y if beta is None else b.op("Add", [y, beta])


@dataclass(frozen=True)
class Packed:
    """A block-quantized weight ``W [N, K]`` (:mod:`kiln.ir.ops_quant`): its constants and attributes."""

    packed: Value
    scales: Value
    offsets: Value | None
    attrs: dict

    def inputs(self) -> list[Value]:
        """The primitive's weight inputs after the activation (or the indices)."""
        return [self.packed, self.scales] + ([self.offsets] if self.offsets is not None else [])


def linear(b: Builder, x: Value, w: Value | Packed, bias: Value | None = None) -> Value:
    """``x @ W.T (+ bias)`` for ``W [N, K]``: packed weights through ``MatMulNBits``, float weights (given as
    ``W.T``, ``[K, N]``) through ``MatMul``."""
    if isinstance(w, Packed):
        y = b.op("MatMulNBits", [x, *w.inputs()], **w.attrs)
    else:
        y = b.op("MatMul", [x, w])
    return y if bias is None else b.op("Add", [y, bias])


def embed(b: Builder, table: Value | Packed, ids: Value) -> Value:
    """Rows ``ids`` of an embedding table ``[V, D]`` (packed: ``GatherBlockQuantized``)."""
    if isinstance(table, Packed):
        return b.op("GatherBlockQuantized", [table.packed, ids, *table.inputs()[1:]], **table.attrs)
    return b.op("Gather", [table, ids], axis=0)


@dataclass(frozen=True)
class Rope:
    """RoPE's constant tables, made once per model: ``cos`` and signed ``sin`` rows ``[positions, hd]`` spread
    over the head, and the ``partner`` permutation of a head's elements (see :func:`rotary`)."""

    cos: Value
    sin: Value
    partner: Value


def rope_tables(b: Builder, positions: int, dim: int, base: float, interleaved: bool) -> Rope:
    """RoPE's tables for angles ``p * base^(-2i / dim)``, computed in float64 and rounded once to float32 (the
    model's own reference does the same). Pairs are adjacent elements when ``interleaved`` (llama.cpp, GGUF) and
    the two halves of the head otherwise (HF, onnxruntime's default)."""
    inv = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    ang = np.arange(positions, dtype=np.float64)[:, None] * inv[None]
    i = np.arange(dim)
    half = dim // 2
    if interleaved:
        partner, pair, sign = i ^ 1, i // 2, np.where(i % 2 == 0, -1.0, 1.0)
    else:
        partner, pair, sign = (i + half) % dim, i % half, np.where(i < half, -1.0, 1.0)
    return Rope(b.const(np.cos(ang)[:, pair].astype(np.float32), name="rope_cos_rows"),
                b.const((np.sin(ang)[:, pair] * sign).astype(np.float32), name="rope_sin_rows"),
                b.const(partner.astype(np.int64), name="rope_partner"))


def positions(b: Builder, past: object, tokens: object) -> Value:
    """int32 ``[T]``: the positions ``P .. P + T - 1`` of the new tokens after ``past`` cached ones."""
    return b.op("Iota", [], shape=(tokens,), start=past, delta=1, dtype="int32")


def rotary(b: Builder, x: Value, rope: Rope, pos: Value) -> Value:
    """RoPE on ``x [B, T, heads, hd]`` at positions ``pos [T]``: each pair ``(x0, x1)`` becomes
    ``(x0 cos - x1 sin, x0 sin + x1 cos)``.

    Written as ``x * C + partner(x) * S``, with ``partner`` a constant permutation of the head's elements (a
    Gather) and ``C``, ``S`` the rows of :func:`rope_tables` at the positions (the same for every layer, computed
    once after common-subexpression elimination): two kernels, where slicing the pairs and concatenating them
    takes five.
    """
    hd, t = x.shape[3], x.shape[1]
    c = reshape(b, b.op("Gather", [rope.cos, pos], axis=0), (1, t, 1, hd))
    s = reshape(b, b.op("Gather", [rope.sin, pos], axis=0), (1, t, 1, hd))
    swapped = b.op("Gather", [x, rope.partner], axis=3)
    return b.op("Add", [b.op("Mul", [x, c]), b.op("Mul", [swapped, s])])


def causal_attention(b: Builder, q: Value, k: Value, v: Value, past_k: Value, past_v: Value, scale: float, *,
                     positions: Value | None = None, valid: Value | None = None, window: int = -1,
                     softcap: float = 0.0, sink: bool = False, write: Value | None = None,
                     past_len=None) -> tuple[Value, Value, Value]:
    """Grouped-query causal self-attention with a KV cache.

    Args:
        q: ``[B, T, H, hd]`` queries (after RoPE); k, v: ``[B, T, KV, hd]`` new keys (after RoPE) and values.
        past_k, past_v: ``[B, KV, P, hd]`` the cache of the ``P`` tokens before; with ``write``, the whole cache
            ``[B, KV, max_context, hd]``.
        scale: the scores' factor (``1 / sqrt(hd)``).
        write, past_len: an in-place cache (ONNX TensorScatter-24): int64 ``[B]``, the row the new keys and
            values go to, and ``P`` (a run-time dim), the rows in use before them. The cache is then updated where
            it lies (a decode step writes one row, not the whole cache) and attention reads its first ``P + T``
            rows.
        positions: int32 ``[B, T]``, each query's position; default ``P + t`` (from the shapes).
        valid: int32 ``[B]``, the cache rows of each batch entry that hold tokens (rows from there are hidden);
            default all.
        window: a sliding window: a query at position ``p`` sees keys ``p - window < j <= p`` (``-1``: all).
        softcap: scores become ``softcap * tanh(scores / softcap)`` (0: none).
        sink: a softmax with an extra zero logit (onnxruntime's ``smooth_softmax``).

    Returns:
        ``(out [B, T, H * hd], present_k, present_v)``: the caches ``[B, KV, P + T, hd]`` (with ``write``, the
        updated whole caches). A query at position ``p`` attends to
        cache rows ``j <= p`` (the cache row is the key's position). The ``H / KV`` query heads of a key/value
        head are one row block of a single batched MatMul (no repeated keys).
    """
    bsz, t, h, hd = q.shape
    kv = k.shape[2]
    group = h // kv
    if write is None:
        past = past_k.shape[2]
        present_k = keys = b.op("Concat", [past_k, transpose(b, k, (0, 2, 1, 3))], axis=2)
        present_v = values = b.op("Concat", [past_v, transpose(b, v, (0, 2, 1, 3))], axis=2)
    else:
        past = past_len
        present_k = b.op("TensorScatter", [past_k, transpose(b, k, (0, 2, 1, 3)), write], axis=2, mode="linear")
        present_v = b.op("TensorScatter", [past_v, transpose(b, v, (0, 2, 1, 3)), write], axis=2, mode="linear")
        rows = symbolic.simplify(past + t)
        keys, values = (b.op("Slice", [c], starts=(0, 0, 0, 0), ends=(bsz, kv, rows, hd), steps=(1, 1, 1, 1))
                        for c in (present_k, present_v))
    total = keys.shape[2]
    rows = symbolic.simplify(group * t)
    qg = reshape(b, transpose(b, q, (0, 2, 1, 3)), (bsz, kv, rows, hd))  # head kv*G+g, token t -> row g*T+t
    scores = b.op("MatMul", [qg, transpose(b, keys, (0, 1, 3, 2))])  # [B, KV, G*T, S]
    scores = b.op("Mul", [scores, b.const(np.array(scale, np.float32))])
    if softcap > 0:
        cap = b.const(np.array(softcap, np.float32))
        scores = b.op("Mul", [b.op("Tanh", [b.op("Div", [scores, cap])]), cap])
    # row r is token r % T; it sees cache rows s <= its position (and inside the window, and valid)
    r = b.op("Iota", [], shape=(rows,), start=0, delta=1, dtype="int32")
    tok = b.op("Mod", [r, dim_value(b, t)])
    if positions is None:
        pos = reshape(b, b.op("Add", [tok, dim_value(b, past)]), (rows, 1))
    else:
        pos = reshape(b, b.op("Gather", [positions, tok], axis=1), (bsz, 1, rows, 1))
    s = reshape(b, b.op("Iota", [], shape=(total,), start=0, delta=1, dtype="int32"), (1, total))
    hidden = b.op("Greater", [s, pos])
    if window > 0:
        hidden = b.op("Or", [hidden, b.op("LessOrEqual", [s, b.op("Sub", [pos, dim_value(b, window)])])])
    if valid is not None:
        hidden = b.op("Or", [hidden, b.op("GreaterOrEqual", [s, reshape(b, valid, (bsz, 1, 1, 1))])])
    scores = b.op("Where", [hidden, b.const(np.array(-np.inf, np.float32)), scores])
    ax = 3
    m = b.op("ReduceMax", [scores], axes=(ax,), keepdims=1)
    zero = b.const(np.array(0.0, np.float32))
    if sink:
        m = b.op("Max", [m, zero])
    e = b.op("Exp", [b.op("Sub", [scores, m])])
    total_e = b.op("ReduceSum", [e], axes=(ax,), keepdims=1)
    if sink:
        total_e = b.op("Add", [total_e, b.op("Exp", [b.op("Sub", [zero, m])])])
    p = b.op("Div", [e, total_e])
    ctx = b.op("MatMul", [p, values])  # [B, KV, G*T, hd]
    ctx = transpose(b, reshape(b, ctx, (bsz, h, t, hd)), (0, 2, 1, 3))
    return reshape(b, ctx, (bsz, t, h * hd)), present_k, present_v


def attention(b: Builder, q: Value, k: Value, v: Value, scale: float) -> Value:
    """Bidirectional multi-head attention, ``softmax(scale * q k^T) v`` with no mask (Vaswani et al. 2017): the
    encoder's self-attention and a decoder's cross-attention.

    Args:
        q: ``[B, H, S, hd]`` queries; k, v: ``[B, H, L, hd]`` keys and values (head-major).
        scale: the scores' factor (``1 / sqrt(hd)``).

    Returns:
        ``[B, S, H * hd]``, the heads joined again.
    """
    bsz, h, s, _ = q.shape
    scores = b.op("Mul", [b.op("MatMul", [q, transpose(b, k, (0, 1, 3, 2))]),
                          b.const(np.array(scale), dtype=q.dtype)])  # [B, H, S, L]
    m = b.op("ReduceMax", [scores], axes=(3,), keepdims=1)
    e = b.op("Exp", [b.op("Sub", [scores, m])])
    p = b.op("Div", [e, b.op("ReduceSum", [e], axes=(3,), keepdims=1)])
    ctx = transpose(b, b.op("MatMul", [p, v]), (0, 2, 1, 3))  # [B, S, H, hd]
    return reshape(b, ctx, (bsz, s, h * v.shape[3]))


def dim_value(b: Builder, d) -> Value:
    """A run-time dim (or int) as an int32 scalar value."""
    if symbolic.is_symbolic(d):
        return b.op("SymConst", [], shape=(), values=(d,), dtype="int32")
    return b.const(np.array(d, np.int32))


def swiglu(b: Builder, x: Value, gate: Value | Packed, up: Value | Packed, down: Value | Packed) -> Value:
    """The Llama MLP: ``down(silu(gate(x)) * up(x))``."""
    g = linear(b, x, gate)
    return linear(b, b.op("Mul", [b.op("Mul", [g, b.op("Sigmoid", [g])]), linear(b, x, up)]), down)
