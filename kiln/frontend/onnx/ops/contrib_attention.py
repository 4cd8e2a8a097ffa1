"""onnxruntime's ``GroupQueryAttention`` (domain ``com.microsoft``), the attention of q4 decoder exports
(onnxruntime-genai's model builder, transformers.js's repos), on the decoder blocks of :mod:`kiln.frontend.decoder`.

Semantics from onnxruntime's ContribOperators.md and its CPU kernel (``GroupQueryAttention``, past and present
in separate buffers): the new keys and values are appended to ``past_key`` / ``past_value`` ([B, KV, P, hd]) to
give ``present_key`` / ``present_value`` ([B, KV, P + S, hd]); batch entry ``b``'s ``S`` new tokens sit at
positions ``seqlens_k[b] + 1 - S ..  seqlens_k[b]`` (``seqlens_k`` = total length - 1), each attending to the
cache rows up to its position (and inside ``local_window_size``); with ``do_rotary`` RoPE (``cos_cache``,
``sin_cache``) is applied to queries and keys at those positions first.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.frontend import decoder
from kiln.frontend.onnx.ops.attention import rotary_embedding
from kiln.frontend.onnx.registry import onnx_op
from kiln.frontend.shapes import reshape
from kiln.ir.graph import Builder, Value

MS = "com.microsoft"


def _split_packed(b: Builder, qkv: Value, heads: int, kv_heads: int) -> tuple[Value, Value, Value]:
    """Queries, keys and values of a packed ``[B, S, (H + 2 KV) * hd]`` input."""
    bsz, s, width = qkv.shape
    hd = width // (heads + 2 * kv_heads)
    bounds = [0, heads * hd, (heads + kv_heads) * hd, width]
    return tuple(b.op("Slice", [qkv], starts=(0, 0, lo), ends=(bsz, s, hi), steps=(1, 1, 1))
                 for lo, hi in itertools.pairwise(bounds))


@onnx_op("GroupQueryAttention", since=1, domain=MS)
def group_query_attention(b: Builder, query: Value, key: Value | None = None, value: Value | None = None,
                          past_key: Value | None = None, past_value: Value | None = None,
                          seqlens_k: Value | None = None, total_sequence_length: Value | None = None,
                          cos_cache: Value | None = None, sin_cache: Value | None = None,
                          position_ids: Value | None = None, attention_bias: Value | None = None,
                          head_sink: Value | None = None, *, num_heads: int, kv_num_heads: int, scale: float = 0.0,
                          do_rotary: int = 0, rotary_interleaved: int = 0, local_window_size: int = -1,
                          softcap: float = 0.0, smooth_softmax: int = 0, qk_output: int = 0,
                          _nout: int = 1) -> list[Value]:
    """com.microsoft GroupQueryAttention-1: outputs ``output [B, S, H * hd]``, ``present_key`` and
    ``present_value [B, KV, P + S, hd]``.

    Raises:
        KilnError: inputs Kiln does not take yet (``attention_bias``, ``head_sink``, the ``output_qk`` output,
            past and present sharing one buffer), missing ``seqlens_k`` or caches for ``do_rotary``.
        ShapeError: inputs that do not fit the head counts.
    """
    if attention_bias is not None or head_sink is not None or qk_output or _nout > 3:
        raise KilnError("GroupQueryAttention: attention_bias, head_sink and the output_qk output are not supported")
    if seqlens_k is None:
        raise KilnError("GroupQueryAttention: needs seqlens_k")
    if key is None:
        query, key, value = _split_packed(b, query, num_heads, kv_num_heads)
    bsz, s, width = query.shape
    if width % num_heads or num_heads % kv_num_heads:
        raise ShapeError(f"GroupQueryAttention: query width {width} and num_heads {num_heads} / kv_num_heads "
                         f"{kv_num_heads} do not fit")
    hd = width // num_heads
    if past_key is None:
        past_key = past_value = b.const(np.zeros((bsz, kv_num_heads, 0, hd), np.float32))
    if past_key.shape[3] != hd or past_key.shape[1] != kv_num_heads:
        raise ShapeError(f"GroupQueryAttention: past_key {list(past_key.shape)} does not fit [B, {kv_num_heads}, P, "
                         f"{hd}]")
    # position of each new token: seqlens_k + 1 - S + t (onnxruntime's rule for the rotary and the mask)
    valid = b.op("Add", [b.op("Cast", [seqlens_k], to="int32"), b.const(np.array(1, np.int32))])  # [B]
    start = b.op("Sub", [valid, decoder.dim_value(b, s)])
    t = b.op("Iota", [], shape=(s,), start=0, delta=1, dtype="int32")
    positions = b.op("Add", [reshape(b, start, (bsz, 1)), reshape(b, t, (1, s))])  # [B, S]
    if position_ids is not None:
        positions = b.op("Cast", [position_ids], to="int32")
    if do_rotary:
        if cos_cache is None or sin_cache is None:
            raise KilnError("GroupQueryAttention: do_rotary needs cos_cache and sin_cache")
        rotary_dim = 2 * cos_cache.shape[1]
        query = rotary_embedding(b, query, cos_cache, sin_cache, positions, interleaved=rotary_interleaved,
                                 num_heads=num_heads, rotary_embedding_dim=rotary_dim)
        key = rotary_embedding(b, key, cos_cache, sin_cache, positions, interleaved=rotary_interleaved,
                               num_heads=kv_num_heads, rotary_embedding_dim=rotary_dim)
    q = reshape(b, query, (bsz, s, num_heads, hd))
    k = reshape(b, key, (bsz, s, kv_num_heads, hd))
    v = reshape(b, value, (bsz, s, kv_num_heads, hd))
    out, present_k, present_v = decoder.causal_attention(
        b, q, k, v, past_key, past_value, scale or 1.0 / math.sqrt(hd), positions=positions, valid=valid,
        window=local_window_size, softcap=softcap, sink=bool(smooth_softmax))
    return [out, present_k, present_v]
