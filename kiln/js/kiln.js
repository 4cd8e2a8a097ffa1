// @ts-check
// Kiln browser runtime: runs a Kiln package (made by `kiln compile`) on WebGPU, WebGL2 or
// WebAssembly, whichever the package holds and the browser can run.
// Zero dependencies, no build step; ES modules typed with JSDoc.
//
//   import * as kiln from './kiln.js';
//   const session = await kiln.load('./');                       // package directory URL
//   const x = new kiln.Tensor('float32', new Float32Array(3 * 224 * 224), [1, 3, 224, 224]);
//   const {logits} = await session.run({input: x});              // {name: kiln.Tensor}
//   session.target;                                              // 'webgpu', 'webgl2' or 'wasm'
//
// Train-step packages (`kiln compile --train`, docs/training.md) also train on WebGPU (train.js):
//   const loss = await session.trainStep({input: x, labels});    // one SGD/Adam step, the loss before it
//   const bytes = await session.exportWeights();                  // the trained weights as safetensors
//
// On WebGPU, inputs and outputs can stay on the GPU between runs (gputensor.js, docs/runtime.md):
//   const x = await session.upload(input);                        // a kiln.GPUTensor
//   const {logits} = await session.run({input: x}, {output: 'gpu'}); // GPUTensors, nothing read back
//   const t = await logits.read();                                // a kiln.Tensor
// Sessions share one WebGPU device per page (load option `device`) and its pipeline cache.
//
// Language-model packages (`kiln compile MODEL.gguf`, docs/generation.md) stream answers (generate.js):
//   for await (const {text} of session.generate([{role: 'user', content: 'Hi'}], {maxNewTokens: 64})) ...
//   const chunks = await session.chat.completions.create({messages, stream: true});  // OpenAI-shaped chunks
// and `load(url, {onProgress})` reports the weights' download; they are kept in the browser's Cache API
// (`cache`, default on), so a second visit reads them from there.
//
// Speech packages (`kiln compile WHISPER_FOLDER`, docs/speech.md) transcribe (speech.js):
//   const speech = await kiln.loadSpeech('./');
//   const {text, segments} = await speech.transcribe(samples, {sampleRate: 48000, onSegment});
//
// `loadFiles` loads a package from memory ({path: ArrayBuffer}) instead of a URL (the RPC
// runtime, rpc.js, uses it), and `Session.time` measures runs on the device.
//
// Modules, one responsibility each: errors.js (error classes), tensor.js (Tensor, dtypes and
// their storage conversions), package.js (manifest, weights, checksums), preprocess.js (image
// pre-processing, top-k), and one backend per target: webgpu.js, webgl2.js, wasm.js.
//
// A backend module exports
//   target: string                                   the manifest target it runs ('webgpu', ...)
//   unavailable(spec?): Promise<string | null>       why this browser cannot run it (the package's target entry
//                                                     `spec`, e.g. its WebGPU features), or null
//   create(source, manifest, options): Promise<Backend>
// and a Backend has
//   target, adapterInfo {vendor, architecture, device, description}, timestampQuery: boolean
//   run(inputs, {output}): Promise<{[output]: ArrayBuffer}>   inputs [{spec, data}] in storage form (tensor.js),
//                                                    outputs' storage bytes (at least their elements);
//                                                    WebGPU also takes [{spec, gpu: GPUTensor}] and
//                                                    {output: 'gpu'} (GPUTensors out)
//   time(inputs, {repeat, warmup, useTimestamps}): Promise<{clock, times, wall}>   milliseconds
//   dispose()
// This module checks feeds, converts dtypes, serialises runs and picks the target.

import {bindDims, outputShape} from './dims.js';
import {DeviceError, KilnError, PackageError, ShapeError} from './errors.js';
import {memorySource, readManifest, urlSource, verifyingSource} from './package.js';
import {encodeSafetensors} from './train.js';
import {Tensor, fromStorage, shapeText, toStorage} from './tensor.js';
import {GPUTensor} from './gputensor.js';

export {DeviceError, KilnError, PackageError, ShapeError} from './errors.js';
export {FORMAT, FORMAT_MAJOR} from './package.js';
export {Tensor} from './tensor.js';
export {GPUTensor} from './gputensor.js';
export {preprocessImage, topK} from './preprocess.js';

/** Targets in the order `target: 'auto'` tries them: the fastest first. */
export const TARGETS = ['webgpu', 'webgl2', 'wasm'];

