"""Voice activity detection with Silero VAD through Kiln and onnxruntime, side by side.

Silero VAD (``silero_vad.onnx``, opset 16) takes one chunk of audio at a time: 512 new samples at 16 kHz (256 at
8 kHz) after the last 64 (32) samples of the previous chunk as context, the LSTM state ``[2, 1, 128]`` from the
previous call, and the sample rate ``sr``; it returns the speech probability of the chunk and the next state.
Its graph is an ``If(sr == 16000)`` whose branches are the 16 kHz and 8 kHz networks, so ``sr`` is decided at
run time: Kiln compiles both branches into the package (docs/control-flow.md). A package has fixed input
shapes, so each sample rate gets its own package (cached in ``--cache``); in the 16 kHz package the 8 kHz branch
cannot run (its shapes do not fit 576 samples) and Kiln warns about it at compile time.

The audio is a WAV file (16-bit PCM mono at 16 or 8 kHz, read with the standard library's ``wave``) or, by
default, a synthetic signal made in code: low noise with two voiced bursts (a harmonic series on a gliding
pitch, amplitude-modulated at a syllable rate). Speech segments come from the probabilities with the hysteresis
Silero's own ``get_speech_timestamps`` uses (start above ``--threshold``, end below ``threshold - 0.15``).

    python examples/vad.py [--wav FILE] [--sr 16000|8000] [--engine both|kiln|onnxruntime] [--cache DIR] [--models DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np

MODELS = (Path(__file__).resolve().parents[1] / ".." / "shared" / "models").resolve()

#: sample rate -> (new samples per chunk, context samples from the previous chunk)
CHUNKS = {16000: (512, 64), 8000: (256, 32)}


def synthetic_audio(sr: int = 16000, seconds: float = 3.0, seed: int = 0) -> np.ndarray:
    """A deterministic test signal, float32 [seconds * sr] in [-1, 1]: noise (std 0.003) everywhere, and voiced
    bursts at 0.5-1.2 s and 1.8-2.5 s: harmonics 1-10 of a pitch gliding 140-220 Hz, with 1/k amplitudes,
    amplitude-modulated at 4 Hz."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(sr * seconds)) / sr
    x = 0.003 * rng.standard_normal(t.size)
    for start, end in ((0.5, 1.2), (1.8, 2.5)):
        on = (t >= start) & (t < end)
        tt = t[on] - start
        f0 = 140 + 80 * tt / (end - start)
        phase = 2 * np.pi * np.cumsum(f0) / sr
        voiced = sum(np.sin(k * phase) / k for k in range(1, 11) if k * f0.max() < sr / 2)
        envelope = np.sin(np.pi * tt / (end - start)) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * tt))
        x[on] += 0.3 * envelope * voiced
    return np.clip(x, -1, 1).astype(np.float32)


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """A 16-bit PCM mono WAV file as float32 samples in [-1, 1] and its sample rate.
    Raises ``ValueError`` for other sample widths or channel counts."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(f"{path}: need 16-bit PCM mono, got {8 * w.getsampwidth()}-bit, {w.getnchannels()} channels")
        data = np.frombuffer(w.readframes(w.getnframes()), "<i2")
        return (data / 32768.0).astype(np.float32), w.getframerate()


Model = Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def kiln_model(sr: int, cache: str | Path = "build/vad-packages", models: Path = MODELS) -> Model:
    """Silero VAD compiled by Kiln for ``sr``'s chunk length (cached), run natively on WebGPU:
    ``(input [1, L], state [2, 1, 128], sr) -> (probability [1, 1], state)``."""
    import warnings

    from package_cache import cached_package

    import kiln

    n, context = CHUNKS[sr]
    with warnings.catch_warnings():  # the other sample rate's branch cannot run at this chunk length (expected)
        warnings.filterwarnings("ignore", message="If 'If_0'")
        pkg = cached_package(models / "silero_vad.onnx", cache, {"input": (1, n + context), "state": (2, 1, 128),
                                                                 "sr": ()})
    session = kiln.load(pkg)

    def run(x, state, rate):
        out = session.run({"input": x, "state": state, "sr": np.array(rate, np.int64)})
        return out["output"], out["stateN"]

    return run


def onnxruntime_model(models: Path = MODELS) -> Model:
    """Silero VAD on onnxruntime (CPU), the same calling convention as :func:`kiln_model`."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(models / "silero_vad.onnx"), providers=["CPUExecutionProvider"])

    def run(x, state, rate):
        prob, state = session.run(None, {"input": x, "state": state, "sr": np.array(rate, np.int64)})
        return prob, state

    return run


