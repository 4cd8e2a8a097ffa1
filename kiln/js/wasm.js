// @ts-check
// Kiln browser runtime: the WebAssembly backend (zero dependencies besides errors.js and package.js;
// its Web Workers run wasm-host.js and wasm-worker.js).
//
// Runs a package's `targets.wasm` (docs/package-format.md): every kernel is an exported function of one
// SIMD128 module, and every buffer lives at a fixed offset of one linear memory. Single-threaded, the
// module is instantiated in one worker (wasm-host.js runs a WasmBackend there; the page's thread keeps a
// WorkerBackend that forwards each call) and each plan step is one call over all its tiles. Never on the page's
// thread: a run that outlives the time limit (`timeoutMs`: an edited module that loops for ever) is stopped by
// terminating its worker, and the page stays responsive meanwhile.
// With threads (only where the page is cross-origin isolated, so SharedArrayBuffer exists), the
// package's threaded module is instantiated in each of N workers over one shared memory; a run
// posts one message to every worker, each computes its contiguous share of every step's tiles, the
// workers meet at an Atomics barrier between steps, and each answers when the plan is done.
// A package with run-time dims: the kernels read the dims from the module's array `kiln_dims` (its address from
// the export kiln_dims()), written when they change, and each step runs over its `tiles` size expression.
// See kiln.js for the backend interface this module implements.

import {
  bindPoints, checkCount, chosenStep, dimsWords, evalDims, growSizes, grownSize, outputShape, regrow,
} from './dims.js';
import {DeviceError, KilnError, PackageError, ShapeError} from './errors.js';
import {readWeights, sha256Hex} from './package.js';
import {DTYPES, product} from './tensor.js';

/** @typedef {import('./manifest').Manifest} Manifest */
/** @typedef {import('./manifest').WasmTarget} WasmTarget */
/** @typedef {import('./manifest').TensorSpec} TensorSpec */

/** The manifest target this backend runs. */
export const target = 'wasm';

/** The smallest module using SIMD128: `(func (result v128) (v128.const i32x4 0 0 0 0))`. */
const SIMD_PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,  // magic, version 1
  0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b,  // type section: () -> v128
  0x03, 0x02, 0x01, 0x00,  // function section
  0x0a, 0x16, 0x01, 0x14, 0x00, 0xfd, 0x0c, ...new Array(16).fill(0), 0x0b,  // code: v128.const 0, end
]);

/** Most worker threads a session starts by default. */
const MAX_DEFAULT_THREADS = 8;

/** The default time limit of one run, in milliseconds (as the Python wasm runtime's `timeout_s`). */
export const DEFAULT_TIMEOUT_MS = 600_000;

/** @type {Record<string, new (message: string) => Error>} the error classes a worker's answer may name */
const ERRORS = {KilnError, PackageError, DeviceError, ShapeError};

/**
 * Why this browser cannot run WebAssembly packages, or null if it can: it needs WebAssembly with
 * SIMD128 (a tiny SIMD module must validate).
 * @returns {Promise<string | null>}
 */
export async function unavailable() {
  if (typeof WebAssembly !== 'object') return 'no WebAssembly';
  try {
    return WebAssembly.validate(SIMD_PROBE) ? null : 'WebAssembly has no SIMD128 (fixed-width SIMD)';
  } catch (error) {
    return `WebAssembly.validate failed: ${error.message}`;
  }
}

/** Whether this page may share memory with workers (cross-origin isolated: COOP + COEP headers). */
function canShareMemory() {
  return globalThis.crossOriginIsolated === true && typeof SharedArrayBuffer === 'function' &&
    typeof Worker === 'function';
}

/**
 * Fetch, check and compile one of the package's wasm modules.
 * @param {import('./package.js').PackageSource} source @param {{module: string, bytes: number, sha256: string}} entry
 * @param {boolean} verify check its SHA-256 @returns {Promise<WebAssembly.Module>}
 * @throws {PackageError} a missing, truncated or corrupted module. @throws {DeviceError} one the browser cannot compile.
 */
