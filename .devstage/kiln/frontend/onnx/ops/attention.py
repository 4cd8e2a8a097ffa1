"""ONNX Attention-23/24 decomposed into MatMul, masks and a guarded softmax (semantics of onnx's reference).

``Y = softmax(softcap(Q K^T * scale) + bias) V`` with the key/value cache concatenated, grouped-query
heads repeated, and ``bias`` the sum of the attention mask (bool: 0 / -inf; float: as given) and
the causal, sliding-window and padding masks, which depend only on shapes (and on the constant
``nonpad_kv_seqlen``) and are folded to constants. A query row whose bias is all -inf gives 0.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.common import const_value
from kiln.frontend.onnx.ops.nn import _reshape, transpose
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value


def _to_4d(b: Builder, x: Value, heads: int | None, what: str) -> Value:
    if len(x.shape) == 4:
        return x
    if len(x.shape) != 3 or not heads or x.shape[2] % heads:
        raise ShapeError(f"Attention: {what} {list(x.shape)} needs rank 4, or rank 3 with a dividing num_heads")
    n, s, hidden = x.shape
    return transpose(b, _reshape(b, x, (n, s, heads, hidden // heads)), (0, 2, 1, 3))


def _const_bias(q_len: int, kv_len: int, batch: int, causal: bool, offset, left: int, right: int,
                nonpad) -> np.ndarray | None:
    """Causal, sliding-window and padding masks (0 / -inf) as one array broadcastable to [B, H, q, kv]."""
    if not causal and left < 0 and right < 0 and nonpad is None:
        return None
    i = np.arange(q_len).reshape(-1, 1)
    j = np.arange(kv_len).reshape(1, -1)
    off = np.asarray(offset).reshape(-1, 1, 1, 1) if np.ndim(offset) else offset
    allowed = np.ones((1, 1, q_len, kv_len), bool)
    if causal:
        allowed = allowed & (j <= i + off)
    diff = (i + off) - j
    if left >= 0:
        allowed = allowed & (diff <= left)
    if right >= 0:
        allowed = allowed & (-diff <= right)
    if nonpad is not None:
        allowed = allowed & (np.arange(kv_len) < nonpad.reshape(-1, 1)).reshape(batch, 1, 1, kv_len)
    return np.where(allowed, 0.0, -np.inf).astype(np.float32)


def _safe_softmax(b: Builder, x: Value, masked_rows: Value | None) -> Value:
    """Softmax over the last axis that gives 0 (not NaN) for rows that are all -inf."""
    ax = len(x.shape) - 1
    m = b.op("ReduceMax", [x], axes=(ax,), keepdims=1)
    if masked_rows is None:
        e = b.op("Exp", [b.op("Sub", [x, m])])
        return b.op("Div", [e, b.op("ReduceSum", [e], axes=(ax,), keepdims=1)])
    zero = b.const(np.array(0.0), dtype=x.dtype)
    m = b.op("Where", [b.op("IsInf", [m], detect_negative=1, detect_positive=0), zero, m])
    e = b.op("Exp", [b.op("Sub", [x, m])])
    s = b.op("ReduceSum", [e], axes=(ax,), keepdims=1)
    s = b.op("Where", [b.op("Equal", [s, zero]), b.const(np.array(1.0), dtype=x.dtype), s])
    return b.op("Where", [masked_rows, zero, b.op("Div", [e, s])])


@onnx_op("Attention", since=23)
def attention(b: Builder, q: Value, k: Value, v: Value, attn_mask: Value | None = None,
              past_key: Value | None = None, past_value: Value | None = None, nonpad_kv_seqlen: Value | None = None,
              *, is_causal: int = 0, kv_num_heads: int | None = None, q_num_heads: int | None = None,
              qk_matmul_output_mode: int = 0, scale: float | None = None, softcap: float = 0.0,
              softmax_precision: int | None = None, left_window_size: int = -1, right_window_size: int = -1,
              _nout: int = 1) -> list[Value]:
    """ONNX Attention-23/24/25: outputs Y, present_key, present_value and (by ``qk_matmul_output_mode``) the
    scores after matmul and softcap (0, 1), after adding the bias (2), or after the softmax (3).

    Raises:
        KilnError: ``past_key`` without ``past_value``; ShapeError: inputs that do not fit.
    """
    if (past_key is None) != (past_value is None):
        raise KilnError("Attention: past_key and past_value must be given together")
    rank3 = len(q.shape) == 3
    q4, k4, v4 = _to_4d(b, q, q_num_heads, "Q"), _to_4d(b, k, kv_num_heads, "K"), _to_4d(b, v, kv_num_heads, "V")
    if past_key is not None:
        k4 = b.op("Concat", [past_key, k4], axis=2)
        v4 = b.op("Concat", [past_value, v4], axis=2)
    present_k, present_v = k4, v4
    batch, hq, q_len, head = q4.shape
    hkv, kv_len = k4.shape[1], k4.shape[2]
    # masks: the user's attention mask (bool or additive), plus the shape-only ones as a constant
    nonpad = None if nonpad_kv_seqlen is None else const_value(nonpad_kv_seqlen, "nonpad_kv_seqlen")
    offset = (nonpad.reshape(-1) - q_len) if (nonpad is not None and past_key is None) else (
        past_key.shape[2] if past_key is not None else 0)
    const_bias = _const_bias(q_len, kv_len, batch, bool(is_causal), offset, left_window_size, right_window_size,
                             nonpad)
    bias = None
    if attn_mask is not None:
        pad = kv_len - attn_mask.shape[-1]
        if pad > 0:
            rank = len(attn_mask.shape)
            pads = [0] * (2 * rank)
            pads[2 * rank - 1] = pad
            fill = False if attn_mask.dtype == "bool" else -math.inf
            attn_mask = b.op("Pad", [attn_mask], pads=tuple(pads), mode="constant", value=fill)
        if attn_mask.dtype == "bool":
            attn_mask = b.op("Where", [attn_mask, b.const(np.array(0.0), dtype=q.dtype),
                                       b.const(np.array(-np.inf), dtype=q.dtype)])
        bias = attn_mask
    if const_bias is not None:
        cb = b.const(const_bias, dtype=q.dtype)
        bias = cb if bias is None else b.op("Add", [bias, cb])
    # grouped-query attention: repeat each key/value head (h0, h0, h1, h1, ...)
    if hq != hkv:
        if hq % hkv:
            raise ShapeError(f"Attention: {hq} query heads are not a multiple of {hkv} key/value heads")
        r = hq // hkv

        def repeat(t: Value) -> Value:
            t5 = _reshape(b, t, (batch, hkv, 1, kv_len, t.shape[3]))
            t5 = b.op("Expand", [t5], shape=(batch, hkv, r, kv_len, t.shape[3]))
            return _reshape(b, t5, (batch, hq, kv_len, t.shape[3]))

        k4, v4 = repeat(k4), repeat(v4)
    s = np.float32(math.sqrt(scale if scale is not None else 1 / math.sqrt(head)))
    sc = b.const(np.array(s), dtype=q.dtype)
    qk = b.op("MatMul", [b.op("Mul", [q4, sc]), transpose(b, b.op("Mul", [k4, sc]), (0, 1, 3, 2))])
    if softcap and softcap > 0:
        cap = b.const(np.array(softcap), dtype=q.dtype)
        qk = b.op("Mul", [b.op("Tanh", [b.op("Div", [qk, cap])]), cap])
    scores = qk if bias is None else b.op("Add", [qk, bias])
    masked_rows = None
    if bias is not None:
        masked_rows = b.op("IsInf", [b.op("ReduceMax", [bias], axes=(len(bias.shape) - 1,), keepdims=1)],
                           detect_negative=1, detect_positive=0)
    p = _safe_softmax(b, scores, masked_rows)
    y = b.op("MatMul", [p, v4])
    if rank3:
        y = _reshape(b, transpose(b, y, (0, 2, 1, 3)), (batch, q_len, hq * v4.shape[3]))
    qk_out = {2: scores, 3: p}.get(qk_matmul_output_mode, qk)
    return [y, present_k, present_v, qk_out][:max(_nout, 1)]


@onnx_op("RotaryEmbedding", since=23)
def rotary_embedding(b: Builder, x: Value, cos_cache: Value, sin_cache: Value, position_ids: Value | None = None,
                     *, interleaved: int = 0, num_heads: int = 0, rotary_embedding_dim: int = 0) -> Value:
    """ONNX RotaryEmbedding-23: rotate the first ``rotary_embedding_dim`` features of each head by the cached
    angles (gathered by ``position_ids`` when given); halves, or even/odd pairs when ``interleaved``.

    ``x`` is [B, H, S, D] or [B, S, H*D] (with ``num_heads``).
    """
    shape = x.shape
    if len(shape) == 4:
        xs = transpose(b, x, (0, 2, 1, 3))  # [B, S, H, D]
    elif num_heads:
        xs = _reshape(b, x, (shape[0], shape[1], num_heads, shape[2] // num_heads))
    else:
        raise ShapeError(f"RotaryEmbedding: input {list(shape)} needs rank 4, or rank 3 with num_heads")
    n, s, h, d = xs.shape
    rd = rotary_embedding_dim or d
    half = rd // 2
    cos, sin = cos_cache, sin_cache
    if position_ids is not None:
        cos = b.op("Gather", [cos, position_ids], axis=0)
        sin = b.op("Gather", [sin, position_ids], axis=0)
    cos = _reshape(b, cos, (*cos.shape[:-1], 1, half))  # [B or 1.., S, 1, half]
    sin = _reshape(b, sin, (*sin.shape[:-1], 1, half))

    def part(start: int, step: int, count: int, axis_len: int) -> Value:
        ends = [n, s, h, start + step * (count - 1) + 1]
        return b.op("Slice", [xs], starts=(0, 0, 0, start), ends=tuple(ends), steps=(1, 1, 1, step))

    if interleaved:
        x1, x2 = part(0, 2, half, rd), part(1, 2, half, rd)
    else:
        x1, x2 = part(0, 1, half, rd), part(half, 1, half, rd)
    real = b.op("Sub", [b.op("Mul", [cos, x1]), b.op("Mul", [sin, x2])])
    imag = b.op("Add", [b.op("Mul", [sin, x1]), b.op("Mul", [cos, x2])])
    if interleaved:
        rot = _reshape(b, b.op("Concat", [_reshape(b, real, (n, s, h, half, 1)), _reshape(b, imag, (n, s, h, half, 1))],
                                axis=4), (n, s, h, rd))
    else:
        rot = b.op("Concat", [real, imag], axis=3)
    if rd < d:
        rest = b.op("Slice", [xs], starts=(0, 0, 0, rd), ends=(n, s, h, d), steps=(1, 1, 1, 1))
        rot = b.op("Concat", [rot, rest], axis=3)
    if len(shape) == 4:
        return transpose(b, rot, (0, 2, 1, 3))
    return _reshape(b, rot, shape)


@onnx_op("LinearAttention", since=27)
def linear_attention(b: Builder, q: Value, k: Value, v: Value, past_state: Value | None = None,
                     decay: Value | None = None, beta: Value | None = None, *, chunk_size: int = 0,
                     kv_num_heads: int, q_num_heads: int, scale: float = 0.0, update_rule: str = "gated_delta",
                     _nout: int = 1) -> list[Value]:
    """ONNX LinearAttention-27, unrolled over the (static) sequence: a [d_k, d_v] state per key/value head is
    decayed (gated rules), delta-corrected (delta rules), updated with ``k v^T`` and read with ``q``.

    Inputs are [B, T, H*D]; outputs Y [B, T, Hq*d_v] and the final state [B, Hkv, d_k, d_v].

    Raises:
        KilnError: an unknown ``update_rule`` or a decay/beta input that does not match it.
    """
    if update_rule not in ("linear", "gated", "delta", "gated_delta"):
        raise KilnError(f"LinearAttention: unknown update_rule {update_rule!r}")
    gating, delta = update_rule in ("gated", "gated_delta"), update_rule in ("delta", "gated_delta")
    if gating != (decay is not None) or delta != (beta is not None):
        raise KilnError(f"LinearAttention: update_rule {update_rule!r} does not fit the decay/beta inputs given")
    out_dtype = q.dtype
    state_dtype = past_state.dtype if past_state is not None else out_dtype
    if out_dtype != "float32":  # computed in float32 and rounded once at the end, as onnx's reference does
        q, k, v, past_state, decay, beta = (None if x is None else b.op("Cast", [x], to="float32")
                                            for x in (q, k, v, past_state, decay, beta))
    q4, k4, v4 = _to_4d(b, q, q_num_heads, "query"), _to_4d(b, k, kv_num_heads, "key"), \
        _to_4d(b, v, kv_num_heads, "value")
    batch, hq, steps, dk = q4.shape
    hkv, dv = k4.shape[1], v4.shape[3]
    group = hq // hkv
    state = past_state if past_state is not None else b.const(np.zeros((batch, hkv, dk, dv)), dtype=q.dtype)
    if gating:
        last = decay.shape[-1]
        decay4 = transpose(b, _reshape(b, decay, (batch, steps, hkv, last // hkv)), (0, 2, 1, 3))
    if delta:
        beta4 = transpose(b, _reshape(b, beta, (batch, steps, beta.shape[-1], 1)), (0, 2, 1, 3))
    sc = b.const(np.array(scale if scale else 1 / math.sqrt(dk)), dtype=q.dtype)

    def step(t4: Value, t: int) -> Value:  # t4[:, :, t:t+1, :]
        n, h, _, d = t4.shape
        return b.op("Slice", [t4], starts=(0, 0, t, 0), ends=(n, h, t + 1, d), steps=(1, 1, 1, 1))

    outs = []
    for t in range(steps):
        kt, vt = step(k4, t), step(v4, t)  # [B, Hkv, 1, d]
        if gating:
            g = _reshape(b, step(decay4, t), (batch, hkv, decay4.shape[3], 1))
            state = b.op("Mul", [state, b.op("Exp", [g])])
        if delta:
            retrieved = b.op("MatMul", [kt, state])  # [B, Hkv, 1, dv]
            vt = b.op("Mul", [step(beta4, t), b.op("Sub", [vt, retrieved])])
        state = b.op("Add", [state, b.op("Mul", [_reshape(b, kt, (batch, hkv, dk, 1)), vt])])
        read = state
        if group > 1:
            read = _reshape(b, b.op("Expand", [_reshape(b, state, (batch, hkv, 1, dk, dv))],
                                    shape=(batch, hkv, group, dk, dv)), (batch, hq, dk, dv))
        outs.append(b.op("Mul", [b.op("MatMul", [step(q4, t), read]), sc]))  # [B, Hq, 1, dv]
    y = outs[0] if steps == 1 else b.op("Concat", outs, axis=2)
    y = _reshape(b, transpose(b, y, (0, 2, 1, 3)), (batch, steps, hq * dv))
    if out_dtype != "float32":
        y, state = b.op("Cast", [y], to=out_dtype), b.op("Cast", [state], to=state_dtype)
    return [y, state][:max(_nout, 1)]
