"""Whisper speech recognition (Radford et al. 2022, "Robust Speech Recognition via Large-Scale Weak Supervision")
from a CTranslate2 model folder (``model.bin``, ``config.json``, ``tokenizer.json``), as three graph-IR programs:

- :func:`log_mel_graph`: float32 ``audio [1, blocks, 160]`` (up to 30 s of 16 kHz samples with the STFT's context in
  rows of 160, :func:`kiln.runtime.speech.mel_blocks`; ``blocks`` a run-time dim) -> ``log_mel [1, n_mels, frames]``
  (``log10(max(mel power, 1e-10))``) and ``log_mel_max [1]``. The STFT (400-sample periodic Hann window, hop 160)
  is a MatMul of the frames (rows of 400 samples) with the window folded into cos/sin filters, the power a sum of
  squares, the mel filterbank (Slaney's, librosa's default, :func:`mel_filters`) a MatMul.
- :func:`encoder_graph`: ``log_mel [1, n_mels, 3000]``, ``log_mel_max [1]`` (the maximum over the whole
  recording) and ``frames`` int64 ``[1]`` (the window's frames that hold audio) -> ``encoder_hidden_states
  [1, 1500, D]``. Whisper's normalisation ``(max(x, max - 8) + 4) / 4`` is applied on the device, frames from
  ``frames`` on are zero (the reference pads a short window's normalised features with zeros); then two
  Conv1d + GELU (the second of stride 2), the sinusoidal positions, pre-norm transformer layers, a final LayerNorm.
- :func:`decoder_graph`: one decoder step over run-time dims ``sequence`` (``T``, new tokens), ``past_sequence``
  (``P``) and ``encoder_sequence`` (``E``, 1500 or 0): inputs ``input_ids`` int64 ``[1, T]``,
  ``past_sequence_length`` int64 ``[1]`` (its value is ``P``) and ``encoder_hidden_states [1, E, D]``; outputs
  ``logits [1, 1, vocab]`` (the last token's) and ``next_token`` int64 ``[1, 1]`` (the arg max after the model's
  ``suppress_ids``). State: per layer the self-attention cache ``past_key_values.l.key/.value [1, H, 448, hd]``
  and the cross-attention cache ``cross_key_values.l.key/.value [1, H, 1500, hd]``. A window's first step feeds
  the encoder's output (``E = 1500``): the cross keys and values are projected once and written into their cache
  (TensorScatter, in place); later steps feed ``E = 0`` and read the cache. Self-attention is causal with the
  in-place cache of :func:`kiln.frontend.decoder.causal_attention`; the output projection is the token embedding
  (tied).

CTranslate2's Whisper layout (``ctranslate2/specs/whisper_spec.py``, revision 3): ``encoder/conv1``,
``encoder/conv2``, ``encoder/position_encodings/encodings``, ``encoder/layer_N/self_attention/linear_0`` (Q, K, V
fused; K's bias is zero) and ``linear_1`` (output), ``ffn/linear_0``, ``ffn/linear_1``; the decoder's
``self_attention`` as the encoder's, ``attention/linear_0`` (cross Q), ``linear_1`` (cross K, V fused),
``linear_2`` (output); ``decoder/embeddings/weight`` (its alias ``decoder/projection/weight``);
``decoder/position_encodings/encodings [448, D]``. LayerNorm epsilon 1e-5, exact (erf) GELU.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kiln.arith import symbolic
from kiln.errors import ModelFormatError
from kiln.frontend import decoder
from kiln.frontend.ctranslate2 import CT2Model, read_ctranslate2
from kiln.frontend.shapes import reshape, transpose
from kiln.ir.graph import Builder, Graph, Value

__all__ = ["CHUNK_SAMPLES", "HOP", "N_FFT", "N_FRAMES", "SAMPLE_RATE", "WhisperConfig", "WhisperModel",
           "decoder_graph", "encoder_graph", "log_mel_graph", "mel_filters", "read_whisper", "speech_manifest"]

SAMPLE_RATE = 16000  #: Hz
N_FFT = 400  #: samples per STFT frame (25 ms)
HOP = 160  #: samples between frames (10 ms)
N_FRAMES = 3000  #: mel frames in a 30-s window
#: hop-long blocks a frame spans (a 400-sample frame: two blocks and half the third)
FRAME_BLOCKS = -(-N_FFT // HOP)
#: the most samples one ``log_mel`` run reads: a window's 3000 frames as 3002 rows of 160 (:func:`log_mel_graph`)
CHUNK_SAMPLES = (N_FRAMES + FRAME_BLOCKS - 1) * HOP
EPS = 1e-5


@dataclass(frozen=True)
class WhisperConfig:
    """A Whisper model's sizes, from its variables, and its decoding configuration (``config.json``).

    Attributes:
        n_mels: mel bins (80; 128 for large-v3).
        width: the model width ``D``.
        encoder_layers, encoder_heads, decoder_layers, decoder_heads: the transformer's sizes.
        vocab: the vocabulary (51864 English-only, 51865 multilingual, 51866 large-v3).
        audio_ctx: encoder positions (1500); text_ctx: decoder positions (448).
        suppress_ids: tokens never sampled; suppress_ids_begin: not sampled first (the blank, end of text).
        lang_ids: the language tokens (multilingual models); alignment_heads: (layer, head) pairs for word timing.
    """

    n_mels: int
    width: int
    encoder_layers: int
    encoder_heads: int
    decoder_layers: int
    decoder_heads: int
    vocab: int
    audio_ctx: int
    text_ctx: int
    suppress_ids: tuple[int, ...] = ()
    suppress_ids_begin: tuple[int, ...] = ()
    lang_ids: tuple[int, ...] = ()
    alignment_heads: tuple[tuple[int, int], ...] = field(default=())

    @property
    def multilingual(self) -> bool:
        """Whether the vocabulary has the language tokens (51865 and up)."""
        return self.vocab >= 51865


@dataclass
class WhisperModel:
    """A CTranslate2 Whisper model: its variables (float32), :class:`WhisperConfig` and folder."""

    variables: dict[str, np.ndarray]
    config: WhisperConfig
    folder: Path

    def w(self, name: str) -> np.ndarray:
        """Variable ``name`` as float32.

        Raises:
            ModelFormatError: the file has no such variable.
        """
        if name not in self.variables:
            raise ModelFormatError(f"the Whisper model in {self.folder} has no variable {name}")
        return np.asarray(self.variables[name], np.float32)


def _layers(ct2: CT2Model, prefix: str) -> int:
    n = 0
    while f"{prefix}/layer_{n}/ffn/linear_0/weight" in ct2.variables:
        n += 1
    return n


def read_whisper(folder: str | os.PathLike) -> WhisperModel:
    """Read a CTranslate2 Whisper model folder (``model.bin`` and ``config.json``; ``tokenizer.json`` is read by
    the package writer).

    Raises:
        ModelFormatError: no ``model.bin``, a CTranslate2 model of another type (its spec is named), or variables
            missing or of unexpected shapes.
    """
    root = Path(folder)
    if root.is_file():
        root = root.parent
    if not (root / "model.bin").is_file():
        raise ModelFormatError(f"{root} has no model.bin: not a CTranslate2 model folder")
    ct2 = read_ctranslate2(root / "model.bin")
    if ct2.spec != "WhisperSpec":
        raise ModelFormatError(f"{root / 'model.bin'} is a CTranslate2 {ct2.spec}, not a Whisper model (WhisperSpec)")
    meta = {}
    if (root / "config.json").is_file():
        try:
            meta = json.loads((root / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise ModelFormatError(f"{root / 'config.json'} is not readable JSON: {e}") from None
        if not isinstance(meta, dict):
            raise ModelFormatError(f"{root / 'config.json'} is not a JSON object")
    v = ct2.variables
    try:
        conv1 = v["encoder/conv1/weight"]
        emb = v["decoder/embeddings/weight"]
        cfg = WhisperConfig(
            n_mels=int(conv1.shape[1]), width=int(conv1.shape[0]),
            encoder_layers=_layers(ct2, "encoder"), encoder_heads=ct2.scalar("encoder/num_heads"),
            decoder_layers=_layers(ct2, "decoder"), decoder_heads=ct2.scalar("decoder/num_heads"),
            vocab=int(emb.shape[0]), audio_ctx=int(v["encoder/position_encodings/encodings"].shape[0]),
            text_ctx=int(v["decoder/position_encodings/encodings"].shape[0]),
            suppress_ids=tuple(int(i) for i in meta.get("suppress_ids", [])),
            suppress_ids_begin=tuple(int(i) for i in meta.get("suppress_ids_begin", [])),
            lang_ids=tuple(int(i) for i in meta.get("lang_ids", [])),
            alignment_heads=tuple((int(a), int(b)) for a, b in meta.get("alignment_heads", [])))
    except KeyError as e:
        raise ModelFormatError(f"{root / 'model.bin'}: a WhisperSpec without {e.args[0]}") from None
    except (IndexError, TypeError, ValueError, OverflowError) as e:  # a variable's rank, config.json's types or values
        raise ModelFormatError(f"{root}: not a Whisper model Kiln reads ({type(e).__name__}: {e})") from None
    if min(cfg.encoder_heads, cfg.decoder_heads, cfg.encoder_layers, cfg.decoder_layers, cfg.width) < 1 or \
            cfg.width % cfg.encoder_heads or cfg.width % cfg.decoder_heads:
        raise ModelFormatError(f"{root / 'model.bin'}: width {cfg.width} does not split into "
                               f"{cfg.encoder_heads}/{cfg.decoder_heads} heads (or no layers)")
    _check_shapes(v, cfg, root)
    _check_decoder_flags(v, root)
    if cfg.audio_ctx * 2 != N_FRAMES:
        raise ModelFormatError(f"{root / 'model.bin'}: {cfg.audio_ctx} encoder positions; Whisper has "
                               f"{N_FRAMES // 2} (30-s windows)")
    return WhisperModel(v, cfg, root)


#: the decoder attributes CTranslate2's TransformerDecoder reads, with its defaults when a file lacks one, and the
#: values of Whisper (ctranslate2/specs/whisper_spec.py): what this frontend builds
_DECODER_FLAGS = {"scale_embeddings": (1, 0), "pre_norm": (1, 1), "activation": (0, 3), "alibi": (0, 0),
                  "start_from_zero_embedding": (0, 0)}


def _check_decoder_flags(v: dict[str, np.ndarray], root: Path) -> None:
    """Refuse a decoder that CTranslate2 would run otherwise than Whisper's (embeddings scaled by sqrt(D),
    post-norm, another activation than GELU (3), ALiBi): a flag missing from the file takes CTranslate2's default.

    Raises:
        ModelFormatError: naming the flag, its value and Whisper's.
    """
    for name, (default, whisper) in _DECODER_FLAGS.items():
        key = f"decoder/{name}"
        got = int(np.asarray(v[key]).reshape(-1)[0]) if key in v and np.asarray(v[key]).size else default
        if got != whisper:
            raise ModelFormatError(f"{root / 'model.bin'}: {key} is {got}{'' if key in v else ' (the default)'}, "
                                   f"Whisper's is {whisper}; not a Whisper decoder Kiln builds")


def _check_shapes(v: dict[str, np.ndarray], c: WhisperConfig, root: Path) -> None:
    """Every variable the graphs read, with the shape they need (a corrupt or foreign file fails here, by name)."""
    d, ff = c.width, None
    want = {"encoder/conv1/weight": (d, c.n_mels, 3), "encoder/conv2/weight": (d, d, 3),
            "encoder/position_encodings/encodings": (c.audio_ctx, d), "decoder/embeddings/weight": (c.vocab, d),
            "decoder/position_encodings/encodings": (c.text_ctx, d)}
    for side, layers in (("encoder", c.encoder_layers), ("decoder", c.decoder_layers)):
        for i in range(layers):
            p = f"{side}/layer_{i}/"
            ff = ff or (v[p + "ffn/linear_0/weight"].shape[0] if p + "ffn/linear_0/weight" in v else None)
            want |= {p + "self_attention/linear_0/weight": (3 * d, d), p + "self_attention/linear_1/weight": (d, d),
                     p + "ffn/linear_0/weight": (ff, d), p + "ffn/linear_1/weight": (d, ff)}
            if side == "decoder":
                want |= {p + "attention/linear_0/weight": (d, d), p + "attention/linear_1/weight": (2 * d, d),
                         p + "attention/linear_2/weight": (d, d)}
    for name, shape in want.items():
        got = v.get(name)
        if got is None or tuple(got.shape) != shape or got.dtype.kind != "f":
            what = "missing" if got is None else f"{got.dtype} {list(got.shape)}"
            raise ModelFormatError(f"{root / 'model.bin'}: {name} is {what}; a Whisper model of width {d} has "
                                   f"{list(shape)} floats")


# ----------------------------------------------------------------------------------------------- audio front end
def mel_filters(n_mels: int, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """Slaney's mel filterbank (librosa.filters.mel's default, ``htk=False, norm="slaney"``; what Whisper uses):
    ``[n_mels, n_fft // 2 + 1]`` float32 triangles between centres spaced evenly on the Slaney mel scale
    (linear to 1 kHz, logarithmic above) from 0 Hz to ``sample_rate / 2``, each scaled to unit area
    (``2 / (f_right - f_left)``)."""
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0

    def hz_to_mel(f: float) -> float:
        return f / f_sp if f < min_log_hz else min_log_mel + math.log(f / min_log_hz) / logstep

    mels = np.linspace(0.0, hz_to_mel(sample_rate / 2), n_mels + 2)
    hz = np.where(mels >= min_log_mel, min_log_hz * np.exp(logstep * (mels - min_log_mel)), f_sp * mels)
    bins = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)
    ramps = hz[:, None] - bins[None, :]
    gaps = np.diff(hz)
    lower = -ramps[:-2] / gaps[:-1, None]
    upper = ramps[2:] / gaps[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper)) * (2.0 / (hz[2:] - hz[:-2]))[:, None]
    return weights.astype(np.float32)


def _stft_filters(n_fft: int) -> np.ndarray:
    """``[n_fft, 2 * bins + 2]``: the periodic Hann window times ``cos`` then times ``-sin`` of ``2 pi j k / n`` (angles
    reduced exactly, ``j k mod n``), the real and imaginary parts of a one-sided DFT as the columns of a MatMul's
    right operand, and two zero columns (404 for Whisper: a multiple of 4, so the C targets' product vectorises along
    its columns while its rows, the frames, are a run-time dim)."""
    j = np.arange(n_fft)
    k = np.arange(n_fft // 2 + 1)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * j / n_fft)  # periodic Hann (torch.hann_window, np.hanning(n+1)[:-1])
    theta = 2 * np.pi * ((k[:, None] * j[None, :]) % n_fft) / n_fft
    filters = np.concatenate([np.cos(theta), -np.sin(theta), np.zeros((2, n_fft))]) * window[None, :]
    return np.ascontiguousarray(filters.T).astype(np.float32)


def log_mel(b: Builder, blocks: Value, n_mels: int) -> tuple[Value, Value]:
    """``log10(max(mel power, 1e-10))`` ``[1, n_mels, frames]`` of ``blocks [1, frames + FRAME_BLOCKS - 1, HOP]``
    (the samples in rows of 160: frame ``f`` = samples ``f * 160 .. f * 160 + 399``), and its maximum ``[1]``.

    Frames are rows (the row's blocks side by side, the last cut to the frame's length); the STFT is their product with
    the filters of :func:`_stft_filters`, the power a sum of squares, the filterbank a MatMul, each with the frames
    outermost (a run-time dim: a short recording computes its own frames only), transposed at the end."""
    bins = N_FFT // 2 + 1
    frames = blocks.shape[1] - (FRAME_BLOCKS - 1)
    pieces = [b.op("Slice", [blocks], starts=(0, k, 0), ends=(1, k + frames, min(HOP, N_FFT - k * HOP)),
                   steps=(1, 1, 1)) for k in range(FRAME_BLOCKS)]
    framed = b.op("Concat", pieces, axis=2)  # [1, frames, N_FFT]
    spec = b.op("MatMul", [framed, b.const(_stft_filters(N_FFT), name="stft_filters")])  # [1, frames, 2 * bins + 2]
    sq = b.op("Mul", [spec, spec])
    re = b.op("Slice", [sq], starts=(0, 0, 0), ends=(1, frames, bins), steps=(1, 1, 1))
    im = b.op("Slice", [sq], starts=(0, 0, bins), ends=(1, frames, 2 * bins), steps=(1, 1, 1))
    power = b.op("Add", [re, im])  # [1, frames, bins]
    filters = np.ascontiguousarray(mel_filters(n_mels).T)
    mel = b.op("MatMul", [power, b.const(filters, name="mel_filters")])  # [1, frames, n_mels]
    mel = b.op("Max", [mel, b.const(np.array(1e-10, np.float32))])
    logs = b.op("Mul", [b.op("Log", [mel]), b.const(np.array(1 / math.log(10), np.float32))])
    rows = b.op("ReduceMax", [logs], axes=(2,), keepdims=0)  # (a frame's, then the chunk's: short loops on GPUs)
    top = reshape(b, b.op("ReduceMax", [rows], axes=(0, 1), keepdims=0), (1,))
    return transpose(b, logs, (0, 2, 1)), top


def log_mel_graph(n_mels: int = 80) -> Graph:
    """The audio front end: ``audio [1, blocks, HOP]`` (a chunk of up to :data:`N_FRAMES` frames of the padded
    recording in rows of 160 samples, :func:`kiln.runtime.speech.mel_blocks`; ``blocks`` a run-time dim, frames + 2)
    -> ``log_mel [1, n_mels, frames]`` and its maximum ``log_mel_max [1]``."""
    g = Graph(name="whisper_log_mel")
    hi = CHUNK_SAMPLES // HOP
    g.size_vars = {"blocks": symbolic.size_var("blocks", 0, FRAME_BLOCKS, hi, opt=hi)}
    audio = Value("audio", "float32", (1, g.size_vars["blocks"], HOP), sym_shape=(1, "blocks", HOP))
    g.inputs.append(audio)
    out, top = log_mel(Builder(g), audio, n_mels)
    out.name = "log_mel"
    top.name = "log_mel_max"
    g.outputs = [out, top]
    return g


# ----------------------------------------------------------------------------------------------- the transformer
def _linear(b: Builder, m: WhisperModel, x: Value, name: str, bias: bool = True) -> Value:
    w = b.const(np.ascontiguousarray(m.w(name + "/weight").T), name=name)
    return decoder.linear(b, x, w, b.const(m.w(name + "/bias")) if bias and name + "/bias" in m.variables else None)


def _norm(b: Builder, m: WhisperModel, x: Value, name: str) -> Value:
    return decoder.layer_norm(b, x, b.const(m.w(name + "/gamma")), b.const(m.w(name + "/beta")), EPS)


def _heads(b: Builder, x: Value, heads: int) -> Value:
    """``[B, S, D]`` -> head-major ``[B, H, S, hd]``."""
    n, s, d = x.shape
    return transpose(b, reshape(b, x, (n, s, heads, d // heads)), (0, 2, 1, 3))


def _split(b: Builder, x: Value, parts: int) -> list[Value]:
    """``[B, S, parts * D]`` -> ``parts`` slices ``[B, S, D]`` (fused projections)."""
    n, s, d = x.shape[0], x.shape[1], x.shape[2] // parts
    return [b.op("Slice", [x], starts=(0, 0, i * d), ends=(n, s, (i + 1) * d), steps=(1, 1, 1)) for i in range(parts)]


def _ffn(b: Builder, m: WhisperModel, x: Value, p: str) -> Value:
    h = _norm(b, m, x, p + "ffn/layer_norm")
    h = b.op("Gelu", [_linear(b, m, h, p + "ffn/linear_0")], approximate="none")
    return b.op("Add", [x, _linear(b, m, h, p + "ffn/linear_1")])


def encoder_graph(m: WhisperModel) -> Graph:
    """The encoder of one 30-s window (module docstring): ``log_mel``, ``log_mel_max``, ``frames`` ->
    ``encoder_hidden_states [1, 1500, D]``."""
    c = m.config
    g = Graph(name="whisper_encoder")
    mel = Value("log_mel", "float32", (1, c.n_mels, N_FRAMES))
    top = Value("log_mel_max", "float32", (1,))
    frames = Value("frames", "int64", (1,))
    g.inputs += [mel, top, frames]
    b = Builder(g)
    floor = b.op("Sub", [top, b.const(np.array(8.0, np.float32))])
    x = b.op("Div", [b.op("Add", [b.op("Max", [mel, floor]), b.const(np.array(4.0, np.float32))]),
                     b.const(np.array(4.0, np.float32))])
    frame = b.const(np.arange(N_FRAMES, dtype=np.int64).reshape(1, 1, N_FRAMES))
    x = b.op("Where", [b.op("Less", [frame, frames]), x, b.const(np.array(0.0, np.float32))])
    for i, stride in ((1, 1), (2, 2)):
        x = b.op("Conv", [x, b.const(m.w(f"encoder/conv{i}/weight"), name=f"encoder.conv{i}")], strides=(stride,),
                 dilations=(1,), pads=(1, 1), group=1)
        x = b.op("Gelu", [b.op("Add", [x, b.const(m.w(f"encoder/conv{i}/bias").reshape(-1, 1))])], approximate="none")
    x = b.op("Add", [transpose(b, x, (0, 2, 1)), b.const(m.w("encoder/position_encodings/encodings"))])
    hd = c.width // c.encoder_heads
    for layer in range(c.encoder_layers):
        p = f"encoder/layer_{layer}/"
        h = _norm(b, m, x, p + "self_attention/layer_norm")
        q, k, v = (_heads(b, t, c.encoder_heads) for t in _split(b, _linear(b, m, h, p + "self_attention/linear_0"), 3))
        x = b.op("Add", [x, _linear(b, m, decoder.attention(b, q, k, v, 1 / math.sqrt(hd)),
                                    p + "self_attention/linear_1")])
        x = _ffn(b, m, x, p)
    out = _norm(b, m, x, "encoder/layer_norm")
    out.name = "encoder_hidden_states"
    g.outputs = [out]
    return g


def decoder_graph(m: WhisperModel, max_tokens: int | None = None, beams: int = 1) -> Graph:
    """One decoder step (module docstring).

    Args:
        m: the model.
        max_tokens: the most tokens one step takes (``T``; default the context, 448).
        beams: the most hypotheses one step decodes (beam search's width): the run-time dim ``beam`` (``B``,
            1 for greedy decoding) is at most this, and the self-attention cache holds this many.
    """
    c = m.config
    ctx, frames_max = c.text_ctx, c.audio_ctx
    g = Graph(name="whisper_decoder")
    seq = symbolic.size_var("sequence", 0, 1, max_tokens or ctx, opt=1)  # schedules for single-token steps
    past = symbolic.size_var("past_sequence", 1, 0, ctx - 1)
    enc = symbolic.size_var("encoder_sequence", 2, 0, frames_max, opt=frames_max)
    g.size_vars = {"sequence": seq, "past_sequence": past, "encoder_sequence": enc}
    beam: int | symbolic.Dim = 1
    if beams > 1:
        beam = g.size_vars["beam"] = symbolic.size_var("beam", 3, 1, beams, opt=1)
    ids = Value("input_ids", "int64", (beam, seq), sym_shape=("beam" if beams > 1 else 1, "sequence"))
    write = Value("past_sequence_length", "int64", (1,))
    hidden = Value("encoder_hidden_states", "float32", (1, enc, c.width), sym_shape=(1, "encoder_sequence", c.width))
    g.inputs += [ids, write, hidden]
    g.value_dims = {write.name: "past_sequence"}
    g.dim_limits = [(("past_sequence", "sequence"), ctx)]
    heads, hd = c.decoder_heads, c.width // c.decoder_heads
    caches = {}
    for layer in range(c.decoder_layers):
        for kind, rows in (("past_key_values", ctx), ("cross_key_values", frames_max)):
            for part in ("key", "value"):
                v = Value(f"{kind}.{layer}.{part}", "float32", (beams if kind == "past_key_values" else 1, heads,
                                                                rows, hd))
                g.inputs.append(v)
                g.state[v.name] = f"{'present' if kind == 'past_key_values' else 'cross_present'}.{layer}.{part}"
                caches[v.name] = v
    b = Builder(g)
    table = b.const(m.w("decoder/embeddings/weight"), name="decoder.embeddings")
    pos = decoder.positions(b, past, seq)
    # every hypothesis writes its rows from P: write_indices [B] (TensorScatter's), all P
    writes = b.op("Add", [b.op("Iota", [], shape=(beam,), start=0, delta=0, dtype="int64"), write]) \
        if beams > 1 else write
    x = b.op("Add", [decoder.embed(b, table, ids),
                     b.op("Gather", [b.const(m.w("decoder/position_encodings/encodings")), pos], axis=0)])
    scale = 1 / math.sqrt(hd)
    row0 = b.const(np.zeros(1, np.int64), name="cross_write_row")
    presents: dict[str, Value] = {}
    for layer in range(c.decoder_layers):
        p = f"decoder/layer_{layer}/"
        h = _norm(b, m, x, p + "self_attention/layer_norm")
        q, k, v = _split(b, _linear(b, m, h, p + "self_attention/linear_0"), 3)
        q, k, v = (reshape(b, t, (beam, seq, heads, hd)) for t in (q, k, v))
        out, pk, pv = decoder.causal_attention(b, q, k, v, caches[f"past_key_values.{layer}.key"],
                                               caches[f"past_key_values.{layer}.value"], scale, write=writes,
                                               past_len=past)
        presents[f"past_key_values.{layer}.key"], presents[f"past_key_values.{layer}.value"] = pk, pv
        x = b.op("Add", [x, _linear(b, m, out, p + "self_attention/linear_1")])
        h = _norm(b, m, x, p + "attention/layer_norm")
        q = _heads(b, _linear(b, m, h, p + "attention/linear_0"), heads)
        ek, ev = _split(b, _linear(b, m, hidden, p + "attention/linear_1"), 2)
        cross = []
        for part, t in (("key", ek), ("value", ev)):
            name = f"cross_key_values.{layer}.{part}"
            present = b.op("TensorScatter", [caches[name], _heads(b, t, heads), row0], axis=2, mode="linear")
            presents[name] = present
            cross.append(present)
        attended = decoder.attention(b, q, cross[0], cross[1], scale)
        x = b.op("Add", [x, _linear(b, m, attended, p + "attention/linear_2")])
        x = _ffn(b, m, x, p)
    x = b.op("Slice", [x], starts=(0, seq - 1, 0), ends=(beam, seq, c.width), steps=(1, 1, 1))
    x = _norm(b, m, x, "decoder/layer_norm")
    # the output projection is the embedding (tied): read transposed, not stored twice (const_fold keeps it)
    logits = b.op("MatMul", [x, b.op("Transpose", [table], perm=(1, 0))])
    logits.name = "logits"
    masked = logits
    if c.suppress_ids:
        bias = np.zeros(c.vocab, np.float32)
        bias[[i for i in c.suppress_ids if 0 <= i < c.vocab]] = -np.inf
        masked = b.op("Add", [logits, b.const(bias, name="suppress")])
    best = b.op("ReduceMax", [masked], axes=(2,), keepdims=1)
    top = b.op("ArgMax", [masked, best], axis=2, keepdims=0, select_last_index=0)
    top.name = "next_token"
    g.outputs = [logits, top]
    for name, present_name in g.state.items():
        presents[name].name = present_name
        g.outputs.append(presents[name])
    return g


def speech_manifest(m: WhisperModel) -> dict:
    """The speech package's ``speech.json`` (format 1.0, docs/speech.md) for ``m``: the front end's sizes, the
    parts, the special tokens (from the model's ``tokenizer.json``) and the decoding configuration.

    Raises:
        ModelFormatError: no ``tokenizer.json`` beside the model, or one without Whisper's special tokens.
    """
    c = m.config
    path = m.folder / "tokenizer.json"
    try:
        added = {t["content"]: int(t["id"]) for t in json.loads(path.read_text()).get("added_tokens", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelFormatError(f"{path}: not a readable tokenizer.json ({type(e).__name__}: {e})") from None
    names = {"eot": "<|endoftext|>", "sot": "<|startoftranscript|>", "sot_prev": "<|startofprev|>",
             "no_timestamps": "<|notimestamps|>", "transcribe": "<|transcribe|>",
             "translate": "<|translate|>"}
    missing = [n for n in names.values() if n not in added]
    if missing:
        raise ModelFormatError(f"{path} lacks Whisper's special tokens {', '.join(missing)}")
    tokens = {k: added[v] for k, v in names.items()}
    tokens["timestamp_begin"] = tokens["no_timestamps"] + 1  # <|0.00|> (CTranslate2 and openai-whisper take it so)
    for extra in ("<|nospeech|>", "<|nocaptions|>"):
        if extra in added:
            tokens["no_speech"] = added[extra]
            break
    by_id = {i: t for t, i in added.items()}
    languages = {by_id[i][2:-2]: i for i in c.lang_ids if i in by_id} if c.multilingual else {}
    from kiln.frontend import audio

    resample = {"taps": 2 * audio.HALF_TAPS, "max_outputs": audio.MAX_OUTPUTS, "rolloff": audio.ROLLOFF,
                "zero_crossings": audio.ZERO_CROSSINGS, "min_rate": 4000, "max_rate": SAMPLE_RATE * audio.MAX_RATIO}
    return {"format": "1.2", "kind": "speech-to-text", "architecture": "whisper",
            "parts": {"resample": "resample", "log_mel": "log_mel", "encoder": "encoder", "decoder": "decoder"},
            "resample": resample,
            "tokenizer": "tokenizer.json", "sample_rate": SAMPLE_RATE, "n_fft": N_FFT, "hop": HOP,
            "frames": N_FRAMES, "chunk_samples": CHUNK_SAMPLES, "n_mels": c.n_mels, "width": c.width,
            "vocab": c.vocab, "max_context": c.text_ctx, "time_precision": 0.02, "input_stride": 2,
            "multilingual": c.multilingual, "languages": languages, "tokens": tokens,
            "suppress_ids": [i for i in c.suppress_ids if 0 <= i < c.vocab],
            "suppress_ids_begin": [i for i in c.suppress_ids_begin if 0 <= i < c.vocab],
            "alignment_heads": [list(h) for h in c.alignment_heads]}
