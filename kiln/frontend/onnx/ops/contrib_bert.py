"""onnxruntime's encoder contrib operators (domain ``com.microsoft``), as its transformer optimizer
(``onnxruntime.transformers.optimizer.optimize_model``) writes them into the BERT-style models people publish:
``Gelu``, ``FastGelu``, ``BiasGelu``, ``QuickGelu``, ``BiasAdd``, ``SkipLayerNormalization``,
``EmbedLayerNormalization``, ``FusedMatMul``, ``Attention``, ``MultiHeadAttention``, and ``QAttention`` (what
``onnxruntime.quantization.quantize_dynamic`` makes of Attention), each decomposed into Kiln's primitives.

Semantics from onnxruntime's ContribOperators.md and its CPU kernels (``contrib_ops/cpu/bert``).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.contrib_quant import matmul_integer_to_float
from kiln.frontend.onnx.ops.nn import _matmul as matmul
from kiln.frontend.onnx.ops.norm import layer_norm
from kiln.frontend.onnx.registry import onnx_op
from kiln.frontend.shapes import reshape, transpose
from kiln.ir.graph import Builder, Value

MS = "com.microsoft"


def _scalar(b: Builder, value: float, like: Value) -> Value:
    return b.const(np.array(value), dtype=like.dtype)


@onnx_op("Gelu", since=1, domain=MS)
def ms_gelu(b: Builder, x: Value) -> Value:
    """com.microsoft Gelu-1: ``0.5 x (1 + erf(x / sqrt 2))``."""
    return b.op("Gelu", [x], approximate="none")


@onnx_op("BiasGelu", since=1, domain=MS)
def bias_gelu(b: Builder, a: Value, bias: Value) -> Value:
    """com.microsoft BiasGelu-1: ``Gelu(A + B)`` (erf form), B ``[hidden]``."""
    return b.op("Gelu", [b.op("Add", [a, bias])], approximate="none")


@onnx_op("FastGelu", since=1, domain=MS)
def fast_gelu(b: Builder, x: Value, bias: Value | None = None) -> Value:
    """com.microsoft FastGelu-1: ``0.5 x (1 + tanh(0.797885 x + 0.035677 x^3))`` of ``X (+ bias)``: ONNX Gelu-20's
    tanh approximation (``sqrt(2 / pi) (x + 0.044715 x^3)``)."""
    if bias is not None:
        x = b.op("Add", [x, bias])
    return b.op("Gelu", [x], approximate="tanh")


@onnx_op("QuickGelu", since=1, domain=MS)
def quick_gelu(b: Builder, x: Value, *, alpha: float = 1.702) -> Value:
    """com.microsoft QuickGelu-1: ``x * sigmoid(alpha x)``."""
    return b.op("Mul", [x, b.op("Sigmoid", [b.op("Mul", [x, _scalar(b, alpha, x)])])])


@onnx_op("BiasAdd", since=1, domain=MS)
def bias_add(b: Builder, x: Value, bias: Value, skip: Value) -> Value:
    """com.microsoft BiasAdd-1: ``X + bias + skip`` (X, skip ``[N, S, C]``, bias ``[C]``)."""
    return b.op("Add", [b.op("Add", [x, bias]), skip])


@onnx_op("SkipLayerNormalization", since=1, domain=MS)
def skip_layer_norm(b: Builder, x: Value, skip: Value, gamma: Value, beta: Value | None = None,
                    bias: Value | None = None, *, epsilon: float = 1e-12, _nout: int = 1) -> list[Value]:
    """com.microsoft SkipLayerNormalization-1: LayerNormalization over the last axis of ``s = input + skip (+ bias)``,
    ``(s - mean) / sqrt(var + eps) * gamma (+ beta)``.

    input ``[B, S, hidden]`` (or ``[tokens, hidden]``), skip the same or broadcastable, gamma, beta and bias
    ``[hidden]``. Outputs: output; mean and inv_std_var (``[..., 1]``); input_skip_bias_sum ``s``.
    """
    s = b.op("Add", [x, skip])
    if bias is not None:
        s = b.op("Add", [s, bias])
    y, mean, inv = layer_norm(b, s, gamma, beta, axis=-1, epsilon=epsilon, _nout=3)
    return [y, mean, inv, s][:max(_nout, 1)]


@onnx_op("FusedMatMul", since=1, domain=MS)
def fused_matmul(b: Builder, a: Value, w: Value, *, alpha: float = 1.0, transA: int = 0, transB: int = 0,
                 transBatchA: int = 0, transBatchB: int = 0) -> Value:
    """com.microsoft FusedMatMul-1: ``alpha * op(A) @ op(B)``, ``op`` transposing the last two axes when asked.

    Raises:
        KilnError: ``transBatchA`` or ``transBatchB`` (batch axes moved; not supported yet).
    """
    if transBatchA or transBatchB:
        raise KilnError("FusedMatMul: transBatchA / transBatchB are not supported yet")

    def last_two(t: Value, flag: int) -> Value:
        if not flag:
            return t
        if len(t.shape) < 2:
            raise ShapeError(f"FusedMatMul: a transposed operand needs rank >= 2, got {list(t.shape)}")
        perm = list(range(len(t.shape)))
        perm[-2], perm[-1] = perm[-1], perm[-2]
        return transpose(b, t, perm)

    y = matmul(b, last_two(a, transA), last_two(w, transB))
    return y if alpha == 1.0 else b.op("Mul", [y, _scalar(b, alpha, y)])


def _key_mask(b: Builder, mask: Value, batch, seq, total, dtype: str, fill: float) -> Value:
    """The additive mask of ``mask_index`` (0 where a key is seen, ``fill`` where not), broadcastable to
    ``[B, heads, S, total]``: int32 ``[B]`` key lengths (right padding), ``[2B]`` ends then starts, ``[B, total]`` or
    ``[B, S, total]`` raw masks (a key is seen where the mask is > 0)."""
    zero, filled = b.const(np.array(0.0), dtype=dtype), b.const(np.array(fill), dtype=dtype)
    if mask.dtype != "int32":
        mask = b.op("Cast", [mask], to="int32")
    shape = tuple(mask.shape)
    if len(shape) == 1:
        j = reshape(b, b.const(np.arange(total, dtype=np.int32)) if isinstance(total, int) else
                    b.op("Iota", [], shape=(total,), start=0, delta=1, dtype="int32"), (1, total))
        if shape[0] == batch:
            seen = b.op("Less", [j, reshape(b, mask, (batch, 1))])
        elif shape[0] == 2 * batch:
            end = b.op("Slice", [mask], starts=(0,), ends=(batch,), steps=(1,))
            start = b.op("Slice", [mask], starts=(batch,), ends=(2 * batch,), steps=(1,))
            seen = b.op("And", [b.op("Less", [j, reshape(b, end, (batch, 1))]),
                                b.op("GreaterOrEqual", [j, reshape(b, start, (batch, 1))])])
        else:
            raise ShapeError(f"Attention: mask_index {list(shape)} must be [B] or [2B] (B = {batch})")
        return reshape(b, b.op("Where", [seen, zero, filled]), (batch, 1, 1, total))
    seen = b.op("Greater", [mask, b.const(np.array(0), dtype="int32")])
    if len(shape) == 2 and shape == (batch, total):
        return reshape(b, b.op("Where", [seen, zero, filled]), (batch, 1, 1, total))
    if len(shape) == 3 and shape == (batch, seq, total):
        return reshape(b, b.op("Where", [seen, zero, filled]), (batch, 1, seq, total))
    raise ShapeError(f"Attention: mask_index {list(shape)} must be [B], [2B], [B, {total}] or [B, S, {total}] "
                     "(4-D masks are not supported yet)")


def _attend(b: Builder, q: Value, k: Value, v: Value, *, scale: float, mask: Value | None, fill: float, causal: bool,
            attention_bias: Value | None) -> Value:
    """``softmax(scale * q k^T + masks) v`` for heads ``[B, N, S, H]`` (keys and values ``[B, N, L, H]``), the heads
    joined again: ``[B, S, N * Hv]``. The masks add ``fill`` where ``mask`` (:func:`_key_mask`) hides a key and, with
    ``causal``, where a key comes after its query (``j > i + L - S``), plus ``attention_bias`` as given."""
    batch, heads, seq, head = q.shape
    total = k.shape[2]
    s = b.const(np.array(scale or 1.0 / math.sqrt(head)), dtype=q.dtype)
    scores = b.op("Mul", [b.op("MatMul", [q, transpose(b, k, (0, 1, 3, 2))]), s])  # [B, N, S, L]
    if mask is not None:
        scores = b.op("Add", [scores, _key_mask(b, mask, batch, seq, total, q.dtype, fill)])
    if attention_bias is not None:
        scores = b.op("Add", [scores, attention_bias])
    if causal:  # onnxruntime's PrepareMask: a later key's score is the lowest float, whatever the other masks say
        if not (isinstance(seq, int) and isinstance(total, int)):
            raise KilnError("Attention: unidirectional needs static sequence lengths")
        later = np.arange(total)[None, :] > np.arange(seq)[:, None] + (total - seq)
        lowest = b.const(np.array(np.finfo(np.float32).min), dtype=q.dtype)
        scores = b.op("Where", [b.const(later), lowest, scores])
    m = b.op("ReduceMax", [scores], axes=(3,), keepdims=1)
    e = b.op("Exp", [b.op("Sub", [scores, m])])
    p = b.op("Div", [e, b.op("ReduceSum", [e], axes=(3,), keepdims=1)])
    ctx = transpose(b, b.op("MatMul", [p, v]), (0, 2, 1, 3))
    return reshape(b, ctx, (batch, seq, heads * v.shape[3]))


@onnx_op("Attention", since=1, domain=MS)
def ms_attention(b: Builder, x: Value, weights: Value, bias: Value | None = None, mask_index: Value | None = None,
                 past: Value | None = None, attention_bias: Value | None = None,
                 past_sequence_length: Value | None = None, *, num_heads: int, qkv_hidden_sizes=None,
                 unidirectional: int = 0, scale: float = 0.0, mask_filter_value: float = -10000.0,
                 do_rotary: int = 0, past_present_share_buffer: int = 0, rotary_embedding_dim: int = 0,
                 _nout: int = 1) -> list[Value]:
    """com.microsoft Attention-1: multi-head self-attention with the Q/K/V projections packed in one weight.

    ``input [B, S, D] @ weights [D, Dq + Dk + Dv] (+ bias)`` gives Q, K and V (``qkv_hidden_sizes``, default three
    equal parts), each split into ``num_heads`` heads; ``scores = scale * Q K^T`` (``scale`` 0: ``1 / sqrt(head
    size)``) plus ``mask_filter_value`` where ``mask_index`` hides a key (:func:`_key_mask`) and, with
    ``unidirectional``, where a key comes after the query, plus ``attention_bias`` ``[B or 1, heads or 1, S, S]``;
    softmax over the keys, times V, the heads joined again: output ``[B, S, Dv]``. The second output, present, is
    ``[2, B, heads, S, head size]`` (keys, values).

    Raises:
        KilnError: a ``past`` cache, ``do_rotary`` or a shared past/present buffer (not supported yet);
        ShapeError: weights or masks that do not fit.
    """
    if past is not None or past_sequence_length is not None or past_present_share_buffer:
        raise KilnError("Attention (com.microsoft): a past key/value cache is not supported yet")
    if do_rotary:
        raise KilnError("Attention (com.microsoft): do_rotary is not supported yet")
    sizes = _qkv_sizes(x, weights, num_heads, qkv_hidden_sizes)
    qkv = b.op("MatMul", [x, weights])
    if bias is not None:
        qkv = b.op("Add", [qkv, bias])
    return _packed_attention(b, qkv, sizes, num_heads, scale=scale, mask=mask_index, fill=mask_filter_value,
                             causal=bool(unidirectional), attention_bias=attention_bias, nout=_nout)


def _qkv_sizes(x: Value, weights: Value, heads: int, qkv_hidden_sizes) -> list[int]:
    """The query, key and value widths of a packed projection ``x [B, S, D] @ weights [D, Dq + Dk + Dv]``.

    Raises:
        ShapeError: shapes or sizes that do not fit.
    """
    if len(x.shape) != 3 or len(weights.shape) != 2 or weights.shape[0] != x.shape[2]:
        raise ShapeError(f"Attention: input {list(x.shape)} and weights {list(weights.shape)} must be [B, S, D] and "
                         "[D, Dq + Dk + Dv]")
    sizes = [int(v) for v in qkv_hidden_sizes] if qkv_hidden_sizes else [weights.shape[1] // 3] * 3
    if sum(sizes) != weights.shape[1] or sizes[0] != sizes[1] or any(v % heads for v in sizes):
        raise ShapeError(f"Attention: qkv sizes {sizes} do not fit weights {list(weights.shape)} and num_heads {heads}")
    return sizes


def _packed_attention(b: Builder, qkv: Value, sizes: list[int], heads: int, *, scale: float, mask: Value | None,
                      fill: float, causal: bool, attention_bias: Value | None, nout: int) -> list[Value]:
    """Attention's and QAttention's shared part: the packed projection ``qkv [B, S, Dq + Dk + Dv]`` split into heads,
    :func:`_attend`, and the present output ``[2, B, N, S, H]`` when asked for."""
    batch, seq, _ = qkv.shape
    parts = []
    for lo, hi in itertools.pairwise(np.cumsum([0, *sizes])):
        part = b.op("Slice", [qkv], starts=(0, 0, int(lo)), ends=(batch, seq, int(hi)), steps=(1, 1, 1))
        parts.append(transpose(b, reshape(b, part, (batch, seq, heads, int(hi - lo) // heads)), (0, 2, 1, 3)))
    q, k, v = parts
    out = _attend(b, q, k, v, scale=scale, mask=mask, fill=fill, causal=causal, attention_bias=attention_bias)
    if nout <= 1:
        return [out]
    if sizes[1] != sizes[2]:
        raise KilnError("Attention: present needs keys and values of one size")
    return [out, b.op("Concat", [reshape(b, k, (1, *k.shape)), reshape(b, v, (1, *v.shape))], axis=0)]


@onnx_op("QAttention", since=1, domain=MS)
def q_attention(b: Builder, x: Value, weights: Value, bias: Value, input_scale: Value, weight_scale: Value,
                mask_index: Value | None = None, input_zero_point: Value | None = None,
                weight_zero_point: Value | None = None, past: Value | None = None, *, num_heads: int,
                unidirectional: int = 0, do_rotary: int = 0, past_present_share_buffer: int = 0,
                mask_filter_value: float = -10000.0, scale: float = 0.0, _nout: int = 1) -> list[Value]:
    """com.microsoft QAttention-1, what ``onnxruntime.quantization.quantize_dynamic`` makes of Attention: the packed
    projection from 8-bit input and weights, ``float32((input - izp) @ (weights - wzp)) * (input_scale *
    weight_scale) + bias`` (exact in int32; weights' scale and zero point per tensor or per column), then as
    :func:`ms_attention`.

    Raises:
        KilnError: a past cache or do_rotary (not supported yet); ShapeError: shapes that do not fit.
    """
    if past is not None or past_present_share_buffer or do_rotary:
        raise KilnError("QAttention: a past key/value cache and do_rotary are not supported yet")
    sizes = _qkv_sizes(x, weights, num_heads, None)
    qkv = matmul_integer_to_float(b, x, weights, input_scale, weight_scale, input_zero_point, weight_zero_point, bias)
    return _packed_attention(b, qkv, sizes, num_heads, scale=scale, mask=mask_index, fill=mask_filter_value,
                             causal=bool(unidirectional), attention_bias=None, nout=_nout)


def _heads(b: Builder, x: Value, heads: int, what: str) -> Value:
    """``[B, S, N * H]`` as heads ``[B, N, S, H]`` (rank 4 taken as already split)."""
    if len(x.shape) == 4:
        return x
    if len(x.shape) != 3 or x.shape[2] % heads:
        raise ShapeError(f"MultiHeadAttention: {what} {list(x.shape)} must be [B, S, D] with D a multiple of "
                         f"num_heads {heads}, or [B, N, S, H]")
    bsz, s, d = x.shape
    return transpose(b, reshape(b, x, (bsz, s, heads, d // heads)), (0, 2, 1, 3))


@onnx_op("MultiHeadAttention", since=1, domain=MS)
def multi_head_attention(b: Builder, query: Value, key: Value | None = None, value: Value | None = None,
                         bias: Value | None = None, key_padding_mask: Value | None = None,
                         attention_bias: Value | None = None, past_key: Value | None = None,
                         past_value: Value | None = None, past_sequence_length: Value | None = None,
                         cache_indirection: Value | None = None, *, num_heads: int, mask_filter_value: float = -10000.0,
                         scale: float = 0.0, unidirectional: int = 0, _nout: int = 1) -> list[Value]:
    """com.microsoft MultiHeadAttention-1: attention of query ``[B, S, Dq]`` over key ``[B, L, Dk]`` and value ``[B, L,
    Dv]`` (or keys and values already split into heads, ``[B, N, L, H]``), each ``+ bias`` (``[Dq + Dk + Dv]``)
    when given, with key_padding_mask (``[B]`` key lengths or ``[B, L]`` raw, as :func:`_key_mask`),
    attention_bias ``[B or 1, N or 1, S, L]`` and ``unidirectional``; outputs ``[B, S, Dv]`` and present key and
    value ``[B, N, L, H]``.

    Raises:
        KilnError: packed query/key/value, a past cache or beam-search cache indirection, unidirectional cross
            attention (not supported yet);
        ShapeError: inputs that do not fit.
    """
    if key is None or value is None or len(query.shape) != 3:
        raise KilnError("MultiHeadAttention: packed query/key/value inputs are not supported yet")
    if past_key is not None or past_value is not None or past_sequence_length is not None or \
            cache_indirection is not None:
        raise KilnError("MultiHeadAttention: a past key/value cache is not supported yet")
    if bias is not None:
        if len(key.shape) != 3 or len(value.shape) != 3:
            raise ShapeError("MultiHeadAttention: a bias needs key and value of rank 3")
        dq, dk, dv = query.shape[2], key.shape[2], value.shape[2]
        if tuple(bias.shape) != (dq + dk + dv,):
            raise ShapeError(f"MultiHeadAttention: bias {list(bias.shape)} must be [{dq + dk + dv}]")
        parts = [b.op("Slice", [bias], starts=(lo,), ends=(hi,), steps=(1,))
                 for lo, hi in ((0, dq), (dq, dq + dk), (dq + dk, dq + dk + dv))]
        query, key, value = (b.op("Add", [t, p]) for t, p in zip((query, key, value), parts))
    q, k, v = (_heads(b, t, num_heads, w) for t, w in ((query, "query"), (key, "key"), (value, "value")))
    if unidirectional and q.shape[2] != k.shape[2]:
        raise KilnError("MultiHeadAttention: unidirectional with queries and keys of different lengths is not "
                        "supported (onnxruntime's CPU kernel masks them unaligned)")
    out = _attend(b, q, k, v, scale=scale, mask=key_padding_mask, fill=mask_filter_value,
                  causal=bool(unidirectional), attention_bias=attention_bias)
    return [out, k, v][:max(_nout, 1)]


@onnx_op("EmbedLayerNormalization", since=1, domain=MS)
def embed_layer_norm(b: Builder, input_ids: Value, segment_ids: Value | None, word_embedding: Value,
                     position_embedding: Value, segment_embedding: Value | None = None, gamma: Value | None = None,
                     beta: Value | None = None, mask: Value | None = None, position_ids: Value | None = None, *,
                     epsilon: float = 1e-12, mask_index_type: int = 1, _nout: int = 1) -> list[Value]:
    """com.microsoft EmbedLayerNormalization-1: BERT's embeddings, ``LayerNorm(word[input_ids] + position[position_ids]
    (+ segment[segment_ids]))`` over the hidden axis (positions ``0 .. S - 1`` without position_ids).

    Outputs: output ``[B, S, H]``; mask_index int32 ``[B]``, the count of ones in each row of ``mask`` (the key lengths
    com.microsoft Attention takes; zeros without a mask); embedding_sum, the sum before the normalisation.

    Raises:
        ShapeError: missing gamma or beta, or a segment embedding without segment ids.
    """
    if gamma is None or beta is None:
        raise ShapeError("EmbedLayerNormalization: gamma and beta are required")
    if (segment_ids is None) != (segment_embedding is None):
        raise ShapeError("EmbedLayerNormalization: segment_ids and segment_embedding go together")
    batch, seq = input_ids.shape
    x = b.op("Gather", [word_embedding, input_ids], axis=0)
    if position_ids is None:
        positions = b.const(np.arange(seq, dtype=np.int32).reshape(1, seq)) if isinstance(seq, int) else \
            reshape(b, b.op("Iota", [], shape=(seq,), start=0, delta=1, dtype="int32"), (1, seq))
    else:
        positions = position_ids
    x = b.op("Add", [x, b.op("Gather", [position_embedding, positions], axis=0)])
    if segment_ids is not None:
        x = b.op("Add", [x, b.op("Gather", [segment_embedding, segment_ids], axis=0)])
    y = layer_norm(b, x, gamma, beta, axis=-1, epsilon=epsilon)[0]
    if _nout <= 1:
        return [y]
    if mask is not None:  # onnxruntime counts the entries equal to 1
        ones = b.op("Equal", [mask, b.const(np.array(1), dtype=mask.dtype)])
        mask_index = b.op("ReduceSum", [b.op("Cast", [ones], to="int32")], axes=(1,), keepdims=0)
    else:
        mask_index = b.const(np.zeros(batch, np.int32)) if isinstance(batch, int) else \
            b.op("Mul", [b.op("ReduceSum", [input_ids], axes=(1,), keepdims=0), b.const(np.array(0, np.int32))])
    return [y, mask_index, x][:_nout]
