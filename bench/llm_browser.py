"""A language model in headless Chromium: Kiln's WebAssembly (and WebGPU) target against onnxruntime-web.

The model is SmolLM2-135M. Kiln runs its own package compiled from the GGUF (``kiln-wasm``: the GGUF's Q4_1
weights, the last row's logits only) and a package compiled from the 4-bit ONNX decoder (``kiln-wasm-onnx``);
onnxruntime-web runs that same ONNX file (``ort-wasm``: MatMulNBits weights, optimum's decoder layout).
Measured as ``bench.llm`` does natively, each in one ``run()`` of the model:

* prefill: ``P`` random token ids with an empty cache; tokens/s = ``P`` / median seconds;
* decode: one token after a cache of ``C - 1`` random values (``attention_mask`` of length ``C``,
  ``position_ids`` ``[[C - 1]]`` where the model takes them); Kiln's GGUF packages keep their cache as state
  (``past_sequence_length`` ``[C - 1]``, the cache in place, not fed; their decode logits go unchecked here, the
  tests check them); tokens/s = 1 / median seconds;
* load: from the session's creation until it is ready to run (weights over loopback, checks, compilation).

Each run is timed in the page from ``run()`` until its outputs are JavaScript tensors (every output, the new
cache included, as a page gets them); the contestants run interleaved (one run of each per round), so that a
busy machine slows them alike. The first run of each contestant at each size is checked: the max abs
difference of its last row's logits against onnxruntime CPU (Python) on the same feeds, running ``q4.onnx`` and
running ``fp32.onnx``, the export that it was quantized from (the GGUF's weights dequantized). Each contestant
is held to :data:`TOLERANCE` against the one of its own weights: q4.onnx, or fp32.onnx for the GGUF contestants
(``kiln-wasm``, ``kiln-wasm-mt``, ``kiln-webgpu``) that compute with the Q4_1 weights; the other difference
(the 4-bit re-quantization with integer zero points: ~10) is only reported. Prints a table (tokens/s, and
each Kiln contestant's ratio to its onnxruntime-web peer: ``x1.5`` = 1.5 times the peer's tokens/s) and writes
JSON (``llm-browser-<date>.json``, with every run's ms)::

    .venv/bin/python -m bench.llm_browser                        # kiln-wasm, kiln-wasm-onnx, ort-wasm
    .venv/bin/python -m bench.llm_browser --prompts 16 --contexts 64 --repeat 2 --prefill-repeat 1   # smoke
    .venv/bin/python -m bench.llm_browser --contestants kiln-wasm-mt,ort-wasm-mt
    .venv/bin/python -m bench.llm_browser --webgpu               # also kiln-webgpu, ort-webgpu (small sizes)

Contestants: ``kiln-wasm`` (GGUF package, one thread), ``kiln-wasm-onnx`` (q4.onnx package, one thread),
``kiln-wasm-mt`` (GGUF package, one Web Worker per core), ``kiln-webgpu`` (GGUF package), ``ort-wasm`` (wasm EP,
``numThreads`` 1), ``ort-wasm-mt`` (``numThreads`` = cores) and ``ort-webgpu`` (WebGPU EP). onnxruntime-web's
wasm contestants import ``onnxruntime-web/wasm`` (``--ort-wasm-bundle``), its WebGPU one
``onnxruntime-web/webgpu``, the native WebGPU EP (``--ort-webgpu-bundle``; the JSEP one of ``onnxruntime-web`` and
``/all`` fails on this model, "cannot convert shape": its MatMulNBits takes zero points only in rows of a
multiple of 4 bytes, and K = 576 in blocks of 32 makes 9). A page fixes its
onnxruntime-web build and thread count when it makes its first session, so each pair gets a page of its own
(one browser; Kiln's contestants share the first page; the pages take turns). On this machine WebGPU is
SwiftShader (on the CPU) and very slow: the WebGPU contestants are off unless named or ``--webgpu`` is given,
and run at ``--webgpu-prompts`` and ``--webgpu-contexts`` (16 and 128) with ``--webgpu-repeat`` runs.

The artefacts are made once in ``--work`` (``build/bench-llm-browser/``) and reused: ``fp32.onnx``
(``kiln.zoo.llama_export``; about 30 s), ``q4.onnx`` (onnxruntime's MatMulNBits quantizer, blocks of 32 with
zero points; a few seconds) and the two Kiln packages (``webgpu,wasm`` targets, WebGPU schedules for the CPU;
20-30 s each), rebuilt when a run needs a larger context or prompt than they were built for, and all of them
with ``--rebuild`` (after changes to the compiler or the exporter). onnxruntime-web is installed from npm into
``bench/web/node_modules`` on first use.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench.browser import ORT_DIST, ensure_onnxruntime_web, serve_root
from bench.common import ROOT, write_record

MODEL = ROOT / "models" / "zoo" / "SmolLM2-135M-Instruct.Q4_1.gguf"
WORK = ROOT / "build" / "bench-llm-browser"

#: max abs difference of the last row's logits expected against onnxruntime CPU on the contestant's own weights
#: (q4.onnx; fp32.onnx for the GGUF packages, whose Q4_1 weights it holds dequantized). The logits reach ~30;
#: with random caches of ~1000 values, summation order alone moves them by a few 1e-3 (onnxruntime-web's wasm EP
#: differs from onnxruntime CPU by 2e-3 at context 128), so 1e-2 (~3e-4 of the largest logit)
TOLERANCE = 1e-2

#: extra context the packages are compiled for beyond the largest size a run needs
SLACK = 16


class Contestant(NamedTuple):
    """One way to run the model in the page."""

    runtime: str  #: ``kiln`` or ``ort``
    model: str  #: ``gguf`` (Kiln's package from the GGUF), ``onnx`` (Kiln's from q4.onnx) or ``q4`` (the file)
    options: dict  #: Kiln: ``target``, ``threads``; onnxruntime-web: ``ep``, ``threads`` (``"cores"``: all)
    peer: str | None  #: the onnxruntime-web contestant its ratio is taken to
    webgpu: bool = False  #: runs at the WebGPU sizes and repeats


CONTESTANTS = {
    "kiln-wasm": Contestant("kiln", "gguf", {"target": "wasm", "threads": 1}, "ort-wasm"),
    "kiln-wasm-onnx": Contestant("kiln", "onnx", {"target": "wasm", "threads": 1}, "ort-wasm"),
    "kiln-wasm-mt": Contestant("kiln", "gguf", {"target": "wasm", "threads": "cores"}, "ort-wasm-mt"),
    "kiln-webgpu": Contestant("kiln", "gguf", {"target": "webgpu"}, "ort-webgpu", webgpu=True),
    "ort-wasm": Contestant("ort", "q4", {"ep": "wasm", "threads": 1}, None),
    "ort-wasm-mt": Contestant("ort", "q4", {"ep": "wasm", "threads": "cores"}, None),
    "ort-webgpu": Contestant("ort", "q4", {"ep": "webgpu", "threads": 1}, None, webgpu=True),
}

#: onnxruntime-web's entry points (``import 'onnxruntime-web/<name>'``) -> their file in its ``dist``: ``all`` and
#: ``default`` (``'onnxruntime-web'``) run the wasm EP and the JSEP WebGPU EP in one build, ``wasm`` the wasm EP
#: alone, ``webgpu`` the wasm EP and the native (C++) WebGPU EP in another build
ORT_BUNDLES = {"all": "ort.all.min.mjs", "default": "ort.min.mjs", "wasm": "ort.wasm.min.mjs",
               "webgpu": "ort.webgpu.min.mjs"}

#: the served paths of the models (symbolic links in the served folder)
URLS = {"gguf": "./kiln-gguf/", "onnx": "./kiln-onnx/", "q4": "./q4.onnx"}

#: the page: ``setup(name, spec)`` makes a session, ``prepareCase`` fetches one size's feeds, ``bindCase`` makes a
#: contestant's tensors of them, ``runCase`` runs once (ms, and the last row's logits when asked), ``dropCase``
#: frees them; KILN_JS is replaced by the URL of a package's kiln.js, ORT_JS by onnxruntime-web's entry point
PAGE = """<!doctype html><meta charset="utf-8"><title>kiln vs onnxruntime-web: language model</title>
<link rel="icon" href="data:,">
<script type="module">
import * as kiln from 'KILN_JS';
import * as ort from 'ORT_JS';