/** @type {Record<string, () => Promise<any>>} each target's backend module, imported when first needed */
const BACKENDS = {
  webgpu: () => import('./webgpu.js'),
  webgl2: () => import('./webgl2.js'),
  wasm: () => import('./wasm.js'),
};

/**
 * @typedef {import('./manifest').Manifest} Manifest
 * @typedef {import('./manifest').Training} Training
 * @typedef {import('./manifest').TensorSpec} TensorSpec
 * @typedef {import('./package.js').PackageSource} PackageSource
 * @typedef {import('./control.js').RunInput} RunInput
 */

/**
 * Checked feeds: one per input in manifest order, in storage form (or a GPUTensor), with the run-time dims'
 * values bound from their shapes (null for a static package).
 * @typedef {RunInput[] & {dims?: Record<string, number> | null}} CheckedFeeds
 */

/**
 * @typedef {object} LoadOptions
 * @property {boolean} [verify=true] check each weights file's SHA-256 against the manifest.
 * @property {'auto' | 'webgpu' | 'webgl2' | 'wasm'} [target='auto'] the manifest target to run; 'auto' picks
 *   the first of WebGPU, WebGL2 and WebAssembly that the package holds and this browser can run
 *   (by feature detection, see {@link availableTargets}).
 * @property {GPUPowerPreference} [powerPreference='high-performance'] adapter preference (WebGPU, WebGL2).
 * @property {boolean} [timing=false] also request the adapter's 'timestamp-query' feature, where it
 *   has one, so that {@link Session#time} measures with GPU timestamps rather than the wall clock (WebGPU).
 * @property {boolean} [poison=false] (WebGL2) fill activation and output textures with NaN before each run, so
 *   that an element no kernel writes shows up; for tests.
 * @property {'shared' | 'own' | GPUDevice} [device='shared'] (WebGPU) the device: the page's shared one, so that
 *   sessions exchange GPUTensors and reuse each other's compiled pipelines; a new one of the session's own
 *   (freed by {@link Session#destroy}); or a given GPUDevice, e.g. another session's {@link Session#device}.
 * @property {boolean} [subgroups] (WebGPU) run kernels' subgroup forms (format 1.14, subgroups.js): true wherever
 *   the device can, false never; by default on GPUs, not on CPU adapters (SwiftShader), which emulate them.
 * @property {(p: import('./package.js').LoadProgress) => void} [onProgress] called as the weights are read:
 *   `{file, loaded, total, cached}` (bytes over all weights files; `cached`: this file came from the cache).
 * @property {boolean} [cache=true] keep the weights files in the browser's Cache API (cache 'kiln-weights',
 *   keyed by URL and SHA-256; a secure context has one) and take them from there on later loads; a damaged
 *   entry is dropped and downloaded again.
 * @property {number} [threads] WebAssembly worker threads (default: the hardware's, at most 8, when the page is
 *   cross-origin isolated; otherwise 1; at most 16, the stacks a threaded module has). WebAssembly never runs on
 *   the page's thread.
 * @property {number | null} [timeoutMs=600000] (WebAssembly) the longest one run (one timed run of
 *   {@link Session#time}, one segment of a run with data-dependent dims, the module's start) may compute, in
 *   milliseconds; past it the workers are terminated, the call rejects with a DeviceError and the session refuses
 *   later calls (load it again). null: no limit.
 */

/**
 * Load a package and prepare it to run: read and check the manifest, pick the target, get the
 * device, download (and verify) the weights into device memory, and compile every kernel.
 *
 * @param {string | URL} url URL of the package directory (relative URLs resolve against the page).
 * @param {LoadOptions} [options]
 * @returns {Promise<Session>}
 * @throws {PackageError} unreachable, malformed, corrupted or newer-format package, or a forced target
 *   the package does not hold.
 * @throws {DeviceError} no target the package holds can run here (no WebGPU, no adapter, no WebGL2 with
 *   float render targets, ...), or the device lacks a limit or feature the package needs.
 */
export async function load(url, options = {}) {
  const root = new URL(url, globalThis.location?.href);
  if (!root.pathname.endsWith('/')) root.pathname += '/';
  return loadFrom(urlSource(root, {cache: options.cache ?? true, onProgress: options.onProgress}), options);
}

