"""Whisper in headless Chromium: Kiln's speech package (kiln.js + speech.js) against onnxruntime-web on the ONNX export
of the same weights (``kiln.zoo.whisper_export``, optimum's layout: encoder, first decoder step, step with past).

    .venv/bin/python -m bench.asr_browser [--targets wasm] [--repeat 3] [--clips DIR]
    .venv/bin/python -m bench.asr_browser --targets wasm,webgpu --repeat 1      # WebGPU is SwiftShader here: slow

Each contestant transcribes every clip greedily without timestamps, 30-s windows prompted with the text before, in
one page, one thread (``kiln-wasm``: ``threads: 1``; ``ort-wasm``: ``numThreads`` 1, ``onnxruntime-web/wasm``; with
``webgpu``: ``kiln-webgpu`` and ``ort-webgpu``, ``onnxruntime-web/webgpu``). Kiln is timed end to end from the
samples (resampling skipped: they are 16 kHz; features, encoder and decoder on its target); onnxruntime-web gets
its features precomputed in Python for free (numpy, ``bench.asr.log_mel``) and is timed from the encoder on, its
suppression and arg max in JavaScript as Kiln's. The contestants alternate clip by clip; the median of
``--repeat`` runs after one warm-up. Prints real-time factor, ms per decoded token, encoder ms per window and the
features' ms (all clips; Kiln's only: onnxruntime-web's are free), checks that the token ids agree, and writes JSON
(``asr-browser-<date>.json``). Issue 17's goal: Kiln's wasm at least as fast as
onnxruntime-web's wasm EP.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.asr import MODEL, Greedy, load_clips
from bench.browser import ensure_onnxruntime_web, serve_root
from bench.common import ROOT, write_record

PAGE = """<!doctype html><meta charset="utf-8"><title>kiln vs onnxruntime-web: whisper</title>
<link rel="icon" href="data:,">
<script type="module">
import * as kiln from './pkg/kiln.js';
import * as ort from './ort/ORT_BUNDLE';

ort.env.wasm.wasmPaths = new URL('./ort/', location.href).href;
ort.env.wasm.numThreads = 1;
ort.env.logLevel = 'error';
const spec = await (await fetch('./pkg/speech.json')).json();
const f32 = async (url) => new Float32Array(await (await fetch(url)).arrayBuffer());
let speech = null, ortSessions = null;

window.setupKiln = async (target) => {
  const t0 = performance.now();
  speech = await kiln.loadSpeech('./pkg/', {target, threads: 1, cache: false});
  return performance.now() - t0;
};

window.setupOrt = async (ep) => {
  const t0 = performance.now();
  const make = (f) => ort.InferenceSession.create(`./onnx/${f}`, {executionProviders: [ep]});
  ortSessions = {encoder: await make('encoder.onnx'), first: await make('decoder.onnx'), rest: await make('decoder_with_past.onnx')};
  return performance.now() - t0;
};

window.runKiln = async (clip) => {
  const samples = await f32(`./clips/${clip}.f32`);
  const t0 = performance.now();
  const r = await speech.transcribe(samples);
  return {ms: performance.now() - t0, tokens: r.segments.flatMap((s) => s.tokens), decodeMs: r.stats.decodeMs,
          count: r.stats.tokens, encodeMs: r.stats.encodeMs, windows: r.stats.windows,
          featuresMs: r.stats.featuresMs + r.stats.resampleMs};
};

const argmax = (x) => { let b = 0; for (let i = 1; i < x.length; i++) if (x[i] > x[b]) b = i; return b; };

