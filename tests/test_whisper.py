"""Whisper speech to text (issue 17): the CTranslate2 reader, the log-mel front end, the encoder and the whole
transcription against the reference implementation, CTranslate2 (through faster-whisper, which drives it), on
clips espeak-ng speaks at test time (tests/speech_clips.py), natively on WebGPU (lavapipe) and wasm.

The model is Whisper tiny.en from ``kiln zoo get whisper_tiny_en`` (setup.sh puts it in models/zoo).
"""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.compiler import compile_graph
from kiln.errors import KilnError, ModelFormatError, PackageError
from kiln.frontend import whisper
from kiln.frontend.ctranslate2 import read_ctranslate2
from kiln.package.writer import write_package
from kiln.runtime.speech import mel_blocks
from tests.speech_clips import CLIPS, espeak_available, make_clip, word_error_rate

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "zoo" / "whisper_tiny_en"
needs_model = pytest.mark.skipif(not (MODEL / "model.bin").exists(),
                                 reason="run setup.sh (kiln zoo get whisper_tiny_en -o models/zoo)")
needs_espeak = pytest.mark.skipif(not espeak_available(), reason="run setup.sh (apt: espeak-ng)")
pytestmark = [needs_model]

ct2 = pytest.importorskip("ctranslate2")


@pytest.fixture(scope="module")
def model() -> whisper.WhisperModel:
    return whisper.read_whisper(MODEL)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, tuple[Path, np.ndarray]]:
    if not espeak_available():
        pytest.skip("run setup.sh (apt: espeak-ng)")
    folder = tmp_path_factory.mktemp("clips")
    return {c.name: make_clip(c, folder) for c in CLIPS}


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """The speech package, webgpu and wasm, default schedules for WebGPU on a CPU."""
    from kiln.compiler import compile_whisper

    return compile_whisper(MODEL, tmp_path_factory.mktemp("speech") / "pkg", target="webgpu,wasm",
                           device_class="cpu", validate=False)


@pytest.fixture(scope="module")
def reference():
    """faster-whisper over the same CTranslate2 file on the CPU, float32."""
    from faster_whisper import WhisperModel

    return WhisperModel(str(MODEL), device="cpu", compute_type="float32", cpu_threads=2)


def _reference_segments(ref, samples: np.ndarray, timestamps: bool, beam: int = 1) -> list[tuple[float, float, str]]:
    segs, _ = ref.transcribe(samples, beam_size=beam, temperature=0.0, without_timestamps=not timestamps,
                             condition_on_previous_text=True, compression_ratio_threshold=None,
                             log_prob_threshold=None, no_speech_threshold=None, vad_filter=False)
    return [(round(s.start, 3), round(s.end, 3), s.text) for s in segs]


# ------------------------------------------------------------------------------------------------ the reader
def test_reader_reads_the_whisper_file(model):
    c = model.config
    sizes = (c.n_mels, c.width, c.encoder_layers, c.decoder_layers, c.encoder_heads, c.vocab)
    assert sizes == (80, 384, 4, 4, 6, 51864)
    assert (c.audio_ctx, c.text_ctx, c.multilingual) == (1500, 448, False)
    raw = read_ctranslate2(MODEL / "model.bin")
    assert raw.spec == "WhisperSpec" and raw.version == 6 and raw.revision == 3
    assert raw.variables["decoder/projection/weight"] is raw.variables["decoder/embeddings/weight"]  # the alias
    assert raw.variables["encoder/conv1/weight"].dtype == np.float16
    assert 50256 in c.suppress_ids_begin and len(c.alignment_heads) == 8


def _ct2_file(path: Path, spec: str, variables: dict[str, np.ndarray]) -> Path:
    """A CTranslate2 model file in the layout of ctranslate2's ModelSpec._serialize (binary version 6)."""
    def text(s: str) -> bytes:
        return struct.pack("<H", len(s) + 1) + s.encode() + b"\0"

    ids = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4}
    out = struct.pack("<I", 6) + text(spec) + struct.pack("<II", 1, len(variables))
    for name, a in variables.items():
        out += text(name) + struct.pack("<B", a.ndim) + b"".join(struct.pack("<I", d) for d in a.shape)
        out += struct.pack("<BI", ids[str(a.dtype)], a.nbytes) + a.tobytes()
    path.write_bytes(out + struct.pack("<I", 0))
    return path


