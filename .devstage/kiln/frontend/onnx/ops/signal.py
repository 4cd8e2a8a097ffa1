"""Signal-processing ONNX operators: DFT and STFT (matrix products with constant twiddle matrices),
MelWeightMatrix (a constant)."""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.ops.common import const_value, norm_axis
from kiln.frontend.onnx.ops.nn import _reshape, transpose
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir import dtypes
from kiln.ir.graph import Builder, Value


def _twiddles(n_in: int, n: int, k: int, inverse: bool) -> tuple[np.ndarray, np.ndarray]:
    """``cos`` and ``sin`` of ``2 pi j k / n`` for input index ``j < n_in`` (rows past ``n`` are zero: the
    signal is cropped to ``n``) and output index ``< k``, float32; angles reduced exactly (``j*k mod n``)
    and values within 1e-12 of zero made zero, so sin(pi) contributes nothing."""
    j = np.arange(n_in)[:, None]
    kk = np.arange(k)[None, :]
    theta = 2 * np.pi * ((j * kk) % n) / n
    c, s = np.cos(theta), np.sin(theta)
    c[np.abs(c) < 1e-12] = 0.0
    s[np.abs(s) < 1e-12] = 0.0
    c[j[:, 0] >= n] = 0.0
    s[j[:, 0] >= n] = 0.0
    return c.astype(np.float32), s.astype(np.float32)