async function compileModule(source, entry, verify) {
  const bytes = await source.bytes(entry.module, 'wasm module');
  if (bytes.byteLength !== entry.bytes) {
    throw new PackageError(`wasm module ${entry.module}: size mismatch (expected ${entry.bytes} bytes, got ${bytes.byteLength})`);
  }
  if (verify) {
    const digest = await sha256Hex(bytes);
    if (digest !== entry.sha256) {
      throw new PackageError(`wasm module ${entry.module}: SHA-256 checksum mismatch (expected ${entry.sha256}, ` +
        `got ${digest}); the package is corrupted or was edited`);
    }
  }
  try {
    return await WebAssembly.compile(bytes);
  } catch (error) {
    throw new DeviceError(`this browser cannot compile the package's wasm module ${entry.module}: ${error.message}`);
  }
}

/**
 * Instantiate the package's module (threaded where it can and `threads` allows) and write the weights.
 * @param {import('./package.js').PackageSource} source
 * @param {Manifest} manifest
 * @param {{verify: boolean, poison?: boolean, threads?: number, timeoutMs?: number | null}} options  `threads`:
 *   worker threads (default: the hardware's, at most 8, when the page is cross-origin isolated and the package has
 *   a threaded module; otherwise 1, in one worker). `poison` fills activation and output buffers with NaN before
 *   each run. `timeoutMs`: the longest one run (or one segment of a run with data-dependent dims, one timed run of
 *   `time`, the start) may compute before its workers are stopped, in milliseconds (default 600,000; null: none).
 * @returns {Promise<WasmBackend | WorkerBackend>}
 * @throws {KilnError} a bad `threads` or `timeoutMs`.
 * @throws {DeviceError} threads asked for where the page is not cross-origin isolated, or a module this
 *   browser cannot compile.
 * @throws {PackageError} a missing or corrupted module or weights file.
 */
export async function create(source, manifest, options) {
  const spec = manifest.targets.wasm;
  const limitMs = options.timeoutMs === undefined ? DEFAULT_TIMEOUT_MS : options.timeoutMs;
  if (limitMs !== null && !(typeof limitMs === 'number' && Number.isFinite(limitMs) && limitMs > 0)) {
    throw new KilnError('load: timeoutMs must be a finite number of milliseconds above 0, or null, got ' +
      (typeof limitMs === 'number' ? limitMs : `${typeof limitMs} ${JSON.stringify(limitMs)}`));
  }
  const sharing = canShareMemory() && Boolean(spec.threads);
  let threads = options.threads;
  if (threads === undefined || threads === null) {
    threads = sharing ? Math.max(1, Math.min(MAX_DEFAULT_THREADS, navigator.hardwareConcurrency || 1)) : 1;
  }
  if (!Number.isInteger(threads) || threads < 1) throw new KilnError(`load: threads must be an integer >= 1, got ${threads}`);
  if (threads > 1 && !sharing) {
    throw new DeviceError(`cannot run the wasm target on ${threads} threads: ` + (spec.threads
      ? 'the page is not cross-origin isolated (serve it with COOP: same-origin and COEP: require-corp, as `kiln serve` does)'
      : 'the package has no threaded module'));
  }
  let entry = threads > 1 ? spec.threads : spec;
  let module = await compileModule(source, entry, options.verify);
  if (threads > 1 && !WebAssembly.Module.exports(module).some((e) => e.name === 'kiln_worker_stack')) {
    // a threaded module built before workers had stacks of their own: they shared one, and libm's sinf and cosf
    // (which reduce large arguments through it) raced; such a package runs on one thread
    if (options.threads !== undefined && options.threads !== null) {
      throw new DeviceError(`cannot run the wasm target on ${threads} threads: the package's threaded module has no ` +
        'stack for each worker (it was compiled by an older Kiln); recompile it, or load it with threads: 1');
    }
    threads = 1;
    entry = spec;
    module = await compileModule(source, entry, options.verify);
  }
  let backend;
  try {
    backend = threads > 1
      ? await WasmBackend.threaded(module, manifest, threads, limitMs)
      : await WorkerBackend.start(module, manifest, {poison: Boolean(options.poison), limitMs});
  } catch (error) {  // (the engine's own errors: a module or memory layout that does not fit the manifest)
    if (error instanceof KilnError) throw error;
    throw new PackageError(`wasm module ${entry.module}: cannot instantiate it with the manifest's memory ` +
      `(${error?.name}: ${error?.message}); the package is damaged or inconsistent`);
  }
  backend.poison = Boolean(options.poison);
  try {
    await readWeights(source, manifest, options.verify, (file, weights) => backend.writeWeights(weights));
  } catch (error) {
    backend.dispose();
    throw error;
  }
  return backend;
}