/**
 * Load a speech package (`speech.json`: a Whisper model compiled by `kiln compile WHISPER_FOLDER`), its four
 * parts on one device; the session transcribes (speech.js, loaded on first use).
 * @param {string | URL} url the package directory.
 * @param {LoadOptions} [options] as for {@link load}, for each part.
 * @returns {Promise<import('./speech.js').SpeechSession>}
 * @throws {PackageError} not a speech package; what {@link load} throws.
 */
export async function loadSpeech(url, options = {}) {
  const speech = await import('./speech.js');
  return speech.loadSpeech(url, options);
}

/**
 * Load a package from memory instead of a URL: the same checks and steps as {@link load}
 * (the weights' sizes and SHA-256 are verified unless `verify` is false).
 *
 * @param {Map<string, ArrayBuffer | ArrayBufferView> | Record<string, ArrayBuffer | ArrayBufferView>} files
 *   package path ('manifest.json', 'weights.safetensors', 'kernels/k0.wgsl', ...) -> the file's bytes.
 *   Typed arrays are copied; ArrayBuffers are used as they are.
 * @param {LoadOptions} [options]
 * @returns {Promise<Session>} a session whose `url` is null.
 * @throws {PackageError} a missing, malformed or corrupted file, or a newer-format package.
 * @throws {DeviceError} as for {@link load}.
 */
export async function loadFiles(files, options = {}) {
  return loadFrom(memorySource(files, options.onProgress), options);
}

/**
 * The targets this browser can run, in preference order, each with why not if it cannot:
 * WebGPU needs `navigator.gpu` and an adapter; WebGL2 a `webgl2` context with
 * `EXT_color_buffer_float`; WebAssembly the SIMD128 proposal (a tiny SIMD module validates).
 * With a `manifest`, a target also needs what the package's entry for it asks for: WebGPU an adapter with
 * its `features` (an fp16 package's 'shader-f16').
 * @param {readonly string[]} [targets=TARGETS] the targets to probe.
 * @param {Manifest} [manifest] a package's manifest.
 * @returns {Promise<{target: string, reason: string | null}[]>} `reason` null where the target can run.
 */
export async function availableTargets(targets = TARGETS, manifest = undefined) {
  const out = [];
  for (const target of targets) {
    let reason;
    try {
      reason = await (await backendModule(target)).unavailable(manifest?.targets?.[target]);
    } catch (error) {
      reason = `${error.name}: ${error.message}`;
    }
    out.push({target, reason});
  }
  return out;
}

/** @param {string} target @returns {Promise<any>} the backend module */
async function backendModule(target) {
  const importer = BACKENDS[target];
  if (!importer) throw new KilnError(`unknown target '${target}' (known: ${TARGETS.join(', ')})`);
  return importer();
}

/**
 * @param {PackageSource} source
 * @param {LoadOptions} options
 * @returns {Promise<Session>}
 */
async function loadFrom(source, options) {
  const {verify = true, target = 'auto'} = options;
  const manifest = await readManifest(source, verify);
  if (verify) source = verifyingSource(source, manifest);  // kernels, modules, tokenizer: checked as they are read
  const held = Object.keys(manifest.targets ?? {});
  const heldText = held.join(', ') || 'none';
  let chosen;
  if (target === 'auto') {
    const candidates = TARGETS.filter((t) => held.includes(t));
    if (!candidates.length) {
      throw new PackageError(`${source.name}: the package holds no target this runtime runs ` +
        `(it has: ${heldText}; this runtime runs ${TARGETS.join(', ')})`);
    }
    if (candidates.length === 1) {
      chosen = candidates[0];  // its own errors say best why it cannot run
    } else {
      const probed = await availableTargets(candidates, manifest);
      chosen = probed.find((p) => p.reason === null)?.target;
      if (!chosen) {
        throw new DeviceError(`this browser can run none of the package's targets: ` +
          probed.map((p) => `${p.target} (${p.reason})`).join('; '));
      }
    }
  } else {
    if (!TARGETS.includes(target)) {
      throw new KilnError(`load: target must be 'auto' or one of ${TARGETS.join(', ')}, got '${target}'`);
    }
    if (!held.includes(target)) {
      throw new PackageError(`${source.name}: the package has no '${target}' target (it has: ${heldText}); ` +
        `compile it with \`kiln compile --target ${[...held, target].join(',')}\``);
    }
    chosen = target;
  }
  const module = await backendModule(chosen);
  if (target !== 'auto') {
    const reason = await module.unavailable(manifest.targets[chosen]);
    if (reason) throw new DeviceError(`cannot run the ${chosen} target in this browser: ${reason}`);
  }
  const backend = await module.create(source, manifest, {...options, verify});
  return new Session(source, manifest, backend);
}