ort.env.wasm.wasmPaths = new URL('./ort/', location.href).href;
ort.env.logLevel = 'error';
const sessions = {};  // name -> {runtime, layout, inputs, logits, run(feeds), feeds: {case: feeds}}
const cases = {};     // case -> {tokens, past, ids: BigInt64Array, cache: {layout: url}, caches: {layout: [...]}}
let config = null;    // {layers, kv_heads, head_dim}

window.configure = (c) => { config = c; };

window.setup = async (name, spec) => {
  // (Kiln's threaded module has stacks for 16 workers)
  const cores = spec.runtime === 'kiln' ? Math.min(16, navigator.hardwareConcurrency) : navigator.hardwareConcurrency;
  const threads = spec.threads === 'cores' ? cores : spec.threads;
  const t0 = performance.now();
  let s;
  if (spec.runtime === 'kiln') {
    const options = {target: spec.target, cache: false};  // a first visit: the weights come over the network
    if (threads) options.threads = threads;
    const session = await kiln.load(spec.url, options);
    const logits = session.manifest.generation?.logits ?? 'logits';
    const a = session.adapterInfo ?? {};
    s = {inputs: session.inputs.map((i) => i.name), logits, run: (f) => session.run(f),
         target: session.target, state: Boolean(session.manifest.state),
         device: session.target === 'wasm' ? a.device : [a.vendor, a.architecture, a.device].filter(Boolean).join(' ')};
  } else {
    ort.env.wasm.numThreads = threads;  // read when the page makes its first session
    const session = await ort.InferenceSession.create(spec.url, {executionProviders: [spec.ep]});
    s = {inputs: session.inputNames, logits: 'logits', run: (f) => session.run(f), target: spec.ep,
         device: `${threads} thread${threads > 1 ? 's' : ''}`};
  }
  s.runtime = spec.runtime;
  s.layout = spec.layout;
  s.feeds = {};
  sessions[name] = s;
  return {load: performance.now() - t0, target: s.target, device: s.device, inputs: s.inputs, threads};
};

