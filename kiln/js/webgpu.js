// @ts-check
// Kiln browser runtime: the WebGPU backend (zero dependencies; its own modules: pipelines.js, subgroups.js, ...).
//
// Execution matches the native runtime (kiln/runtime/native.py): one GPUBuffer per
// manifest buffer, weights uploaded once at load, one compute pipeline per kernel and one
// bind group per plan step; each run writes the inputs, records every dispatch in one
// compute pass, copies the outputs into one mappable staging buffer, submits once and maps it once.
// Feeds may be GPUTensors (gputensor.js), copied into the input buffers on the GPU, and
// `run(inputs, {output: 'gpu'})` copies the outputs into new GPUTensors instead of reading them back.
// Sessions share one device per page by default (`sharedDevice`), and every device has a
// pipeline cache keyed by the SHA-256 of the kernel's WGSL (`pipelineCache`, pipelines.js): a second session of
// a package, or of one sharing kernels, compiles nothing.
// See kiln.js for the backend interface this module implements.

import {ControlRunner, isControlPlan, kernelSteps} from './control.js';
import {createTrainer, readBuffers, runTrainStep} from './train.js';
import {
  bindPoints, checkCount, dimsWords, growSizes, grownSize, outputShape, stepDispatch, variantIndex,
} from './dims.js';
import {DeviceError, PackageError} from './errors.js';
import {GPUTensor, storageType} from './gputensor.js';
import {readWeights} from './package.js';
import {createPipelines, pipelineCache} from './pipelines.js';
import {isCpuAdapter} from './subgroups.js';
import {DTYPES, product} from './tensor.js';

/** @typedef {import('./manifest').Manifest} Manifest */
/** @typedef {import('./manifest').WebGPUTarget} WebGPUTarget */
/** @typedef {import('./manifest').WebGPUKernel} WebGPUKernel */
/** @typedef {import('./manifest').KernelStep} KernelStep */
/** @typedef {import('./manifest').TensorSpec} TensorSpec */
/** @typedef {import('./package.js').PackageSource} PackageSource */

/** The manifest target this backend runs. */
export const target = 'webgpu';
export {PIPELINE_CACHE_SIZE, pipelineCache} from './pipelines.js';

/**
 * Why this browser cannot run WebGPU packages, or null if it can (it has `navigator.gpu`
 * and an adapter, with the WebGPU features the package's target entry `spec` lists, such as
 * an fp16 package's 'shader-f16').
 * @param {WebGPUTarget} [spec] the manifest's `targets.webgpu`
 * @returns {Promise<string | null>}
 */
export async function unavailable(spec = undefined) {
  const gpu = globalThis.navigator?.gpu;
  if (!gpu) return 'navigator.gpu is missing';
  try {
    const adapter = await gpu.requestAdapter();
    if (!adapter) return 'requestAdapter() returned null';
    const missing = (spec?.features ?? []).filter((f) => !adapter.features.has(f));
    return missing.length ? `the adapter lacks WebGPU features ${missing.join(', ')}` : null;
  } catch (error) {
    return `requestAdapter() failed: ${error.message}`;
  }
}

/**
 * Get a WebGPU device and build the package's buffers, pipelines and bind groups.
 * @param {PackageSource} source
 * @param {Manifest} manifest
 * @param {{verify: boolean, powerPreference?: GPUPowerPreference, timing?: boolean,
 *   device?: 'shared' | 'own' | GPUDevice, subgroups?: boolean}} options
 * @returns {Promise<WebGPUBackend>}
 * @throws {DeviceError} no WebGPU, no adapter, or a missing limit or feature.
 * @throws {PackageError} a kernel that does not compile, bad weights, or an invalid plan.
 */
export async function create(source, manifest, options) {
  const {verify, powerPreference = 'high-performance', timing = false, device: wanted = 'shared', subgroups} = options;
  const spec = manifest.targets.webgpu;
  const started = performance.now();
  const grows = manifest.buffers.some((b) => b.grow !== undefined);
  const {adapter, device, shared} = await chooseDevice(spec, powerPreference, timing, wanted, grows);
  const deviceMs = performance.now() - started;
  try {
    const backend = await WebGPUBackend.create(source, manifest, adapter, device, verify, subgroups);
    backend.sharedDevice = shared;
    if (!timing) backend.timestampQuery = false;  // a shared device may have the feature; time() uses it when asked
    backend.loadMs = {...backend.loadMs, device: deviceMs, total: performance.now() - started};
    return backend;
  } catch (error) {
    if (!shared) device.destroy();
    throw error;
  }
}

/** @type {{key: string, promise: Promise<{adapter: GPUAdapter, device: GPUDevice}>}[]} the page's shared devices */
const SHARED = [];