def probabilities(model: Model, audio: np.ndarray, sr: int) -> np.ndarray:
    """The speech probability of every whole chunk of ``audio`` (float32 [chunks]), the state and context
    carried from chunk to chunk as Silero's ``OnnxWrapper`` does (zero state and context at the start)."""
    n, context = CHUNKS[sr]
    state = np.zeros((2, 1, 128), np.float32)
    ctx = np.zeros(context, np.float32)
    probs = []
    for i in range(len(audio) // n):
        chunk = audio[i * n:(i + 1) * n]
        prob, state = model(np.concatenate([ctx, chunk])[None], state, sr)
        ctx = chunk[-context:]
        probs.append(float(prob.reshape(-1)[0]))
    return np.array(probs, np.float32)


def segments(probs: np.ndarray, chunk_seconds: float, threshold: float = 0.5,
             min_silence: float = 0.1) -> list[tuple[float, float]]:
    """Speech segments ``(start, end)`` in seconds: a segment starts at a chunk above ``threshold`` and ends at
    the first chunk below ``threshold - 0.15`` (or the end of the audio); segments less than ``min_silence``
    seconds apart are merged (Silero's ``min_silence_duration_ms``, 100 ms by default)."""
    out, start = [], None
    for i, p in enumerate(probs):
        if start is None and p >= threshold:
            start = i
        elif start is not None and p < threshold - 0.15:
            out.append((start * chunk_seconds, i * chunk_seconds))
            start = None
    if start is not None:
        out.append((start * chunk_seconds, len(probs) * chunk_seconds))
    merged: list[tuple[float, float]] = []
    for a, b in out:
        if merged and a - merged[-1][1] < min_silence:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wav", help="16-bit PCM mono WAV at 16 or 8 kHz (default: a synthetic signal)")
    ap.add_argument("--sr", type=int, choices=sorted(CHUNKS), default=16000, help="sample rate of the synthetic signal")
    ap.add_argument("--engine", choices=["both", "kiln", "onnxruntime"], default="both")
    ap.add_argument("--threshold", type=float, default=0.5)
    ap.add_argument("--cache", default="build/vad-packages", help="directory of compiled packages")
    ap.add_argument("--models", type=Path, default=MODELS, help="directory holding silero_vad.onnx")
    args = ap.parse_args(argv)
    audio, sr = read_wav(args.wav) if args.wav else (synthetic_audio(args.sr), args.sr)
    if sr not in CHUNKS:
        ap.error(f"sample rate {sr} Hz: Silero VAD takes 16000 or 8000")
    engines = {"kiln": lambda: kiln_model(sr, args.cache, args.models),
               "onnxruntime": lambda: onnxruntime_model(args.models)}
    names = list(engines) if args.engine == "both" else [args.engine]
    chunk_seconds = CHUNKS[sr][0] / sr
    results = {}
    for name in names:
        probs = probabilities(engines[name](), audio, sr)
        results[name] = probs
        spans = segments(probs, chunk_seconds, args.threshold)
        print(f"{name:>12}: {len(spans)} speech segment(s) in {len(audio) / sr:.2f} s at {sr} Hz "
              f"(probability {probs.min():.3f}..{probs.max():.3f})")
        for start, end in spans:
            print(f"{'':>14}{start:6.2f} s - {end:6.2f} s")
    if len(results) == 2:
        diff = float(np.abs(results["kiln"] - results["onnxruntime"]).max())
        same = segments(results["kiln"], chunk_seconds, args.threshold) == segments(results["onnxruntime"],
                                                                                    chunk_seconds, args.threshold)
        print(f"largest probability difference Kiln vs onnxruntime: {diff:.2e}; same segments: {same}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