window.runOrt = async (clip, windows) => {
  const feats = [];
  for (let w = 0; w < windows; w++) feats.push(await f32(`./clips/${clip}.${w}.f32`));
  const tk = spec.tokens, layers = ortSessions.first.outputNames.filter((n) => n.startsWith('cross.')).length / 2;
  const t0 = performance.now();
  let decodeMs = 0, encodeMs = 0, count = 0;
  const history = [];
  for (const window of feats) {
    const te = performance.now();
    const hidden = (await ortSessions.encoder.run({mel: new ort.Tensor('float32', window, [1, 80, 3000])})).encoder_hidden_states;
    encodeMs += performance.now() - te;
    const prompt = (history.length ? [tk.sot_prev, ...history.slice(-223)] : []).concat([tk.sot, tk.no_timestamps]);
    const td = performance.now();
    let ids = prompt, past = null, cross = null;
    const tokens = [];
    while (tokens.length < Math.min(224, 448 - prompt.length + 1)) {
      const feeds = {input_ids: new ort.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, ids.length])};
      let out;
      if (!past) {
        feeds.encoder_hidden_states = hidden;
        out = await ortSessions.first.run(feeds);
        cross = [];
        for (let i = 0; i < layers; i++) cross.push(out[`cross.${i}.key`], out[`cross.${i}.value`]);
      } else {
        for (let i = 0; i < layers; i++) {
          feeds[`past.${i}.key`] = past[2 * i]; feeds[`past.${i}.value`] = past[2 * i + 1];
          feeds[`cross.${i}.key`] = cross[2 * i]; feeds[`cross.${i}.value`] = cross[2 * i + 1];
        }
        out = await ortSessions.rest.run(feeds);
      }
      past = [];
      for (let i = 0; i < layers; i++) past.push(out[`present.${i}.key`], out[`present.${i}.value`]);
      const vocab = out.logits.dims[2];
      const row = Float32Array.from(out.logits.data.subarray(out.logits.data.length - vocab));
      for (const i of spec.suppress_ids) row[i] = -Infinity;
      if (!tokens.length) for (const i of spec.suppress_ids_begin) row[i] = -Infinity;
      const token = argmax(row);
      if (token === tk.eot) break;
      tokens.push(token);
      ids = [token];
    }
    decodeMs += performance.now() - td;
    count += tokens.length;
    history.push(...tokens);
  }
  return {ms: performance.now() - t0, tokens: history, decodeMs, count, encodeMs, windows, featuresMs: 0};
};
window.info = () => ({userAgent: navigator.userAgent, ortWeb: ort.env.versions?.web ?? null});
window.benchReady = true;
</script>
"""

BUNDLES = {"wasm": "ort.wasm.min.mjs", "webgpu": "ort.webgpu.min.mjs"}


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the JSON record."""
    from playwright.sync_api import sync_playwright

    from kiln.compiler import compile_whisper
    from kiln.zoo.whisper_export import export_onnx
    from tests.browser import launch_chromium

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--clips", type=Path, default=None)
    ap.add_argument("--targets", default="wasm", help="wasm, webgpu or wasm,webgpu")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    a = ap.parse_args(argv)
    console = Console(stderr=True)
    targets = a.targets.split(",")
    clips = load_clips(a.clips)
    greedy = Greedy(a.model)
    root = Path(tempfile.mkdtemp(prefix="kiln-asr-browser-"))
    console.log("compiling the speech package and exporting ONNX ...")
    compile_whisper(a.model, root / "pkg", target=",".join(targets), device_class="cpu", validate=False)
    export_onnx(a.model, root / "onnx")
    shutil.copytree(ensure_onnxruntime_web(console), root / "ort")
    (root / "clips").mkdir()
    windows = {}
    for name, audio in clips.items():
        audio.astype("<f4").tofile(root / "clips" / f"{name}.f32")
        for w, window in enumerate(greedy.windows(audio)):
            window.astype("<f4").tofile(root / "clips" / f"{name}.{w}.f32")
            windows[name] = w + 1
    for target in targets:
        (root / f"{target}.html").write_text(PAGE.replace("ORT_BUNDLE", BUNDLES[target]))
    server, url = serve_root(root)
    record: dict = {"model": a.model.name, "repeat": a.repeat, "clips": {k: round(len(v) / 16000, 2)
                                                                          for k, v in clips.items()}}
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p)
            record["chromium"] = browser.version
            for target in targets:
                page = browser.new_context().new_page()
                page.set_default_timeout(3_600_000)
                page.on("pageerror", lambda e: console.print(f"[red]{e}[/]"))
                page.goto(f"{url}{target}.html")
                page.wait_for_function("window.benchReady === true", timeout=120_000)
                kiln_name, ort_name = f"kiln-{target}", f"ort-{target}"
                record[kiln_name] = {"load_ms": page.evaluate("(t) => window.setupKiln(t)", target), "clips": {}}
                record[ort_name] = {"load_ms": page.evaluate("(t) => window.setupOrt(t)", target), "clips": {}}
                record["info"] = page.evaluate("window.info()")
                for name in clips:
                    runs = {kiln_name: [], ort_name: []}
                    for i in range(a.repeat + 1):  # the first run of each is a warm-up
                        runs[kiln_name].append(page.evaluate("(c) => window.runKiln(c)", name))
                        runs[ort_name].append(page.evaluate("([c, w]) => window.runOrt(c, w)", [name, windows[name]]))
                        console.log(f"{name} run {i}: kiln {runs[kiln_name][-1]['ms']:.0f} ms, ort "
                                    f"{runs[ort_name][-1]['ms']:.0f} ms")
                    for who, rs in runs.items():
                        timed = rs[1:] if len(rs) > 1 else rs
                        last = rs[-1]
                        record[who]["clips"][name] = {
                            "audio_s": len(clips[name]) / 16000, "ms": float(np.median([r["ms"] for r in timed])),
                            "decode_ms": float(np.median([r["decodeMs"] for r in timed])), "tokens": last["count"],
                            "encode_ms": float(np.median([r["encodeMs"] for r in timed])), "ids": last["tokens"],
                            "features_ms": float(np.median([r["featuresMs"] for r in timed])),
                            "all_ms": [r["ms"] for r in rs]}
                page.context.close()
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    table = Table(title=f"Whisper tiny.en in Chromium {record.get('chromium', '')}: {len(clips)} clips, "
                        f"{sum(record['clips'].values()):.1f} s of audio (median of {a.repeat})")
    for col in ("contestant", "real-time factor", "ms / token", "encoder ms / window", "features ms", "kiln / ort"):
        table.add_column(col, justify="left" if col == "contestant" else "right")
    for target in targets:
        rtf = {}
        for who in (f"kiln-{target}", f"ort-{target}"):
            c = record[who]["clips"].values()
            audio = sum(x["audio_s"] for x in c)
            record[who]["real_time_factor"] = rtf[who] = sum(x["ms"] for x in c) / 1e3 / audio
            record[who]["ms_per_token"] = sum(x["decode_ms"] for x in c) / max(1, sum(x["tokens"] for x in c))
            record[who]["encoder_ms_per_window"] = sum(x["encode_ms"] for x in c) / sum(windows.values())
            record[who]["features_ms"] = sum(x["features_ms"] for x in c)
        ratio = rtf[f"ort-{target}"] / rtf[f"kiln-{target}"]
        record[f"kiln_over_ort_{target}"] = ratio
        record[f"same_ids_{target}"] = all(record[f"kiln-{target}"]["clips"][n]["ids"] ==
                                           record[f"ort-{target}"]["clips"][n]["ids"] for n in clips)
        for who in (f"kiln-{target}", f"ort-{target}"):
            r = record[who]
            table.add_row(who, f"{r['real_time_factor']:.3f}", f"{r['ms_per_token']:.1f}",
                          f"{r['encoder_ms_per_window']:.0f}", f"{r['features_ms']:.0f}",
                          f"{ratio:.2f}x faster" if who.startswith("kiln") else "")
    Console().print(table)
    for target in targets:
        Console().print(f"{target}: the same token ids: {record[f'same_ids_{target}']}")
    path = write_record(record, a.out, "asr-browser")
    Console().print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