const bytes = async (url) => {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.arrayBuffer();
};

window.prepareCase = async (key, spec) => {
  cases[key] = {...spec, ids: new BigInt64Array(await bytes(spec.ids)), caches: {}};
};

// the case's past tensors in a layout (fetched once a case): 'hf', or 'gguf' (K in llama.cpp's RoPE pair order)
const pastTensors = async (c, layout) => {
  if (!c.caches[layout]) {
    const all = new Float32Array(await bytes(c.cache[layout]));
    const per = config.kv_heads * c.past * config.head_dim;
    c.caches[layout] = Array.from({length: 2 * config.layers}, (_, k) => all.slice(k * per, (k + 1) * per));
  }
  return c.caches[layout];
};

window.bindCase = async (name, key) => {
  const s = sessions[name], c = cases[key];
  const cache = await pastTensors(c, s.layout);
  const T = s.runtime === 'kiln' ? kiln.Tensor : ort.Tensor;
  const total = c.past + c.tokens;
  const f = {};
  for (const input of s.inputs) {
    const m = /^past_key_values\\.(\\d+)\\.(key|value)$/.exec(input);
    if (input === 'input_ids') {
      f[input] = new T('int64', c.ids, [1, c.tokens]);
    } else if (input === 'attention_mask') {
      f[input] = new T('int64', new BigInt64Array(total).fill(1n), [1, total]);
    } else if (input === 'past_sequence_length') {  // a package whose KV cache is state (kept in place)
      f[input] = new T('int64', BigInt64Array.of(BigInt(c.past)), [1]);
    } else if (input === 'position_ids') {
      f[input] = new T('int64', BigInt64Array.from({length: c.tokens}, (_, i) => BigInt(c.past + i)), [1, c.tokens]);
    } else if (m) {
      const k = 2 * Number(m[1]) + (m[2] === 'value' ? 1 : 0);
      f[input] = new T('float32', cache[k], [1, config.kv_heads, c.past, config.head_dim]);
    } else {
      throw new Error(`${name}: an input this benchmark cannot feed: ${input}`);
    }
  }
  s.feeds[key] = f;
};

window.runCase = async (name, key, check) => {
  const s = sessions[name];
  const t0 = performance.now();
  const out = await s.run(s.feeds[key]);
  const ms = performance.now() - t0;
  if (!check) return {ms};
  if (s.state && cases[key].past) return {ms, unchecked: true};  // its cache is not the random one the others get
  const logits = out[s.logits];
  const vocab = logits.dims[logits.dims.length - 1];
  return {ms, dims: Array.from(logits.dims), row: Array.from(logits.data.subarray(logits.data.length - vocab))};
};

window.dropCase = (key) => {
  delete cases[key];
  for (const s of Object.values(sessions)) delete s.feeds[key];
};

