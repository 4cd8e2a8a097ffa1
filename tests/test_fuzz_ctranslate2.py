"""Fuzzing the CTranslate2 and Whisper readers (issues 17 and 19): whatever bytes ``model.bin`` and ``config.json``
hold, reading ends in a valid model or a :class:`~kiln.errors.KilnError` with a one-line message: never another
exception, a hang or an allocation the file's size does not bound.

Hypothesis (derandomized: the same inputs every run, a bounded number of them) mutates a small valid WhisperSpec
file (bit flips, truncations, spliced bytes, counts and sizes overwritten with extreme values) and generates
``config.json`` contents; a longer campaign is ``python -m tools.fuzz_campaign ctranslate2``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from fuzzing import fuzz_settings, mutated
from hypothesis import given
from hypothesis import strategies as st

from kiln.errors import KilnError
from kiln.frontend import whisper
from kiln.frontend.ctranslate2 import read_ctranslate2

FUZZ = fuzz_settings(300)

_IDS = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4}


def _text(s: str) -> bytes:
    return struct.pack("<H", len(s) + 1) + s.encode() + b"\0"


def ct2_bytes(spec: str, variables: dict[str, np.ndarray], aliases: dict[str, str] | None = None) -> bytes:
    """A CTranslate2 model file in the layout of ctranslate2's ModelSpec._serialize (binary version 6)."""
    out = struct.pack("<I", 6) + _text(spec) + struct.pack("<II", 3, len(variables))
    for name, a in variables.items():
        out += _text(name) + struct.pack("<B", a.ndim) + b"".join(struct.pack("<I", d) for d in a.shape)
        out += struct.pack("<BI", _IDS[str(a.dtype)], a.nbytes) + a.tobytes()
    out += struct.pack("<I", len(aliases or {}))
    for alias, target in (aliases or {}).items():
        out += _text(alias) + _text(target)
    return out


#: the decoder attributes CTranslate2's WhisperSpec writes (without them CTranslate2 runs another decoder)
DECODER_FLAGS = {"decoder/scale_embeddings": np.array(0, np.int8), "decoder/pre_norm": np.array(1, np.int8),
                 "decoder/activation": np.array(3, np.int8), "decoder/alibi": np.array(0, np.int8),
                 "decoder/start_from_zero_embedding": np.array(0, np.int8)}


def tiny_whisper() -> bytes:
    """A valid WhisperSpec of width 8 (2 heads), one encoder and one decoder layer, 16 tokens: what the mutations
    start from."""
    rng = np.random.default_rng(0)
    d, ff, vocab = 8, 16, 16

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float16)

    v: dict[str, np.ndarray] = {
        "encoder/num_heads": np.array(2, np.int16), "decoder/num_heads": np.array(2, np.int16),
        "encoder/conv1/weight": w(d, 80, 3), "encoder/conv1/bias": w(d), "encoder/conv2/weight": w(d, d, 3),
        "encoder/conv2/bias": w(d), "encoder/position_encodings/encodings": w(1500, d),
        "encoder/layer_norm/gamma": w(d), "encoder/layer_norm/beta": w(d),
        "decoder/embeddings/weight": w(vocab, d), "decoder/position_encodings/encodings": w(4, d),
        "decoder/layer_norm/gamma": w(d), "decoder/layer_norm/beta": w(d), **DECODER_FLAGS}
    for side in ("encoder", "decoder"):
        p = f"{side}/layer_0/"
        for norm in ("self_attention", "ffn") + (("attention",) if side == "decoder" else ()):
            v[p + norm + "/layer_norm/gamma"], v[p + norm + "/layer_norm/beta"] = w(d), w(d)
        v |= {p + "self_attention/linear_0/weight": w(3 * d, d), p + "self_attention/linear_0/bias": w(3 * d),
              p + "self_attention/linear_1/weight": w(d, d), p + "self_attention/linear_1/bias": w(d),
              p + "ffn/linear_0/weight": w(ff, d), p + "ffn/linear_0/bias": w(ff),
              p + "ffn/linear_1/weight": w(d, ff), p + "ffn/linear_1/bias": w(d)}
        if side == "decoder":
            v |= {p + "attention/linear_0/weight": w(d, d), p + "attention/linear_0/bias": w(d),
                  p + "attention/linear_1/weight": w(2 * d, d), p + "attention/linear_1/bias": w(2 * d),
                  p + "attention/linear_2/weight": w(d, d), p + "attention/linear_2/bias": w(d)}
    return ct2_bytes("WhisperSpec", v, {"decoder/projection/weight": "decoder/embeddings/weight"})