/**
 * Post `message` to `worker` and wait for its answer; a `{type: 'tick'}` message (one timed run done) restarts the
 * clock. After `limitMs` without an answer, `onTimeout()` (which stops the worker) runs and the promise rejects with
 * the DeviceError it returns. While the answer is awaited, `pending` holds a function that rejects it at once (a
 * backend disposed mid-run calls it).
 * @param {Worker} worker @param {any} message
 * @param {{transfer?: Transferable[], limitMs: number | null, onTimeout: () => DeviceError,
 *   pending: Set<(error: Error) => void>}} options
 * @returns {Promise<any>} the answer
 * @throws {DeviceError} the worker failed or was stopped; a KilnError the worker answered with.
 */
function ask(worker, message, {transfer = [], limitMs, onTimeout, pending}) {
  return new Promise((resolve, reject) => {
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let timer;
    /** @param {Error | null} error @param {any} [value] */
    const settle = (error, value) => {
      clearTimeout(timer);
      pending.delete(settle);
      if (error) reject(error); else resolve(value);
    };
    const arm = () => {
      clearTimeout(timer);
      if (limitMs !== null) timer = setTimeout(() => settle(onTimeout()), limitMs);
    };
    worker.onmessage = ({data}) => {
      if (data.type === 'tick') return arm();
      if (data.type !== 'error') return settle(null, data);
      const Class = Object.hasOwn(ERRORS, data.name) ? ERRORS[data.name] : null;
      if (Class) return settle(new Class(data.message));
      const error = new Error(data.message);  // (the engine's own: create() says what it means)
      error.name = String(data.name);
      settle(error);
    };
    worker.onerror = (event) => {
      event.preventDefault?.();
      settle(new DeviceError(`wasm worker failed: ${event.message || 'its script did not load or threw'}`));
    };
    pending.add(settle);
    arm();
    worker.postMessage(message, transfer);
  });
}

/**
 * The answers a backend awaits from its workers, within its time limit: past it, `stop()` (which terminates the
 * workers) runs and the backend refuses every later call with the reason.
 */
class WorkerCalls {
  /** @param {number | null} limitMs @param {() => void} stop */
  constructor(limitMs, stop) {
    /** the time limit of each answer, in ms (null: none) */
    this.limitMs = limitMs;
    /** @private */ this.stop = stop;
    /** why the backend cannot run any more (its workers were stopped), or null */
    this.stopped = /** @type {string | null} */ (null);
    /** @private the answers awaited (ask) @type {Set<(error: Error) => void>} */
    this.pending = new Set();
  }

  /**
   * Post `message` to `worker` and wait for its answer (module ask), unless the backend was stopped.
   * @param {Worker} worker @param {any} message @param {Transferable[]} [transfer] @returns {Promise<any>}
   */
  ask(worker, message, transfer = []) {
    if (this.stopped) return Promise.reject(new DeviceError(this.stopped));
    return ask(worker, message, {
      transfer, limitMs: this.limitMs, pending: this.pending,
      onTimeout: () => {
        this.stopped ??= `the wasm module ran longer than its time limit of ${this.limitMs / 1000} s and was ` +
          'stopped (load the package again to run it; raise load\'s timeoutMs if it is that slow)';
        this.stop();
        return new DeviceError(this.stopped);
      },
    });
  }

  /** The backend was disposed: later calls are refused, and the answers awaited are rejected at once. */
  end() {
    this.stopped ??= 'the session was destroyed';
    for (const settle of [...this.pending]) settle(new DeviceError(this.stopped));
  }
}