/**
 * The copies {@link Session#reorderState} makes: per state tensor of more than one batch entry, its buffer, the
 * bytes per entry and the `[destination, source]` entries that change.
 * @param {Manifest} manifest @param {number[]} order
 * @returns {{buffer: number, rowBytes: number, pairs: number[][]}[]}
 * @throws {KilnError} no such state, or an order entry out of range.
 */
export function stateRowMoves(manifest, order) {
  const rows = (manifest.state ?? []).filter((s) => s.shape[0] > 1);
  if (!rows.length) {
    throw new KilnError(`${manifest.name}: no state of several hypotheses to reorder (compile the decoder with beams > 1)`);
  }
  return rows.flatMap((s) => {
    const n = s.shape[0];
    if (order.length > n || order.some((i) => !Number.isInteger(i) || i < 0 || i >= n)) {
      throw new KilnError(`reorderState: order [${order}] does not fit state '${s.name}' of ${n} hypotheses`);
    }
    const pairs = order.map((src, b) => [b, src]).filter(([b, src]) => b !== src);
    return pairs.length ? [{buffer: s.buffer, rowBytes: s.bytes / n, pairs}] : [];
  });
}

/**
 * A loaded package on one target's device. Create it with {@link load} or {@link loadFiles}.
 */
export class Session {
  /**
   * Use {@link load} or {@link loadFiles}.
   * @param {PackageSource} source
   * @param {Manifest} manifest
   * @param {any} backend a target's backend (see the top of this file)
   */
  constructor(source, manifest, backend) {
    /** @type {string | null} URL of the package directory; null for a package loaded with {@link loadFiles}. */
    this.url = source.url;
    /** The package's `manifest.json`, parsed (preprocess and postprocess hints included). */
    this.manifest = manifest;
    /** The target being run: 'webgpu', 'webgl2' or 'wasm'. */
    this.target = backend.target;
    /** @type {TensorSpec[]} input descriptions from the manifest */
    this.inputs = manifest.inputs;
    /** @type {TensorSpec[]} output descriptions from the manifest */
    this.outputs = manifest.outputs;
    /** The device's vendor, architecture, device and description as the browser reports them. */
    this.adapterInfo = backend.adapterInfo;
    /** Whether runs can be timed with GPU timestamps ({@link Session#time}). */
    this.timestampQuery = backend.timestampQuery;
    /** The manifest's `training` section (inputs, outputs, trainable, state, loss, optimizer) of a
     * train-step package, or null. */
    this.training = manifest.training ?? null;
    /** Kernels whose compiled pipeline the device's cache already held at load (WebGPU; 0 elsewhere). */
    this.pipelineHits = backend.pipelineHits ?? 0;
    /** Milliseconds of the load's phases where the backend reports them (WebGPU: device, pipelines, total). */
    this.loadMs = backend.loadMs ?? {};
    /** @private */ this.backend = backend;
    /** @private */ this.source = source;
    /** Bytes of weights this load downloaded and took from the browser's cache: `{downloaded, cached}`. */
    this.weightsOrigin = {...source.origin};
    /** @private @type {Promise<import('./generate.js').Generator> | null} */ this.generatorPromise = null;
    /** @private @type {Promise<unknown>} runs are serialised: backends reuse their staging memory */
    this.queue = Promise.resolve();
  }