VALID = tiny_whisper()


def _read(folder: Path, data: bytes, config: str | None = None) -> None:
    """Read ``data`` as ``model.bin`` (and ``config``) in ``folder``: a model, or a KilnError of one line."""
    (folder / "model.bin").write_bytes(data)
    if config is not None:
        (folder / "config.json").write_text(config)
    try:
        whisper.read_whisper(folder)
    except KilnError as e:
        assert "\n" not in str(e) and str(e)


def test_the_seed_file_is_a_valid_whisper(tmp_path):
    (tmp_path / "model.bin").write_bytes(VALID)
    m = whisper.read_whisper(tmp_path)
    assert (m.config.width, m.config.encoder_layers, m.config.decoder_layers, m.config.vocab) == (8, 1, 1, 16)


@FUZZ
@given(data=mutated(VALID, "<I", [0, 1, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 3 * 10**9]))
def test_mutated_model_files_end_in_kiln_errors(tmp_path, data):
    _read(tmp_path, data)


@FUZZ
@given(data=st.binary(max_size=512))
def test_arbitrary_bytes_end_in_kiln_errors(tmp_path, data):
    (tmp_path / "model.bin").write_bytes(data)
    try:
        read_ctranslate2(tmp_path / "model.bin")
    except KilnError as e:
        assert "\n" not in str(e)


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=4), max_leaves=12)


@FUZZ
@given(config=_JSON)
def test_config_json_of_any_value_ends_in_kiln_errors(tmp_path, config):
    _read(tmp_path, VALID, json.dumps(config))


@FUZZ
@given(config=st.dictionaries(st.sampled_from(["suppress_ids", "suppress_ids_begin", "lang_ids", "alignment_heads",
                                               "other"]), _JSON, max_size=4))
def test_config_json_of_any_shape_ends_in_kiln_errors(tmp_path, config):
    _read(tmp_path, VALID, json.dumps(config))


def test_config_json_with_infinite_ids(tmp_path):
    """Found by a 20000-example campaign: ``Infinity`` (JSON as Python writes it) among the ids was an
    OverflowError."""
    (tmp_path / "model.bin").write_bytes(VALID)
    (tmp_path / "config.json").write_text('{"suppress_ids": [Infinity]}')
    with pytest.raises(KilnError, match="not a Whisper model Kiln reads .OverflowError"):
        whisper.read_whisper(tmp_path)


def test_config_json_that_is_not_json(tmp_path):
    (tmp_path / "model.bin").write_bytes(VALID)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(KilnError, match="config.json is not readable JSON"):
        whisper.read_whisper(tmp_path)


@FUZZ
@given(tokenizer=_JSON | st.dictionaries(st.just("added_tokens"), st.lists(_JSON, max_size=3), max_size=1))
def test_tokenizer_json_of_any_shape_ends_in_kiln_errors(tmp_path, tokenizer):
    (tmp_path / "model.bin").write_bytes(VALID)
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    try:
        whisper.speech_manifest(whisper.read_whisper(tmp_path))
    except KilnError as e:
        assert "\n" not in str(e)


def test_a_name_with_a_line_break_is_refused_in_one_line(tmp_path):
    """(Found by the 30-minute campaign of 2026-11-27.) A variable name holding a newline went into the message of
    the next error, which then spanned two lines; strings with control characters are refused where they are read."""
    at = VALID.index(b"encoder/num_heads")
    (tmp_path / "model.bin").write_bytes(VALID[:at + 8] + b"\n" + VALID[at + 9:])
    with pytest.raises(KilnError, match="holds control characters") as e:
        whisper.read_whisper(tmp_path)
    assert "\n" not in str(e.value)