/** A package in WebAssembly linear memory. Create it with {@link create}. */
export class WasmBackend {
  /**
   * @param {WebAssembly.Memory} memory
   * @param {Manifest} manifest
   * @param {number} threads
   * @param {number | null} [limitMs] the workers' time limit per compute (threaded)
   * @private
   */
  constructor(memory, manifest, threads, limitMs = null) {
    /** The manifest target this backend runs. */
    this.target = target;
    /** What runs the kernels. */
    this.adapterInfo = {
      vendor: 'WebAssembly', architecture: 'SIMD128', device: `${threads} thread${threads > 1 ? 's' : ''}`,
      description: threads > 1 ? 'Web Workers over shared memory' : 'single-threaded',
    };
    /** WebAssembly runs are timed with the wall clock. */
    this.timestampQuery = false;
    /** Worker threads computing the kernels (1: the calling thread). */
    this.threads = threads;
    /** the linear memory (internal: create() writes the weights into it) */
    this.memory = memory;
    /** @private */ this.manifest = manifest;
    /** @private @type {WasmTarget} */ this.spec = manifest.targets.wasm;
    /** @type {number[]} byte address of each buffer (internal, as memory) */
    this.offsets = this.spec.memory.offsets;
    /** whether runs fill activation and output buffers with NaN first (internal: set by create()) */
    this.poison = false;
    /** @private @type {Function[]} the single-threaded plan: one closure per step */
    this.calls = [];
    /** @private @type {Worker[]} */ this.workers = [];
    /** @private each step's tiles for the current run-time dims (the plan's totals in a static package) */
    this.tiles = this.spec.plan.map((s) => s.total);
    /** @private each step's kernel for the current run-time dims (a variant's, or the step's own) */
    this.kernels = this.spec.plan.map((s) => s.kernel);
    /** @private byte address of the module's kiln_dims array (run-time dims), 0 when there is none */
    this.dimsAddress = 0;
    /** @private the dims last written (JSON) @type {string | null} */
    this.dimsKey = null;
    /** @private whether the workers have the current tiles */
    this.tilesSent = true;
    /** @private data-dependent dims (format 1.9): after which step a run reads counts (dims.js) */
    this.binds = bindPoints(this.spec.plan);
    /** @private whether buffers grow with growable dims (format 1.10) */
    this.grows = manifest.buffers.some((b) => b.grow !== undefined);
    /** @private growable buffers' bytes for the current dims @type {Map<number, number>} */
    this.grown = new Map();
    /** @private the single-threaded module's exports (planCalls again when buffers move) */
    this.exports = /** @type {WebAssembly.Exports | null} */ (null);
    /** @private whether the workers have the current buffer addresses */
    this.ptrsSent = true;
    /** @private the answers awaited from the workers, within the time limit of each compute */
    this.answers = new WorkerCalls(limitMs, () => this.dispose());
  }

  /**
   * The single-threaded backend: one instance on this thread.
   * @param {WebAssembly.Module} module @param {Manifest} manifest @returns {Promise<WasmBackend>} (internal: create())
   */
  static async single(module, manifest) {
    const instance = await WebAssembly.instantiate(module, {});
    const memory = /** @type {WebAssembly.Memory} */ (instance.exports.memory);
    const layout = manifest.targets.wasm.memory;
    if (memory.buffer.byteLength < layout.bytes) {
      memory.grow(Math.ceil((layout.bytes - memory.buffer.byteLength) / 65536));
    }
    const backend = new WasmBackend(memory, manifest, 1);
    backend.exports = instance.exports;
    backend.calls = backend.planCalls(instance.exports);
    if (manifest.dynamic_dims?.length) backend.dimsAddress = backend.dimsExport(instance.exports)();
    return backend;
  }