def test_reader_dequantizes_int8_weights(tmp_path, rng):
    w = rng.standard_normal((8, 4)).astype(np.float32)
    scale = (127 / np.abs(w).max(axis=1)).astype(np.float32)
    q = np.round(w * scale[:, None]).astype(np.int8)
    m = read_ctranslate2(_ct2_file(tmp_path / "model.bin", "TransformerSpec",
                                   {"x/weight": q, "x/weight_scale": scale}))
    assert m.variables["x/weight"].dtype == np.float32 and "x/weight_scale" not in m.variables
    np.testing.assert_allclose(m.variables["x/weight"], w, atol=np.abs(w).max() / 127)


def test_reader_refuses_other_files(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))
    with pytest.raises(ModelFormatError, match="binary version .* not a CTranslate2 model file"):
        read_ctranslate2(tmp_path / "model.bin")
    good = (MODEL / "model.bin").read_bytes()
    (tmp_path / "model.bin").write_bytes(good[:100_000])
    with pytest.raises(ModelFormatError, match="truncated|or the file ends first"):
        read_ctranslate2(tmp_path / "model.bin")
    other = tmp_path / "mt"
    other.mkdir()
    _ct2_file(other / "model.bin", "TransformerSpec", {"x": np.zeros(3, np.float32)})
    with pytest.raises(ModelFormatError, match="is a CTranslate2 TransformerSpec, not a Whisper model"):
        whisper.read_whisper(other)


