// Kiln browser runtime: the WebGPU backend (zero dependencies besides errors.js and package.js).
//
// Execution matches the native runtime (kiln/runtime/native.py): one GPUBuffer per
// manifest buffer, weights uploaded once at load, one compute pipeline per kernel and one
// bind group per plan step; each run writes the inputs, records every dispatch in one
// compute pass, copies the outputs to mappable staging buffers, submits once and maps them.
// See kiln.js for the backend interface this module implements.

import {createTrainer, readBuffers, runTrainStep} from './train.js';
import {dimsWords, outputShape, stepDispatch} from './dims.js';
import {DeviceError, PackageError} from './errors.js';
import {kernelText, readWeights} from './package.js';

/** The manifest target this backend runs. */
export const target = 'webgpu';

/**
 * Why this browser cannot run WebGPU packages, or null if it can (it has `navigator.gpu`
 * and an adapter).
 * @returns {Promise<string | null>}
 */
export async function unavailable() {
  const gpu = globalThis.navigator?.gpu;
  if (!gpu) return 'navigator.gpu is missing';
  try {
    return (await gpu.requestAdapter()) ? null : 'requestAdapter() returned null';
  } catch (error) {
    return `requestAdapter() failed: ${error.message}`;
  }
}

/**
 * Get a WebGPU device and build the package's buffers, pipelines and bind groups.
 * @param {import('./package.js').PackageSource} source
 * @param {any} manifest
 * @param {{verify: boolean, powerPreference?: GPUPowerPreference, timing?: boolean}} options
 * @returns {Promise<WebGPUBackend>}
 * @throws {DeviceError} no WebGPU, no adapter, or a missing limit or feature.
 * @throws {PackageError} a kernel that does not compile, bad weights, or an invalid plan.
 */
export async function create(source, manifest, options) {
  const {verify, powerPreference = 'high-performance', timing = false} = options;
  const spec = manifest.targets.webgpu;
  const {adapter, device} = await requestDevice(spec, powerPreference, timing);
  try {
    return await WebGPUBackend.create(source, manifest, adapter, device, verify);
  } catch (error) {
    device.destroy();
    throw error;
  }
}

/**
 * Request an adapter and a device with the package's features and limits.
 *
 * The manifest's `limits` are what the plan uses (largest buffer, bindings per kernel,
 * workgroup and dispatch sizes); each must be within the adapter's, or a DeviceError names
 * the limit. They are requested as they are, so the device offers exactly what the plan needs.
 *
 * @param {any} spec the manifest's target entry (features, limits, kernels, plan)
 * @param {GPUPowerPreference} powerPreference
 * @param {boolean} timing also request 'timestamp-query' if the adapter has it
 * @returns {Promise<{adapter: GPUAdapter, device: GPUDevice}>}
 */