  /**
   * Run the model.
   *
   * @param {Record<string, Tensor | GPUTensor>} feeds input name -> tensor of the manifest's dtype and shape;
   *   on WebGPU also a {@link GPUTensor} on this session's device, copied into the input on the GPU.
   * @param {{output?: 'cpu' | 'gpu', outputs?: string[], read?: string[]}} [options] `output: 'gpu'` (WebGPU):
   *   the outputs are copied, on the GPU, into new GPUTensors that later runs never change, and nothing is read
   *   back (`tensor.read()` does). `outputs`: only these outputs are returned (onnxruntime's `output_names`; with
   *   `output: 'gpu'` the others are not copied). `read` (with `output: 'gpu'`): outputs among those returned whose
   *   read back is recorded in the run's own command buffer, their GPUTensors' first `read()` returning it (a
   *   decoder step's `next_token`: one submission a step, not two).
   * @returns {Promise<Record<string, Tensor | GPUTensor>>} output name -> new tensor (copied out of device
   *   memory), or new GPUTensor with `output: 'gpu'`.
   * @throws {ShapeError} unknown, missing, wrongly typed or wrongly shaped input.
   * @throws {DeviceError} a GPUTensor of another device; the device was lost or rejected the work.
   * @throws {KilnError} a destroyed GPUTensor, a bad `output`, an unknown name in `outputs`, `read` without
   *   `output: 'gpu'` or naming an output not returned, or GPU tensors on a target other than WebGPU.
   */
  async run(feeds, options = {}) {
    const {output = 'cpu', outputs = null, read = []} = options;
    if (output !== 'cpu' && output !== 'gpu') throw new KilnError(`run: output must be 'cpu' or 'gpu', got '${output}'`);
    if (output === 'gpu') this.requireWebGPU("run(feeds, {output: 'gpu'})");
    const known = this.outputs.map((spec) => spec.name);
    const unknown = (outputs ?? []).filter((name) => !known.includes(name));
    if (unknown.length) {
      const quoted = (names) => names.map((n) => `'${n}'`).join(', ');
      throw new KilnError(`run: unknown output${unknown.length > 1 ? 's' : ''} ${quoted(unknown)}; the model's ` +
                          `outputs are ${quoted(known)}`);
    }
    if (read.length && (output !== 'gpu' || read.some((name) => !(outputs ?? known).includes(name)))) {
      throw new KilnError(`run: read names outputs to read back with output 'gpu', among those returned`);
    }
    const checked = this.checkFeeds(feeds);
    // run-time dims (dims.js): bound from the fed shapes; outputs take their shapes from them
    const env = checked.dims;
    const result = this.queue.then(async () => {
      const raw = await this.backend.run(checked, {output, dims: env, ...(output === 'gpu' ? {outputs, read} : {})});
      if (output === 'gpu') return raw;
      return Object.fromEntries(this.outputs.filter((spec) => !outputs || outputs.includes(spec.name)).map(
        (spec) => [spec.name, fromStorage(env ? {...spec, shape: outputShape(spec, env)} : spec, raw[spec.name])]));
    });
    this.queue = result.catch(() => undefined);
    return result;
  }

  /**
   * Reorder the hypotheses of the package's state for beam search (kiln/runtime/generate.py's `reorder_state`):
   * batch entry `b` of every state tensor with more than one (a self-attention cache `[beams, H, context, hd]`)
   * becomes the entry `order[b]` was; state of one entry (a shared cross-attention cache) is kept. Queued after
   * the runs before it; only the moved entries are copied, on the device.
   * @param {ArrayLike<number>} order entries in `[0, entries)`; `[0, 0, 0]` copies the first to three hypotheses.
   * @returns {Promise<void>}
   * @throws {KilnError} no state of several hypotheses, an order entry out of range, or a backend without it.
   */
  async reorderState(order) {
    const moves = stateRowMoves(this.manifest, Array.from(order, Number));
    if (typeof this.backend.moveRows !== 'function') {
      throw new KilnError(`reorderState: the '${this.target}' runtime keeps no state; use webgpu or wasm`);
    }
    const result = this.queue.then(() => this.backend.moveRows(moves));
    this.queue = result.catch(() => undefined);
    return result;
  }

  /**
   * Time the model's compute on the device: the inputs are written once, then each of
   * `warmup + repeat` runs records every kernel, submits them alone and waits until the
   * device has finished (no uploads or readbacks are timed).
   *
   * With `clock: 'auto'` and a WebGPU device that has 'timestamp-query' (load with `{timing: true}`),
   * each time is the GPU time between the start and the end of the compute pass, from
   * timestamps written by the device (browsers may round them, Chrome to 0.1 ms).
   * Otherwise each time is the wall clock until the device has finished the work
   * (WebGPU: `onSubmittedWorkDone`; WebGL2: `gl.finish()` after the draws; WebAssembly: the calls).
   *
   * @param {Record<string, Tensor>} feeds as for {@link Session#run}.
   * @param {{repeat?: number, warmup?: number, clock?: 'auto' | 'wall'}} [options]
   *   `repeat` timed runs (integer >= 1, default 10) after `warmup` untimed runs (>= 0, default 1).
   * @returns {Promise<{clock: 'timestamp-query' | 'wall', times: number[], wall: number[]}>}
   *   `times`: milliseconds per timed run on `clock`; `wall`: wall-clock milliseconds of the same runs.
   * @throws {ShapeError} a bad feed (see {@link Session#run}).
   * @throws {KilnError} `repeat`, `warmup` or `clock` out of range.
   * @throws {DeviceError} the device was lost or rejected the work.
   */
  async time(feeds, options = {}) {
    const {repeat = 10, warmup = 1, clock = 'auto'} = options;
    if (!Number.isInteger(repeat) || repeat < 1) throw new KilnError(`time: repeat must be an integer >= 1, got ${repeat}`);
    if (!Number.isInteger(warmup) || warmup < 0) throw new KilnError(`time: warmup must be an integer >= 0, got ${warmup}`);
    if (clock !== 'auto' && clock !== 'wall') throw new KilnError(`time: clock must be 'auto' or 'wall', got '${clock}'`);
    const checked = this.checkFeeds(feeds);
    const useTimestamps = clock === 'auto' && this.timestampQuery;
    const result = this.queue.then(() => this.backend.time(checked, {repeat, warmup, useTimestamps, dims: checked.dims}));
    this.queue = result.catch(() => undefined);
    return result;
  }

