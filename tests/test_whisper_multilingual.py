"""A multilingual Whisper (issue 17): the 51865-token vocabulary with its 99 language tokens, language and task in
the prompt, the timestamp tokens after them. No multilingual model ships in a registry package we know of, so this
builds one: tiny random weights (width 16, one layer each side) in CTranslate2's own file layout, with the
vocabulary, ``config.json`` and a ``tokenizer.json`` of Whisper's special tokens, and checks Kiln's decoded tokens
for ``language="de"``, ``task="translate"`` against CTranslate2's ``generate`` on the same features (greedy and beam
search, with and without timestamps).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.errors import KilnError

ct2 = pytest.importorskip("ctranslate2")
from tests.test_fuzz_ctranslate2 import DECODER_FLAGS, ct2_bytes

TEXT = 50257  #: text tokens, as Whisper's byte-level BPE has
LANGUAGES = ["en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it", "id",
             "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur", "hr", "bg",
             "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk", "br",
             "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si", "km", "sn", "yo", "so",
             "af", "oc", "ka", "be", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt",
             "sa", "lb", "my", "bo", "tl", "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su"]  # Whisper's order


def _vocabulary() -> list[str]:
    specials = ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{c}|>" for c in LANGUAGES), "<|translate|>",
                "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    stamps = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    return [f"w{i}" for i in range(TEXT)] + specials + stamps


def _weights(rng, d: int, vocab: int, mels: int = 80, ff: int = 32) -> dict[str, np.ndarray]:
    def w(*shape, scale=None):  # (biases small: the tokens then follow the positions and the audio)
        scale = scale if scale is not None else 0.1 if len(shape) == 1 else 1.0
        return (scale * rng.standard_normal(shape)).astype(np.float16)

    def gamma(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float16)

    v: dict[str, np.ndarray] = {
        "encoder/num_heads": np.array(2, np.int16), "decoder/num_heads": np.array(2, np.int16),
        "encoder/conv1/weight": w(d, mels, 3, scale=0.2), "encoder/conv1/bias": w(d),
        "encoder/conv2/weight": w(d, d, 3, scale=0.3), "encoder/conv2/bias": w(d),
        "encoder/position_encodings/encodings": w(1500, d), "encoder/layer_norm/gamma": gamma(d),
        "encoder/layer_norm/beta": w(d), "decoder/embeddings/weight": w(vocab, d),
        "decoder/position_encodings/encodings": w(448, d, scale=3.0), "decoder/layer_norm/gamma": gamma(d),
        "decoder/layer_norm/beta": w(d), **DECODER_FLAGS}
    for side in ("encoder", "decoder"):
        p = f"{side}/layer_0/"
        for norm in ("self_attention", "ffn") + (("attention",) if side == "decoder" else ()):
            v[p + norm + "/layer_norm/gamma"], v[p + norm + "/layer_norm/beta"] = gamma(d), w(d)
        s = 1 / np.sqrt(d)
        v |= {p + "self_attention/linear_0/weight": w(3 * d, d, scale=s), p + "self_attention/linear_0/bias": w(3 * d),
              p + "self_attention/linear_1/weight": w(d, d, scale=s), p + "self_attention/linear_1/bias": w(d),
              p + "ffn/linear_0/weight": w(ff, d, scale=s), p + "ffn/linear_0/bias": w(ff),
              p + "ffn/linear_1/weight": w(d, ff, scale=1 / np.sqrt(ff)), p + "ffn/linear_1/bias": w(d)}
        if side == "decoder":
            v |= {p + "attention/linear_0/weight": w(d, d, scale=s), p + "attention/linear_0/bias": w(d),
                  p + "attention/linear_1/weight": w(2 * d, d, scale=s), p + "attention/linear_1/bias": w(2 * d),
                  p + "attention/linear_2/weight": w(d, d, scale=s), p + "attention/linear_2/bias": w(d)}
    return v


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """The multilingual model folder: model.bin, vocabulary.txt, config.json, tokenizer.json."""
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    folder = tmp_path_factory.mktemp("whisper_multilingual")
    tokens = _vocabulary()
    assert len(tokens) == 51865
    ids = {t: i for i, t in enumerate(tokens)}
    rng = np.random.default_rng(7)
    (folder / "model.bin").write_bytes(ct2_bytes("WhisperSpec", _weights(rng, 16, len(tokens)),
                                                 {"decoder/projection/weight": "decoder/embeddings/weight"}))
    (folder / "vocabulary.txt").write_text("\n".join(tokens) + "\n")
    lang_ids = [ids[f"<|{c}|>"] for c in LANGUAGES]
    (folder / "config.json").write_text(json.dumps({
        "suppress_ids": [1, 2, 3, ids["<|translate|>"], ids["<|transcribe|>"], ids["<|startoflm|>"],
                         ids["<|startofprev|>"], ids["<|startoftranscript|>"], ids["<|nospeech|>"]],
        "suppress_ids_begin": [220, ids["<|endoftext|>"]], "lang_ids": lang_ids, "alignment_heads": [[0, 0]]}))
    tok = Tokenizer(WordLevel({t: i for i, t in enumerate(tokens[:TEXT])}, unk_token="w0"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in tokens[TEXT:]])
    assert tok.token_to_id("<|0.00|>") == ids["<|notimestamps|>"] + 1
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def package(model, tmp_path_factory) -> Path:
    from kiln.compiler import compile_whisper

    return compile_whisper(model, tmp_path_factory.mktemp("ml_pkg") / "pkg", target="webgpu,wasm",
                           device_class="cpu", validate=False, beams=3)


def _reference(model: Path, samples: np.ndarray, prompt: list[int], beam: int) -> list[int]:
    """CTranslate2's tokens for one window: faster-whisper's features (its last frame dropped, as its transcribe
    does), CTranslate2's encoder and ``generate``."""
    from faster_whisper.feature_extractor import FeatureExtractor

    features = FeatureExtractor(feature_size=80)(samples)[None, :, :-1]
    window = np.zeros((1, 80, 3000), np.float32)
    window[:, :, :features.shape[2]] = features
    ref = ct2.models.Whisper(str(model), device="cpu", compute_type="float32")
    encoded = ref.encode(ct2.StorageView.from_array(window))
    return ref.generate(encoded, [prompt], beam_size=beam, max_length=448, suppress_blank=True,
                        suppress_tokens=[-1])[0].sequences_ids[0]