/**
 * The device a backend runs on: `'own'` a new one, `'shared'` the page's shared device for this power
 * preference (made with the adapter's maxima for the limits packages name, so later packages fit), or a
 * GPUDevice the caller gives (another session's `device`), checked against the package's needs.
 * @param {WebGPUTarget} spec @param {GPUPowerPreference} powerPreference @param {boolean} timing
 * @param {'shared' | 'own' | GPUDevice} wanted
 * @param {boolean} [grows=false] the package's buffers grow (format 1.10): a new device of its own asks for the
 *   adapter's largest buffers, as the Python runtime does, so that growth is bounded by the GPU, not the first size
 * @returns {Promise<{adapter: any, device: GPUDevice, shared: boolean}>}
 * @throws {DeviceError} as {@link requestDevice}, or a given device that lacks a feature or limit.
 */
async function chooseDevice(spec, powerPreference, timing, wanted, grows = false) {
  if (wanted === 'own') return {...await requestDevice(spec, powerPreference, timing, false, grows), shared: false};
  if (wanted !== 'shared') {
    if (!(globalThis.GPUDevice && wanted instanceof GPUDevice)) {
      throw new DeviceError(`load: device must be 'shared', 'own' or a GPUDevice (e.g. another session's device), ` +
        `got ${wanted?.constructor?.name ?? typeof wanted}`);
    }
    const lacking = fitsDevice(wanted, spec, false);
    if (lacking) throw new DeviceError(`the given device ${lacking}`);
    return {adapter: {info: wanted.adapterInfo}, device: wanted, shared: true};
  }
  for (const entry of SHARED) {
    if (entry.key !== powerPreference) continue;
    const {adapter, device} = /** @type {{adapter?: GPUAdapter, device?: GPUDevice}} */ (
      await entry.promise.catch(() => ({})));
    if (device && !fitsDevice(device, spec, timing && adapter.features.has('timestamp-query'))) {
      return {adapter, device, shared: true};
    }
  }
  const entry = {key: powerPreference, promise: requestDevice(spec, powerPreference, timing, true)};
  SHARED.push(entry);
  try {
    const {adapter, device} = await entry.promise;
    device.lost.then(() => SHARED.splice(SHARED.indexOf(entry) >>> 0, 1));
    return {adapter, device, shared: true};
  } catch (error) {
    SHARED.splice(SHARED.indexOf(entry) >>> 0, 1);
    throw error;
  }
}

/**
 * What `device` lacks of the package's features and limits (and 'timestamp-query' if `timestamps`), or null.
 * @param {GPUDevice} device @param {WebGPUTarget} spec @param {boolean} timestamps
 * @returns {string | null}
 */
function fitsDevice(device, spec, timestamps) {
  const features = [...(spec.features ?? []), ...(timestamps ? ['timestamp-query'] : [])];
  const missing = features.filter((f) => !device.features.has(f));
  if (missing.length) return `lacks WebGPU features ${missing.join(', ')}`;
  for (const [limit, needed] of Object.entries(spec.limits ?? {})) {
    const have = device.limits[limit];
    if (have !== undefined && have < needed) return `has ${limit}=${have}, the package needs ${needed}`;
  }
  return null;
}

/**
 * Request an adapter and a device with the package's features and limits.
 *
 * The manifest's `limits` are what the plan uses (largest buffer, bindings per kernel,
 * workgroup and dispatch sizes); each must be within the adapter's, or a DeviceError names
 * the limit. They are requested as they are, so the device offers exactly what the plan needs.
 *
 * @param {WebGPUTarget} spec the manifest's target entry (features, limits, kernels, plan)
 * @param {GPUPowerPreference} powerPreference
 * @param {boolean} timing also request 'timestamp-query' if the adapter has it
 * @param {boolean} [maximal=false] request the adapter's own value of every limit the package names, and
 *   'timestamp-query' when the adapter has it (a device to share with later packages)
 * @param {boolean} [grows=false] also request the adapter's maxStorageBufferBindingSize and maxBufferSize (buffers
 *   that grow at run time)
 * @returns {Promise<{adapter: GPUAdapter, device: GPUDevice}>}
 */
async function requestDevice(spec, powerPreference, timing, maximal = false, grows = false) {
  const gpu = globalThis.navigator?.gpu;
  if (!gpu) {
    throw new DeviceError('WebGPU is not available in this browser (navigator.gpu is missing); use a recent ' +
      'Chrome, Edge or Safari, or Firefox with WebGPU enabled, and serve the page from https:// or localhost');
  }
  const adapter = await gpu.requestAdapter({powerPreference});
  if (!adapter) {
    throw new DeviceError('no WebGPU adapter available (navigator.gpu.requestAdapter() returned null); ' +
      'the GPU may be blocklisted or WebGPU disabled in this browser');
  }
  const name = describeAdapter(adapter.info);
  const features = spec.features ?? [];
  const missing = features.filter((f) => !adapter.features.has(f));
  if (missing.length) {
    const fp16 = missing.includes('shader-f16') ?
      ' (it computes in fp16: load a package compiled with --precision fp32 on this adapter)' : '';
    throw new DeviceError(`adapter ${name} lacks WebGPU features ${missing.join(', ')}, which the package needs${fp16}`);
  }
  /** @type {Record<string, number>} */
  const requiredLimits = {};
  for (const [limit, needed] of Object.entries(spec.limits ?? {})) {
    const have = adapter.limits[limit];
    if (have === undefined) continue;  // a limit this browser does not know
    if (have < needed) {
      throw new DeviceError(`adapter ${name} has ${limit}=${have}, the package needs ${needed}`);
    }
    requiredLimits[limit] = maximal ? have : needed;
  }
  if (grows || maximal) {  // growable buffers: as large as the adapter allows
    for (const limit of ['maxStorageBufferBindingSize', 'maxBufferSize']) {
      if (adapter.limits[limit] !== undefined) requiredLimits[limit] = adapter.limits[limit];
    }
  }
  const requiredFeatures = /** @type {GPUFeatureName[]} */ ([...features]);
  if ((timing || maximal) && adapter.features.has('timestamp-query') && !requiredFeatures.includes('timestamp-query')) {
    requiredFeatures.push('timestamp-query');
  }
  // kernels' subgroup forms (subgroups.js) where the adapter has the feature
  if (adapter.features.has('subgroups') && !requiredFeatures.includes('subgroups')) requiredFeatures.push('subgroups');
  let device;
  try {
    device = await adapter.requestDevice({requiredFeatures, requiredLimits});
  } catch (error) {
    throw new DeviceError(`cannot create a WebGPU device on adapter ${name}: ${error.message}`);
  }
  return {adapter, device};
}