async function requestDevice(spec, powerPreference, timing) {
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
    throw new DeviceError(`adapter ${name} lacks WebGPU features ${missing.join(', ')}, which the package needs`);
  }
  /** @type {Record<string, number>} */
  const requiredLimits = {};
  for (const [limit, needed] of Object.entries(spec.limits ?? {})) {
    const have = adapter.limits[limit];
    if (have === undefined) continue;  // a limit this browser does not know
    if (have < needed) {
      throw new DeviceError(`adapter ${name} has ${limit}=${have}, the package needs ${needed}`);
    }
    requiredLimits[limit] = needed;
  }
  const requiredFeatures = [...features];
  if (timing && adapter.features.has('timestamp-query') && !requiredFeatures.includes('timestamp-query')) {
    requiredFeatures.push('timestamp-query');
  }
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
 * @param {ArrayBuffer} source
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
 * @param {typeof KilnError} ErrorType
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
   * @param {any} manifest
   * @param {GPUBuffer[]} buffers one per manifest buffer, indexed by buffer id
   * @param {{pipeline: GPUComputePipeline, bindGroup: GPUBindGroup, dispatch: number[]}[]} steps
   * @param {Map<string, GPUBuffer>} staging mappable copy of each output, by output name
   * @private
   */
  constructor(adapter, device, manifest, buffers, steps, staging) {
    /** The manifest target this backend runs. */
    this.target = target;
    const info = adapter.info ?? {};
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
    /** @private @type {GPUDeviceLostInfo | null} */
    this.lost = null;
    device.lost.then((lost) => { this.lost = lost; });
  }

  /**
   * Build the GPU objects; see {@link create}.
   * @param {import('./package.js').PackageSource} source @param {any} manifest @param {GPUAdapter} adapter
   * @param {GPUDevice} device @param {boolean} verify
   * @returns {Promise<WebGPUBackend>}
   */
  static async create(source, manifest, adapter, device, verify) {
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
    await throwScopeError(device, PackageError, `${root}: cannot create the package's buffers`);
    await throwScopeError(device, DeviceError, 'out of GPU memory creating the package\'s buffers');

    // run-time dims (dims.js): one uniform buffer of dim values, bound after each reading kernel's storage buffers
    const dimsBuffer = manifest.dynamic_dims?.length ? device.createBuffer({
      label: 'kiln_dims', size: spec.dims_uniform.bytes, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
    }) : null;
    const [pipelines] = await Promise.all([
      createPipelines(source, device, spec.kernels),
      readWeights(source, manifest, verify, async (file, weights) => {
        device.pushErrorScope('validation');
        for (const w of weights) writePadded(device.queue, buffers[w.buffer.id], w.bytes, w.offset, w.length);
        await throwScopeError(device, PackageError, `weights file ${file}: cannot upload`);
      }),
    ]);

    device.pushErrorScope('validation');
    const steps = spec.plan.map((step, index) => {
      const {pipeline, layout} = pipelines[step.kernel] ?? {};
      if (!pipeline) throw new PackageError(`${root}: plan step ${index} names kernel ${step.kernel}, which does not exist`);
      const entries = step.buffers.map((id, binding) => ({binding, resource: {buffer: buffers[id]}}));
      const dimsBinding = spec.kernels[step.kernel].dims_binding;
      if (dimsBinding !== undefined) entries.push({binding: dimsBinding, resource: {buffer: dimsBuffer}});
      const bindGroup = device.createBindGroup({label: step.node, layout, entries});
      return {pipeline, bindGroup, dispatch: step.dispatch, step};
    });
    const staging = new Map(manifest.outputs.map((o) => [o.name, device.createBuffer({
      label: `staging_${o.name}`,
      size: manifest.buffers[o.buffer].bytes,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    })]));
    const trainer = manifest.training ? createTrainer(device, manifest, buffers, pipelines) : null;
    await throwScopeError(device, PackageError, `${root}: invalid execution plan`);
    const backend = new WebGPUBackend(adapter, device, manifest, buffers, steps, staging);
    /** @private the dims uniform of a package with run-time dims, or null */
    backend.dimsBuffer = dimsBuffer;
    /** @private */ backend.manifest = manifest;
    /** @private the dims last written into the uniform (JSON), and the dispatches they give */
    backend.dimsKey = null;
    backend.dispatches = steps.map((s) => s.dispatch);
    /** @private the train plan of a train-step package (train.js), or null */
    backend.trainer = trainer;
    /** @private the manifest's training section, or null */
    backend.training = manifest.training ?? null;
    return backend;
  }

  /**
   * Run the plan once.
   * @param {{spec: any, data: ArrayBufferView}[]} inputs every manifest input, its data in storage form
   * @returns {Promise<Record<string, ArrayBuffer>>} each output's buffer contents (storage form)
   * @throws {DeviceError} the device was lost or rejected the work.
   */
  async run(inputs, dims = null) {
    this.checkLost();
    const {device} = this;
    device.pushErrorScope('validation');
    this.writeInputs(inputs);
    this.setDims(dims);
    const encoder = device.createCommandEncoder();
    this.encodePass(encoder);
    for (const output of this.outputs) {
      const staging = this.staging.get(output.name);
      // every stored element takes 4 bytes (the package format's storage types)
      const size = dims ? 4 * outputShape(output, dims).reduce((a, b) => a * b, 1) : staging.size;
      if (size) encoder.copyBufferToBuffer(this.buffers[output.buffer], 0, staging, 0, size);
    }
    device.queue.submit([encoder.finish()]);
    await throwScopeError(device, DeviceError, 'WebGPU rejected the run');
    const results = {};
    await Promise.all(this.outputs.map(async (output) => {
      const staging = this.staging.get(output.name);
      await staging.mapAsync(GPUMapMode.READ);
      try {
        results[output.name] = staging.getMappedRange(0, staging.size).slice(0);
      } finally {
        staging.unmap();
      }
    }));
    return results;
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
    this.device.queue.writeBuffer(this.dimsBuffer, 0, dimsWords(this.manifest, dims));
    this.dispatches = this.steps.map((s) => stepDispatch(s.step, dims));
    this.dimsKey = key;
  }

  /** @private @throws {DeviceError} the device was lost */
  checkLost() {
    if (this.lost) throw new DeviceError(`the WebGPU device was lost (${this.lost.reason}): ${this.lost.message}`);
  }

  /** @param {{spec: any, data: ArrayBufferView}[]} inputs in storage form @private */
  writeInputs(inputs) {
    for (const {spec, data} of inputs) {
      writePadded(this.device.queue, this.buffers[spec.buffer], data.buffer, data.byteOffset, data.byteLength);
    }
  }

  /**
   * Record every plan step in one compute pass.
   * @param {GPUCommandEncoder} encoder
   * @param {GPUComputePassTimestampWrites} [timestampWrites]
   * @private
   */
  encodePass(encoder, timestampWrites) {
    const pass = encoder.beginComputePass(timestampWrites ? {timestampWrites} : {});
    let current = null;
    for (const [i, {pipeline, bindGroup}] of this.steps.entries()) {
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
   * @param {{spec: any, data: ArrayBufferView}[]} inputs in storage form
   * @param {{repeat: number, warmup: number, useTimestamps: boolean}} options
   * @returns {Promise<{clock: 'timestamp-query' | 'wall', times: number[], wall: number[]}>} milliseconds
   * @throws {DeviceError} the device was lost or rejected the work.
   */
  async time(inputs, {repeat, warmup, useTimestamps, dims = null}) {
    this.checkLost();
    const {device} = this;
    device.pushErrorScope('validation');
    this.writeInputs(inputs);
    this.setDims(dims);
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
   * @param {{spec: any, data: ArrayBufferView}[]} inputs every training input, in storage form
   * @returns {Promise<Record<string, ArrayBuffer>>} each training output's bytes (storage form)
   * @throws {DeviceError} the device was lost or rejected the work.
   */
  async trainStep(inputs) {
    this.checkLost();
    return runTrainStep(this, inputs, writePadded);
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

  /** Free the GPU buffers and the device. */
  dispose() {
    this.device.destroy();
  }
}

/**
 * Read every kernel's WGSL and compile its pipeline (in parallel).
 * @param {PackageSource} source
 * @param {GPUDevice} device
 * @param {any[]} kernels the target's kernels
 * @returns {Promise<{pipeline: GPUComputePipeline, layout: GPUBindGroupLayout}[]>}
 */
function createPipelines(source, device, kernels) {
  return Promise.all(kernels.map(async (kernel) => {
    const code = await kernelText(source, kernel);
    const module = device.createShaderModule({label: kernel.name, code});
    const layout = device.createBindGroupLayout({
      label: kernel.name,
      entries: [...kernel.bindings.map((b) => ({
        binding: b.binding,
        visibility: GPUShaderStage.COMPUTE,
        buffer: {type: b.access === 'read' ? 'read-only-storage' : 'storage'},
      })), ...(kernel.dims_binding === undefined ? [] : [
        {binding: kernel.dims_binding, visibility: GPUShaderStage.COMPUTE, buffer: {type: 'uniform'}}])],
    });
    try {
      const pipeline = await device.createComputePipelineAsync({
        label: kernel.name,
        layout: device.createPipelineLayout({bindGroupLayouts: [layout]}),
        compute: {module, entryPoint: kernel.entry_point},
      });
      return {pipeline, layout};
    } catch (error) {
      const info = await module.getCompilationInfo();
      const details = info.messages.filter((m) => m.type === 'error')
        .map((m) => `${kernel.source}:${m.lineNum}:${m.linePos}: ${m.message}`).join('\n');
      throw new PackageError(`kernel ${kernel.name} does not compile on this device: ${error.message}` +
        (details ? `\n${details}` : ''));
    }
  }));
}