  /**
   * The threaded backend: `threads` workers, each with an instance over one shared memory.
   * @param {WebAssembly.Module} module @param {Manifest} manifest @param {number} threads
   * @param {number | null} limitMs the time limit of the start and of each compute
   * @returns {Promise<WasmBackend>} (internal: create())
   */
  static async threaded(module, manifest, threads, limitMs) {
    const {pages, max_pages: maximum = pages} = manifest.targets.wasm.memory;  // (1.10: growable buffers grow it)
    const memory = new WebAssembly.Memory({initial: pages, maximum, shared: true});
    const backend = new WasmBackend(memory, manifest, threads, limitMs);
    const control = new SharedArrayBuffer(8);  // the barrier: [arrived, generation]
    const steps = backend.spec.plan.map((s) => ({
      export: backend.spec.kernels[s.kernel].export, ptrs: s.buffers.map((b) => backend.offsets[b]), total: s.total,
    }));
    try {
      const ready = await Promise.all(Array.from({length: threads}, (_, index) => {
        const worker = new Worker(new URL('./wasm-worker.js', import.meta.url), {type: 'module', name: `kiln-wasm-${index}`});
        backend.workers.push(worker);
        return backend.answers.ask(worker, {type: 'init', module, memory, control, index, workers: threads, steps});
      }));
      if (manifest.dynamic_dims?.length) {
        if (!ready[0].dims) throw new Error('the threaded module has no kiln_dims export (run-time dims)');
        backend.dimsAddress = ready[0].dims;
      }
    } catch (error) {
      backend.dispose();
      throw new DeviceError(`cannot start the wasm worker threads: ${error.message}`);
    }
    return backend;
  }

  /**
   * Each plan step as a call of its kernel export over all its tiles (skipped when run-time dims leave it none).
   * @param {WebAssembly.Exports} exports @returns {Function[]} @private
   */
  planCalls(exports) {
    const fns = /** @type {Function[]} */ (this.spec.kernels.map((kernel) => exports[kernel.export]));
    return this.spec.plan.map((step, index) => {
      for (const k of [step.kernel, ...(step.variants ?? []).map((v) => v.kernel)]) {
        if (typeof fns[k] !== 'function') throw new PackageError(`wasm plan step ${index}: no kernel export for kernel ${k}`);
      }
      const ptrs = step.buffers.map((b) => this.offsets[b]);
      if (step.tiles === undefined && !step.variants) {
        const fn = fns[step.kernel], args = [...ptrs, 0, step.total];
        return () => fn(...args);
      }
      return () => {
        const tiles = this.tiles[index];
        if (tiles > 0) fns[this.kernels[index]](...ptrs, 0, tiles);
      };
    });
  }

  /**
   * The module's kiln_dims export (the address of its run-time dims array).
   * @param {WebAssembly.Exports} exports @returns {Function} @private
   */
  dimsExport(exports) {
    const fn = exports.kiln_dims;
    if (typeof fn !== 'function') throw new PackageError('the wasm module has no kiln_dims export (run-time dims)');
    return /** @type {Function} */ (fn);
  }

  /**
   * Write run-time dims into the module's kiln_dims array and evaluate each step's tiles (dims.js); no-op for a
   * static package or unchanged dims.
   * @param {Record<string, number> | null} dims @private
   */
  setDims(dims) {
    if (!dims || !this.dimsAddress) return;
    const key = JSON.stringify(dims);
    if (key === this.dimsKey) return;
    if (this.grows) this.relayout(dims);
    const words = dimsWords(this.manifest, dims);
    const view = new Int32Array(this.memory.buffer, this.dimsAddress, words.length);
    if (this.workers.length) for (let i = 0; i < words.length; i++) Atomics.store(view, i, words[i]);
    else view.set(words);
    const steps = this.spec.plan.map((s) => chosenStep(s, dims));  // (a variant scheduled for these dims, or the step)
    this.kernels = steps.map((s) => s.kernel);
    this.tiles = steps.map((s) => (s.tiles === undefined ? s.total : Math.max(0, evalDims(s.tiles, dims))));
    this.tilesSent = false;
    this.dimsKey = key;
  }