/** @param {GPUAdapterInfo | undefined} info @returns {string} */
function describeAdapter(info) {
  if (!info) return '(unknown)';
  const parts = [info.vendor, info.architecture, info.device, info.description].filter(Boolean);
  return parts.length ? `'${parts.join(' ')}'` : '(unnamed)';
}

/**
 * Write `byteLength` bytes of `source` from `sourceOffset` to the start of `buffer`,
 * padding to WebGPU's 4-byte write granularity.
 * @param {GPUQueue} queue
 * @param {GPUBuffer} buffer
 * @param {ArrayBufferLike} source
 * @param {number} sourceOffset
 * @param {number} byteLength
 */
function writePadded(queue, buffer, source, sourceOffset, byteLength) {
  if (byteLength === 0) return;  // an empty tensor
  if (byteLength % 4 === 0) {
    queue.writeBuffer(buffer, 0, source, sourceOffset, byteLength);
  } else {
    const padded = new Uint8Array(Math.ceil(byteLength / 4) * 4);
    padded.set(new Uint8Array(source, sourceOffset, byteLength));
    queue.writeBuffer(buffer, 0, padded);
  }
}

/**
 * Pop a WebGPU error scope and throw it as `ErrorType` with `context`, if there was an error.
 * @param {GPUDevice} device
 * @param {new (message: string) => Error} ErrorType
 * @param {string} context
 */
async function throwScopeError(device, ErrorType, context) {
  const error = await device.popErrorScope();
  if (error) throw new ErrorType(`${context}: ${error.message}`);
}


/** A package on a WebGPU device: its buffers, pipelines and bind groups. Create it with {@link create}. */
export class WebGPUBackend {
  /**
   * @param {GPUAdapter} adapter
   * @param {GPUDevice} device
   * @param {Manifest} manifest
   * @param {GPUBuffer[]} buffers one per manifest buffer, indexed by buffer id
   * @param {{pipeline: GPUComputePipeline, bindGroup: GPUBindGroup, dispatch: number[], step: KernelStep,
   *   alternatives: {pipeline: GPUComputePipeline, bindGroup: GPUBindGroup}[]}[]} steps (`alternatives`: the
   *   step's kernel and its variants', setDims picks one)
   * @param {{buffer: GPUBuffer, offsets: number[], sizes: number[]}} staging one mappable buffer taking every
   *   output's copy, at `offsets[i]` for the i-th output
   * @private
   */
  constructor(adapter, device, manifest, buffers, steps, staging) {
    /** The manifest target this backend runs. */
    this.target = target;
    const info = /** @type {Partial<GPUAdapterInfo>} */ (adapter.info ?? {});
    /** The adapter's vendor, architecture, device and description as the browser reports them. */
    this.adapterInfo = {
      vendor: info.vendor ?? '', architecture: info.architecture ?? '',
      device: info.device ?? '', description: info.description ?? '',
    };
    /** Whether runs can be timed with GPU timestamps. */
    this.timestampQuery = device.features.has('timestamp-query');
    /** @private */ this.device = device;
    /** @private */ this.outputs = manifest.outputs;
    /** @private */ this.buffers = buffers;
    /** @private */ this.steps = steps;
    /** @private */ this.staging = staging;
    /** @private @type {GPUBuffer | null} reorderState's, kept for the next steps */ this.scratch = null;
    /** @private @type {GPUDeviceLostInfo | {reason: string, message: string} | null} */
    this.lost = null;
    device.lost.then((lost) => { this.lost = lost; });
    // set by create() right after construction:
    /** whether the device outlives this backend (shared, or the caller's); internal */
    this.sharedDevice = false;
    /** @private the runner of a plan with control steps, or null @type {ControlRunner | null} */
    this.control = null;
    /** @private the dims uniform of a package with run-time dims, or null @type {GPUBuffer | null} */
    this.dimsBuffer = null;
    /** @private makes the steps' bind groups again (growable buffers grew) @type {(() => any[]) | null} */
    this.rebind = null;
    /** @private whether buffers grow with growable dims (format 1.10) */
    this.grows = manifest.buffers.some((b) => b.grow !== undefined);
    /** @private */ this.manifest = manifest;
    /** @private the dims last written into the uniform (JSON), and the dispatches they give @type {string | null} */
    this.dimsKey = null;
    /** @private @type {number[][]} */
    this.dispatches = steps.map((s) => s.dispatch);
    /** @private data-dependent dims (format 1.9): after which step the run reads counts back (dims.js) */
    this.binds = bindPoints(manifest.targets.webgpu.plan);
    /** @private a mappable buffer for the counts, made on first use @type {GPUBuffer | null} */
    this.countStaging = null;
    /**
     * @private the train plan of a train-step package (train.js), or null
     * @type {import('./train.js').Trainer | null}
     */
    this.trainer = null;
    /** @private the manifest's training section, or null */
    this.training = manifest.training ?? null;
    /** kernels whose pipeline the device's cache already held */
    this.pipelineHits = 0;
    /**
     * milliseconds of the load's phases (the pipelines compile while the weights download)
     * @type {Record<string, number>}
     */
    this.loadMs = {};
  }

