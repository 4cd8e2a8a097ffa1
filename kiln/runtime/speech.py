"""Speech to text over a speech package (``speech.json``, docs/speech.md): Whisper's long-form transcription.

A speech package holds four packages run on one device: ``resample`` (a recording at another rate to 16 kHz),
``log_mel`` (up to 30 s of 16 kHz samples to its log-mel spectrogram), ``encoder`` (a window's spectrogram to the
encoder's states) and ``decoder`` (one decoder
step with the self- and cross-attention caches as state). :class:`SpeechSession` drives them as the reference
implementations do (openai-whisper's ``transcribe``, faster-whisper's ``generate_segments`` over CTranslate2):

1. the whole recording's features: the STFT of the samples with 160 zeros appended, centred (reflected), its
   last frame dropped, in chunks of 3000 frames on the device; the maximum over the recording for the
   normalisation (which the encoder applies);
2. 30-s windows from frame ``seek``: the encoder runs once per window (its output stays on the device and feeds
   the decoder's first step, which writes the cross-attention cache), then the prompt (``<|startofprev|>`` and
   the previous windows' text when conditioning on it, ``<|startoftranscript|>``, language and task for
   multilingual models, ``<|notimestamps|>`` without timestamps) and greedy decoding (the arg max after the
   model's ``suppress_ids``, and ``suppress_ids_begin`` at the first token: CTranslate2's ``suppress_tokens=[-1]``
   and ``suppress_blank``) or beam search (CTranslate2's ``BeamSearch``, over the same suppressed logits, the
   decoder's cache reordered between steps), with Whisper's timestamp rules (CTranslate2's
   ``ApplyTimestampRules``) when timestamps are asked for;
3. segments split at consecutive timestamp tokens; the next window starts at the last complete timestamp (or
   after the window, without timestamps or after a single ending timestamp).

Not done (as faster-whisper with ``temperature=0``, ``compression_ratio_threshold``, ``log_prob_threshold`` and
``no_speech_threshold`` all ``None``): temperature fallback, skipping windows judged silent, voice activity
detection, word timestamps.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError, PackageError, one_line
from kiln.package.format import check_file, check_manifest_digest
from kiln.package.manifest import validate_speech_manifest
from kiln.runtime import open_session
from kiln.runtime.generate import host_array, release_tensors

SPEECH = "speech.json"
#: (format 1.2) speech.json's own SHA-256, as a package's manifest.sha256
SPEECH_DIGEST = "speech.sha256"
FORMAT_MAJOR = 1
#: the first format whose speech.json lists its files (``files``) and has SPEECH_DIGEST
INTEGRITY_VERSION = (1, 2)
MAX_AUDIO_S = 4 * 3600  #: the longest recording transcribed, seconds (its features: 4 h = 1.4 M frames x 80)


@dataclass
class Segment:
    """A transcribed span: ``start``, ``end`` in seconds from the recording's start, ``text`` and its token ids
    (timestamp tokens included)."""

    start: float
    end: float
    text: str
    tokens: list[int]


@dataclass
class TranscriptionStats:
    """What a transcription took.

    Attributes:
        audio_s: the recording's length, seconds.
        resample_ms, features_ms, encode_ms, decode_ms: time resampling to 16 kHz (0 for 16 kHz audio), in the
            log-mel front end, the encoder (all windows) and the decoder steps, milliseconds.
        windows: 30-s windows encoded; tokens: tokens decoded (prompts excluded).
        total_ms: the whole transcription, milliseconds.
    """

    audio_s: float = 0.0
    resample_ms: float = 0.0
    features_ms: float = 0.0
    encode_ms: float = 0.0
    decode_ms: float = 0.0
    windows: int = 0
    tokens: int = 0
    total_ms: float = 0.0

    @property
    def real_time_factor(self) -> float:
        """Processing time over audio time (below 1: faster than real time)."""
        return self.total_ms / 1e3 / self.audio_s if self.audio_s else 0.0

    @property
    def ms_per_token(self) -> float:
        """Decoder milliseconds per decoded token."""
        return self.decode_ms / self.tokens if self.tokens else 0.0


@dataclass
class Transcript:
    """A transcription: its segments, their text joined, and :class:`TranscriptionStats`."""

    segments: list[Segment] = field(default_factory=list)
    stats: TranscriptionStats = field(default_factory=TranscriptionStats)

    @property
    def text(self) -> str:
        """The segments' text, joined (Whisper's text tokens carry their leading spaces)."""
        return "".join(s.text for s in self.segments).strip()


def read_speech_manifest(package: str | os.PathLike) -> dict[str, Any]:
    """``speech.json`` of a speech package, checked (format 1.2) against ``speech.sha256``.

    Raises:
        PackageError: no such file, malformed JSON, a newer major format, a file the speech package's schema
            (``kiln/package/speech.schema.json``) refuses (one line naming the JSON path), or (1.2) no
            ``speech.sha256`` or a ``speech.json`` that differs from it.
    """
    p = Path(package) / SPEECH
    try:
        data = p.read_bytes()
        spec = json.loads(data)
    except FileNotFoundError:
        raise PackageError(f"{package} is not a speech package (no {SPEECH}; kiln compile a Whisper model folder "
                           "makes one)") from None
    except (OSError, ValueError, RecursionError) as e:
        raise PackageError(f"{p}: not readable JSON: {e}") from None
    major = str(spec.get("format", "0")).split(".")[0] if isinstance(spec, dict) else "0"
    if major != str(FORMAT_MAJOR):
        got = spec.get("format") if isinstance(spec, dict) else None
        raise PackageError(f"{p}: speech package format {got} is not {FORMAT_MAJOR}.x; recompile it with this Kiln")
    validate_speech_manifest(spec, str(p))
    digest = Path(package) / SPEECH_DIGEST
    # (the digest is checked wherever it is, so editing the format down to 1.1 does not turn the check off)
    if digest.is_file() or tuple(int(v) for v in spec["format"].split(".")) >= INTEGRITY_VERSION:
        check_manifest_digest(data, digest.read_bytes() if digest.is_file() else None, str(package),
                              (SPEECH, SPEECH_DIGEST))
        if "files" not in spec:
            raise PackageError(f"{p}: no 'files' (a speech package of format 1.2 or later lists its files)")
    return spec


def read_speech_file(package: str | os.PathLike, spec: dict[str, Any], relative: str) -> bytes:
    """The bytes of file ``relative`` beside the parts (the tokenizer), checked (format 1.2) against speech.json's
    ``files``.

    Raises:
        PackageError: the file is missing, or (1.2) unlisted or of another size or SHA-256.
    """
    try:
        data = (Path(package) / relative).read_bytes()
    except OSError as e:
        raise PackageError(f"{package}: cannot read {relative} ({e.strerror or e})") from None
    if "files" in spec:
        check_file(data, {f["path"]: f for f in spec["files"]}.get(relative), f"{package}: {relative}")
    return data


def is_speech_package(package: str | os.PathLike) -> bool:
    """Whether ``package`` is a speech package directory (it has ``speech.json``)."""
    return (Path(package) / SPEECH).is_file()


def load_audio(source: str | os.PathLike | np.ndarray, sample_rate: int | None = None) -> tuple[np.ndarray, int]:
    """Audio as float32 mono samples and their rate.

    Args:
        source: a sound file (WAV, FLAC, OGG, MP3: whatever libsndfile reads, through ``soundfile``), or samples
            (``[samples]``, or ``[samples, channels]``, float in [-1, 1]).
        sample_rate: the samples' rate (required for an array; ignored for a file, which states its own).

    Returns:
        ``(samples [n] float32, rate in Hz)``; channels are averaged.

    Raises:
        KilnError: an unreadable or empty file, an array without a rate, or a non-positive rate.
    """
    if isinstance(source, np.ndarray):
        if sample_rate is None:
            raise KilnError("audio given as samples needs its sample rate (sample_rate=...)")
        data, rate = np.asarray(source, np.float32), int(sample_rate)
    else:
        import soundfile

        try:
            data, rate = soundfile.read(str(source), dtype="float32", always_2d=True)
        except (RuntimeError, OSError, TypeError) as e:  # soundfile.LibsndfileError is a RuntimeError
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise KilnError(f"cannot read audio {source}: {msg}") from None
    if data.ndim == 2:
        data = data.mean(axis=1, dtype=np.float32)
    if data.ndim != 1:
        raise KilnError(f"audio must be [samples] or [samples, channels], got {list(data.shape)}")
    if rate <= 0:
        raise KilnError(f"sample rate must be positive, got {rate}")
    if data.size == 0:
        raise KilnError(f"the audio {'' if isinstance(source, np.ndarray) else str(source) + ' '}is empty "
                        "(no samples)")
    return np.ascontiguousarray(data, np.float32), rate


def _stft_signal(audio: np.ndarray, n_fft: int, hop: int) -> tuple[np.ndarray, int]:
    """Whisper's STFT input (``hop`` zeros appended, ``n_fft / 2`` samples reflected at both ends; float32) and its
    frame count (:func:`chunk_audio` says why)."""
    x = np.concatenate([np.asarray(audio, np.float32).reshape(-1), np.zeros(hop, np.float32)])
    x = np.pad(x, n_fft // 2, mode="reflect")
    return x, (len(x) - n_fft) // hop


def mel_blocks(audio: np.ndarray, n_fft: int, hop: int, frames_per_chunk: int) -> tuple[list[np.ndarray], int]:
    """The ``log_mel`` part's inputs for a recording, and its frame count (array layout only, no arithmetic).

    The signal is :func:`chunk_audio`'s (``hop`` zeros appended, ``n_fft / 2`` samples reflected at both ends); each
    chunk of up to ``frames_per_chunk`` frames is ``[1, frames + ceil(n_fft / hop) - 1, hop]`` float32: the samples
    its frames span in rows of ``hop`` (zeros past the end), so a short recording's chunk holds its own frames only.
    """
    x, frames = _stft_signal(audio, n_fft, hop)
    extra = -(-n_fft // hop) - 1
    out = []
    for start in range(0, frames, frames_per_chunk):
        blocks = min(frames_per_chunk, frames - start) + extra
        row = np.zeros(blocks * hop, np.float32)
        part = x[start * hop: start * hop + blocks * hop]
        row[:len(part)] = part
        out.append(row.reshape(1, blocks, hop))
    return out, frames


def chunk_audio(audio: np.ndarray, n_fft: int, hop: int, frames_per_chunk: int) -> tuple[np.ndarray, int]:
    """The STFT input chunks of a recording, and its frame count (array layout only, no arithmetic).

    Whisper's features (openai-whisper's ``log_mel_spectrogram``, faster-whisper's ``FeatureExtractor``) are the
    STFT of the samples with ``hop`` zeros appended, centred (``n_fft / 2`` samples reflected at both ends), its
    last frame dropped: ``len(audio) // hop + 1`` frames, frame ``f`` the ``n_fft`` samples from ``f * hop`` of the
    padded signal. Returns that signal as rows of ``frames_per_chunk`` frames, ``[chunks, (frames_per_chunk - 1) *
    hop + n_fft]`` float32 (zeros past the end), and the frame count: the input of speech packages made before
    ``log_mel`` took :func:`mel_blocks`.
    """
    x, frames = _stft_signal(audio, n_fft, hop)
    width = (frames_per_chunk - 1) * hop + n_fft
    n = -(-frames // frames_per_chunk)
    out = np.zeros((n, width), np.float32)
    for i in range(n):
        part = x[i * frames_per_chunk * hop: i * frames_per_chunk * hop + width]
        out[i, :len(part)] = part
    return out, frames


def resample_spans(n_in: int, num: int, den: int, taps: int, most: int) -> Iterator[tuple[int, int, int, int, int]]:
    """The runs that resample ``n_in`` samples by ``num / den`` (input rate over output rate, reduced) with the
    resample part (:func:`kiln.frontend.audio.resample_graph`, ``taps = 2H``): ``ceil(n_in den / num)`` outputs in
    chunks of at most ``most``, each ``(first output, outputs, phase, first input, inputs)``. Positions are exact
    integers here (Python's) and per chunk in int32 (``phase + outputs * num < 2^31``); the inputs index the signal
    with ``taps / 2 - 1`` zeros before it (and zeros after)."""
    total = -(-n_in * den // num)
    step = max(1, min(most, (2**31 - 1 - den) // num))
    for first in range(0, total, step):
        count = min(step, total - first)
        base, phase = divmod(first * num, den)
        need = (phase + (count - 1) * num) // den + taps
        yield first, count, phase, base, need


class SpeechSession:
    """A loaded speech package (Whisper), ready to transcribe.

    Args:
        package: the package directory (``kiln compile`` of a CTranslate2 Whisper model folder).
        target: ``webgpu`` (wgpu-py), ``wasm`` (wasmtime) or ``cpu``; the three parts share one device.
        options: passed to each part's session (:func:`kiln.load`'s options).

    Raises:
        PackageError: not a speech package, or a part that does not load.
    """

    def __init__(self, package: str | os.PathLike, target: str = "webgpu", **options: Any):
        from tokenizers import Tokenizer

        self.path = Path(package)
        self.spec = read_speech_manifest(self.path)
        self.target = target
        data = read_speech_file(self.path, self.spec, self.spec["tokenizer"])  # (checked before any part loads)
        parts = self.spec["parts"]
        self.resampler = open_session(self.path / parts["resample"], target, **options)
        self.log_mel = open_session(self.path / parts["log_mel"], target, **options)
        self.encoder = open_session(self.path / parts["encoder"], target, **options)
        self.decoder = open_session(self.path / parts["decoder"], target, **options)
        try:
            self.tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # noqa: BLE001  (tokenizers raises a plain Exception for a malformed file)
            raise PackageError(f"{self.path}: {self.spec['tokenizer']} is not a tokenizer ({one_line(e)[:200]})") \
                from None
        self.tokens = self.spec["tokens"]
        self._gpu = hasattr(self.decoder, "upload")
        self._busy = False

    # ------------------------------------------------------------------------------------------- front end
    def resample(self, audio: np.ndarray, rate: int) -> np.ndarray:
        """``audio`` at ``rate`` Hz resampled to the package's rate (16 kHz) on the device: windowed-sinc
        interpolation (:mod:`kiln.frontend.audio`), ``ceil(len * 16000 / rate)`` samples.

        Raises:
            KilnError: a rate outside what the filter has taps for (``resample.min_rate`` .. ``max_rate``).
        """
        r = self.spec["resample"]
        if not r["min_rate"] <= rate <= r["max_rate"]:
            raise KilnError(f"cannot resample audio at {rate} Hz: rates from {r['min_rate']} to {r['max_rate']} Hz "
                            "are resampled to 16 kHz")
        out_rate = self.spec["sample_rate"]
        if rate == out_rate:
            return np.asarray(audio, np.float32)
        g = math.gcd(rate, out_rate)
        num, den = rate // g, out_rate // g
        c = r["rolloff"] * min(1.0, den / num)
        filt = np.array([math.pi * c, c, math.pi * c / (2 * r["zero_crossings"])], np.float32)
        taps = r["taps"]
        lead = np.zeros(taps // 2 - 1, np.float32)
        x = np.concatenate([lead, np.asarray(audio, np.float32)])
        parts = []
        for _, count, phase, base, need in resample_spans(len(audio), num, den, taps, r["max_outputs"]):
            span = np.zeros((1, need), np.float32)
            got = x[base:base + need]
            span[0, :len(got)] = got
            out = self.resampler.run({"audio": span, "samples": np.asarray([count], np.int64),
                                      "ratio": np.asarray([num, den], np.int32),
                                      "phase": np.asarray([phase], np.int32), "filter": filt})
            parts.append(out["resampled"][0])
        return np.concatenate(parts)

    def features(self, audio: np.ndarray) -> tuple[np.ndarray, float]:
        """The log-mel spectrogram of 16 kHz ``audio``, computed on the device.

        Returns:
            ``(log10 mel power [n_mels, frames] float32, its maximum)``: before Whisper's normalisation, which the
            encoder applies (``(max(x, max - 8) + 4) / 4``).
        """
        s = self.spec
        if len(self.log_mel.manifest["inputs"][0]["shape"]) == 3:  # [1, blocks, hop] (run-time blocks)
            rows, frames = mel_blocks(audio, s["n_fft"], s["hop"], s["frames"])
        else:  # (a package made before: whole 30-s rows)
            chunks, frames = chunk_audio(audio, s["n_fft"], s["hop"], s["frames"])
            rows = [row[None] for row in chunks]
        parts, top = [], -np.inf
        for row in rows:
            out = self.log_mel.run({"audio": row})
            parts.append(out["log_mel"][0])
            top = max(top, float(out["log_mel_max"][0]))
        return np.concatenate(parts, axis=1)[:, :frames], top

    # ------------------------------------------------------------------------------------------- decoding
    def _prompt(self, previous: list[int], timestamps: bool, language: str | None, task: str) -> list[int]:
        t = self.tokens
        prompt = [t["sot_prev"], *previous[-(self.spec["max_context"] // 2 - 1):]] if previous else []
        prompt.append(t["sot"])
        if self.spec["multilingual"]:
            langs = self.spec["languages"]
            prompt += [langs[language or "en"], t[task]]
        if not timestamps:
            prompt.append(t["no_timestamps"])
        return prompt

    def _suppressed(self, logits: np.ndarray, generated: list[int], timestamps: bool,
                    max_initial: int) -> np.ndarray:
        """The logits with what may not come next at -inf: the model's ``suppress_ids``, ``suppress_ids_begin``
        first, and with timestamps CTranslate2's ``ApplyTimestampRules`` (pairs, never decreasing, the first
        token a timestamp at most ``max_initial`` steps of 0.02 s in, a timestamp when their total probability
        beats every text token's)."""
        t = self.tokens
        x = logits.astype(np.float32).copy()
        x[self.spec["suppress_ids"]] = -np.inf
        if not generated:
            x[self.spec["suppress_ids_begin"]] = -np.inf
        if not timestamps:
            return x
        eot, begin = t["eot"], t["timestamp_begin"]
        x[t["no_timestamps"]] = -np.inf
        check = True
        if not generated:
            x[:begin] = -np.inf
            x[begin + max_initial + 1:] = -np.inf
            check = False
        else:
            last = generated[-1]
            if last >= begin:
                penultimate = generated[-2] if len(generated) > 1 else last
                if penultimate >= begin:  # a pair is complete: text (or the end) next
                    x[begin:] = -np.inf
                    check = False
                else:  # a timestamp opened: another (not earlier) or the end next
                    x[:eot] = -np.inf
                    x[begin:last] = -np.inf
            else:
                stamps = [g for g in generated if g >= begin]
                if stamps:  # timestamps never decrease
                    x[begin:stamps[-1] + 1] = -np.inf
        if check:
            finite = np.where(np.isfinite(x), x, -np.inf)
            text_best = finite[:begin].max()
            stamps = finite[begin:]
            top = stamps.max()
            mass = top + np.log(np.exp(stamps - top).sum()) if np.isfinite(top) else -np.inf
            if mass > text_best:
                x[:begin] = -np.inf
        return x

    def _step(self, ids: list[list[int]], cached: int, memory):
        """One decoder step: ``ids`` ``[B, T]`` after ``cached`` tokens; returns its outputs (on the device with
        WebGPU)."""
        feeds = {"input_ids": np.asarray(ids, np.int64), "past_sequence_length": np.asarray([cached], np.int64),
                 "encoder_hidden_states": memory}
        return self.decoder.run(feeds, output="gpu") if self._gpu else self.decoder.run(feeds)

    def _decode(self, states, prompt: list[int], timestamps: bool, max_new: int, stats: TranscriptionStats,
                max_initial: int) -> list[int]:
        """Greedy decoding of one window: the prompt, then up to ``max_new`` tokens (the end token excluded)."""
        empty = np.zeros((1, 0, self.spec["width"]), np.float32)
        generated: list[int] = []
        ids, cached, memory = prompt, 0, states
        t0 = time.perf_counter()
        while len(generated) < max_new:
            out = self._step([ids], cached, memory)
            cached += len(ids)
            memory = empty
            if timestamps or not generated:
                scores = self._suppressed(host_array(out["logits"]).reshape(-1), generated, timestamps, max_initial)
                token = int(np.argmax(scores))
            else:
                token = int(host_array(out["next_token"]).reshape(-1)[-1])
            release_tensors(out.values())
            if token == self.tokens["eot"]:
                break
            generated.append(token)
            ids = [token]
        stats.decode_ms += (time.perf_counter() - t0) * 1e3
        stats.tokens += len(generated)
        return generated

    def _decode_beam(self, states, prompt: list[int], timestamps: bool, max_new: int, stats: TranscriptionStats,
                     max_initial: int, beam: int, patience: float, length_penalty: float) -> list[int]:
        """Beam search over one window, CTranslate2's ``BeamSearch::search`` (src/decoding.cc): each step's
        log-probabilities (after the same suppression as greedy decoding) added to each hypothesis' sum, the best
        ``2 * beam`` continuations of all hypotheses; of the first ``beam``, one ending (the end token, or the
        step limit) is finished and replaced by the next candidate that does not end. Done at
        ``round(beam * patience)`` finished hypotheses; the best by sum / length ** ``length_penalty``. The
        prompt runs once as one hypothesis; the decoder's self-attention cache is then copied to every
        hypothesis and reordered after each step (:meth:`reorder_state`), the cross-attention cache shared."""
        eot = self.tokens["eot"]
        empty = np.zeros((1, 0, self.spec["width"]), np.float32)
        candidates, enough = 2 * beam, max(1, round(beam * patience))
        finished: list[tuple[float, list[int]]] = []
        alive: list[list[int]] = [[]]
        sums = np.zeros(1, np.float32)  # (float32 sums, as CTranslate2 keeps them)
        t0 = time.perf_counter()
        out = self._step([prompt], 0, states)
        cached = len(prompt)
        for step in range(max_new):
            logits = host_array(out["logits"]).reshape(len(alive), -1)
            release_tensors(out.values())
            vocab = logits.shape[1]
            logp = np.stack([_log_softmax(self._suppressed(row, seq, timestamps, max_initial))
                             for row, seq in zip(logits, alive)])
            total = (logp + sums[:, None]).reshape(-1)
            top = np.argpartition(-total, candidates)[:candidates] if total.size > candidates else \
                np.arange(total.size)
            top = top[np.lexsort((top, -total[top]))]  # best first; ties: the lower index
            origin, token, score = top // vocab, top % vocab, total[top]
            last = step + 1 == max_new
            keep, spare = [], beam
            for k in range(min(beam, len(top))):
                pick = k
                if token[k] == eot or last:
                    seq = alive[origin[k]] + ([] if token[k] == eot else [int(token[k])])
                    finished.append((float(score[k]), seq))
                    for j in range(spare, len(top)):  # another continuation takes its place
                        if token[j] != eot:
                            pick, spare = j, j + 1
                            break
                keep.append(pick)
            if last or len(finished) >= enough:
                break
            alive = [alive[origin[j]] + [int(token[j])] for j in keep]
            sums = score[keep]
            self.decoder.reorder_state(origin[keep])
            out = self._step([[seq[-1]] for seq in alive], cached, empty)
            cached += 1
        stats.decode_ms += (time.perf_counter() - t0) * 1e3

        def normalised(f: tuple[float, list[int]]) -> float:
            return f[0] / len(f[1]) ** length_penalty if f[1] else -np.inf

        best = max(finished, key=normalised)[1] if finished else []
        stats.tokens += len(best)
        return best

    def _text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode([t for t in tokens if t < self.tokens["eot"]])

    def segments(self, audio: str | os.PathLike | np.ndarray, *, sample_rate: int | None = None,
                 timestamps: bool = False, language: str | None = None, task: str = "transcribe",
                 condition_on_previous_text: bool = True, max_initial_timestamp: float = 1.0,
                 beam_size: int = 1, patience: float = 1.0, length_penalty: float = 1.0,
                 stats: TranscriptionStats | None = None) -> Iterator[Segment]:
        """Transcribe ``audio``, yielding segments as each window is decoded (see :meth:`transcribe`)."""
        beams = int(self.spec.get("beams", 1))
        if not (isinstance(beam_size, int) and 1 <= beam_size <= beams):
            raise KilnError(f"beam size {beam_size!r} is not from 1 to {beams} (the decoder's cache holds {beams} "
                            "hypotheses; kiln compile --beams sets it)")
        if not patience > 0 or not math.isfinite(length_penalty):
            raise KilnError(f"patience must be > 0 and length_penalty finite, not {patience!r}, {length_penalty!r}")
        if self._busy:
            raise KilnError("this speech session is already transcribing (its decoder holds one cache); finish or "
                            "close the other transcription, or load another session")
        if task not in ("transcribe", "translate"):
            raise KilnError(f"task must be 'transcribe' or 'translate', not {task!r}")
        if language is not None and (not self.spec["multilingual"] or language not in self.spec["languages"]):
            known = ", ".join(sorted(self.spec["languages"])) if self.spec["multilingual"] else "none: English only"
            raise KilnError(f"language {language!r} is not one of the model's ({known})")
        samples, rate = load_audio(audio, sample_rate)
        seconds = len(samples) / rate
        if seconds > MAX_AUDIO_S:
            raise KilnError(f"the audio is {seconds:.0f} s long; at most {MAX_AUDIO_S} s is transcribed at once "
                            "(split it)")
        stats = stats if stats is not None else TranscriptionStats()
        stats.audio_s = seconds
        self._busy = True
        try:
            t0 = time.perf_counter()
            samples = self.resample(samples, rate)
            stats.resample_ms = (time.perf_counter() - t0) * 1e3
            search = (beam_size, patience, length_penalty)
            yield from self._segments(samples, timestamps, language, task, condition_on_previous_text,
                                      max_initial_timestamp, search, stats, t0)
        finally:
            self._busy = False

    def _segments(self, samples, timestamps, language, task, condition, max_initial_timestamp, search, stats,
                  t_start):
        s, tk = self.spec, self.tokens
        t0 = time.perf_counter()
        raw, top = self.features(samples)
        stats.features_ms = (time.perf_counter() - t0) * 1e3
        n_frames, per_s = s["frames"], s["sample_rate"] / s["hop"]  # 3000 frames, 100 a second
        content = raw.shape[1] - 1
        precision = s["time_precision"]
        stride = s["input_stride"]
        max_initial = round(max_initial_timestamp / precision)
        seek, history, reset = 0, [], 0
        begin = tk["timestamp_begin"]
        window = np.zeros((1, raw.shape[0], n_frames), np.float32)
        while seek < content:
            size = min(n_frames, content - seek)
            offset = seek / per_s
            window[:] = 0.0
            window[0, :, :size] = raw[:, seek:seek + size]
            t0 = time.perf_counter()
            feeds = {"log_mel": window, "log_mel_max": np.asarray([top], np.float32),
                     "frames": np.asarray([size], np.int64)}
            enc = self.encoder.run(feeds, output="gpu") if self._gpu else self.encoder.run(feeds)
            states = enc["encoder_hidden_states"]
            if self._gpu:
                self.encoder.sync()
            stats.encode_ms += (time.perf_counter() - t0) * 1e3
            stats.windows += 1
            prompt = self._prompt(history[reset:], timestamps, language, task)
            max_new = min(s["max_context"] // 2, s["max_context"] - (len(prompt) - 1))
            if search[0] > 1:
                tokens = self._decode_beam(states, prompt, timestamps, max_new, stats, max_initial, *search)
            else:
                tokens = self._decode(states, prompt, timestamps, max_new, stats, max_initial)
            release_tensors([states])
            found, after = _split(tokens, begin, offset, size, size / per_s, seek, precision, stride)
            # a window whose last complete timestamp is <|0.00|> would be decoded again, the same, for ever (the
            # reference loops so): go on after it instead
            seek = after if after > seek else seek + size
            for seg in found:
                text = self._text(seg.tokens)
                if seg.start == seg.end or not text.strip():
                    continue
                seg.text = text
                history.extend(seg.tokens)
                yield seg
            if not condition:
                reset = len(history)
        stats.total_ms = (time.perf_counter() - t_start) * 1e3

    def transcribe(self, audio: str | os.PathLike | np.ndarray, *, sample_rate: int | None = None,
                   timestamps: bool = False, language: str | None = None, task: str = "transcribe",
                   condition_on_previous_text: bool = True, max_initial_timestamp: float = 1.0,
                   beam_size: int = 1, patience: float = 1.0, length_penalty: float = 1.0,
                   on_segment: Callable[[Segment], None] | None = None) -> Transcript:
        """Transcribe a recording (greedy decoding or beam search; the module docstring says how).

        Args:
            audio: a sound file (WAV, FLAC, OGG, MP3) or float32 samples (with ``sample_rate``).
            sample_rate: the samples' rate in Hz (arrays only); other rates than 16 kHz are resampled on the
                device (:meth:`resample`).
            timestamps: segment timestamps from the model's timestamp tokens (else one segment per 30-s window).
            language: the spoken language's code (multilingual models; default ``en``).
            task: ``transcribe``, or ``translate`` (to English; multilingual models).
            condition_on_previous_text: prompt each window with the text decoded so far (Whisper's default).
            max_initial_timestamp: the first timestamp of a window is at most this many seconds in.
            beam_size: 1 for greedy decoding, else beam search with this many hypotheses (at most the package's
                ``beams``, 5 by default; faster-whisper's default is 5).
            patience: beam search stops at ``round(beam_size * patience)`` finished hypotheses (Kasai et al. 2022).
            length_penalty: beam search ranks finished hypotheses by log-probability / length ** this.
            on_segment: called with each segment as it is decoded.

        Returns:
            :class:`Transcript`: segments, text and :class:`TranscriptionStats`.

        Raises:
            KilnError: unreadable or empty audio, a sample rate it cannot resample, audio over :data:`MAX_AUDIO_S`,
                an unknown language or task, a beam size the package cannot hold, or a transcription already
                running on this session.
        """
        result = Transcript()
        for seg in self.segments(audio, sample_rate=sample_rate, timestamps=timestamps, language=language,
                                 task=task, condition_on_previous_text=condition_on_previous_text,
                                 max_initial_timestamp=max_initial_timestamp, beam_size=beam_size,
                                 patience=patience, length_penalty=length_penalty, stats=result.stats):
            result.segments.append(seg)
            if on_segment is not None:
                on_segment(seg)
        return result


def _log_softmax(x: np.ndarray) -> np.ndarray:
    """``log(softmax(x))`` of a float32 row, -inf entries staying -inf."""
    top = x.max()
    return x - (top + np.log(np.exp(x - top).sum()))


def _split(tokens: list[int], begin: int, offset: float, size: int, duration: float, seek: int, precision: float,
           stride: int) -> tuple[list[Segment], int]:
    """A window's tokens as segments (split after each pair of consecutive timestamps) and the next seek (frames):
    faster-whisper's ``_split_segments_by_timestamps``."""
    single_end = len(tokens) >= 2 and tokens[-2] < begin <= tokens[-1]
    pairs = [i for i in range(1, len(tokens)) if tokens[i] >= begin and tokens[i - 1] >= begin]
    if pairs:
        cuts = pairs + ([len(tokens)] if single_end else [])
        out, last = [], 0
        for cut in cuts:
            part = tokens[last:cut]
            out.append(Segment(offset + (part[0] - begin) * precision, offset + (part[-1] - begin) * precision, "",
                               part))
            last = cut
        if single_end:
            return out, seek + size
        return out, seek + (tokens[last - 1] - begin) * stride
    end = duration
    stamps = [t for t in tokens if t >= begin]
    if stamps and stamps[-1] != begin:
        end = (stamps[-1] - begin) * precision
    return [Segment(offset, offset + end, "", tokens)], seek + size
