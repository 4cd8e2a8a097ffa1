"""The examples on real models: PP-OCRv4 reading samples/page.png (examples/ocr.py) and all-MiniLM-L6-v2 sentence
embeddings (examples/sentence_embeddings.py), through Kiln natively (wgpu-py; lavapipe here) against onnxruntime."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import ROOT, SHARED_MODELS

import kiln

sys.path.insert(0, str(ROOT / "examples"))
import ocr
import package_cache
import sentence_embeddings as st
import vad

pytestmark = pytest.mark.skipif(not SHARED_MODELS.is_dir(), reason="needs ../shared/models")

#: one recognition bucket (960 wide) holds every line of page.png: one rec package instead of two keeps the test's
#: compiles and lavapipe's first-run shader compilation down (the example's default buckets are 320 wide)
WIDTH_STEP = 960


class Recording:
    """A runner that remembers every (input, output) pair it ran."""

    def __init__(self, runner):
        self.runner, self.calls = runner, []

    def __call__(self, x):
        y = self.runner(x)
        self.calls.append((x.copy(), y.copy()))
        return y


@pytest.fixture(scope="module")
def ocr_runs(tmp_path_factory):
    """Kiln's and onnxruntime's lines of page.png, the Kiln engine's recorded network calls and the package cache."""
    cache = tmp_path_factory.mktemp("ocr-packages")
    image = ocr.read_image(ocr.DEFAULT_IMAGE)
    characters = ocr.rec_characters()
    engine = ocr.make_engine("kiln", cache=cache, device_class="cpu")
    recorded = ocr.Engine(Recording(engine.det), Recording(engine.cls), Recording(engine.rec))
    got = ocr.ocr(image, recorded, characters, width_step=WIDTH_STEP)
    expected = ocr.ocr(image, ocr.make_engine("onnxruntime"), characters, width_step=WIDTH_STEP)
    return got, expected, recorded, engine, cache


def test_ocr_page_matches_onnxruntime_word_for_word(ocr_runs):
    got, expected, *_ = ocr_runs
    assert [ln.text for ln in got] == [ln.text for ln in expected]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g.box, e.box)
        assert abs(g.score - e.score) < 1e-3
    # non-trivial: the page's heading and body lines, as onnxruntime reads them (examples/ocr.py --engine onnxruntime)
    text = " ".join(ln.text for ln in got)
    assert len(got) >= 5, text
    assert got[0].text == "Region-based segmentation"
    assert got[1].text == "Let us first determine markers of the coins and the"
    for word in ("background", "markers", "pixels", "unambiguously", "object", "histogram"):
        assert word in text, text


def test_ocr_networks_match_onnxruntime_on_the_page(ocr_runs):
    """Each network's output on the very inputs the Kiln pipeline fed it (det: probability map [1,1,192,384]; cls:
    [1,2] probabilities; rec: [1,T,6625] probabilities) against onnxruntime's.

    rec's bound is 5e-4: on page.png's lines Kiln differs from onnxruntime by 3e-5 to 1.7e-4, the most at a step
    where two classes nearly tie (p = 0.53 / 0.47, where a logit error e moves p by e / 4); onnxruntime's
    optimised and unoptimised graphs differ by up to 4e-5 there. The greedy path must agree wherever the top two
    classes are more than 1e-3 apart."""
    _, _, recorded, *_ = ocr_runs
    for name, file, atol in (("det", ocr.DET, 1e-4), ("cls", ocr.CLS, 1e-4), ("rec", ocr.REC, 5e-4)):
        runner = ocr.onnxruntime_runner(SHARED_MODELS / file)
        calls = getattr(recorded, name).calls
        assert calls, name
        for x, y in calls:
            expected = runner(x)
            np.testing.assert_allclose(y, expected, atol=atol, rtol=0, err_msg=f"{name} {x.shape}")
            if name == "rec":
                top2 = np.sort(expected, -1)[..., -2:]
                clear = top2[..., 1] - top2[..., 0] > 1e-3
                np.testing.assert_array_equal(y.argmax(-1)[clear], expected.argmax(-1)[clear])
    assert {x.shape for x, _ in recorded.rec.calls} == {(1, 3, 48, WIDTH_STEP)}


def test_ocr_packages_are_cached_per_shape(ocr_runs):
    *_, engine, cache = ocr_runs
    names = sorted(p.name for p in cache.iterdir())
    assert names == ["ch_PP-OCRv4_det_infer-1x3x192x384-cpu", f"ch_PP-OCRv4_rec_infer-1x3x48x{WIDTH_STEP}-cpu",
                     "ch_ppocr_mobile_v2.0_cls_infer-1x3x48x192-cpu"]
    compiled = []
    assert ocr.KilnRunner(SHARED_MODELS / ocr.DET, cache, log=compiled.append).package((1, 3, 192, 384)) \
        == cache / names[0]
    assert compiled == []  # reused, not compiled again
    with pytest.raises(kiln.ShapeError, match="rank 4"):
        engine.det.package((3, 192, 384))