  /**
   * Build the GPU objects; see {@link create}.
   * @param {PackageSource} source @param {Manifest} manifest @param {GPUAdapter} adapter
   * @param {GPUDevice} device @param {boolean} verify
   * @param {boolean} [subgroups] run kernels' subgroup forms (undefined: on GPUs, not CPU adapters)
   * @returns {Promise<WebGPUBackend>}
   */
  static async create(source, manifest, adapter, device, verify, subgroups = undefined) {
    const root = source.name;
    const spec = manifest.targets.webgpu;
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
    device.pushErrorScope('out-of-memory');
    device.pushErrorScope('validation');
    const buffers = [];
    for (const b of manifest.buffers) {
      if (b.id !== buffers.length) throw new PackageError(`${root}: manifest buffer ids must be 0, 1, 2, ... in order`);
      buffers.push(device.createBuffer({label: `b${b.id}_${b.kind}`, size: b.bytes, usage}));
    }
    // both scopes are popped before awaiting, so that other sessions on a shared device cannot interleave
    const [invalid, oom] = [device.popErrorScope(), device.popErrorScope()];
    const [invalidError, oomError] = await Promise.all([invalid, oom]);
    if (invalidError) throw new PackageError(`${root}: cannot create the package's buffers: ${invalidError.message}`);
    if (oomError) throw new DeviceError(`out of GPU memory creating the package's buffers: ${oomError.message}`);

    const cache = pipelineCache(device);
    const hitsBefore = cache.hits;
    const compileStart = performance.now();
    let pipelinesMs = 0;
    // run-time dims (dims.js): one uniform buffer of dim values, bound after each reading kernel's storage buffers
    const dimsBuffer = manifest.dynamic_dims?.length ? device.createBuffer({
      label: 'kiln_dims', size: spec.dims_uniform.bytes, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
    }) : null;
    const [pipelines] = await Promise.all([
      createPipelines(source, device, spec.kernels, subgroups ?? !isCpuAdapter(adapter.info),
        spec.subgroup_probe).then((p) => {
        pipelinesMs = performance.now() - compileStart;
        return p;
      }),
      readWeights(source, manifest, verify, async (file, weights) => {
        device.pushErrorScope('validation');
        for (const w of weights) writePadded(device.queue, buffers[w.buffer.id], w.bytes, w.offset, w.length);
        await throwScopeError(device, PackageError, `weights file ${file}: cannot upload`);
      }),
    ]);

    device.pushErrorScope('validation');
    const control = isControlPlan(spec.plan);  // run-time If/Loop (format 1.4): control.js runs the plan
    // a plan without control steps holds kernel steps only
    const flat = control ? kernelSteps(spec.plan) : /** @type {KernelStep[]} */ (spec.plan);
    const steps = bindSteps(device, spec, flat, pipelines, buffers, dimsBuffer, root);
    const staging = makeStaging(device, manifest.outputs.map((o) => copySize(o, buffers[o.buffer])));
    const trainer = manifest.training ? createTrainer(device, manifest, buffers, pipelines) : null;
    await throwScopeError(device, PackageError, `${root}: invalid execution plan`);
    const backend = new WebGPUBackend(adapter, device, manifest, buffers, steps, staging);
    backend.control = control ? new ControlRunner(device, buffers, spec.plan, steps) : null;
    backend.dimsBuffer = dimsBuffer;
    backend.rebind = () => bindSteps(device, spec, flat, pipelines, buffers, dimsBuffer, root);
    backend.trainer = trainer;
    backend.pipelineHits = cache.hits - hitsBefore;
    backend.loadMs = {pipelines: pipelinesMs};
    return backend;
  }

