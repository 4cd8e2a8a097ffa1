// Kiln kernel measurement: compile WGSL candidates of one kernel, run and time them on WebGPU.
// The device side of the RPC `measure` request (docs/rpc-protocol.md), used by rpc.js; no package needed.
//
//   const measurer = await KernelMeasurer.create();
//   const {clock, results, samples} = await measurer.measure(request, blobs);

import * as kiln from './kiln.js';

/**
 * Output indices a measurement returns: floor(j * n / m) for j < m (every index when n <= m),
 * as kiln/tune/measure.py's sample_indices.
 * @param {number} n output elements @param {number} m sample size
 * @returns {number[]}
 */
export function sampleIndices(n, m) {
  if (n <= m) return Array.from({length: n}, (_, i) => i);
  return Array.from({length: m}, (_, j) => Math.floor((j * n) / m));
}

/** Measures kernel candidates on a WebGPU device of its own (with 'timestamp-query' when offered). */
export class KernelMeasurer {
  /** @param {GPUDevice} device */
  constructor(device) {
    /** The device candidates run on. */
    this.device = device;
    /** Whether passes are timed with GPU timestamps. */
    this.timestampQuery = device.features.has('timestamp-query');
    /** Set when the device is lost; {@link KernelMeasurer.create} makes a new one then. */
    this.lost = false;
    device.lost.then(() => { this.lost = true; });
  }

  /**
   * A measurer on the high-performance adapter, with its largest buffer limits.
   * @returns {Promise<KernelMeasurer>}
   * @throws {kiln.DeviceError} no WebGPU adapter.
   */
  static async create() {
    const adapter = await globalThis.navigator?.gpu?.requestAdapter({powerPreference: 'high-performance'});
    if (!adapter) throw new kiln.DeviceError('no WebGPU adapter available to measure kernels on');
    const requiredFeatures = adapter.features.has('timestamp-query') ? ['timestamp-query'] : [];
    const requiredLimits = {};
    for (const name of ['maxStorageBufferBindingSize', 'maxBufferSize']) requiredLimits[name] = adapter.limits[name];
    return new KernelMeasurer(await adapter.requestDevice({requiredFeatures, requiredLimits}));
  }