  /**
   * Lay the growable buffers (format 1.10, docs/dynamic-shapes.md *Growable buffers*) out for `dims` (dims.js
   * `regrow`: after the fixed ones, which never move), growing the memory when they need more of it.
   * @param {Record<string, number>} dims
   * @throws {ShapeError} a buffer over 2 GiB, or more memory than the module can grow to
   * @private
   */
  relayout(dims) {
    this.grown = growSizes(this.manifest, dims);
    const {offsets, bytes} = regrow(this.spec.memory, this.grown);
    const have = this.memory.buffer.byteLength;
    if (bytes > have) {
      try {
        this.memory.grow(Math.ceil((grownSize(have, bytes) - have) / 65536));
      } catch {
        throw new ShapeError(`the run's dims need ${Math.ceil(bytes / 2 ** 20)} MiB of wasm memory, more than the ` +
          'module can grow to (2 GiB): run smaller inputs');
      }
    }
    if (offsets.every((o, i) => o === this.offsets[i])) return;
    this.offsets = offsets;
    if (this.exports) this.calls = this.planCalls(this.exports);
    this.ptrsSent = false;
  }

  /**
   * Bytes of buffer `id` for the current dims (a growable buffer's run-time size).
   * @param {number} id @returns {number} @private
   */
  bufferBytes(id) {
    return this.grown.get(id) ?? this.manifest.buffers[id].bytes;
  }

  /**
   * Write weights into their buffers (create(), as readWeights reads each file).
   * @param {{buffer: {id: number}, bytes: ArrayBuffer, offset: number, length: number}[]} weights
   */
  writeWeights(weights) {
    const memory = new Uint8Array(this.memory.buffer);
    for (const w of weights) memory.set(new Uint8Array(w.bytes, w.offset, w.length), this.offsets[w.buffer.id]);
  }

  /** Fill activation and output buffers with NaN. @private */
  fillPoison() {
    for (const b of this.manifest.buffers) {
      if (b.kind !== 'activation' && b.kind !== 'output') continue;
      new Float32Array(this.memory.buffer, this.offsets[b.id], this.bufferBytes(b.id) / 4).fill(NaN);
    }
  }