  /**
   * Run the plan once.
   * @param {{spec: TensorSpec, data?: ArrayBufferView, gpu?: GPUTensor}[]} inputs every manifest input: its data in
   *   storage form, or a GPUTensor on this device (copied into the input's buffer on the GPU)
   * @param {{output?: 'cpu' | 'gpu', dims?: Record<string, number> | null, outputs?: string[] | null,
   *   read?: string[]}} [options] `'gpu'`: copy the outputs into new GPUTensors, read nothing back; `dims`: the
   *   run-time dims' values (dims.js), null for a static package; with `'gpu'`, `outputs`: only these outputs
   *   (null: all), `read`: outputs whose read back is recorded in the run's own command buffer (their GPUTensors'
   *   first `read()` returns it)
   * @returns {Promise<Record<string, ArrayBuffer | GPUTensor>>} each output's buffer contents (storage form),
   *   or with `output: 'gpu'` each output's new GPUTensor
   * @throws {DeviceError} the device was lost or rejected the work.
   */
  async run(inputs, {output = 'cpu', dims = null, outputs = null, read = []} = {}) {
    this.checkLost();
    const {device} = this;
    device.pushErrorScope('validation');
    this.setDims(dims);  // (first: growable buffers grow before the inputs are written into them)
    this.writeInputs(inputs);
    let encoder = device.createCommandEncoder();
    for (const {spec, gpu} of inputs) {
      const size = gpu ? copySize(spec, this.buffers[spec.buffer], gpu.dims) : 0;
      if (size) encoder.copyBufferToBuffer(gpu.buffer, 0, this.buffers[spec.buffer], 0, size);
    }
    if (this.control) {  // run-time If/Loop: control.js submits and reads conditions as it goes
      encoder = await this.control.execute(encoder, inputs).catch(async (error) => {
        await device.popErrorScope().catch(() => undefined);
        throw error;
      });
    } else if (this.binds.length && dims) {  // data-dependent dims: submits and reads counts back as it goes
      encoder = await this.encodeBinding(encoder, dims).catch(async (error) => {
        await device.popErrorScope().catch(() => undefined);
        throw error;
      });
    } else {
      this.encodePass(encoder);
    }
    const {staging} = this;
    // run-time dims: each output's shape (and so its bytes) follows from the dims
    const shapes = this.outputs.map((spec) => (dims ? outputShape(spec, dims) : spec.shape));
    const sizes = dims ? this.outputs.map((spec, i) => copySize(spec, this.buffers[spec.buffer], shapes[i]))
      : staging.sizes;
    if (output === 'gpu') {
      /** @type {Record<string, GPUTensor>} */
      const results = {};
      const reads = [];
      this.outputs.forEach((spec, i) => {
        if (outputs && !outputs.includes(spec.name)) return;
        const t = results[spec.name] = GPUTensor.empty(device, spec.dtype, shapes[i], spec.name);
        if (sizes[i]) encoder.copyBufferToBuffer(this.buffers[spec.buffer], 0, t.buffer, 0, sizes[i]);
        if (read.includes(spec.name)) reads.push(t.startRead(encoder, this.buffers[spec.buffer]));
      });
      device.queue.submit([encoder.finish()]);
      for (const started of reads) started();
      await throwScopeError(device, DeviceError, 'WebGPU rejected the run');
      return results;
    }
    this.outputs.forEach((spec, i) => {
      if (sizes[i]) {
        encoder.copyBufferToBuffer(this.buffers[spec.buffer], 0, staging.buffer, staging.offsets[i], sizes[i]);
      }
    });
    device.queue.submit([encoder.finish()]);
    await throwScopeError(device, DeviceError, 'WebGPU rejected the run');
    await staging.buffer.mapAsync(GPUMapMode.READ);
    try {
      const mapped = staging.buffer.getMappedRange();
      return Object.fromEntries(this.outputs.map((spec, i) => [spec.name,
        mapped.slice(staging.offsets[i], staging.offsets[i] + sizes[i])]));
    } finally {
      staging.buffer.unmap();
    }
  }

  /** The WebGPU device this backend runs on (to load another session on it, or to check GPUTensors). */
  get gpuDevice() {
    return this.device;
  }

  /**
   * Write run-time dims into the dims uniform and evaluate every step's dispatch (dims.js); no-op for
   * static packages or unchanged dims.
   * @param {Record<string, number> | null} dims @private
   */
  setDims(dims) {
    if (!dims || !this.dimsBuffer) return;
    const key = JSON.stringify(dims);
    if (key === this.dimsKey) return;
    if (this.grows) this.grow(dims);
    this.device.queue.writeBuffer(this.dimsBuffer, 0, dimsWords(this.manifest, dims));
    this.dispatches = this.steps.map((s) => stepDispatch(s.step, dims));
    for (const s of this.steps) Object.assign(s, s.alternatives[variantIndex(s.step, dims)]);  // (a variant's kernel)
    this.dimsKey = key;
  }

