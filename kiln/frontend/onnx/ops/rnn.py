"""Recurrent ONNX operators, unrolled over their (static) sequence length: RNN, GRU, LSTM.

The input projection of every time step is one MatMul; each step then adds the recurrent
MatMul and applies the gate activations, so a sequence of length T becomes about T small
kernels per gate group. Per-batch ``sequence_lens`` shorter than the sequence are not supported.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.common import const_value
from kiln.frontend.onnx.ops.nn import _reshape, transpose
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value

#: activation name -> number of (alpha, beta) parameters it consumes, in ONNX's order
_ACT_PARAMS = {"Relu": 0, "Tanh": 0, "Sigmoid": 0, "Softsign": 0, "Softplus": 0, "LeakyRelu": 1,
               "ThresholdedRelu": 1, "Elu": 1, "HardSigmoid": 2, "ScaledTanh": 2, "Affine": 2}
_ACT_DEFAULTS = {"LeakyRelu": (0.01,), "ThresholdedRelu": (1.0,), "Elu": (1.0,), "HardSigmoid": (0.2, 0.5),
                 "ScaledTanh": (1.0, 1.0), "Affine": (1.0, 0.0)}


def _scalar(b: Builder, v: float) -> Value:
    return b.const(np.array(v, np.float32))


def _activation(b: Builder, name: str, params: tuple[float, ...]):
    def apply(x: Value) -> Value:
        if name in ("Relu", "Tanh", "Sigmoid", "Softsign", "Softplus"):
            return b.op(name, [x])
        if name == "LeakyRelu":
            return b.op("LeakyRelu", [x], alpha=float(params[0]))
        if name == "ThresholdedRelu":
            return b.op("ThresholdedRelu", [x], alpha=float(params[0]))
        if name == "Elu":
            return b.op("Elu", [x], alpha=float(params[0]))
        if name == "HardSigmoid":
            return b.op("HardSigmoid", [x], alpha=float(params[0]), beta=float(params[1]))
        if name == "ScaledTanh":
            return b.op("Mul", [b.op("Tanh", [b.op("Mul", [x, _scalar(b, params[1])])]), _scalar(b, params[0])])
        return b.op("Add", [b.op("Mul", [x, _scalar(b, params[0])]), _scalar(b, params[1])])  # Affine
    return apply


def _activations(b: Builder, names, alphas, betas, per_dir: int, dirs: int, defaults: list[str]):
    names = list(names) if names else defaults * dirs
    if len(names) != per_dir * dirs:
        raise KilnError(f"expected {per_dir * dirs} activations, got {names}")
    alphas, betas = list(alphas or []), list(betas or [])
    out = []
    for n in names:
        if n not in _ACT_PARAMS:
            raise KilnError(f"unsupported activation {n!r}")
        k = _ACT_PARAMS[n]
        params = list(_ACT_DEFAULTS.get(n, ()))
        if k >= 1 and alphas:
            params[0] = alphas.pop(0)
        if k >= 2 and betas:
            params[1] = betas.pop(0)
        out.append(_activation(b, n, tuple(params)))
    return [out[d * per_dir:(d + 1) * per_dir] for d in range(dirs)]


def _slice_last(b: Builder, x: Value, k: int, size: int) -> Value:
    rank = len(x.shape)
    return b.op("Slice", [x], starts=(0,) * (rank - 1) + (k * size,),
                ends=tuple(x.shape[:-1]) + ((k + 1) * size,), steps=(1,) * rank)


def _pick(b: Builder, x: Value, index: int, axis: int = 0) -> Value:
    """``x[index]`` along ``axis``, that axis removed."""
    starts = [0] * len(x.shape)
    ends = list(x.shape)
    starts[axis], ends[axis] = index, index + 1
    s = b.op("Slice", [x], starts=tuple(starts), ends=tuple(ends), steps=(1,) * len(x.shape))
    return _reshape(b, s, tuple(d for i, d in enumerate(x.shape) if i != axis))


def _peephole(b: Builder, g: Value, cell: Value, p: Value | None, k: int, hidden: int) -> Value:
    """LSTM gate pre-activation ``g`` plus the peephole term ``P[k] * cell`` (when there are peepholes)."""
    return g if p is None else b.op("Add", [g, b.op("Mul", [cell, _slice_last(b, p, k, hidden)])])


def _recurrence(b: Builder, kind: str, x: Value, w: Value, r: Value, bias: Value | None, seq_lens: Value | None,
                h0: Value | None, c0: Value | None, p: Value | None, attrs: dict) -> list[Value]:
    layout = int(attrs.get("layout", 0))
    if layout:
        x = transpose(b, x, (1, 0, 2))
        h0 = transpose(b, h0, (1, 0, 2)) if h0 is not None else None
        c0 = transpose(b, c0, (1, 0, 2)) if c0 is not None else None
    seq, batch, _ = x.shape
    direction = attrs.get("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    hidden = int(attrs["hidden_size"]) if attrs.get("hidden_size") else r.shape[-1]
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    if seq_lens is not None and np.any(const_value(seq_lens, "sequence_lens") != seq):
        raise KilnError(f"{kind}: sequence_lens shorter than the sequence are not supported")
    defaults = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind]
    acts = _activations(b, attrs.get("activations"), attrs.get("activation_alpha"), attrs.get("activation_beta"),
                        len(defaults), dirs, defaults)
    clip = attrs.get("clip")
    lbr = int(attrs.get("linear_before_reset", 0))
    ys, hs, cs = [], [], []
    for d in range(dirs):
        wd, rd = _pick(b, w, d), _pick(b, r, d)  # [G*H, in], [G*H, H]
        xw = b.op("MatMul", [x, transpose(b, wd, (1, 0))])  # [seq, batch, G*H]
        if bias is not None:
            bd = _pick(b, bias, d)
            wb, rb = _slice_last(b, bd, 0, gates * hidden), _slice_last(b, bd, 1, gates * hidden)
            xw = b.op("Add", [xw, wb])
        else:
            rb = None
        rt = transpose(b, rd, (1, 0))  # [H, G*H]
        h = _pick(b, h0, d) if h0 is not None else b.const(np.zeros((batch, hidden), np.float32))
        c = _pick(b, c0, d) if c0 is not None else b.const(np.zeros((batch, hidden), np.float32))
        pd = _pick(b, p, d) if p is not None else None
        f = acts[d]
        steps = range(seq) if (direction == "forward" or (direction == "bidirectional" and d == 0)) \
            else range(seq - 1, -1, -1)
        outs: dict[int, Value] = {}
        for t in steps:
            xt = _pick(b, xw, t)  # [batch, G*H]

            def gate(k: int, pre: Value) -> Value:
                g = _slice_last(b, pre, k, hidden)
                if clip is not None:
                    g = b.op("Clip", [g], min=-float(clip), max=float(clip))
                return g

            if kind == "GRU":
                hr = b.op("MatMul", [h, rt])
                if rb is not None:
                    hr = b.op("Add", [hr, rb])
                z = f[0](gate(0, b.op("Add", [_slice_last(b, xt, 0, 2 * hidden), _slice_last(b, hr, 0, 2 * hidden)])))
                rr = f[0](gate(1, b.op("Add", [_slice_last(b, xt, 0, 2 * hidden), _slice_last(b, hr, 0, 2 * hidden)])))
                if lbr:
                    pre = b.op("Add", [_slice_last(b, xt, 2, hidden), b.op("Mul", [rr, _slice_last(b, hr, 2, hidden)])])
                else:
                    rh = b.op("MatMul", [b.op("Mul", [rr, h]), _slice_last(b, rt, 2, hidden)])
                    if rb is not None:
                        rh = b.op("Add", [rh, _slice_last(b, rb, 2, hidden)])
                    pre = b.op("Add", [_slice_last(b, xt, 2, hidden), rh])
                hh = f[1](gate(0, pre))
                one_minus_z = b.op("Sub", [_scalar(b, 1.0), z])
                h = b.op("Add", [b.op("Mul", [one_minus_z, hh]), b.op("Mul", [z, h])])
            else:
                pre = b.op("Add", [xt, b.op("MatMul", [h, rt])])
                if rb is not None:
                    pre = b.op("Add", [pre, rb])
                if kind == "RNN":
                    h = f[0](gate(0, pre))
                else:
                    i = f[0](_peephole(b, gate(0, pre), c, pd, 0, hidden))
                    fg = f[0](_peephole(b, gate(2, pre), c, pd, 2, hidden))
                    if int(attrs.get("input_forget", 0)):
                        fg = b.op("Sub", [_scalar(b, 1.0), i])
                    cc = f[1](gate(3, pre))
                    c = b.op("Add", [b.op("Mul", [fg, c]), b.op("Mul", [i, cc])])
                    o = f[0](_peephole(b, gate(1, pre), c, pd, 1, hidden))
                    h = b.op("Mul", [o, f[2](c)])
            outs[t] = h
        ys.append(b.op("Concat", [_reshape(b, outs[t], (1, 1, batch, hidden)) for t in range(seq)], axis=0)
                  if seq > 1 else _reshape(b, outs[0], (1, 1, batch, hidden)))
        hs.append(_reshape(b, h, (1, batch, hidden)))
        cs.append(_reshape(b, c, (1, batch, hidden)))
    y = ys[0] if dirs == 1 else b.op("Concat", ys, axis=1)  # [seq, dirs, batch, H]
    yh = hs[0] if dirs == 1 else b.op("Concat", hs, axis=0)
    yc = cs[0] if dirs == 1 else b.op("Concat", cs, axis=0)
    if layout:
        y = transpose(b, y, (2, 0, 1, 3))
        yh, yc = transpose(b, yh, (1, 0, 2)), transpose(b, yc, (1, 0, 2))
    outs_all = [y, yh, yc] if kind == "LSTM" else [y, yh]
    return outs_all[:max(int(attrs.get("_nout", 1)), 1)]


def _convert(kind: str):
    def convert(b: Builder, x: Value, w: Value, r: Value, bias: Value | None = None, seq_lens: Value | None = None,
                h0: Value | None = None, c0: Value | None = None, p: Value | None = None, *, _nout: int = 1,
                **attrs) -> list[Value]:
        attrs["_nout"] = _nout
        if len(x.shape) != 3:
            raise ShapeError(f"{kind}: input {list(x.shape)} is not rank 3")
        if kind != "LSTM" and c0 is not None:
            raise KilnError(f"{kind}: too many inputs")
        return _recurrence(b, kind, x, w, r, bias, seq_lens, h0, c0, p, attrs)

    convert.__doc__ = (f"ONNX {kind}-7/14/22: unrolled over the sequence; forward, reverse or bidirectional; "
                       "activations with alpha/beta, clip, layout. Raises KilnError for sequence_lens shorter than "
                       "the sequence or unknown activations.")
    return convert


for _kind in ("RNN", "GRU", "LSTM"):
    onnx_op(_kind, since=7)(_convert(_kind))

#: ONNX LSTM's converter, for the operators that reduce to it (onnxruntime's DynamicQuantizeLSTM)
lstm_like = _convert("LSTM")