  /**
   * Run one train step of a train-step package: forward, loss, backward and the optimizer's update of
   * the trainable weights, which stay on the device (later runs and steps use the updated weights).
   *
   * @param {Record<string, Tensor>} feeds the model's inputs and the labels (`session.training.inputs`):
   *   class indices `int64 [N]` for cross-entropy, targets shaped like the prediction for mse.
   * @param {{outputs?: boolean}} [options] `outputs: true` resolves to every training output (the loss,
   *   and `grad/<weight>` in packages compiled with gradient outputs) instead of the loss alone.
   * @returns {Promise<number | Record<string, Tensor>>} the loss before the update.
   * @throws {KilnError} not a train-step package, or a target that does not train (only WebGPU does).
   * @throws {ShapeError} a bad feed (see {@link Session#run}).
   * @throws {DeviceError} the device was lost or rejected the work.
   */
  async trainStep(feeds, options = {}) {
    const training = this.requireTraining('trainStep');
    const checked = this.checkFeeds(feeds, training.inputs);
    if (checked.some((c) => c.gpu)) throw new KilnError('trainStep: feeds must be kiln.Tensors (GPUTensors feed run and time)');
    const result = this.queue.then(async () => {
      const raw = await this.backend.trainStep(checked);
      const outs = Object.fromEntries(training.outputs.map((spec) => [spec.name, fromStorage(spec, raw[spec.name])]));
      return options.outputs ? outs : /** @type {number} */ (outs[training.loss.output].data[0]);  // float32
    });
    this.queue = result.catch(() => undefined);
    return result;
  }

  /**
   * The current trainable weights (and, with `optimizer`, the optimizer's state), copied from the device.
   * @param {{optimizer?: boolean}} [options]
   * @returns {Promise<Record<string, Tensor>>} state name (the ONNX initializer name of a weight) -> tensor
   * @throws {KilnError} not a train-step package, or a target that does not train.
   */
  async weights(options = {}) {
    const training = this.requireTraining('weights');
    const chosen = training.state.filter((s) => s.kind === 'param' || options.optimizer);
    const result = this.queue.then(async () => {
      const raw = await this.backend.readBuffers(chosen.map((s) => ({id: s.buffer, bytes: s.bytes})));
      return Object.fromEntries(chosen.map((s, i) => [s.name, fromStorage(s, raw[i])]));
    });
    this.queue = result.catch(() => undefined);
    return result;
  }