  /**
   * Make every growable buffer (format 1.10, docs/dynamic-shapes.md *Growable buffers*) large enough for `dims`: a
   * larger one replaces it (a state buffer keeps its contents), and the bind groups and the readback staging buffer
   * are made again.
   * @param {Record<string, number>} dims
   * @throws {ShapeError} a buffer over 2 GiB; {DeviceError} one over the device's buffer limits
   * @private
   */
  grow(dims) {
    const {device} = this;
    const limit = Math.min(device.limits.maxBufferSize, device.limits.maxStorageBufferBindingSize);
    /** @type {GPUCommandEncoder | null} */
    let encoder = null;
    const old = [];
    for (const [id, need] of growSizes(this.manifest, dims)) {
      const buffer = this.buffers[id];
      if (need <= buffer.size) continue;
      if (need > limit) {
        throw new DeviceError(`dims ${JSON.stringify(dims)} need a buffer of ${need} bytes; the device allows ${limit} ` +
          '(maxStorageBufferBindingSize): run smaller inputs');
      }
      const {kind} = this.manifest.buffers[id];
      const size = Math.min(grownSize(buffer.size, need), limit);
      const fresh = device.createBuffer({label: `b${id}_${kind}`, size, usage: buffer.usage});
      if (kind === 'state') {
        encoder ??= device.createCommandEncoder();
        encoder.copyBufferToBuffer(buffer, 0, fresh, 0, buffer.size);
      }
      this.buffers[id] = fresh;  // (in place: the control and training runners share the array)
      old.push(buffer);
    }
    if (!old.length) return;
    if (encoder) device.queue.submit([encoder.finish()]);
    for (const buffer of old) buffer.destroy();  // (work already submitted still completes)
    this.steps = /** @type {() => any[]} */ (this.rebind)();
    this.dispatches = this.steps.map((st) => st.dispatch);
    this.staging.buffer.destroy();
    // (a grown output's staging takes its whole buffer: the run's shape is known only as it runs)
    this.staging = makeStaging(device, this.outputs.map((o, i) => (this.manifest.buffers[o.buffer].grow !== undefined
      ? this.buffers[o.buffer].size : this.staging.sizes[i])));
  }