window.info = async () => {
  const a = await navigator.gpu?.requestAdapter();
  return {userAgent: navigator.userAgent, cores: navigator.hardwareConcurrency, ortWeb: ort.env.versions?.web ?? null,
          adapter: a ? `${a.info.vendor} ${a.info.architecture} ${a.info.description}`.trim() : 'none'};
};
window.benchReady = true;
</script>
"""


@contextmanager
def step(console: Console, text: str) -> Iterator[None]:
    """Show ``text`` with a spinner and the time spent until the block ends."""
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True, disable=not console.is_terminal) as progress:
        progress.add_task(text, total=None)
        yield


def prepare(names: list[str], model: Path, work: Path, max_context: int, max_prompt: int, rebuild: bool,
            console: Console) -> dict:
    """Make (or reuse) the artefacts ``names`` need in ``work``: ``q4.onnx`` and the Kiln packages.

    A package is reused when ``work/build.json`` says it was built from ``model`` for at least ``max_context``
    tokens of context and ``max_prompt`` prompt tokens. ``fp32.onnx``, the export before quantization (the GGUF's
    weights dequantized), is kept as the reference of the GGUF packages. Returns ``{"config", "seconds", "q4",
    "fp32", "gguf", "onnx"}``: the model's config, the seconds each step took (or ``"reused"``) and the paths.
    """
    from kiln.compiler import compile_model

    work.mkdir(parents=True, exist_ok=True)
    stamp_path = work / "build.json"
    stamps = json.loads(stamp_path.read_text()) if stamp_path.exists() else {}
    models = {CONTESTANTS[n].model for n in names}
    info: dict = {"seconds": {}}
    q4, fp32 = work / "q4.onnx", work / "fp32.onnx"
    if q4.exists() and fp32.exists() and stamps.get("q4", {}).get("model") == model.name and not rebuild:
        info["seconds"]["q4"] = "reused"
    else:
        import onnxruntime.quantization.matmul_nbits_quantizer as mq

        from kiln.zoo.llama_export import export_decoder, quantize_4bit

        mq.logger.setLevel(logging.WARNING)  # it logs every node at INFO
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            t0 = time.perf_counter()
            with step(console, f"exporting {model.name} to ONNX (fp32, about 30 s) ..."):
                config = export_decoder(model, Path(tmp) / "fp32.onnx")
                Path(tmp, "fp32.onnx").replace(fp32)
            t1 = time.perf_counter()
            console.log(f"exported the fp32 ONNX decoder in {t1 - t0:.0f} s")
            with step(console, "quantizing to 4 bits (MatMulNBits, blocks of 32) ..."):
                quantize_4bit(fp32, Path(tmp) / "q4.onnx")
            t2 = time.perf_counter()
            console.log(f"quantized in {t2 - t1:.0f} s: {q4} ({(Path(tmp) / 'q4.onnx').stat().st_size / 1e6:.0f} MB)")
            (Path(tmp) / "q4.onnx").replace(q4)
        stamps["q4"] = {"model": model.name, "config": config}
        stamps.pop("onnx", None)  # made from the old file
        stamp_path.write_text(json.dumps(stamps, indent=1))
        info["seconds"]["q4"] = {"export": t1 - t0, "quantize": t2 - t1}
    info["config"] = stamps["q4"]["config"]
    info["q4"], info["fp32"] = q4, fp32
    for kind in ("gguf", "onnx"):
        if kind not in models:
            continue
        out = work / f"kiln-{kind}"
        want = {"model": model.name, "max_context": max_context, "max_prompt": max_prompt}
        have = stamps.get(kind, {})
        if (out.exists() and not rebuild and have.get("model") == model.name
                and have.get("max_context", 0) >= max_context and have.get("max_prompt", 0) >= max_prompt):
            info["seconds"][kind] = "reused"
            info[kind] = out
            continue
        if out.exists():
            shutil.rmtree(out)
        t0 = time.perf_counter()
        console.log(f"compiling Kiln's package from {'the GGUF' if kind == 'gguf' else 'q4.onnx'} "
                    f"(webgpu,wasm; context {max_context}, prompts up to {max_prompt}) ...")
        if kind == "gguf":
            compile_model(model, out, max_context=max_context, device_class="cpu", validate=False,
                          target="webgpu,wasm", progress=True)
        else:
            compile_model(q4, out, dims={"sequence": (1, max_prompt, 1), "past_sequence": (0, max_context - 1),
                                         "total_sequence": "past_sequence+sequence"},
                          device_class="cpu", validate=False, target="webgpu,wasm", progress=True)
        info["seconds"][kind] = time.perf_counter() - t0
        console.log(f"compiled {out} in {info['seconds'][kind]:.0f} s")
        stamps[kind] = want
        stamp_path.write_text(json.dumps(stamps, indent=1))
        info[kind] = out
    return info


def write_feeds(root: Path, cases: list[tuple[str, int]], config: dict, seed: int) -> dict[str, dict]:
    """Write each case's random feeds into ``root/feeds/<case>/`` and return ``{case: {kind, n, tokens, past, ids,
    cache, arrays}}`` (``ids``, ``cache``: their URLs; ``arrays``: the token ids and the past values).

    ``ids.bin``: the token ids (int64); ``cache.bin``: the ``2 * layers`` past tensors (float32) one after another,
    keys and values of each layer in turn, as the ONNX export lays them out; ``cache-gguf.bin``: the same with
    each key's head dim in llama.cpp's order (its converter permutes Q and K so that RoPE rotates adjacent pairs,
    and Kiln's GGUF packages keep that layout: ``gguf[2i + j] = hf[j * head_dim / 2 + i]``), so that every
    contestant sees the same cache.
    """
    out = {}
    for kind, n in cases:
        key = f"{kind}-{n}"
        rng = np.random.default_rng([seed, kind == "decode", n])  # a case's feeds do not depend on the others
        tokens, past = (n, 0) if kind == "prefill" else (1, n - 1)
        ids = rng.integers(100, 40000, (1, tokens)).astype(np.int64)
        cache = rng.standard_normal((2 * config["layers"], 1, config["kv_heads"], past, config["head_dim"]),
                                    dtype=np.float32)
        d = root / "feeds" / key
        d.mkdir(parents=True)
        ids.tofile(d / "ids.bin")
        cache.tofile(d / "cache.bin")
        gguf, keys = cache.copy(), cache[0::2]
        gguf[0::2] = keys.reshape(*keys.shape[:-1], 2, config["head_dim"] // 2).swapaxes(-1, -2).reshape(keys.shape)
        gguf.tofile(d / "cache-gguf.bin")
        out[key] = {"kind": kind, "n": n, "tokens": tokens, "past": past, "ids": f"./feeds/{key}/ids.bin",
                    "cache": {"hf": f"./feeds/{key}/cache.bin", "gguf": f"./feeds/{key}/cache-gguf.bin"},
                    "arrays": (ids, cache)}
    return out


def reference(model: Path, feeds: dict[str, dict], config: dict) -> dict[str, np.ndarray]:
    """The last row's logits of onnxruntime CPU (Python) running the ONNX decoder ``model`` on each case's feeds."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    out = {}
    for key, f in feeds.items():
        ids, cache = f["arrays"]
        past, tokens = f["past"], f["tokens"]
        x = {"input_ids": ids, "attention_mask": np.ones((1, past + tokens), np.int64),
             "position_ids": np.arange(past, past + tokens, dtype=np.int64)[None]}
        for i in range(config["layers"]):
            x[f"past_key_values.{i}.key"], x[f"past_key_values.{i}.value"] = cache[2 * i], cache[2 * i + 1]
        out[key] = session.run(["logits"], x)[0][0, -1]
    return out


def run_case(pages: dict, where: dict[str, str], key: str, names: list[str], f: dict,
             expected: dict[str, np.ndarray], rounds: dict[str, tuple[int, int]], results: dict,
             console: Console) -> None:
    """Run one case (``prefill-P`` or ``decode-C``): its feeds are fetched into the pages, each contestant's first
    run is checked against ``expected`` (onnxruntime CPU's last row of logits from ``q4`` and ``fp32``: the max abs
    differences ``max_abs_diff`` and ``max_abs_diff_fp32``), then ``warmup + repeat`` interleaved rounds
    (``rounds[name]``) are run and the ``repeat`` last timed; fills ``results[name][kind][n]`` (ms, tokens/s)."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    spec = {k: f[k] for k in ("tokens", "past", "ids", "cache")}
    used = list(dict.fromkeys(where[n] for n in names))
    for p in used:
        pages[p].evaluate("([key, spec]) => window.prepareCase(key, spec)", [key, spec])
    label = f"prefill {f['n']}" if f["kind"] == "prefill" else f"decode @{f['n']}"
    entries = {}
    for name in names:
        r = entries[name] = results[name].setdefault(f["kind"], {}).setdefault(f["n"], {})
        try:
            pages[where[name]].evaluate("([name, key]) => window.bindCase(name, key)", [name, key])  # fetches
            with step(console, f"{label}: first run of {name} ..."):
                first = pages[where[name]].evaluate("([n, k]) => window.runCase(n, k, true)", [name, key])
        except Exception as e:  # noqa: BLE001  (one failing contestant must not stop the run)
            r["error"] = str(e).splitlines()[0][:400]
            console.print(f"[red]{name} {label}: {r['error']}[/]")
            continue
        if first.get("unchecked"):
            r.update(cold_ms=first["ms"], unchecked="the KV cache is the package's state, not the random one fed",
                     times_ms=[])
            continue
        row = np.asarray(first["row"], np.float32)
        r.update(cold_ms=first["ms"], logits_dims=first["dims"], ref_max_abs=float(np.abs(expected["q4"]).max()),
                 max_abs_diff=float(np.abs(row - expected["q4"]).max()),
                 max_abs_diff_fp32=float(np.abs(row - expected["fp32"]).max()),
                 argmax_match=bool(row.argmax() == expected["q4"].argmax()),
                 argmax_match_fp32=bool(row.argmax() == expected["fp32"].argmax()), times_ms=[])
    live = [n for n in names if "error" not in entries[n]]
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task(f"{label}: interleaved runs of {', '.join(live)}",
                                 total=sum(sum(rounds[n]) for n in live))
        for round_ in range(max((sum(rounds[n]) for n in live), default=0)):
            for name in live:
                r = entries[name]
                warmup, repeat = rounds[name]
                if round_ >= warmup + repeat or "error" in r:
                    continue
                try:
                    ms = pages[where[name]].evaluate("([n, k]) => window.runCase(n, k, false)", [name, key])["ms"]
                except Exception as e:  # noqa: BLE001
                    r["error"] = str(e).splitlines()[0][:400]
                    console.print(f"[red]{name} {label}: {r['error']}[/]")
                    continue
                if round_ >= warmup:
                    r["times_ms"].append(ms)
                progress.advance(task)
    for name in live:
        r = entries[name]
        if "error" in r or not r["times_ms"]:
            continue
        med = float(np.median(r["times_ms"]))
        r.update(median_ms=med, min_ms=float(min(r["times_ms"])), max_ms=float(max(r["times_ms"])),
                 tokens_per_s=f["tokens"] / (med / 1e3))
        diffs = ("logits unchecked (its cache is state)" if "unchecked" in r else
                 f"logits max diff {r['max_abs_diff']:.1e} (q4), {r['max_abs_diff_fp32']:.1e} (fp32)")
        console.log(f"{label}: {name} {med:.1f} ms median ({r['tokens_per_s']:.3g} tokens/s), first run "
                    f"{r['cold_ms']:.0f} ms, {diffs}")
    for p in used:
        pages[p].evaluate("(key) => window.dropCase(key)", key)


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL, help="the GGUF (Llama family)")
    ap.add_argument("--contestants", default="kiln-wasm,kiln-wasm-onnx,ort-wasm",
                    help=f"comma list of {', '.join(CONTESTANTS)}")
    ap.add_argument("--webgpu", action="store_true", help="also kiln-webgpu and ort-webgpu (SwiftShader here: slow)")
    ap.add_argument("--prompts", default="128", help="prefill prompt lengths (tokens), comma list")
    ap.add_argument("--contexts", default="128,1024", help="decode contexts (tokens, the new one included)")
    ap.add_argument("--repeat", type=int, default=10, help="timed decode runs per contestant")
    ap.add_argument("--warmup", type=int, default=1, help="untimed decode runs after the checked first run")
    ap.add_argument("--prefill-repeat", type=int, default=5)
    ap.add_argument("--prefill-warmup", type=int, default=0)
    ap.add_argument("--webgpu-prompts", default="16", help="prefill prompt lengths of the WebGPU contestants")
    ap.add_argument("--webgpu-contexts", default="128", help="decode contexts of the WebGPU contestants")
    ap.add_argument("--webgpu-repeat", type=int, default=2, help="timed runs of the WebGPU contestants")
    ap.add_argument("--webgpu-warmup", type=int, default=0)
    ap.add_argument("--repeat-for", default="", metavar="NAME=N,...",
                    help="fewer (or more) timed runs for some contestants, e.g. kiln-wasm-onnx=2")
    ap.add_argument("--ort-wasm-bundle", default="wasm", choices=list(ORT_BUNDLES),
                    help="the onnxruntime-web entry point ort-wasm and ort-wasm-mt import ('onnxruntime-web/wasm')")
    ap.add_argument("--ort-webgpu-bundle", default="webgpu", choices=[b for b in ORT_BUNDLES if b != "wasm"],
                    help="the entry point ort-webgpu imports ('onnxruntime-web/webgpu': the native WebGPU EP)")
    ap.add_argument("--seed", type=int, default=0, help="of the random token ids and cache values")
    ap.add_argument("--work", type=Path, default=WORK, help="where q4.onnx and the packages are made and reused")
    ap.add_argument("--rebuild", action="store_true", help="make q4.onnx and the packages again")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    names = list(dict.fromkeys(args.contestants.split(",") + (["kiln-webgpu", "ort-webgpu"] if args.webgpu else [])))
    unknown = [n for n in names if n not in CONTESTANTS]
    if unknown:
        ap.error(f"unknown contestants {unknown}; known: {', '.join(CONTESTANTS)}")
    sizes = {k: [int(x) for x in getattr(args, k).split(",") if x]
             for k in ("prompts", "contexts", "webgpu_prompts", "webgpu_contexts")}
    if any(n < 1 for v in sizes.values() for n in v):
        ap.error("prompt lengths and contexts are at least 1")
    try:
        overrides = {k: int(v) for k, v in (kv.split("=") for kv in args.repeat_for.split(",") if kv)}
    except ValueError:
        ap.error(f"--repeat-for takes NAME=N,... (N an integer), not {args.repeat_for!r}")
    if set(overrides) - set(names):
        ap.error(f"--repeat-for names contestants that do not run: {sorted(set(overrides) - set(names))}")
    console = Console(width=150)

    # what each contestant runs: cases "prefill-P" / "decode-C", and its (warmup, repeat) for each
    cases: dict[str, list[str]] = {}
    rounds: dict[str, dict[str, tuple[int, int]]] = {}
    for name in names:
        c = CONTESTANTS[name]
        prompts, contexts = ((sizes["webgpu_prompts"], sizes["webgpu_contexts"]) if c.webgpu
                             else (sizes["prompts"], sizes["contexts"]))
        for kind, ns in (("prefill", prompts), ("decode", contexts)):
            for n in ns:
                if c.webgpu:
                    w, r = args.webgpu_warmup, args.webgpu_repeat
                else:
                    w, r = (args.prefill_warmup, args.prefill_repeat) if kind == "prefill" else (args.warmup,
                                                                                             args.repeat)
                if name in overrides:
                    r = overrides[name]
                cases.setdefault(f"{kind}-{n}", []).append(name)
                rounds.setdefault(f"{kind}-{n}", {})[name] = (w, max(1, r))
    order = sorted(cases, key=lambda k: (k.startswith("decode"), int(k.split("-")[1])))
    max_prompt = max([int(k.split("-")[1]) for k in cases if k.startswith("prefill")] + [1])
    need = max(int(k.split("-")[1]) for k in cases)
    if max_prompt > 512 and any(CONTESTANTS[n].model == "gguf" for n in names):
        ap.error("Kiln's GGUF packages take prompts of up to 512 tokens a run")
    max_context = need + SLACK

    from playwright.sync_api import sync_playwright

    from tests.browser import launch_chromium

    t_start = time.perf_counter()
    dist = ensure_onnxruntime_web(console)
    ort_web = json.loads((ORT_DIST.parent / "package.json").read_text())["version"]
    art = prepare(names, args.model, args.work, max_context, max_prompt, args.rebuild, console)
    config = art["config"]
    # onnxruntime-web's build and thread count are the page's: a page for each, Kiln's contestants on the first
    bundles = {n: args.ort_webgpu_bundle if CONTESTANTS[n].webgpu else args.ort_wasm_bundle for n in names
               if CONTESTANTS[n].runtime == "ort"}
    ort_pages = list(dict.fromkeys(f"{bundles[n]}-{CONTESTANTS[n].options['threads']}" for n in bundles))
    ort_pages = ort_pages or [f"{args.ort_wasm_bundle}-1"]
    where = {n: f"{bundles[n]}-{CONTESTANTS[n].options['threads']}" if n in bundles else ort_pages[0]
             for n in names}
    results: dict[str, dict] = {n: {} for n in names}
    with tempfile.TemporaryDirectory(prefix="kiln-llm-browser-") as tmp:
        root = Path(tmp)
        (root / "ort").symlink_to(dist, target_is_directory=True)
        (root / "q4.onnx").symlink_to(art["q4"].resolve())
        kiln_js = None
        for kind in ("gguf", "onnx"):
            if kind in art:
                (root / f"kiln-{kind}").symlink_to(art[kind].resolve(), target_is_directory=True)
                kiln_js = kiln_js or f"./kiln-{kind}/kiln.js"
        if kiln_js is None:  # no Kiln contestant: the page still imports the runtime
            (root / "kiln-js").symlink_to(ROOT / "kiln" / "js", target_is_directory=True)
            kiln_js = "./kiln-js/kiln.js"
        for key in ort_pages:
            bundle = ORT_BUNDLES[key.split("-")[0]]
            (root / f"{key}.html").write_text(PAGE.replace("KILN_JS", kiln_js).replace("ORT_JS", f"./ort/{bundle}"))
        with step(console, "writing random feeds and onnxruntime CPU's reference logits ..."):
            feeds = write_feeds(root, [(k.split("-")[0], int(k.split("-")[1])) for k in order], config, args.seed)
            expected = {k: {"q4": v} for k, v in reference(art["q4"], feeds, config).items()}
            for k, v in reference(art["fp32"], feeds, config).items():
                expected[k]["fp32"] = v
        server, url = serve_root(root)
        try:
            with sync_playwright() as p:
                browser = launch_chromium(p)
                chromium = browser.version
                pages = {}
                for key in ort_pages:
                    page = browser.new_context().new_page()
                    page.set_default_timeout(1_800_000)
                    page.on("console",
                            lambda m, key=key: m.type == "error" and "[W:onnxruntime" not in m.text
                            and console.print(f"[red]{key}: {m.text}[/]"))  # its warnings come as errors
                    page.on("pageerror", lambda e, key=key: console.print(f"[red]{key}: {e}[/]"))
                    page.goto(f"{url}{key}.html")
                    page.wait_for_function("window.benchReady === true", timeout=60_000)
                    page.evaluate("(c) => window.configure(c)", config)
                    pages[key] = page
                for name in names:
                    c = CONTESTANTS[name]
                    spec = {"runtime": c.runtime, "url": URLS[c.model], "layout": "gguf" if c.model == "gguf" else "hf",
                            **c.options}
                    with step(console, f"loading {name} ..."):
                        try:
                            r = pages[where[name]].evaluate("([name, spec]) => window.setup(name, spec)", [name, spec])
                        except Exception as e:  # noqa: BLE001  (one failing contestant must not stop the run)
                            results[name] = {"error": str(e).splitlines()[0][:400]}
                            console.print(f"[red]{name}: {results[name]['error']}[/]")
                            continue
                    results[name] = {"load_ms": r["load"], "target": r["target"], "device": r["device"],
                                     "threads": r["threads"]}
                    if name in bundles:
                        results[name]["ort_bundle"] = bundles[name]
                        results[name]["device"] += f", {ORT_BUNDLES[bundles[name]]}"
                    console.log(f"loaded {name} ({r['target']}, {r['device']}) in {r['load'] / 1e3:.1f} s")
                for key in order:
                    run_case(pages, where, key, [n for n in cases[key] if "error" not in results[n]], feeds[key],
                             expected[key], rounds[key], results, console)
                info = pages[where[names[0]]].evaluate("window.info()")
                browser.close()
        finally:
            server.shutdown()
            server.server_close()
    elapsed = time.perf_counter() - t_start
    return report(args, argv, names, order, cases, rounds, results, config, art, info, chromium, ort_web, elapsed,
                  console)


def report(args, argv, names, order, cases, rounds, results, config, art, info, chromium, ort_web, elapsed,
           console) -> dict:
    """Print the table and write the JSON record; returns it."""
    sizes = [(k.split("-")[0], int(k.split("-")[1])) for k in order]
    table = Table(title=f"{args.model.stem} in headless Chromium {chromium}: tokens/s, median of the timed runs "
                        f"(run() to outputs); xN = N times the onnxruntime-web peer's tokens/s",
                  caption="diff q4 / fp32: the largest max abs difference of the last row's logits (first run at "
                          "each size) against onnxruntime CPU on q4.onnx / on fp32.onnx (the GGUF's weights "
                          "dequantized, before the 4-bit quantizer); bold: the contestant's own weights (kiln-wasm, "
                          "kiln-wasm-mt and kiln-webgpu run the GGUF's Q4_1), held to "
                          f"{TOLERANCE:g} (red: over); *: the arg max differs")
    table.add_column("contestant")
    table.add_column("target")
    table.add_column("load s", justify="right")
    for kind, n in sizes:
        table.add_column(f"prefill {n}" if kind == "prefill" else f"decode @{n}", justify="right")
    table.add_column("diff q4", justify="right")
    table.add_column("diff fp32", justify="right")
    ratios: dict[str, float] = {}
    failed = []
    for name in names:
        r = results[name]
        if "error" in r:
            table.add_row(name, "", "error: " + r["error"][:100])
            continue
        peer = CONTESTANTS[name].peer
        cells = []
        checked = []
        for kind, n in sizes:
            m = r.get(kind, {}).get(n)
            if m is None:
                cells.append("-")
                continue
            if "max_abs_diff" in m:
                checked.append(m)
            if "tokens_per_s" not in m:
                cells.append("[red]error[/]")
                continue
            cell = f"{m['tokens_per_s']:.3g}"
            theirs = results.get(peer, {}).get(kind, {}).get(n, {}) if peer else {}
            if "tokens_per_s" in theirs:
                ratio = m["tokens_per_s"] / theirs["tokens_per_s"]
                ratios[f"{name}/{peer} {kind} {n}"] = ratio
                cell += f" x{ratio:.2f}"
            cells.append(cell)
        diffs = []
        for suffix in ("", "_fp32"):
            worst = max((m["max_abs_diff" + suffix] for m in checked), default=float("nan"))
            r["max_abs_diff" + suffix] = worst
            r["argmax_match" + suffix] = all(m["argmax_match" + suffix] for m in checked)
            diffs.append(f"{worst:.1e}" + ("" if r["argmax_match" + suffix] else "*"))
        held = 1 if CONTESTANTS[name].model == "gguf" else 0  # its reference: fp32.onnx or q4.onnx
        r["reference"] = "fp32.onnx" if held else "q4.onnx"
        diffs[held] = f"[bold]{diffs[held]}[/]"
        if r["max_abs_diff" + ("_fp32" if held else "")] > TOLERANCE:
            failed.append(name)
            diffs[held] = f"[red]{diffs[held]}[/]"
        table.add_row(name, f"{r['target']} ({r['device']})", f"{r['load_ms'] / 1e3:.1f}", *cells, *diffs)
    console.print(table)
    console.print(f"{info['cores']} cores; onnxruntime-web {ort_web}; adapter: {info['adapter']}; "
                  f"{info['userAgent']}; {elapsed / 60:.1f} min in all")
    if failed:
        console.print(f"[red]logits of {', '.join(failed)} differ from onnxruntime CPU on their weights by more "
                      f"than {TOLERANCE:g}[/]")
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    record = {"benchmark": "llm-browser", "model": args.model.name,
              "command": " ".join([".venv/bin/python -m bench.llm_browser",
                                   *(sys.argv[1:] if argv is None else argv)]),
              "settings": settings, "runs": {k: {n: {"warmup": rounds[k][n][0], "repeat": rounds[k][n][1]}
                                                 for n in cases[k]} for k in order},
              "config": config, "prepare_s": art["seconds"], "chromium": chromium, "onnxruntime_web": ort_web,
              "onnxruntime_web_reported": info["ortWeb"], "user_agent": info["userAgent"], "cores": info["cores"],
              "adapter": info["adapter"], "elapsed_s": elapsed, "ratios": ratios, "tolerance": TOLERANCE,
              "over_tolerance": failed, "results": results}
    path = write_record(record, args.out, "llm-browser")
    console.print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