def _dft(b: Builder, x: Value, dft_length: Value | None, axis: int, inverse: int, onesided: int) -> Value:
    rank = len(x.shape)
    if rank < 2 or x.shape[-1] not in (1, 2):
        raise ShapeError(f"DFT: input {list(x.shape)} must end in a dim of 1 (real) or 2 (complex)")
    ax = norm_axis(axis, rank)
    if ax == rank - 1:
        raise KilnError("DFT: the axis cannot be the last (real/imaginary) one")
    n_in = x.shape[ax]
    if dft_length is not None:
        n = int(np.asarray(const_value(dft_length, "dft_length")).reshape(()))
    else:
        n = 2 * (n_in - 1) if inverse and onesided else n_in
    if n < 1:
        raise ShapeError(f"DFT: dft_length {n} must be positive")
    lead = x.shape[:-1]
    perm = [d for d in range(rank - 1) if d != ax] + [ax]  # the signal axis last, for the matrix product
    back = list(np.argsort(perm))

    def part(i: int) -> Value:
        p = b.op("Slice", [x], starts=(0,) * (rank - 1) + (i,), ends=(*lead, i + 1), steps=(1,) * rank)
        return transpose(b, _reshape(b, p, lead), tuple(perm))

    def mm(v: Value, m: np.ndarray) -> Value:
        return b.op("MatMul", [v, b.const(m)])

    xr = part(0)
    xi = part(1) if x.shape[-1] == 2 else None
    if inverse and onesided:  # irfft: Hermitian spectrum of k = n//2 + 1 bins to a real signal of length n
        k_used = min(n_in, n // 2 + 1)
        c, s = _twiddles(n_in, n, n, True)
        wt = np.full((n_in, 1), 2.0, np.float32)
        wt[0] = 1.0
        if n % 2 == 0 and n // 2 < n_in:
            wt[n // 2] = 1.0
        wt[k_used:] = 0.0
        # rows: frequency k, columns: time n; x[t] = (1/n) sum_k w_k (Re X_k cos - Im X_k sin)
        cm, sm = (c * wt / n).astype(np.float32), (s * wt / n).astype(np.float32)
        y = mm(xr, cm)
        if xi is not None:
            y = b.op("Sub", [y, mm(xi, sm)])
        parts = [y]
    else:
        k = n // 2 + 1 if onesided else n
        c, s = _twiddles(n_in, n, k, bool(inverse))
        if inverse:
            c, s = c / n, s / n
        # forward: (xr + i xi)(cos - i sin); inverse: (xr + i xi)(cos + i sin) / n
        sign = 1.0 if inverse else -1.0
        yr, yi = mm(xr, c), mm(xr, (sign * s).astype(np.float32))
        if xi is not None:
            yr = b.op("Sub", [yr, mm(xi, (sign * s).astype(np.float32))])
            yi = b.op("Add", [yi, mm(xi, c)])
        parts = [yr, yi]
    outs = []
    for v in parts:
        v = transpose(b, v, tuple(int(i) for i in back))
        outs.append(_reshape(b, v, (*v.shape, 1)))
    return outs[0] if len(outs) == 1 else b.op("Concat", outs, axis=rank - 1)


@onnx_op("DFT", since=17)
def dft_17(b: Builder, x: Value, dft_length: Value | None = None, *, axis: int = 1, inverse: int = 0,
           onesided: int = 0) -> Value:
    """ONNX DFT-17: the discrete Fourier transform along ``axis`` of a real ``[..., 1]`` or complex ``[..., 2]``
    signal, as float32 matrix products with constant twiddle factors (``O(n^2)``, for short signals);
    ``onesided`` keeps ``n//2 + 1`` bins, ``inverse`` divides by ``n``; inverse and onesided together take
    a Hermitian half spectrum to a real signal (numpy's irfft). ``dft_length`` must be a constant."""
    return _dft(b, x, dft_length, axis, inverse, onesided)


@onnx_op("DFT", since=20)
def dft_20(b: Builder, x: Value, dft_length: Value | None = None, axis: Value | None = None, *, inverse: int = 0,
           onesided: int = 0) -> Value:
    """ONNX DFT-20: DFT-17 with the axis as a constant input (default -2)."""
    ax = -2 if axis is None else int(np.asarray(const_value(axis, "axis")).reshape(()))
    return _dft(b, x, dft_length, ax, inverse, onesided)


@onnx_op("STFT", since=17)
def stft(b: Builder, signal: Value, frame_step: Value, window: Value | None = None,
         frame_length: Value | None = None, *, onesided: int = 1) -> Value:
    """ONNX STFT-17: the DFT of each frame (``frame_length`` samples every ``frame_step``, times ``window``) of
    a real ``[batch, length, 1]`` or complex ``[batch, length, 2]`` signal: ``[batch, frames, bins, 2]``.
    The frames are one Gather with constant indices; ``frame_step`` and ``frame_length`` must be constants.

    Raises:
        ShapeError: no frame fits the signal, or the window's length is not the frame length.
    """
    if len(signal.shape) != 3 or signal.shape[-1] not in (1, 2):
        raise ShapeError(f"STFT: signal {list(signal.shape)} must be [batch, length, 1 or 2]")
    step = int(np.asarray(const_value(frame_step, "frame_step")).reshape(()))
    if frame_length is not None:
        length = int(np.asarray(const_value(frame_length, "frame_length")).reshape(()))
    elif window is not None:
        length = window.shape[0]
    else:
        raise KilnError("STFT: needs a window or a frame_length")
    if window is not None and tuple(window.shape) != (length,):
        raise ShapeError(f"STFT: window {list(window.shape)} is not of the frame length {length}")
    frames = (signal.shape[1] - length) // step + 1
    if step < 1 or frames < 1:
        raise ShapeError(f"STFT: no frame of {length} samples (step {step}) fits a signal of {signal.shape[1]}")
    idx = np.arange(frames, dtype=np.int64)[:, None] * step + np.arange(length, dtype=np.int64)[None, :]
    x = b.op("Gather", [signal, b.const(idx)], axis=1)  # [batch, frames, length, c]
    if window is not None:
        x = b.op("Mul", [x, _reshape(b, window, (1, 1, length, 1))])
    return _dft(b, x, None, 2, 0, onesided)


@onnx_op("MelWeightMatrix", since=17)
def mel_weight_matrix(b: Builder, num_mel_bins: Value, dft_length: Value, sample_rate: Value,
                      lower_edge_hertz: Value, upper_edge_hertz: Value, *, output_datatype: int = 1) -> Value:
    """ONNX MelWeightMatrix-17, a constant (every input must be one): ``[dft_length // 2 + 1, num_mel_bins]``
    triangular filters whose corners are ``num_mel_bins + 2`` points evenly spaced on the mel scale
    (``2595 log10(1 + f / 700)``) from ``lower_edge_hertz`` to ``upper_edge_hertz``, mapped to DFT bins by
    ``floor((dft_length + 1) * f / sample_rate)`` (onnx's reference implementation of the function)."""
    def scalar(v: Value, what: str):
        return np.asarray(const_value(v, what)).reshape(()).item()

    mels, n_dft, rate = (int(scalar(v, w)) for v, w in ((num_mel_bins, "num_mel_bins"), (dft_length, "dft_length"),
                                                        (sample_rate, "sample_rate")))
    lo, hi = float(scalar(lower_edge_hertz, "lower_edge_hertz")), float(scalar(upper_edge_hertz, "upper_edge_hertz"))
    if mels < 1 or n_dft < 1 or rate < 1 or not 0 <= lo < hi:
        raise ShapeError(f"MelWeightMatrix: bad arguments {mels}, {n_dft}, {rate}, {lo}, {hi}")
    lo_mel, hi_mel = (2595 * np.log1p(f / 700) / np.log(10) for f in (lo, hi))
    points = np.arange(mels + 2) * ((hi_mel - lo_mel) / (mels + 2)) + lo_mel
    bins = (((n_dft + 1) * (700 * np.expm1(points / 2595 * np.log(10)))) // rate).astype(int)
    out = np.zeros((n_dft // 2 + 1, mels))
    for i in range(mels):
        left, centre, right = bins[i], bins[i + 1], bins[i + 2]
        if centre == left:
            out[centre, i] = 1.0
        else:
            out[left:centre + 1, i] = (np.arange(left, centre + 1) - left) / (centre - left)
        if right > centre:
            out[centre:right, i] = (right - np.arange(centre, right)) / (right - centre)
    dt = dtypes.from_onnx(output_datatype)
    return b.const(out.astype(dtypes.NUMPY[dt]), name=b.scope, dtype=dt)
