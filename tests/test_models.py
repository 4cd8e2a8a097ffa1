"""Real models end to end, natively on WebGPU (wgpu-py; lavapipe here), against onnxruntime."""

from __future__ import annotations

import contextlib

import numpy as np
import onnxruntime as ort
import pytest
from conftest import MOBILENET, PPOCR_CASES, SHARED_MODELS

import kiln
from kiln.frontend.onnx.importer import import_model
from kiln.ir import interp

IMAGES = ["chelsea", "coffee", "astronaut", "camera"]


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory):
    return kiln.load(kiln.compile(MOBILENET, tmp_path_factory.mktemp("pkg") / "mobilenet_v2"), poison=True)


@pytest.mark.parametrize("name", IMAGES)
def test_mobilenet_reference_images(mobilenet, reference_npz, name):
    logits = mobilenet.run({"input": reference_npz[f"{name}_input"]})["logits"]
    expected = reference_npz[f"{name}_logits"]
    assert np.abs(logits - expected).max() <= 1e-3
    assert logits.argmax() == expected.argmax()


def test_mobilenet_fresh_input_matches_onnxruntime(mobilenet, rng):
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    expected = ort.InferenceSession(str(MOBILENET), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    np.testing.assert_allclose(mobilenet.run({"input": x})["logits"], expected, atol=1e-3, rtol=0)


def test_mobilenet_batch_of_two_from_symbolic_dim(tmp_path, reference_npz):
    # cpu-class schedules: this test is about symbolic dims, and they run 3x faster on lavapipe; two images
    # rather than four keep it affordable on CI's two cores (the PP-OCR tests bind symbolic dims too)
    pkg = kiln.compile(MOBILENET, tmp_path / "b2", dims={"N": 2}, device_class="cpu")
    session = kiln.load(pkg)
    assert session.inputs[0]["shape"] == [2, 3, 224, 224]
    assert session.inputs[0]["symbolic_shape"] == ["N", 3, 224, 224]
    x = np.concatenate([reference_npz[f"{n}_input"] for n in IMAGES[:2]])
    expected = np.concatenate([reference_npz[f"{n}_logits"] for n in IMAGES[:2]])
    assert np.abs(session.run({"input": x})["logits"] - expected).max() <= 1e-3


def test_interpreter_is_the_spec(reference_npz):
    graph = import_model(MOBILENET)
    out = interp.run(graph, {"input": reference_npz["chelsea_input"]})["logits"]
    assert np.abs(out - reference_npz["chelsea_logits"]).max() <= 1e-4


def _ort(path, feeds):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_minilm_sentence_embeddings_match_onnxruntime(tmp_path):
    # BERT: int64 token inputs, Gather embeddings, LayerNormalization, Where/Equal masks, Erf GELU, Softmax
    path = SHARED_MODELS / "all_minilm_l6_v2.onnx"
    with np.load(SHARED_MODELS / "reference" / "all_minilm_l6_v2_inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    batch, seq = feeds["input_ids"].shape
    session = kiln.load(kiln.compile(path, tmp_path / "minilm", dims={"batch": batch, "seq": seq}), poison=True)
    assert {i["name"]: i["storage"] for i in session.inputs} == dict.fromkeys(feeds, "int32")
    hidden = session.run(feeds)["last_hidden_state"]
    expected = _ort(path, feeds)[0]
    np.testing.assert_allclose(hidden, expected, atol=1e-4, rtol=0)
    mask = feeds["attention_mask"][..., None].astype(np.float32)
    emb = (hidden * mask).sum(1) / mask.sum(1)
    ref = (expected * mask).sum(1) / mask.sum(1)
    cos = np.sum(emb * ref, 1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() > 0.99999


@pytest.mark.parametrize("name,shape,dims", PPOCR_CASES)
def test_ppocr_models_match_onnxruntime(tmp_path, rng, name, shape, dims):
    path = SHARED_MODELS / f"{name}.onnx"
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    session = kiln.load(kiln.compile(path, tmp_path / "pkg", dims=dims), poison=True)
    got = list(session.run({"x": x}).values())
    for g, e in zip(got, _ort(path, {"x": x})):
        np.testing.assert_allclose(g, e, atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------- Silero VAD: run-time If, LSTM, state
SILERO = SHARED_MODELS / "silero_vad.onnx"

#: sample rate -> (new samples per chunk, context samples from the previous chunk): Silero's streaming protocol
VAD_CHUNKS = {16000: (512, 64), 8000: (256, 32)}


def vad_audio(sr: int, chunks: int, seed: int = 0) -> np.ndarray:
    """Deterministic audio of ``chunks`` chunks: low noise, then a voiced burst (harmonics of a 150 Hz pitch,
    amplitude-modulated at 4 Hz) over the middle half, so the speech probability really changes."""
    n = VAD_CHUNKS[sr][0] * chunks
    t = np.arange(n) / sr
    x = 0.003 * np.random.default_rng(seed).standard_normal(n)
    on = (t >= t[-1] / 4) & (t < 3 * t[-1] / 4)
    x[on] += 0.3 * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t[on])) * sum(np.sin(2 * np.pi * 150 * k * t[on]) / k
                                                                      for k in range(1, 11))
    return x.astype(np.float32)


def vad_stream(run, audio: np.ndarray, sr: int) -> tuple[np.ndarray, np.ndarray]:
    """Every chunk's probability [chunks] and state [chunks, 2, 1, 128], the state and context carried along;
    ``run(input, state, sr)`` returns ``(output, stateN)``."""
    n, context = VAD_CHUNKS[sr]
    state, ctx = np.zeros((2, 1, 128), np.float32), np.zeros(context, np.float32)
    probs, states = [], []
    for i in range(len(audio) // n):
        chunk = audio[i * n:(i + 1) * n]
        prob, state = run(np.concatenate([ctx, chunk])[None], state, sr)
        ctx = chunk[-context:]
        probs.append(prob.reshape(-1)[0])
        states.append(state)
    return np.array(probs), np.stack(states)


def _ort_vad():
    session = ort.InferenceSession(str(SILERO), providers=["CPUExecutionProvider"])
    return lambda x, state, sr: tuple(session.run(None, {"input": x, "state": state, "sr": np.array(sr, np.int64)}))


@pytest.fixture(scope="module")
def silero_packages(tmp_path_factory):
    """One package per sample rate: a package's input length is fixed, and 16 kHz chunks (576 samples) do not fit
    the 8 kHz branch (a warning at compile time; taking it raises), while 8 kHz chunks (288) fit both."""
    out = {}
    for sr, (n, context) in VAD_CHUNKS.items():
        with pytest.warns(UserWarning, match="else branch cannot run") if sr == 16000 else contextlib.nullcontext():
            out[sr] = kiln.compile(SILERO, tmp_path_factory.mktemp("vad") / f"silero_{sr}", device_class="cpu",
                                   dims={"input_dim0": 1, "input_dim1": n + context, "state_dim1": 1})
    return out


@pytest.mark.parametrize("sr", [16000, 8000])
def test_silero_vad_stream_matches_onnxruntime(silero_packages, sr):
    session = kiln.load(silero_packages[sr], poison=True)

    def run(x, state, rate):
        out = session.run({"input": x, "state": state, "sr": np.array(rate, np.int64)})
        return out["output"], out["stateN"]

    audio = vad_audio(sr, chunks=8)
    probs, states = vad_stream(run, audio, sr)
    ref_probs, ref_states = vad_stream(_ort_vad(), audio, sr)
    np.testing.assert_allclose(probs, ref_probs, atol=1e-4, rtol=0)
    np.testing.assert_allclose(states, ref_states, atol=1e-4, rtol=0)
    assert ref_probs.max() - ref_probs.min() > 0.3  # the burst moves the probability: the state matters
    assert session.control.readbacks == 1  # the sr == 16000 condition, computed on the GPU


def test_silero_vad_branch_that_does_not_fit_raises(silero_packages):
    session = kiln.load(silero_packages[16000])
    feeds = {"input": np.zeros((1, 576), np.float32), "state": np.zeros((2, 1, 128), np.float32),
             "sr": np.array(8000, np.int64)}
    with pytest.raises(kiln.KilnError, match="else branch cannot run with the compiled shapes"):
        session.run(feeds)
