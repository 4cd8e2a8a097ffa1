"""Audio signal processing as graph-IR programs: band-limited resampling (speech packages resample recordings to
16 kHz on the device with it).

:func:`resample_graph` is windowed-sinc interpolation (J. O. Smith, "Digital Audio Resampling", the method of
libsamplerate's sinc converters and librosa's ``resampy``): output sample ``j`` of a rate change by ``num / den``
(input over output rate, reduced) lies at input position ``t_j = (phase + j * num) / den`` and is

    y_j = sum_k x[floor(t_j) + k - (H - 1)] * h(frac(t_j) + H - 1 - k),   k = 0 .. 2H - 1
    h(tau) = c * sinc(c * tau) * (0.5 + 0.5 cos(pi * tau / W))   for |tau| < W = ZERO_CROSSINGS / c, else 0

with cutoff ``c = ROLLOFF * min(1, den / num)`` (below the lower Nyquist frequency: anti-aliasing when the rate
falls). The position's integer and fractional parts come from int32 arithmetic (exact: ``floor`` and ``mod`` of
``phase + j * num`` by ``den``), so no position drifts however long the recording; the host gives each chunk of
outputs its exact ``phase`` and input span (:func:`kiln.runtime.speech.resample_spans`).
"""

from __future__ import annotations

import math

import numpy as np

from kiln.arith import symbolic
from kiln.frontend.shapes import reshape
from kiln.ir.graph import Builder, Graph, Value

#: zero crossings of the sinc on each side (filter quality: stopband about -70 dB with the Hann window)
ZERO_CROSSINGS = 16
#: the cutoff as a fraction of the lower Nyquist frequency
ROLLOFF = 0.945
#: the largest rate change down (input rate / output rate) the filter has taps for: 96 kHz to 16 kHz
MAX_RATIO = 6
#: taps on each side of an output sample: the filter's half-width at MAX_RATIO
HALF_TAPS = math.ceil(ZERO_CROSSINGS * MAX_RATIO / ROLLOFF)
#: output samples per run at most (about 2 s at 16 kHz): the fusion pass keeps the taps' weights and windows in a few
#: ``[outputs, taps]`` intermediates (27 MB each at this size, inside WebGPU's default 128 MB binding limit); one
#: kernel computing them where the reduction reads is issue 16's fusion work
MAX_OUTPUTS = 32768


def resample_graph(max_outputs: int = MAX_OUTPUTS) -> Graph:
    """The resampler.

    Inputs: ``audio`` float32 ``[1, S]`` (the input span a chunk reads; run-time dim ``input_samples``);
    ``samples`` int64 ``[1]`` (``L``, the outputs wanted: its value binds run-time dim ``samples``, at most
    ``max_outputs``); ``ratio`` int32 ``[2]`` (``num, den``: input rate / output rate, reduced); ``phase`` int32
    ``[1]`` (the first output's position numerator); ``filter`` float32 ``[3]`` (``pi c``, ``c``, ``pi c / (2
    ZERO_CROSSINGS)``). Output ``resampled`` float32 ``[1, L]``.

    Output ``j`` reads ``audio[q_j .. q_j + 2H - 1]`` with ``q_j = (phase + j num) div den``; the caller sizes ``S``
    so every read is inside (``S >= q_{L-1} + 2H``) and keeps ``phase + L num`` under 2^31
    (:func:`kiln.runtime.speech.resample`). The filter is ``c sinc(c tau) = sin(y) / y * c`` with ``y = pi c tau``
    (plus 1e-20, so ``tau = 0`` gives ``c``) and the Hann window ``cos(min(|tau| pi c / 2Z, pi / 2))^2``, zero
    from ``|tau| = Z / c`` on.
    """
    g = Graph(name="resample")
    taps = 2 * HALF_TAPS
    n_out = symbolic.size_var("samples", 0, 1, max_outputs)
    n_in = symbolic.size_var("input_samples", 1, taps, max_outputs * MAX_RATIO + taps + 1)
    g.size_vars = {"samples": n_out, "input_samples": n_in}
    audio = Value("audio", "float32", (1, n_in), sym_shape=(1, "input_samples"))
    count = Value("samples", "int64", (1,))
    ratio = Value("ratio", "int32", (2,))
    phase = Value("phase", "int32", (1,))
    filt = Value("filter", "float32", (3,))
    g.inputs += [audio, count, ratio, phase, filt]
    g.value_dims = {count.name: "samples"}
    b = Builder(g)

    def part(v: Value, i: int) -> Value:
        return b.op("Slice", [v], starts=(i,), ends=(i + 1,), steps=(1,))

    def f32(x: float) -> Value:
        return b.const(np.array(x, np.float32))

    num, den = part(ratio, 0), part(ratio, 1)
    pi_c, c, c_z = part(filt, 0), part(filt, 1), part(filt, 2)  # c_z: pi c / (2 Z)
    j = reshape(b, b.op("Iota", [], shape=(n_out,), start=0, delta=1, dtype="int32"), (n_out, 1))
    pos = b.op("Add", [phase, b.op("Mul", [j, num])])  # [L, 1], exact in int32
    q = b.op("Div", [pos, den])
    rem = b.op("Cast", [b.op("Sub", [pos, b.op("Mul", [q, den])])], to="float32")
    centre = b.op("Add", [b.op("Div", [rem, b.op("Cast", [den], to="float32")]), f32(HALF_TAPS - 1)])
    tau = b.op("Sub", [centre, b.const(np.arange(taps, dtype=np.float32).reshape(1, taps))])  # [L, taps]
    y = b.op("Add", [b.op("Mul", [tau, pi_c]), f32(1e-20)])
    sinc = b.op("Mul", [b.op("Div", [b.op("Sin", [y]), y]), c])
    half = b.op("Cos", [b.op("Min", [b.op("Mul", [b.op("Abs", [tau]), c_z]), f32(math.pi / 2)])])
    hann = b.op("Mul", [half, half])  # 0.5 + 0.5 cos(2a) = cos(a)^2
    idx = b.op("Add", [q, b.const(np.arange(taps, dtype=np.int32).reshape(1, taps))])
    xs = b.op("Gather", [reshape(b, audio, (n_in,)), idx], axis=0)
    y = b.op("ReduceSum", [b.op("Mul", [xs, b.op("Mul", [sinc, hann])])], axes=(1,), keepdims=0)
    out = reshape(b, y, (1, n_out))
    out.name = "resampled"
    g.outputs = [out]
    return g


def resample_reference(audio: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """The same resampler in float64 numpy (the tests' reference): ``ceil(len * out / in)`` samples."""
    g = math.gcd(in_rate, out_rate)
    num, den = in_rate // g, out_rate // g
    c = ROLLOFF * min(1.0, den / num)
    width = ZERO_CROSSINGS / c
    n = -(-len(audio) * den // num)
    x = np.concatenate([np.zeros(HALF_TAPS - 1), np.asarray(audio, np.float64), np.zeros(2 * HALF_TAPS + 1)])
    pos = np.arange(n, dtype=np.int64) * num
    q, r = pos // den, pos % den
    tau = (r / den + HALF_TAPS - 1)[:, None] - np.arange(2 * HALF_TAPS)[None, :]
    h = np.where(np.abs(tau) < width, c * np.sinc(c * tau) * (0.5 + 0.5 * np.cos(np.pi * tau / width)), 0.0)
    return (x[q[:, None] + np.arange(2 * HALF_TAPS)[None, :]] * h).sum(axis=1)