  /** @param {{spec: TensorSpec, data: ArrayBufferView}[]} inputs in storage form @private */
  writeInputs(inputs) {
    const memory = new Uint8Array(this.memory.buffer);
    for (const {spec, data} of inputs) {
      memory.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), this.offsets[spec.buffer]);
    }
  }

  /**
   * Copy state entries within their buffers (kiln.js `stateRowMoves`); the sources are copied out first.
   * @param {{buffer: number, rowBytes: number, pairs: number[][]}[]} moves
   */
  moveRows(moves) {
    const memory = new Uint8Array(this.memory.buffer);
    for (const {buffer, rowBytes, pairs} of moves) {
      const base = this.offsets[buffer];
      const rows = new Map(pairs.map(([, src]) => [src, memory.slice(base + src * rowBytes, base + (src + 1) * rowBytes)]));
      for (const [dst, src] of pairs) memory.set(/** @type {Uint8Array} */ (rows.get(src)), base + dst * rowBytes);
    }
  }

  /**
   * Run plan steps `[first, last)` (default: every step).
   * @param {number} [first] @param {number} [last] @private
   */
  async compute(first = 0, last = this.spec.plan.length) {
    if (this.answers.stopped) throw new DeviceError(this.answers.stopped);
    if (!this.workers.length) {
      for (let i = first; i < last; i++) this.calls[i]();
      return;
    }
    // (the workers keep the last tiles and kernels they were sent)
    const tiles = this.tilesSent ? null : this.tiles;
    const kernels = this.tilesSent ? null : this.kernels.map((k) => this.spec.kernels[k].export);
    const ptrs = this.ptrsSent ? null : this.spec.plan.map((s) => s.buffers.map((b) => this.offsets[b]));
    const message = {type: 'run', tiles, kernels, ptrs, first, last};
    await Promise.all(this.workers.map((worker) => this.answers.ask(worker, message)));
    this.tilesSent = true;
    this.ptrsSent = true;
  }

  /**
   * Run the plan of a package with data-dependent dims (docs/dynamic-shapes.md): up to each step that computes
   * counts, read them from memory, bind the dims (written into `dims`, which the outputs' shapes then follow) and
   * go on with the later steps' tiles evaluated again.
   * @param {Record<string, number>} dims the bound dims (data-dependent ones at their bounds), updated in place
   * @throws {ShapeError} a count outside its dim's bounds
   * @private
   */
  async computeBinding(dims) {
    const specs = Object.fromEntries(this.manifest.dynamic_dims.map((d) => [d.name, d]));
    let start = 0;
    for (const [stop, names] of this.binds) {
      await this.compute(start, stop);
      for (const name of names) {
        const at = this.offsets[/** @type {number} */ (specs[name].count)];
        dims[name] = checkCount(specs[name], new Int32Array(this.memory.buffer, at, 1)[0]);
      }
      this.setDims(dims);
      start = stop;
    }
    await this.compute(start, this.spec.plan.length);
  }

  /**
   * Run the plan once.
   * @param {{spec: TensorSpec, data: ArrayBufferView}[]} inputs every manifest input, its data in storage form
   * (at its run-time size in a package with run-time dims)
   * @param {{dims?: Record<string, number> | null}} [options] `dims`: the run-time dims' values (dims.js), null for
   *   a static package
   * @returns {Promise<Record<string, ArrayBuffer>>} each output's elements (storage form; as many as its run-time
   *   shape has)
   * @throws {DeviceError} a kernel trapped or a worker failed.
   */
  async run(inputs, {dims = null} = {}) {
    this.setDims(dims);  // (first: growable buffers move before the inputs are written)
    if (this.poison) this.fillPoison();
    this.writeInputs(inputs);
    try {
      await (this.binds.length && dims ? this.computeBinding(dims) : this.compute());
    } catch (error) {
      if (error instanceof ShapeError) throw error;
      throw error instanceof DeviceError ? error : new DeviceError(`a wasm kernel failed: ${error.message}`);
    }
    /** @type {Record<string, ArrayBuffer>} */
    const results = {};
    for (const output of this.manifest.outputs) {
      const full = this.bufferBytes(output.buffer);
      const bytes = dims ? Math.min(full, product(outputShape(output, dims)) * DTYPES[output.storage ?? output.dtype].bytes)
        : full;
      const copy = new Uint8Array(bytes);
      copy.set(new Uint8Array(this.memory.buffer, this.offsets[output.buffer], bytes));
      results[output.name] = copy.buffer;
    }
    return results;
  }

  /**
   * Time the kernels: inputs written once, then `warmup + repeat` runs of every plan step.
   * @param {{spec: TensorSpec, data: ArrayBufferView}[]} inputs in storage form
   * @param {{repeat: number, warmup: number, dims?: Record<string, number> | null, onRun?: () => void}} options
   *   (`dims`: as for run; `onRun`: called after each run, wasm-host.js's tick)
   * @returns {Promise<{clock: 'wall', times: number[], wall: number[]}>} milliseconds
   */
  async time(inputs, {repeat, warmup, dims = null, onRun}) {
    this.setDims(dims);
    this.writeInputs(inputs);
    const times = [];
    for (let i = 0; i < warmup + repeat; i++) {
      const start = performance.now();
      await (this.binds.length && dims ? this.computeBinding({...dims}) : this.compute());
      const elapsed = performance.now() - start;
      if (i >= warmup) times.push(elapsed);
      onRun?.();
    }
    return {clock: 'wall', times, wall: [...times]};
  }

  /** Stop the workers and drop the memory. */
  dispose() {
    for (const worker of this.workers) worker.terminate();
    this.workers = [];
    this.calls = [];
    this.answers.end();
  }
}

/**
 * The single-threaded backend, run in a worker (wasm-host.js holds its {@link WasmBackend}); this side forwards each
 * call, within the time limit. Inputs are copied over, outputs moved back. Create it with {@link create}.
 */
