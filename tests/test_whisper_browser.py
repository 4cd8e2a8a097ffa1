"""Whisper in headless Chromium (issue 17): kiln.js's speech.js transcribes the espeak-ng clips (tests/speech_clips.py)
as CTranslate2 does, on wasm and on WebGPU (SwiftShader), and transcribe.html transcribes a dropped WAV file.

SwiftShader's WebGPU decodes about a token a second here, so WebGPU runs one clip (with timestamps) and the rest
only with ``pytest --extended``.
"""

from __future__ import annotations

import shutil

import pytest
from browser import sync_playwright_alone

from tests.browser import ConsoleLog, launch_chromium, serving
from tests.speech_clips import CLIPS, espeak_available, make_clip
from tests.test_whisper import MODEL, _reference_segments, tampered_copy

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not (MODEL / "model.bin").exists(),
                                 reason="run setup.sh (kiln zoo get whisper_tiny_en)"),
              pytest.mark.skipif(not espeak_available(), reason="run setup.sh (apt: espeak-ng)")]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The speech package (webgpu, wasm) with the clips beside it: each clip's 16 kHz samples as raw float32
    (``NAME.f32``) and espeak-ng's own 22050 Hz WAV file; the reference's segments; Chromium; and the package's
    folder."""
    from faster_whisper import WhisperModel

    from kiln.compiler import compile_whisper

    root = tmp_path_factory.mktemp("speech_browser")
    pkg = compile_whisper(MODEL, root / "pkg", target="webgpu,wasm", device_class="cpu", validate=False)
    reference = WhisperModel(str(MODEL), device="cpu", compute_type="float32", cpu_threads=2)
    refs = {}
    for clip in CLIPS:
        path, samples = make_clip(clip, root)
        samples.astype("<f4").tofile(pkg / f"{clip.name}.f32")
        shutil.copyfile(path.with_name(f"{clip.name}_22k.wav"), pkg / f"{clip.name}_22k.wav")
        refs[clip.name] = {ts: _reference_segments(reference, samples, ts) for ts in (False, True)}
        if clip.name == "fox_us":
            refs[clip.name]["beam"] = _reference_segments(reference, samples, False, beam=5)
    (pkg / "junk.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEjunkjunkjunkjunk")
    with serving(pkg) as url, sync_playwright_alone() as playwright:
        browser = launch_chromium(playwright)
        yield url, browser, refs, pkg
        browser.close()


TRANSCRIBE = """async ({target, clips, timestamps}) => {
  const kiln = await import('./kiln.js');
  const speech = await kiln.loadSpeech('./', {target});
  const out = {target: speech.target};
  for (const name of clips) {
    const samples = new Float32Array(await (await fetch(`./${name}.f32`)).arrayBuffer());
    const streamed = [];
    const r = await speech.transcribe(samples, {timestamps, onSegment: (s) => streamed.push(s.text)});
    out[name] = {segments: r.segments.map((s) => [s.start, s.end, s.text]), streamed, text: r.text,
                 windows: r.stats.windows, rtf: r.stats.realTimeFactor};
  }
  let error = '';
  try { await speech.transcribe(new Float32Array(0)); } catch (e) { error = `${e.name}: ${e.message}`; }
  out.empty = error;
  try {
    await speech.transcribe(new Float32Array(100), {sampleRate: 1000});
  } catch (e) { error = `${e.name}: ${e.message}`; }
  out.rate = error;
  return out;
}"""


def _run(served, target: str, clips: list[str], timestamps: bool) -> dict:
    url, browser, *_ = served
    page = browser.new_context().new_page()
    log = ConsoleLog(page)
    page.goto(url + "transcribe.html?target=" + target)
    log.wait_for("body[data-ready]", timeout=300_000)
    out = log.evaluate(TRANSCRIBE, {"target": target, "clips": clips, "timestamps": timestamps})
    page.context.close()
    assert out["target"] == target
    assert out["empty"] == "KilnError: the audio is empty (no samples)"
    assert out["rate"].startswith("KilnError: cannot resample audio at 1000 Hz")
    return out


def _check(out: dict, refs: dict, clips: list[str], timestamps: bool) -> None:
    for name in clips:
        got = [(round(a, 3), round(b, 3), t) for a, b, t in out[name]["segments"]]
        assert got == refs[name][timestamps], name
        assert out[name]["streamed"] == [t for _, _, t in got]
        assert out[name]["rtf"] > 0


def test_wasm_transcripts_equal_ctranslate2(served):
    """Every clip's greedy transcript in Chromium on wasm equals CTranslate2's, segment for segment."""
    names = [c.name for c in CLIPS]
    _check(_run(served, "wasm", names, False), served[2], names, False)


def test_webgpu_transcript_equals_ctranslate2(served):
    """On WebGPU (SwiftShader), with timestamps: the transcript and its segment times equal CTranslate2's."""
    _check(_run(served, "webgpu", ["fox_us"], True), served[2], ["fox_us"], True)