def test_ocr_dynamic_det_one_package(ocr_runs, tmp_path):
    """``--dynamic-det``: ONE detector package with run-time height and width reads page.png word for word as
    onnxruntime's pipeline, and the same package serves the page at another size (probability map within the
    static test's tolerance)."""
    _, expected, _, engine, _ = ocr_runs
    compiled = []
    det = ocr.DynamicDetRunner(SHARED_MODELS / ocr.DET, tmp_path, max_side=384, log=compiled.append)
    got = ocr.ocr(ocr.read_image(ocr.DEFAULT_IMAGE), ocr.Engine(det, engine.cls, engine.rec), ocr.rec_characters(),
                  width_step=WIDTH_STEP)
    assert [ln.text for ln in got] == [ln.text for ln in expected]
    x = ocr.det_preprocess(ocr.read_image(ocr.DEFAULT_IMAGE), limit_side_len=288)
    assert x.shape[2:] != (192, 384)
    np.testing.assert_allclose(det(x), ocr.onnxruntime_runner(SHARED_MODELS / ocr.DET)(x), atol=1e-4, rtol=0)
    assert len(compiled) == 1 and [p.name for p in tmp_path.iterdir()] == ["ch_PP-OCRv4_det_infer-dynamic-32..384_32..384-cpu"]


def test_ocr_cli_prints_lines(capsys):
    assert ocr.main(["--engine", "onnxruntime"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Region-based segmentation" and len(out) >= 5


def test_ctc_greedy_decode_merges_repeats_and_drops_blanks():
    characters = ["", "a", "b", " "]
    steps = [1, 1, 0, 1, 2, 2, 0, 3, 0]  # a a _ a b b _ ' ' _  -> "aab "
    probs = np.full((len(steps), 4), 0.1, np.float32)
    probs[np.arange(len(steps)), steps] = np.linspace(0.5, 0.9, len(steps))
    text, score = ocr.ctc_greedy_decode(probs, characters)
    assert text == "aab "
    assert score == pytest.approx(np.mean(probs[[0, 3, 4, 7], [1, 1, 2, 3]]))
    assert ocr.ctc_greedy_decode(np.eye(4, dtype=np.float32)[[0, 0]], characters) == ("", 0.0)


def test_rec_dictionary_from_model_metadata():
    characters = ocr.rec_characters()
    assert len(characters) == 6625  # the rec model's classes: blank, ppocr_keys_v1.txt's 6623, space
    assert characters[0] == "" and characters[-1] == " "
    assert {"a", "Z", "0", ".", "-"} <= set(characters)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    feeds = st.tokenize(st.SENTENCES)
    cache = tmp_path_factory.mktemp("minilm-packages")
    return feeds, st.embed_kiln(feeds, cache, "cpu"), st.embed_onnxruntime(feeds), cache


def test_sentence_embeddings_match_onnxruntime(minilm):
    feeds, hidden, expected, _ = minilm
    assert feeds["input_ids"].shape == (6, 16)  # padded to a multiple of 16
    assert feeds["attention_mask"][0].sum() == 8  # [CLS] a man is eating food . [SEP]
    np.testing.assert_allclose(hidden, expected, atol=1e-4, rtol=0)
    emb, ref = st.mean_pool(hidden, feeds["attention_mask"]), st.mean_pool(expected, feeds["attention_mask"])
    np.testing.assert_allclose(emb, ref, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
    cos = emb @ emb.T
    assert abs(cos[0, 1] - 0.755) < 0.01  # models README: "A man is eating food." vs "... a piece of bread."
    assert cos[0, 1] > cos[0, 2:].max()  # the paraphrase is the nearest


def test_sentence_embeddings_cli_prints_the_matrix(minilm, capsys):
    *_, cache = minilm
    assert st.main(["--cache", str(cache)]) == 0  # the same shape: the cached package
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[0] A man is eating food."
    row = out[len(st.SENTENCES) + 1].split()
    assert row[0] == "[0]" and row[1] == "1.000" and abs(float(row[2]) - 0.755) < 0.01
    assert len(list(cache.iterdir())) == 1


def test_package_cache_refuses_inconsistent_shapes(tmp_path):
    model = SHARED_MODELS / "all_minilm_l6_v2.onnx"
    assert package_cache.symbolic_dims(model)["input_ids"] == ["batch", "seq"]
    shapes = {"input_ids": (2, 16), "attention_mask": (2, 8), "token_type_ids": (2, 16)}
    with pytest.raises(kiln.ShapeError, match="'seq' given two sizes"):
        package_cache.cached_package(model, tmp_path, shapes)
    with pytest.raises(kiln.ShapeError, match="'token_type_ids' needs a shape of rank 2"):
        package_cache.cached_package(model, tmp_path, {"input_ids": (2, 16), "attention_mask": (2, 16)})
    assert not any(tmp_path.iterdir())  # nothing compiled


def test_vad_example_finds_the_bursts_like_onnxruntime(tmp_path, capsys):
    """examples/vad.py on its synthetic signal (two voiced bursts at 0.5-1.2 s and 1.8-2.5 s): Kiln and onnxruntime
    find the same two segments, with probabilities within 1e-4."""
    audio = vad.synthetic_audio(16000)
    probs = vad.probabilities(vad.kiln_model(16000, tmp_path / "cache", SHARED_MODELS), audio, 16000)
    ref = vad.probabilities(vad.onnxruntime_model(SHARED_MODELS), audio, 16000)
    np.testing.assert_allclose(probs, ref, atol=1e-4, rtol=0)
    spans = vad.segments(probs, 512 / 16000)
    assert spans == vad.segments(ref, 512 / 16000) and len(spans) == 2
    assert abs(spans[0][0] - 0.5) < 0.1 and abs(spans[1][0] - 1.8) < 0.1
    assert vad.main(["--engine", "both", "--cache", str(tmp_path / "cache"), "--models", str(SHARED_MODELS)]) == 0
    assert "same segments: True" in capsys.readouterr().out