@pytest.mark.parametrize("target", ["webgpu", "wasm"])
def test_language_and_task_tokens_decode_as_ctranslate2(model, package, target, monkeypatch):
    session = kiln.load(package, target=target)
    spec = session.spec
    assert spec["multilingual"] and len(spec["languages"]) == 99 and spec["beams"] == 3
    tk = spec["tokens"]
    assert tk["timestamp_begin"] == tk["no_timestamps"] + 1 and tk["no_speech"] == tk["no_timestamps"] - 1
    samples = np.random.default_rng(3).uniform(-0.5, 0.5, 16000 * 4).astype(np.float32)
    seen: list[list[int]] = []
    for name in ("_decode", "_decode_beam"):  # each window's prompt and tokens, as the session decodes them
        real = getattr(session, name)

        def spy(states, prompt, *args, real=real):
            out = real(states, prompt, *args)
            seen.append([prompt, out])
            return out
        monkeypatch.setattr(session, name, spy)
    for timestamps, beam in ((False, 1), (True, 1), (False, 3)) if target == "webgpu" else ((True, 3),):
        seen.clear()
        session.transcribe(samples, sample_rate=16000, language="de", task="translate", timestamps=timestamps,
                           beam_size=beam)
        prompt, tokens = seen[0]
        de = spec["languages"]["de"]
        assert prompt == [tk["sot"], de, tk["translate"]] + ([] if timestamps else [tk["no_timestamps"]])
        assert tokens == _reference(model, samples, prompt, beam), (timestamps, beam)
        assert len(set(tokens)) > 50, tokens  # (the random model says something different at each step)
    with pytest.raises(KilnError, match="language 'xx' is not one of the model's"):
        session.transcribe(samples, sample_rate=16000, language="xx")


@pytest.mark.parametrize("flag,value,says", [("decoder/scale_embeddings", 1, "is 1, Whisper's is 0"),
                                             ("decoder/activation", None, "is 0 (the default), Whisper's is 3"),
                                             ("decoder/pre_norm", 0, "is 0, Whisper's is 1")])
def test_a_decoder_ctranslate2_runs_otherwise_is_refused(tmp_path, flag, value, says):
    """CTranslate2's decoder attributes (a missing one takes its default): a file whose decoder CTranslate2 would run
    otherwise than Whisper's is refused by name, not compiled into different numbers."""
    from kiln.errors import ModelFormatError
    from kiln.frontend.whisper import read_whisper

    v = _weights(np.random.default_rng(0), 16, 64)
    if value is None:
        del v[flag]
    else:
        v[flag] = np.array(value, np.int8)
    (tmp_path / "model.bin").write_bytes(ct2_bytes("WhisperSpec", v, {}))
    with pytest.raises(ModelFormatError, match=re.escape(f"{flag} {says}; not a Whisper decoder")):
        read_whisper(tmp_path)