  /**
   * Record the plan of a package with data-dependent dims (docs/dynamic-shapes.md): up to each step that computes
   * counts, submit, read them back (4 bytes each), bind the dims (written into `dims`, which the caller's output
   * shapes then follow), write the dims uniform and evaluate the later dispatches again.
   * @param {GPUCommandEncoder} encoder @param {Record<string, number>} dims the bound dims (data-dependent ones at
   *   their bounds), updated in place
   * @returns {Promise<GPUCommandEncoder>} the encoder for the rest of the run
   * @throws {ShapeError} a count outside its dim's bounds
   * @private
   */
  async encodeBinding(encoder, dims) {
    const {device} = this;
    const specs = Object.fromEntries(this.manifest.dynamic_dims.map((d) => [d.name, d]));
    let start = 0;
    for (const [stop, names] of this.binds) {
      this.encodePass(encoder, undefined, start, stop);
      const bytes = 4 * names.length;
      if (!this.countStaging || this.countStaging.size < bytes) {
        this.countStaging?.destroy();
        this.countStaging = device.createBuffer({label: 'kiln_counts', size: Math.max(16, bytes),
          usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
      }
      const staging = this.countStaging;
      names.forEach((name, i) => {
        encoder.copyBufferToBuffer(this.buffers[/** @type {number} */ (specs[name].count)], 0, staging, 4 * i, 4);
      });
      device.queue.submit([encoder.finish()]);
      await staging.mapAsync(GPUMapMode.READ, 0, bytes);
      const values = new Int32Array(staging.getMappedRange(0, bytes).slice(0));
      staging.unmap();
      names.forEach((name, i) => { dims[name] = checkCount(specs[name], values[i]); });
      device.queue.writeBuffer(this.dimsBuffer, 0, dimsWords(this.manifest, dims));
      this.dispatches = this.steps.map((s) => stepDispatch(s.step, dims));
      for (const s of this.steps) Object.assign(s, s.alternatives[variantIndex(s.step, dims)]);
      encoder = device.createCommandEncoder();
      start = stop;
    }
    this.dimsKey = null;  // (the uniform holds this run's counts: the next run writes its dims again)
    this.encodePass(encoder, undefined, start, this.steps.length);
    return encoder;
  }

  /** @private @throws {DeviceError} the device was lost */
  checkLost() {
    if (this.lost) throw new DeviceError(`the WebGPU device was lost (${this.lost.reason}): ${this.lost.message}`);
  }

  /** @param {{spec: TensorSpec, data?: ArrayBufferView}[]} inputs in storage form (GPUTensor feeds skipped) @private */
  writeInputs(inputs) {
    for (const {spec, data} of inputs) {
      if (data) writePadded(this.device.queue, this.buffers[spec.buffer], data.buffer, data.byteOffset, data.byteLength);
    }
  }

  /**
   * Record plan steps `[start, stop)` (default: all) in one compute pass.
   * @param {GPUCommandEncoder} encoder
   * @param {GPUComputePassTimestampWrites} [timestampWrites]
   * @param {number} [start] @param {number} [stop]
   * @private
   */
  encodePass(encoder, timestampWrites, start = 0, stop = this.steps.length) {
    const pass = encoder.beginComputePass(timestampWrites ? {timestampWrites} : {});
    let current = null;
    for (let i = start; i < stop; i++) {
      const {pipeline, bindGroup} = this.steps[i];
      const dispatch = this.dispatches[i];
      if (!dispatch[0]) continue;  // run-time dims leave this step nothing to do: a 0-workgroup dispatch is skipped
      if (pipeline !== current) {
        pass.setPipeline(pipeline);
        current = pipeline;
      }
      pass.setBindGroup(0, bindGroup);
      pass.dispatchWorkgroups(dispatch[0], dispatch[1] ?? 1, dispatch[2] ?? 1);
    }
    pass.end();
  }

  /**
   * Time the compute: inputs written once, then `warmup + repeat` passes, each submitted alone
   * and waited for (see `Session.time` in kiln.js).
   * @param {{spec: TensorSpec, data?: ArrayBufferView, gpu?: GPUTensor}[]} inputs in storage form, or GPUTensors
   * @param {{repeat: number, warmup: number, useTimestamps: boolean, dims?: Record<string, number> | null}} options
   * @returns {Promise<{clock: 'timestamp-query' | 'wall', times: number[], wall: number[]}>} milliseconds
   * @throws {DeviceError} the device was lost or rejected the work.
   */
  async time(inputs, {repeat, warmup, useTimestamps, dims = null}) {
    this.checkLost();
    const {device} = this;
    device.pushErrorScope('validation');
    this.writeInputs(inputs);
    this.setDims(dims);
    if (inputs.some((i) => i.gpu)) {
      const encoder = device.createCommandEncoder();
      for (const {spec, gpu} of inputs) {
        const size = gpu ? copySize(spec, this.buffers[spec.buffer], gpu.dims) : 0;
        if (size) encoder.copyBufferToBuffer(gpu.buffer, 0, this.buffers[spec.buffer], 0, size);
      }
      device.queue.submit([encoder.finish()]);
    }
    if (this.control) {  // run-time If/Loop: whole runs on the wall clock
      const result = await this.control.time(inputs, {repeat, warmup}).catch(async (error) => {
        await device.popErrorScope().catch(() => undefined);
        throw error;
      });
      await throwScopeError(device, DeviceError, 'WebGPU rejected the timed runs');
      return result;
    }
    if (this.binds.length && dims) {  // data-dependent dims: whole runs (with their readbacks) on the wall clock
      const times = [];
      try {
        for (let i = 0; i < warmup + repeat; i++) {
          const start = performance.now();
          device.queue.submit([(await this.encodeBinding(device.createCommandEncoder(), {...dims})).finish()]);
          await device.queue.onSubmittedWorkDone();
          if (i >= warmup) times.push(performance.now() - start);
        }
      } catch (error) {
        await device.popErrorScope().catch(() => undefined);
        throw error;
      }
      await throwScopeError(device, DeviceError, 'WebGPU rejected the timed runs');
      return {clock: 'wall', times, wall: [...times]};
    }
    let querySet = null, resolve = null, readback = null;
    if (useTimestamps && this.timestampQuery) {
      querySet = device.createQuerySet({label: 'kiln_time', type: 'timestamp', count: 2});
      resolve = device.createBuffer({label: 'kiln_time_resolve', size: 16,
        usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC});
      readback = device.createBuffer({label: 'kiln_time_read', size: 16,
        usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    }
    const times = [], wall = [];
    let scoped = true;
    try {
      for (let i = 0; i < warmup + repeat; i++) {
        const encoder = device.createCommandEncoder();
        if (querySet) {
          this.encodePass(encoder, {querySet, beginningOfPassWriteIndex: 0, endOfPassWriteIndex: 1});
          encoder.resolveQuerySet(querySet, 0, 2, resolve, 0);
          encoder.copyBufferToBuffer(resolve, 0, readback, 0, 16);
        } else {
          this.encodePass(encoder);
        }
        const commands = encoder.finish();
        const start = performance.now();
        device.queue.submit([commands]);
        await device.queue.onSubmittedWorkDone();
        const elapsed = performance.now() - start;
        let gpu = elapsed;
        if (readback) {
          await readback.mapAsync(GPUMapMode.READ);
          const [begin, end] = new BigInt64Array(readback.getMappedRange(0, 16));
          readback.unmap();
          gpu = Math.max(0, Number(end - begin) / 1e6);
        }
        if (i >= warmup) {
          times.push(gpu);
          wall.push(elapsed);
        }
      }
      scoped = false;
      await throwScopeError(device, DeviceError, 'WebGPU rejected the timed runs');
    } finally {
      if (scoped) device.popErrorScope().catch(() => undefined);
      querySet?.destroy();
      resolve?.destroy();
      readback?.destroy();
    }
    return {clock: querySet ? 'timestamp-query' : 'wall', times, wall};
  }

  /**
   * Run one train step of a train-step package (train.js): the train plan, then every state update.
   * @param {{spec: TensorSpec, data: ArrayBufferView}[]} inputs every training input, in storage form
   * @returns {Promise<Record<string, ArrayBuffer>>} each training output's bytes (storage form)
   * @throws {DeviceError} the device was lost or rejected the work.
   */
  async trainStep(inputs) {
    this.checkLost();
    return runTrainStep(this, inputs, writePadded);
  }

  /**
   * Copy state entries within their buffers (kiln.js `stateRowMoves`): the sources into a scratch buffer, then to
   * their places, in one command buffer.
   * @param {{buffer: number, rowBytes: number, pairs: number[][]}[]} moves
   */
  moveRows(moves) {
    this.checkLost();
    if (!moves.length) return;
    const total = moves.reduce((n, m) => n + m.rowBytes * new Set(m.pairs.map((p) => p[1])).size, 0);
    if (!this.scratch || this.scratch.size < total) {
      this.scratch?.destroy();
      this.scratch = this.device.createBuffer({size: total, label: 'kiln_reorder_state',
        usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST});
    }
    const encoder = this.device.createCommandEncoder({label: 'reorder_state'});
    let at = 0;
    for (const {buffer, rowBytes, pairs} of moves) {
      const slot = new Map();
      for (const src of new Set(pairs.map((p) => p[1]))) {
        slot.set(src, at);
        encoder.copyBufferToBuffer(this.buffers[buffer], src * rowBytes, this.scratch, at, rowBytes);
        at += rowBytes;
      }
      for (const [dst, src] of pairs) encoder.copyBufferToBuffer(this.scratch, slot.get(src), this.buffers[buffer], dst * rowBytes, rowBytes);
    }
    this.device.queue.submit([encoder.finish()]);
  }

  /**
   * Read buffers back (trained weights, optimizer state).
   * @param {{id: number, bytes: number}[]} sources buffer ids and byte counts
   * @returns {Promise<ArrayBuffer[]>}
   */
  async readBuffers(sources) {
    this.checkLost();
    return readBuffers(this.device, sources.map(({id, bytes}) => ({buffer: this.buffers[id], bytes})));
  }

  /** Free the GPU buffers, and the device unless it is shared (its pipeline cache then stays for later sessions). */
  dispose() {
    if (!this.sharedDevice) {
      this.device.destroy();
      return;
    }
    for (const buffer of this.buffers) buffer.destroy();
    this.staging.buffer.destroy();
    this.scratch?.destroy();
    this.trainer?.staging?.forEach?.((b) => b.destroy());
    this.lost = {reason: 'destroyed', message: 'the session was destroyed'};
  }
}

/**
 * Each plan step's GPU objects: its kernel's pipeline and bind group, then its variants' (scheduled for another range
 * of run-time dims: setDims picks one); made at load and again when growable buffers grow.
 * @param {GPUDevice} device @param {WebGPUTarget} spec @param {KernelStep[]} flat the plan's kernel steps
 * @param {{pipeline: GPUComputePipeline, layout: GPUBindGroupLayout}[]} pipelines @param {GPUBuffer[]} buffers
 * @param {GPUBuffer | null} dimsBuffer @param {string} root the package's name, for errors
 * @returns {any[]}
 * @throws {PackageError} a step naming a kernel that does not exist
 */
function bindSteps(device, spec, flat, pipelines, buffers, dimsBuffer, root) {
  return flat.map((step, index) => {
    const alternatives = [step.kernel, ...(step.variants ?? []).map((v) => v.kernel)].map((kernel) => {
      const {pipeline, layout} = pipelines[kernel] ?? {};
      if (!pipeline) throw new PackageError(`${root}: plan step ${index} names kernel ${kernel}, which does not exist`);
      const entries = step.buffers.map((id, binding) => ({binding, resource: {buffer: buffers[id]}}));
      const dimsBinding = spec.kernels[kernel].dims_binding;
      if (dimsBinding !== undefined) entries.push({binding: dimsBinding, resource: {buffer: dimsBuffer}});
      return {pipeline, bindGroup: device.createBindGroup({label: step.node, layout, entries})};
    });
    return {...alternatives[0], alternatives, dispatch: step.dispatch, step};
  });
}

/**
 * The mappable buffer the outputs are read back through: output `i` at `offsets[i]` (8-aligned), `sizes[i]` bytes.
 * @param {GPUDevice} device @param {number[]} sizes
 * @returns {{buffer: GPUBuffer, offsets: number[], sizes: number[]}}
 */
function makeStaging(device, sizes) {
  const offsets = [];
  let end = 0;
  for (const size of sizes) {
    offsets.push(end);
    end += Math.ceil(Math.max(4, size) / 8) * 8;
  }
  return {sizes, offsets, buffer: device.createBuffer({
    label: 'kiln_readback', size: Math.max(8, end), usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  })};
}

/**
 * Bytes of the tensor `spec` (an input or output) of shape `shape` (default: the manifest's; run-time dims give
 * smaller ones) in its buffer `buffer`, rounded up to whole 4-byte words.
 * @param {TensorSpec} spec @param {GPUBuffer} buffer @param {number[]} [shape]
 * @returns {number}
 */
function copySize(spec, buffer, shape = spec.shape) {
  const storage = spec.storage ?? storageType(spec.dtype);
  return Math.min(buffer.size, Math.ceil(product(shape) * DTYPES[storage].bytes / 4) * 4);
}