def test_compile_refuses_another_model_type_and_writes_nothing(tmp_path):
    from kiln.compiler import compile_model

    other = tmp_path / "mt"
    other.mkdir()
    _ct2_file(other / "model.bin", "TransformerSpec", {"x": np.zeros(3, np.float32)})
    with pytest.raises(ModelFormatError, match="not a Whisper model"):
        compile_model(other, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ the front end
def test_mel_filters_match_the_reference():
    from faster_whisper.feature_extractor import FeatureExtractor

    np.testing.assert_allclose(whisper.mel_filters(80), FeatureExtractor.get_mel_filters(16000, 400, 80), atol=1e-7)
    np.testing.assert_allclose(whisper.mel_filters(128), FeatureExtractor.get_mel_filters(16000, 400, 128), atol=1e-7)


@pytest.mark.parametrize("target", ["webgpu", "wasm"])
def test_resampling_matches_its_reference(target, package, rng):
    """The device's windowed-sinc resampler within 1e-5 of the same filter in float64 numpy, over several runs (the
    chunks' phases exact), from rates above and below 16 kHz; a tone keeps its frequency and one above 8 kHz is
    filtered out (more than 60 dB down)."""
    from kiln.frontend.audio import resample_reference
    from kiln.runtime.speech import SpeechSession

    session = SpeechSession(package, target=target)
    for rate, seconds in ((44100, 4.3), (22050, 1.0), (48000, 2.5), (8000, 1.0), (96000, 0.5)):
        n = int(rate * seconds)
        t = np.arange(n) / rate
        x = (0.5 * np.sin(2 * np.pi * 1000 * t) + 0.02 * rng.standard_normal(n)).astype(np.float32)
        ours = session.resample(x, rate)
        ref = resample_reference(x, rate, 16000)
        assert ours.shape == ref.shape == (-(-n * 16000 // rate),)
        np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)
        spectrum = np.abs(np.fft.rfft(ours * np.hanning(len(ours))))
        assert abs(np.argmax(spectrum) * 16000 / len(ours) - 1000) < 2
    high = (0.5 * np.sin(2 * np.pi * 11000 * np.arange(44100) / 44100)).astype(np.float32)
    assert np.abs(session.resample(high, 44100)[500:-500]).max() < 0.5e-3
    with pytest.raises(KilnError, match="cannot resample audio at 200000 Hz"):
        session.resample(np.zeros(1000, np.float32), 200000)


@pytest.mark.parametrize("target", ["webgpu", "wasm"])
def test_log_mel_matches_the_reference(target, clips, tmp_path, rng):
    """The device's log-mel features, normalised as Whisper does, against faster-whisper's numpy front end (an FFT):
    within 1e-4 on speech (the clips, one over two 30-s chunks), on noise and on a click in silence. On a pure tone
    in faint noise, within 1e-4 wherever the mel power is within 6 decades of the recording's peak, and within 1e-3
    in the last 2 decades above Whisper's floor (peak - 8): there a bin's power is what is left of the tone's
    Hann-window leakage cancelling itself, and the STFT's 400-term float32 sums (a MatMul, not an FFT) keep about
    0.2% of it."""
    from faster_whisper.feature_extractor import FeatureExtractor

    session = kiln.load(write_package(compile_graph(whisper.log_mel_graph(80), target, device_class="cpu"),
                                      tmp_path / "pkg"), target=target)
    t = np.arange(16000 * 37) / 16000
    tone = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
    noise = (0.1 * rng.standard_normal(16000 * 5)).astype(np.float32)
    click = np.zeros(16000 * 3, np.float32)
    click[20000] = 0.9
    for name, audio in [*((c, clips[c][1]) for c in clips), ("noise", noise), ("click", click), ("tone", tone)]:
        rows, frames = mel_blocks(audio, whisper.N_FFT, whisper.HOP, whisper.N_FRAMES)
        outs = [session.run({"audio": row}) for row in rows]
        raw = np.concatenate([o["log_mel"][0] for o in outs], axis=1)[:, :frames]
        top = max(float(o["log_mel_max"][0]) for o in outs)
        ours = (np.maximum(raw, top - 8.0) + 4.0) / 4.0
        ref = FeatureExtractor()(audio)
        assert ours.shape == ref.shape, name
        if name != "tone":
            np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0, err_msg=name)
            continue
        deep = ref < (top - 6.0 + 4.0) / 4.0  # within 2 decades of the floor
        np.testing.assert_allclose(ours[~deep], ref[~deep], atol=1e-4, rtol=0, err_msg=name)
        np.testing.assert_allclose(ours[deep], ref[deep], atol=1e-3, rtol=0, err_msg=name)


@pytest.mark.parametrize("target", ["webgpu", "wasm"])
def test_encoder_matches_ctranslate2(target, package, clips, rng):
    """The encoder's states against CTranslate2's (fp32): within 1e-3 for a spoken clip's window (its padding
    included), and within 1e-3 of the states' largest magnitude for random features (out of the model's
    distribution: larger activations, the same kernels). The speech package's encoder part (compiled once for the
    module)."""
    from faster_whisper.feature_extractor import FeatureExtractor

    session = kiln.load(package / "encoder", target=target)
    ref_model = ct2.models.Whisper(str(MODEL), device="cpu", compute_type="float32")
    speech = FeatureExtractor()(clips["story_long"][1])[:, :3000]
    noise = (rng.standard_normal((80, 3000)) * 1.5 - 2.0).astype(np.float32)
    for features, frames, atol in ((speech, 3000, None), (noise, 2100, "scaled")):
        # the raw log-mel whose normalisation gives ``features`` where they are above max - 8 (all of noise's)
        raw = (features * 4.0 - 4.0)[None].astype(np.float32)
        top = float(raw.max())
        ours = session.run({"log_mel": raw, "log_mel_max": np.asarray([top], np.float32),
                            "frames": np.asarray([frames], np.int64)})["encoder_hidden_states"]
        given = (np.maximum(raw, top - 8.0) + 4.0) / 4.0
        given[..., frames:] = 0.0
        ref = np.array(ref_model.encode(ct2.StorageView.from_array(np.ascontiguousarray(given)), to_cpu=True))
        np.testing.assert_allclose(ours, ref, atol=1e-3 if atol is None else 1e-3 * np.abs(ref).max(), rtol=0)


# ------------------------------------------------------------------------------------------------ transcription
@needs_espeak
@pytest.mark.slow
@pytest.mark.parametrize("target", ["webgpu", "wasm"])
def test_transcripts_equal_ctranslate2(target, package, clips, reference):
    """Greedy transcripts equal CTranslate2's segment for segment (text and times): on wasm every clip without
    timestamps, then the clip of two windows with them (segments split at timestamps, the next window from the last
    one); on webgpu (lavapipe: five times slower here) a clip of one window with timestamps. The word error rate
    against the spoken sentences is the reference's too. (Chromium: every clip on wasm and one on WebGPU,
    tests/test_whisper_browser.py; every clip on WebGPU with --extended there.)"""
    session = kiln.load(package, target=target)
    cases = [(c, False) for c in CLIPS] + [(c, True) for c in CLIPS if c.name == "story_long"] if target == "wasm" \
        else [(c, True) for c in CLIPS if c.name == "fox_us"]
    for clip, timestamps in cases:
        path, samples = clips[clip.name]
        ours = session.transcribe(path, timestamps=timestamps)
        ref = _reference_segments(reference, samples, timestamps)
        got = [(round(s.start, 3), round(s.end, 3), s.text) for s in ours.segments]
        assert got == ref, (clip.name, timestamps)
        text = "".join(s[2] for s in ref)
        assert word_error_rate(clip.text, ours.text) == word_error_rate(clip.text, text)
        assert ours.stats.tokens > 0 and ours.stats.windows == (2 if clip.name == "story_long" else 1)


def test_transcribe_refuses_bad_audio(package, tmp_path, monkeypatch):
    session = kiln.load(package, target="wasm")
    (tmp_path / "noise.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    with pytest.raises(KilnError, match="cannot read audio"):
        session.transcribe(tmp_path / "noise.wav")
    import soundfile

    soundfile.write(str(tmp_path / "empty.wav"), np.zeros(0, np.float32), 16000)
    with pytest.raises(KilnError, match="is empty"):
        session.transcribe(tmp_path / "empty.wav")
    with pytest.raises(KilnError, match="cannot resample audio at 1000 Hz"):
        session.transcribe(np.zeros(8000, np.float32), sample_rate=1000)
    with pytest.raises(KilnError, match="needs its sample rate"):
        session.transcribe(np.zeros(8000, np.float32))
    from kiln.runtime import speech

    monkeypatch.setattr(speech, "MAX_AUDIO_S", 60)
    with pytest.raises(KilnError, match="61 s long; at most 60 s"):
        session.transcribe(np.zeros(16000 * 61, np.float32), sample_rate=16000)
    with pytest.raises(KilnError, match="language 'fr'"):
        session.transcribe(np.zeros(16000, np.float32), sample_rate=16000, language="fr")
    for beam in (0, 6, 2.0):
        with pytest.raises(KilnError, match=f"beam size {beam} is not from 1 to 5"):
            session.transcribe(np.zeros(16000, np.float32), sample_rate=16000, beam_size=beam)


def test_speech_json_is_checked_against_its_schema(package, tmp_path):
    """speech.json as written satisfies kiln/package/speech.schema.json; a damaged one is refused in one line naming
    the JSON path (a part outside the package, a negative token, a missing key, a newer major format)."""
    import json

    from kiln.runtime.speech import read_speech_manifest

    spec = read_speech_manifest(package)
    assert spec["format"] == "1.2" and spec["beams"] == 5
    for change, says in ((lambda s: s["parts"].update(decoder="../elsewhere"), "parts.decoder: '../elsewhere'"),
                         (lambda s: s["tokens"].update(eot=-1), "tokens.eot: -1 is less than the minimum of 0"),
                         (lambda s: s.pop("tokens"), "'tokens' is a required property"),
                         (lambda s: s.update(format="2.0"), "speech package format 2.0 is not 1.x")):
        bad = json.loads(json.dumps(spec))
        change(bad)
        (tmp_path / "speech.json").write_text(json.dumps(bad))
        with pytest.raises(PackageError, match=re.escape(says)) as e:
            read_speech_manifest(tmp_path)
        assert "\n" not in str(e.value)


def tampered_copy(package: Path, to: Path, name: str, edit, parts: bool = True) -> Path:
    """A copy of speech package ``package`` at ``to`` (its parts linked, not copied; left out with ``parts=False``)
    with file ``name`` replaced by ``edit(its bytes)``; the digests are left as they were."""
    to.mkdir()
    for p in package.iterdir():
        if p.is_dir():
            if parts:
                (to / p.name).symlink_to(p, target_is_directory=True)
        elif p.suffix not in (".wav", ".f32"):
            shutil.copyfile(p, to / p.name)
    (to / name).write_bytes(edit((package / name).read_bytes()))
    return to


def test_speech_files_are_checked(package, tmp_path):
    """(speech format 1.2) speech.json is checked against speech.sha256 and the tokenizer against speech.json's
    files: an edited copy of either, or a missing digest, is refused in one line naming the file."""
    from kiln.runtime.speech import SpeechSession, read_speech_manifest

    spec = read_speech_manifest(package)
    assert {f["path"] for f in spec["files"]} >= {"tokenizer.json", "speech.js", "kiln.js", "transcribe.html"}
    assert not any(f["path"].startswith(("encoder/", "decoder/")) for f in spec["files"])
    edited = tampered_copy(package, tmp_path / "a", "speech.json", lambda s: s.replace(b'"beams": 5', b'"beams": 4'))
    with pytest.raises(PackageError, match="speech.json SHA-256 checksum mismatch .* its manifest was edited"):
        read_speech_manifest(edited)
    (edited / "speech.sha256").unlink()
    with pytest.raises(PackageError, match="no speech.sha256"):
        read_speech_manifest(edited)
    downgraded = tampered_copy(package, tmp_path / "c", "speech.json", lambda s: s.replace(b'"1.2"', b'"1.1"'))
    with pytest.raises(PackageError, match="speech.json SHA-256 checksum mismatch"):  # (no way around the digest)
        read_speech_manifest(downgraded)
    # the tokenizer is checked before any part loads: here there are none, and the tokenizer is what is refused
    edited = tampered_copy(package, tmp_path / "b", "tokenizer.json", lambda s: s + b" ", parts=False)
    with pytest.raises(PackageError, match="tokenizer.json: SHA-256 checksum mismatch"):
        SpeechSession(edited, target="wasm")


def test_speech_package_refuses_overwrite(package, tmp_path):
    from kiln.compiler import compile_whisper

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(PackageError, match="already exists"):
        compile_whisper(MODEL, tmp_path / "mine")
    with pytest.raises(PackageError, match="not a Kiln package"):
        compile_whisper(MODEL, tmp_path / "mine", force=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    with pytest.raises(PackageError, match="not a speech package"):
        from kiln.runtime.speech import SpeechSession

        SpeechSession(package / "decoder")


@needs_espeak
@pytest.mark.extended  # bench/asr.py checks every peer's transcripts against Kiln's in each run
def test_torch_and_onnx_peers_match_ctranslate2(clips, tmp_path):
    """bench/asr.py's peers run the same weights: the PyTorch modules' encoder within 1e-3 of CTranslate2's, and the
    ONNX export (optimum's layout: encoder, first step, step with past) under onnxruntime transcribes a two-window
    clip as CTranslate2 does."""
    import torch

    from bench.asr import Greedy, ort_pair
    from kiln.zoo.whisper_export import export_onnx, whisper_modules

    greedy = Greedy(MODEL)
    features = greedy.extract(clips["story_long"][1])
    window = np.ascontiguousarray(features[None, :, :3000])
    encoder, _, _ = whisper_modules(MODEL)
    with torch.no_grad():
        ours = encoder(torch.tensor(window)).numpy()
    ref_model = ct2.models.Whisper(str(MODEL), device="cpu", compute_type="float32")
    ref = np.array(ref_model.encode(ct2.StorageView.from_array(window), to_cpu=True))
    np.testing.assert_allclose(ours, ref, atol=1e-3, rtol=0)
    encode, step, _ = ort_pair(export_onnx(MODEL, tmp_path / "onnx"), "cpu")
    text = greedy.transcribe(clips["story_long"][1], encode, step, {})
    from faster_whisper import WhisperModel

    reference = WhisperModel(str(MODEL), device="cpu", compute_type="float32", cpu_threads=2)
    assert text == "".join(s[2] for s in _reference_segments(reference, clips["story_long"][1], False)).strip()


@needs_espeak
@pytest.mark.slow
def test_beam_search_equals_ctranslate2(package, clips, reference):
    """Beam search (5 hypotheses) as CTranslate2's (faster-whisper ``beam_size=5``), segment for segment, on clips
    where it finds another transcript than greedy decoding (the checks would fail with greedy's): without
    timestamps, and with them (the timestamp rules applied to every hypothesis). On wasm: beam search is the
    runtime's, the same on every target (the cache's reordering on WebGPU: tests/test_beam_state.py)."""
    session = kiln.load(package, target="wasm")
    for name, timestamps in (("fox_us", False), ("numbers_fast", True)):
        path, samples = clips[name]
        ref = _reference_segments(reference, samples, timestamps, beam=5)
        assert ref != _reference_segments(reference, samples, timestamps), name
        ours = session.transcribe(path, timestamps=timestamps, beam_size=5)
        assert [(round(s.start, 3), round(s.end, 3), s.text) for s in ours.segments] == ref, name


@needs_espeak
def test_cli_transcribe_and_info(package, clips, reference):
    """``kiln transcribe`` prints the segments (with timestamps when asked; here with beam search, on wasm) and the
    real-time factor; ``kiln info`` describes a speech package; a package that is not one is refused."""
    from click.testing import CliRunner

    from kiln.cli import main

    path, samples = clips["fox_us"]
    ref = _reference_segments(reference, samples, True, beam=5)
    done = CliRunner().invoke(main, ["transcribe", str(package), str(path), "--timestamps", "--target", "wasm",
                                     "--beam", "5"])
    assert done.exit_code == 0, done.output
    assert f"[00:00.000 --> 00:{ref[0][1]:06.3f}] {ref[0][2].strip()}" in done.output
    assert "real-time factor" in done.output
    info = CliRunner().invoke(main, ["info", str(package)])
    assert info.exit_code == 0 and "whisper" in info.output and "decoder" in info.output, info.output
    assert "beam search up to 5" in info.output
    refused = CliRunner().invoke(main, ["transcribe", str(package / "decoder"), str(path)])
    assert refused.exit_code != 0 and "not a speech package" in refused.output


@needs_espeak
def test_fp16_package_transcribes_as_ctranslate2(clips, reference, tmp_path):
    """``--precision fp16`` (f16 encoder and decoder on lavapipe's shader-f16; the front end stays fp32): a clip's
    transcript is still CTranslate2's."""
    from kiln.compiler import compile_whisper

    pkg = compile_whisper(MODEL, tmp_path / "fp16", target="webgpu", device_class="cpu", validate=False,
                          precision="fp16")
    session = kiln.load(pkg)
    assert session.decoder.manifest.get("precision") == "fp16"
    assert session.log_mel.manifest.get("precision", "fp32") == "fp32"
    samples = clips["weather_gb"][1]
    ours = session.transcribe(samples, sample_rate=16000)
    assert ours.text == "".join(s[2] for s in _reference_segments(reference, samples, False)).strip()


def test_a_window_ending_at_timestamp_zero_is_not_decoded_again(package, monkeypatch):
    """Tokens whose last complete timestamp is <|0.00|> would send the reference's long-form loop back to the same
    window for ever; Kiln goes on after it (the decoder stubbed to return such tokens for every window)."""
    session = kiln.load(package, target="wasm")
    begin = session.tokens["timestamp_begin"]
    monkeypatch.setattr(session, "_decode", lambda *a, **k: [begin, begin])
    result = session.transcribe(np.zeros(16000 * 40, np.float32), sample_rate=16000, timestamps=True)
    assert result.stats.windows == 2 and result.segments == []
