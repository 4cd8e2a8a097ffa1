"""Real models in headless Chromium on the WebGL2 target (SwiftShader through ANGLE) and on the wasm target
(kiln.js's WebAssembly backend, on Web Workers: the pages are cross-origin isolated), against onnxruntime.

Each model is compiled once for both targets and run once on each, on one input: SwiftShader's WebGL2 is
slow (MobileNetV2: about 20 s a run on 2 cores), and compiling the wasm module takes most of the rest.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from browser import CHROMIUM, close_shared_runner
from conftest import MOBILENET, PPOCR_CASES, SEED, SHARED_MODELS
from opcheck import TOLERANCE, run_in_browser

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)"),
]

TARGETS = ("webgl2", "browser:wasm")


@pytest.fixture(scope="module", autouse=True)
def _close_browser():
    yield
    close_shared_runner()


def _run(path, feeds, dims=None, targets=TARGETS):
    """Each target's outputs (in the model's output order) and onnxruntime's."""
    model = onnx.load(str(path))
    got = run_in_browser(model, feeds, targets, name=path.stem, dims=dims)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    return {t: [outs[o.name] for o in model.graph.output] for t, outs in got.items()}, expected


def test_mobilenet(reference_npz):
    got, (expected,) = _run(MOBILENET, {"input": reference_npz["chelsea_input"]})
    for target, (logits,) in got.items():
        assert np.abs(logits - expected).max() <= 1e-3 * TOLERANCE[target], target
        assert np.abs(logits - reference_npz["chelsea_logits"]).max() <= 1e-3 * TOLERANCE[target], target
        assert logits.argmax() == 285, target  # Egyptian cat


def test_minilm():
    with np.load(SHARED_MODELS / "reference" / "all_minilm_l6_v2_inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    batch, seq = feeds["input_ids"].shape
    got, (expected,) = _run(SHARED_MODELS / "all_minilm_l6_v2.onnx", feeds, {"batch": batch, "seq": seq})
    for target, (hidden,) in got.items():
        np.testing.assert_allclose(hidden, expected, atol=1e-4 * TOLERANCE[target], rtol=0, err_msg=target)


@pytest.mark.parametrize("name,shape,dims", PPOCR_CASES)
def test_ppocr(rng, name, shape, dims):
    """Every PP-OCR model on wasm; on WebGL2 (SwiftShader: the slowest) one of them a session, sampled by the session
    seed (KILN_TEST_SEED replays it)."""
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    sampled = [case[0] for case in PPOCR_CASES].index(name) == SEED % len(PPOCR_CASES)
    got, expected = _run(SHARED_MODELS / f"{name}.onnx", {"x": x}, dims, TARGETS if sampled else ("browser:wasm",))
    for target, outs in got.items():
        for g, e in zip(outs, expected):
            np.testing.assert_allclose(g, e, atol=1e-4 * TOLERANCE[target], rtol=0, err_msg=target)


#: loads ./{path}/ on WebGPU and runs Silero VAD over {chunks} (each [1, L] of float32 values), the state carried
STREAM_VAD = """async ({path, chunks, sr}) => {
  const kiln = await import(`./${path}/kiln.js`);
  const session = await kiln.load(`./${path}/`, {target: 'webgpu', poison: true});
  try {
    let state = new kiln.Tensor('float32', new Float32Array(2 * 128), [2, 1, 128]);
    const probs = [], states = [];
    for (const chunk of chunks) {
      const out = await session.run({input: new kiln.Tensor('float32', Float32Array.from(chunk), [1, chunk.length]),
                                     state, sr: new kiln.Tensor('int64', BigInt64Array.from([BigInt(sr)]), [])});
      probs.push(out.output.data[0]);
      state = out.stateN;
      states.push(Array.from(state.data));
    }
    return {target: session.target, probs, states};
  } finally {
    session.destroy();
  }
}"""


@pytest.mark.parametrize("sr", [16000, 8000])
def test_silero_vad_webgpu_stream(sr):
    """Silero VAD (run-time If on sr, LSTM, state in and out) on kiln.js's WebGPU backend (SwiftShader): a stream of
    chunks, each chunk's probability and state against onnxruntime's over the same stream."""
    from browser import shared_runner
    from test_models import SILERO, VAD_CHUNKS, _ort_vad, vad_audio, vad_stream

    import kiln

    n, context = VAD_CHUNKS[sr]
    runner = shared_runner()
    with warnings.catch_warnings():  # 16 kHz chunks do not fit the 8 kHz branch (tests/test_models.py checks the warning)
        warnings.simplefilter("ignore")
        pkg = kiln.compile(SILERO, runner.package_dir(f"silero_{sr}"), device_class="cpu",
                           dims={"input_dim0": 1, "input_dim1": n + context, "state_dim1": 1})
    audio = vad_audio(sr, chunks=6)
    inputs = []
    vad_stream(lambda x, state, rate: (inputs.append(x[0].tolist()) or (np.zeros((1, 1)), state)), audio, sr)
    path = pkg.resolve().relative_to(runner.root.resolve()).as_posix()
    got = runner.log.evaluate(STREAM_VAD, {"path": path, "chunks": inputs, "sr": sr})
    assert got["target"] == "webgpu"
    ref_probs, ref_states = vad_stream(_ort_vad(), audio, sr)
    np.testing.assert_allclose(np.array(got["probs"]), ref_probs, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.array(got["states"]).reshape(ref_states.shape), ref_states, atol=1e-4, rtol=0)
