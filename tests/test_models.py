"""Real models end to end, natively on WebGPU (wgpu-py; lavapipe here), against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import MOBILENET

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


def test_mobilenet_batch_of_four_from_symbolic_dim(tmp_path, reference_npz):
    pkg = kiln.compile(MOBILENET, tmp_path / "b4", dims={"N": 4})
    session = kiln.load(pkg)
    assert session.inputs[0]["shape"] == [4, 3, 224, 224]
    assert session.inputs[0]["symbolic_shape"] == ["N", 3, 224, 224]
    x = np.concatenate([reference_npz[f"{n}_input"] for n in IMAGES])
    expected = np.concatenate([reference_npz[f"{n}_logits"] for n in IMAGES])
    assert np.abs(session.run({"input": x})["logits"] - expected).max() <= 1e-3


def test_interpreter_is_the_spec(reference_npz):
    graph = import_model(MOBILENET)
    out = interp.run(graph, {"input": reference_npz["chelsea_input"]})["logits"]
    assert np.abs(out - reference_npz["chelsea_logits"]).max() <= 1e-4
