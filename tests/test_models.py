"""Real models end to end, natively on WebGPU (wgpu-py; lavapipe here), against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import MOBILENET, SHARED_MODELS

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


@pytest.mark.parametrize("name,shape,dims", [
    ("ch_ppocr_mobile_v2.0_cls_infer", (2, 3, 48, 192), {"x_dim0": 2, "x_dim2": 48, "x_dim3": 192}),
    ("ch_PP-OCRv4_rec_infer", (1, 3, 48, 160), {"p2o.DynamicDimension.0": 1, "x_dim2": 48,
                                                "p2o.DynamicDimension.1": 160}),
    ("ch_PP-OCRv4_det_infer", (1, 3, 64, 96), {"p2o.DynamicDimension.0": 1, "p2o.DynamicDimension.1": 64,
                                               "p2o.DynamicDimension.2": 96}),
])
def test_ppocr_models_match_onnxruntime(tmp_path, rng, name, shape, dims):
    path = SHARED_MODELS / f"{name}.onnx"
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    session = kiln.load(kiln.compile(path, tmp_path / "pkg", dims=dims), poison=True)
    got = list(session.run({"x": x}).values())
    for g, e in zip(got, _ort(path, {"x": x})):
        np.testing.assert_allclose(g, e, atol=1e-4, rtol=0)