export class WorkerBackend {
  /** @param {Worker} worker @param {number | null} limitMs @private */
  constructor(worker, limitMs) {
    /** The manifest target this backend runs. */
    this.target = target;
    /** What runs the kernels. */
    this.adapterInfo = {
      vendor: 'WebAssembly', architecture: 'SIMD128', device: '1 thread', description: 'single-threaded, in a worker',
    };
    /** WebAssembly runs are timed with the wall clock. */
    this.timestampQuery = false;
    /** Worker threads computing the kernels. */
    this.threads = 1;
    /** whether runs fill activation and output buffers with NaN first (set by create(); the worker was told) */
    this.poison = false;
    /** @private */ this.worker = worker;
    /** @private the answer awaited from the worker, within the time limit of each request */
    this.answers = new WorkerCalls(limitMs, () => this.dispose());
  }

  /**
   * Start the worker and instantiate the module there.
   * @param {WebAssembly.Module} module @param {Manifest} manifest
   * @param {{poison: boolean, limitMs: number | null}} options
   * @returns {Promise<WorkerBackend>} (internal: create())
   */
  static async start(module, manifest, {poison, limitMs}) {
    let worker;
    try {
      worker = new Worker(new URL('./wasm-host.js', import.meta.url), {type: 'module', name: 'kiln-wasm'});
    } catch (error) {
      throw new DeviceError(`cannot start the wasm worker: ${error.message}`);
    }
    const backend = new WorkerBackend(worker, limitMs);
    try {
      await backend.request({type: 'init', module, manifest, poison});
    } catch (error) {
      backend.dispose();
      throw error;
    }
    return backend;
  }

  /**
   * Send one request to the worker and wait for its answer's value, within the time limit (which stops the worker).
   * @param {any} message @param {Transferable[]} [transfer] @returns {Promise<any>} @private
   */
  async request(message, transfer = []) {
    return (await this.answers.ask(this.worker, message, transfer)).value;
  }

  /**
   * Write weights into their buffers: the file's bytes are copied to the worker.
   * @param {{buffer: {id: number}, bytes: ArrayBuffer, offset: number, length: number}[]} weights
   * @returns {Promise<void>}
   */
  async writeWeights(weights) {
    if (!weights.length) return;
    await this.request({
      type: 'write', bytes: weights[0].bytes,
      weights: weights.map((w) => ({buffer: {id: w.buffer.id}, offset: w.offset, length: w.length})),
    });
  }

  /**
   * Copies of the inputs' bytes, to move to the worker.
   * @param {{spec: TensorSpec, data: ArrayBufferView}[]} inputs @private
   */
  static wire(inputs) {
    return inputs.map(({spec, data}) => ({
      spec, data: new Uint8Array(data.buffer, data.byteOffset, data.byteLength).slice(),
    }));
  }

  /**
   * Run the plan once in the worker (WasmBackend.run).
   * @param {{spec: TensorSpec, data: ArrayBufferView}[]} inputs @param {{dims?: Record<string, number> | null}} [options]
   *   `dims` is updated in place with the data-dependent dims the run bound
   * @returns {Promise<Record<string, ArrayBuffer>>}
   */
  async run(inputs, {dims = null} = {}) {
    const wire = WorkerBackend.wire(inputs);
    const {results, bound} = await this.request({type: 'run', inputs: wire, dims}, wire.map((i) => i.data.buffer));
    if (dims && bound) Object.assign(dims, bound);
    return results;
  }

  /**
   * Time the kernels in the worker (WasmBackend.time); the time limit applies to each run.
   * @param {{spec: TensorSpec, data: ArrayBufferView}[]} inputs
   * @param {{repeat: number, warmup: number, dims?: Record<string, number> | null}} options
   * @returns {Promise<{clock: 'wall', times: number[], wall: number[]}>}
   */
  async time(inputs, {repeat, warmup, dims = null}) {
    const wire = WorkerBackend.wire(inputs);
    return this.request({type: 'time', inputs: wire, options: {repeat, warmup, dims}}, wire.map((i) => i.data.buffer));
  }

  /**
   * Copy state entries within their buffers (WasmBackend.moveRows).
   * @param {{buffer: number, rowBytes: number, pairs: number[][]}[]} moves @returns {Promise<void>}
   */
  async moveRows(moves) {
    await this.request({type: 'moveRows', moves});
  }

  /** Stop the worker, dropping the memory. */
  dispose() {
    this.worker.terminate();
    this.answers.end();
  }
}