@pytest.mark.extended
def test_webgpu_transcripts_equal_ctranslate2_all_clips(served):
    names = [c.name for c in CLIPS]
    _check(_run(served, "webgpu", names, False), served[2], names, False)


def test_transcribe_page_takes_a_dropped_wav(served):
    """transcribe.html, as a person uses it: a WAV file dropped onto the page (espeak-ng's 22050 Hz file, resampled
    on the device) streams the expected text and shows the real-time factor, greedy and with beam search (5, where
    the transcript differs: speech.js's beam search and the wasm runtime's state reordering); a file that is no
    audio gets a clear error."""
    url, browser, refs, _ = served
    page = browser.new_context().new_page()
    log = ConsoleLog(page)
    page.goto(url + "transcribe.html?target=wasm")
    log.wait_for("body[data-ready]", timeout=300_000)

    def drop(name: str) -> None:
        page.evaluate("""async (name) => {
          const bytes = await (await fetch(`./${name}`)).arrayBuffer();
          const data = new DataTransfer();
          data.items.add(new File([bytes], name, {type: 'audio/wav'}));
          delete document.body.dataset.done;
          document.getElementById('drop').dispatchEvent(new DragEvent('drop', {dataTransfer: data, bubbles: true}));
        }""", name)
        log.wait_for("body[data-done]", timeout=600_000)

    drop("fox_us_22k.wav")
    expected = "".join(t for _, _, t in refs["fox_us"][False]).strip()
    assert page.evaluate("document.body.dataset.text") == expected
    shown = " ".join(page.locator(".segment").all_text_contents())
    assert "[00:00.00" in shown and "real-time factor" in page.text_content("#speed")
    page.select_option("#beam", "5")
    page.uncheck("#timestamps")
    drop("fox_us_22k.wav")
    beam = "".join(t for _, _, t in refs["fox_us"]["beam"]).strip()
    assert beam != expected and page.evaluate("document.body.dataset.text") == beam
    drop("junk.wav")
    assert "cannot decode the audio file" in page.text_content("#status")
    assert page.evaluate("document.getElementById('status').classList.contains('error')")
    page.context.close()


def test_speech_js_loads_only_speech_packages(served):
    url, browser, *_ = served
    page = browser.new_context().new_page()
    page.goto(url + "transcribe.html?target=wasm")
    error = page.evaluate("""async () => {
      const kiln = await import('./kiln.js');
      try { await kiln.loadSpeech('./decoder/'); return 'loaded'; } catch (e) { return `${e.name}: ${e.message}`; }
    }""")
    assert error.startswith("PackageError") and "not a speech package" in error
    page.context.close()


def test_speech_js_refuses_edited_files(served):
    """(speech format 1.2) loadSpeech checks speech.json against its schema and speech.sha256, and the tokenizer against
    speech.json's files, before it loads any part: an edited copy of either is refused, naming the file."""
    url, browser, _, pkg = served
    for name, edit, says in (("speech.json", lambda s: s.replace(b'"beams": 5', b'"beams": 4'), "checksum mismatch"),
                             ("tokenizer.json", lambda s: s + b" ", "checksum mismatch"),
                             ("speech.json", lambda s: s.replace(b'"beams": 5', b'"beams": "5"'),
                              "does not match its schema at /beams")):
        copy = tampered_copy(pkg, pkg / "tampered", name, edit)
        try:
            page = browser.new_context().new_page()
            page.goto(url + "transcribe.html?target=wasm")
            error = page.evaluate("""async () => {
              const kiln = await import('./kiln.js');
              try { await kiln.loadSpeech('./tampered/'); return 'loaded'; } catch (e) { return `${e.name}: ${e.message}`; }
            }""")
            assert error.startswith("PackageError") and f"{name}" in error and says in error, error
            page.context.close()
        finally:
            shutil.rmtree(copy)


def test_transcribe_page_records_the_microphone(served):
    """transcribe.html's Record button: Chromium's fake microphone (a beeping tone) recorded for two seconds, then
    decoded (MediaRecorder's WebM/Opus through Web Audio), resampled and transcribed: the page finishes with the
    real-time factor shown, whatever the model makes of beeps."""
    from tests.browser import CHROMIUM, CHROMIUM_ARGS

    url, shared, *_ = served
    browser = shared.browser_type.launch(executable_path=str(CHROMIUM), headless=True, args=[
        *CHROMIUM_ARGS, "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"])
    try:
        page = browser.new_context(permissions=["microphone"]).new_page()
        log = ConsoleLog(page)
        page.goto(url + "transcribe.html?target=wasm")
        log.wait_for("body[data-ready]", timeout=300_000)
        page.click("#record")
        page.wait_for_function("document.getElementById('record').textContent === 'Stop'")
        page.wait_for_timeout(2000)
        page.click("#record")
        log.wait_for("body[data-done]", timeout=300_000)
        status = page.text_content("#status")
        assert status.startswith("transcribed the recording"), status
        assert "real-time factor" in page.text_content("#speed")
    finally:
        browser.close()