  /**
   * The current trainable weights (and optimizer state with `optimizer`) as a safetensors file, keyed by
   * the ONNX initializer names (load it with `safetensors.numpy.load_file` or `safetensors.torch`).
   * @param {{optimizer?: boolean}} [options]
   * @returns {Promise<Uint8Array>} the file's bytes (e.g. for a download: `new Blob([bytes])`)
   * @throws {KilnError} as for {@link Session#weights}.
   */
  async exportWeights(options = {}) {
    const tensors = await this.weights(options);
    return encodeSafetensors(Object.entries(tensors).map(([name, t]) => ({
      name, dtype: t.type, shape: t.dims, bytes: t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.byteLength),
    })), {format: 'pt', source: 'kiln train step'});
  }

  /**
   * @param {string} what the method called
   * @returns {Training} the training section
   * @private
   */
  requireTraining(what) {
    if (!this.training) {
      throw new KilnError(`${what}: this package has no train step; compile it with \`kiln compile --train\``);
    }
    if (typeof this.backend.trainStep !== 'function') {
      throw new KilnError(`${what}: train steps run on the WebGPU target only; this session runs '${this.target}' ` +
        "(load the package with {target: 'webgpu'} in a browser with WebGPU)");
    }
    return this.training;
  }

  /**
   * Copy tensors to the GPU once, to feed {@link Session#run} without uploads later (WebGPU).
   * @param {Tensor | Record<string, Tensor>} tensors one tensor, or name -> tensor
   * @returns {Promise<GPUTensor | Record<string, GPUTensor>>} new GPUTensors on this session's device
   * @throws {KilnError} not the WebGPU target. @throws {ShapeError} an int64 value outside int32's range.
   */
  async upload(tensors) {
    this.requireWebGPU('upload');
    const device = this.backend.gpuDevice;
    const one = (t) => {
      if (!(t instanceof Tensor)) throw new ShapeError(`upload: expected a kiln.Tensor, got ${t?.constructor?.name ?? typeof t}`);
      return GPUTensor.upload(device, t);
    };
    return tensors instanceof Tensor ? one(tensors)
      : Object.fromEntries(Object.entries(tensors).map(([name, t]) => [name, one(t)]));
  }

  /** The WebGPU device the session runs on (pass it as `load(url, {device})` to share it), or null on other targets. */
  get device() {
    return this.backend.gpuDevice ?? null;
  }

  /** @param {string} what @private @throws {KilnError} the session does not run WebGPU */
  requireWebGPU(what) {
    if (this.target !== 'webgpu') {
      throw new KilnError(`${what}: GPU tensors need the WebGPU target; this session runs '${this.target}'`);
    }
  }

  /**
   * A package inside this one (a language model's `sampler`, format 1.8), loaded for this session's target on
   * its device (so GPUTensors pass between the two).
   * @param {string} folder the part's folder in the package
   * @returns {Promise<Session>}
   * @throws {PackageError} the part is missing or damaged; what {@link load} throws.
   */
  loadPart(folder) {
    return loadFrom(this.source.part(folder), {target: this.target, device: this.backend.gpuDevice ?? 'shared'});
  }

  /**
   * The generation driver of a language-model package (its tokenizer and chat template loaded on first use).
   * @returns {Promise<import('./generate.js').Generator>}
   * @throws {KilnError} the package has no `generation` section (not a language model).
   */
  generator() {
    if (!this.manifest.generation) {
      return Promise.reject(new KilnError(`${this.source.name}: not a language-model package (its manifest has no ` +
        "'generation'; compile a GGUF model: kiln compile MODEL.gguf)"));
    }
    if (!this.generatorPromise) {
      this.generatorPromise = import('./generate.js').then(({Generator}) => Generator.create(this, this.source));
      this.generatorPromise.catch(() => { this.generatorPromise = null; });
    }
    return this.generatorPromise;
  }

  /**
   * Stream the answer to a prompt token by token (a language-model package; generate.js).
   * @param {string | import('./generate.js').ChatMessage[]} prompt text as it is, or chat messages
   *   `[{role: 'user', content}]` through the package's chat template.
   * @param {import('./generate.js').GenerateOptions} [options] `maxNewTokens` (default: until the context is full),
   *   `temperature` (0: greedy),
   *   `topK`, `topP`, `repetitionPenalty`, `seed`, `stop` strings, `signal` (an AbortSignal that stops it).
   * @returns {AsyncGenerator<{token: number, text: string, stats: import('./generate.js').GenerationStats}>}
   *   a chunk per generated token; `stats` has `promptTokens`, `newTokens`, `prefillMs`, `decodeMs`,
   *   `prefillTokensPerS`, `decodeTokensPerS` and, at the end, `stopReason` ('stop', 'length' or 'abort').
   * @throws {KilnError} (at the first step) not a language model, a bad option, an empty prompt, one longer
   *   than the package's context, or text that is not valid UTF-8.
   */
  async *generate(prompt, options = {}) {
    const generator = await this.generator();
    yield* generator.generate(prompt, options);
  }

  /**
   * The OpenAI-style chat surface: `await session.chat.completions.create({messages, stream: true, max_tokens,
   * temperature})` (see generate.js's ChatCompletions).
   * @returns {{completions: import('./generate.js').ChatCompletions}}
   */
  get chat() {
    const create = async (request) => {
      await this.generator();  // a package that is not a language model: that error, not a failed import
      const {ChatCompletions} = await import('./generate.js');
      return new ChatCompletions(() => this.generator(), this.manifest.name ?? this.manifest.source ?? 'kiln')
        .create(request);
    };
    return {completions: /** @type {any} */ ({create})};
  }

  /** Free the session's device memory (and its device, unless shared); the session cannot run afterwards. */
  destroy() {
    this.backend.dispose();
  }

  /**
   * @param {Record<string, Tensor | GPUTensor>} feeds
   * @param {TensorSpec[]} [specs] the inputs to check against (default: the model's)
   * @returns {CheckedFeeds} one per manifest input, in manifest order, its data converted to the buffer's
   *   storage type (or the GPUTensor fed)
   * @private
   */
  checkFeeds(feeds, specs = this.inputs) {
    if (feeds === null || typeof feeds !== 'object') {
      throw new ShapeError(`run() takes an object {inputName: Tensor}, got ${feeds === null ? 'null' : typeof feeds}`);
    }
    const names = specs.map((i) => i.name);
    const quoted = names.map((n) => `'${n}'`).join(', ');
    const unknown = Object.keys(feeds).filter((n) => !names.includes(n));
    if (unknown.length) {
      throw new ShapeError(`unknown input${unknown.length > 1 ? 's' : ''} ${unknown.map((n) => `'${n}'`).join(', ')}; ` +
        `the model's inputs are ${quoted}`);
    }
    const dynamic = specs === this.inputs && Boolean(this.manifest?.dynamic_dims?.length);
    const checked = /** @type {CheckedFeeds} */ (specs.map((spec) => {
      const expected = `${spec.dtype}${shapeText(spec.shape)}`;
      const tensor = feeds[spec.name];
      if (tensor === undefined) throw new ShapeError(`missing input '${spec.name}' (${expected})`);
      if (tensor instanceof GPUTensor) return this.checkGPUFeed(spec, tensor, dynamic);
      if (!(tensor instanceof Tensor)) {
        const got = /** @type {any} */ (tensor)?.constructor?.name ?? typeof tensor;
        throw new ShapeError(`input '${spec.name}': expected a kiln.Tensor (${expected}), got ${got}`);
      }
      if (tensor.type !== spec.dtype) {
        throw new ShapeError(`input '${spec.name}': expected dtype ${spec.dtype}, got ${tensor.type}`);
      }
      if (!dynamic && (tensor.dims.length !== spec.shape.length || tensor.dims.some((d, i) => d !== spec.shape[i]))) {
        throw new ShapeError(`input '${spec.name}': expected shape ${shapeText(spec.shape)} ` +
          `(symbolic ${shapeText(spec.symbolic_shape ?? spec.shape)}), got ${shapeText(tensor.dims)}`);
      }
      return {spec, data: toStorage(spec, tensor.data)};
    }));
    /** run-time dims bound from the feeds' shapes (null for a static package) */
    checked.dims = dynamic ? bindDims(this.manifest, feeds) : null;
    return checked;
  }

  /**
   * @param {TensorSpec} spec @param {GPUTensor} tensor
   * @param {boolean} [dynamic] a package with run-time dims (bindDims checks the shape against them)
   * @returns {{spec: TensorSpec, gpu: GPUTensor}}
   * @private
   */
  checkGPUFeed(spec, tensor, dynamic = false) {
    this.requireWebGPU(`input '${spec.name}'`);
    if (!tensor.buffer) throw new KilnError(`input '${spec.name}': the GPUTensor was destroyed`);
    if (tensor.type !== spec.dtype) {
      throw new ShapeError(`input '${spec.name}': expected dtype ${spec.dtype}, got a GPUTensor of ${tensor.type}`);
    }
    if (!dynamic && (tensor.dims.length !== spec.shape.length || tensor.dims.some((d, i) => d !== spec.shape[i]))) {
      throw new ShapeError(`input '${spec.name}': expected shape ${shapeText(spec.shape)} ` +
        `(symbolic ${shapeText(spec.symbolic_shape ?? spec.shape)}), got a GPUTensor of shape ${shapeText(tensor.dims)}`);
    }
    if (tensor.device !== this.backend.gpuDevice) {
      throw new DeviceError(`input '${spec.name}': the GPUTensor lives on another WebGPU device than this session ` +
        "(buffers cannot move between devices); load both sessions on one device (the default, device: 'shared') " +
        'or upload it again with session.upload()');
    }
    return {spec, gpu: tensor};
  }
}