  /**
   * Measure the candidates of a `measure` request.
   * @param {{inputs: {shape: number[]}[], output: {elements: number}, candidates: {dispatch: number[]}[],
   *   batch: number, repeat: number, warmup: number, sample: number}} request
   * @param {Uint8Array[]} blobs the inputs' float32 data, then each candidate's WGSL (UTF-8).
   * @returns {Promise<{clock: string, results: object[], samples: Uint8Array[]}>} per candidate:
   *   `{ms, error, total, abs_total}` (`ms` null with `error` if it failed) and its float32 sample.
   */
  async measure(request, blobs) {
    const {device} = this;
    const {inputs, output, candidates, batch, repeat, warmup, sample} = request;
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
    const buffers = inputs.map((_, i) => {
      const blob = blobs[i];
      const buffer = device.createBuffer({size: Math.max(4, align4(blob.byteLength)), usage});
      if (blob.byteLength) device.queue.writeBuffer(buffer, 0, blob.buffer, blob.byteOffset, blob.byteLength);
      return buffer;
    });
    const out = device.createBuffer({size: Math.max(4, output.elements * 4), usage});
    const read = device.createBuffer({size: out.size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    const nan = new Float32Array(out.size / 4).fill(NaN);
    const indices = sampleIndices(output.elements, sample);
    const results = [];
    const samples = [];
    try {
      for (const [i, candidate] of candidates.entries()) {
        try {
          const code = new TextDecoder().decode(blobs[inputs.length + i]);
          device.pushErrorScope('validation');
          const module = device.createShaderModule({code});
          const pipeline = await device.createComputePipelineAsync({layout: 'auto', compute: {module, entryPoint: 'main'}});
          const group = device.createBindGroup({layout: pipeline.getBindGroupLayout(0),
            entries: [...buffers, out].map((buffer, binding) => ({binding, resource: {buffer}}))});
          const error = await device.popErrorScope();
          if (error) throw new kiln.DeviceError(error.message);
          device.queue.writeBuffer(out, 0, nan);
          const encoder = device.createCommandEncoder();
          const pass = encoder.beginComputePass();
          pass.setPipeline(pipeline);
          pass.setBindGroup(0, group);
          pass.dispatchWorkgroups(...candidate.dispatch);
          pass.end();
          encoder.copyBufferToBuffer(out, 0, read, 0, out.size);
          device.queue.submit([encoder.finish()]);
          await read.mapAsync(GPUMapMode.READ);
          const y = new Float32Array(read.getMappedRange().slice(0), 0, output.elements);
          read.unmap();
          let total = 0;
          let absTotal = 0;
          for (const v of y) {
            total += v;
            absTotal += Math.abs(v);
          }
          const picked = Float32Array.from(indices, (j) => y[j]);
          const ms = await this.time(pipeline, group, candidate.dispatch, batch, repeat, warmup);
          results.push({ms, error: null, total: Number.isFinite(total) ? total : null,
            abs_total: Number.isFinite(absTotal) ? absTotal : null});
          samples.push(new Uint8Array(picked.buffer));
        } catch (error) {
          if (this.lost) throw error;
          results.push({ms: null, error: `${error?.name ?? 'Error'}: ${error?.message ?? error}`.slice(0, 2000),
            total: null, abs_total: null});
          samples.push(new Uint8Array(0));
        }
      }
    } finally {
      for (const buffer of [...buffers, out, read]) buffer.destroy();
    }
    return {clock: this.timestampQuery ? 'timestamp-query' : 'wall', results, samples};
  }

  /**
   * Median milliseconds per dispatch over `repeat` passes of `batch` dispatches, after `warmup` passes.
   * @private
   */
  async time(pipeline, group, dispatch, batch, repeat, warmup) {
    const {device} = this;
    const passes = warmup + repeat;
    const encodePass = (encoder, timestampWrites) => {
      const pass = encoder.beginComputePass(timestampWrites ? {timestampWrites} : {});
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      for (let k = 0; k < batch; k++) pass.dispatchWorkgroups(...dispatch);
      pass.end();
    };
    const times = [];
    if (this.timestampQuery) {
      const querySet = device.createQuerySet({type: 'timestamp', count: 2 * passes});
      const resolve = device.createBuffer({size: 16 * passes, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC});
      const read = device.createBuffer({size: 16 * passes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
      const encoder = device.createCommandEncoder();
      for (let p = 0; p < passes; p++) {
        encodePass(encoder, {querySet, beginningOfPassWriteIndex: 2 * p, endOfPassWriteIndex: 2 * p + 1});
      }
      encoder.resolveQuerySet(querySet, 0, 2 * passes, resolve, 0);
      encoder.copyBufferToBuffer(resolve, 0, read, 0, 16 * passes);
      device.queue.submit([encoder.finish()]);
      await read.mapAsync(GPUMapMode.READ);
      const ticks = new BigUint64Array(read.getMappedRange().slice(0));
      read.unmap();
      for (let p = warmup; p < passes; p++) {
        const ns = ticks[2 * p + 1] >= ticks[2 * p] ? Number(ticks[2 * p + 1] - ticks[2 * p]) : 0;
        times.push(ns / 1e6 / batch);
      }
      for (const x of [resolve, read, querySet]) x.destroy();
    } else {
      for (let p = 0; p < passes; p++) {
        const encoder = device.createCommandEncoder();
        encodePass(encoder, null);
        const t0 = performance.now();
        device.queue.submit([encoder.finish()]);
        await device.queue.onSubmittedWorkDone();
        if (p >= warmup) times.push((performance.now() - t0) / batch);
      }
    }
    times.sort((a, b) => a - b);
    const mid = times.length >> 1;
    return times.length % 2 ? times[mid] : (times[mid - 1] + times[mid]) / 2;
  }
}

/** @param {number} n @returns {number} n rounded up to a multiple of 4 */
const align4 = (n) => (n + 3) & ~3;
