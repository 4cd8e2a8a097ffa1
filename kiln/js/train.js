// @ts-check
// Kiln browser runtime: train steps of train-step packages on WebGPU (package format 1.3, `training`;
// docs/training.md), and safetensors writing for exporting the trained weights.
//
// A train step writes the inputs (the model's and the labels), records the target's `train_plan` in
// one compute pass, then copies every `update` buffer over its state buffer (the trainable weights,
// the optimizer's moments and step count never leave the device) and the loss to a mappable buffer,
// in one submission. The WebGPU backend (webgpu.js) builds a trainer with `createTrainer` when the
// package has a training section; kiln.js exposes `Session.trainStep` and `Session.exportWeights`.

import {DeviceError, PackageError} from './errors.js';
import {DTYPES} from './tensor.js';

/** @typedef {import('./manifest').Manifest} Manifest */
/** @typedef {import('./manifest').KernelStep} KernelStep */
/** @typedef {import('./manifest').TensorSpec} TensorSpec */

/**
 * @typedef {object} Trainer
 * @property {{pipeline: GPUComputePipeline, bindGroup: GPUBindGroup, dispatch: number[]}[]} steps the train plan
 * @property {Map<string, GPUBuffer>} staging mappable copy of each training output, by name
 */

/**
 * Bind groups of the train plan and staging buffers of its outputs.
 * @param {GPUDevice} device
 * @param {Manifest} manifest the package manifest (with `training` and `targets.webgpu.train_plan`)
 * @param {GPUBuffer[]} buffers one per manifest buffer
 * @param {{pipeline: GPUComputePipeline, layout: GPUBindGroupLayout}[]} pipelines one per kernel
 * @returns {Trainer}
 * @throws {PackageError} a training section without a train plan, or a step naming a missing kernel.
 */
export function createTrainer(device, manifest, buffers, pipelines) {
  // a train plan holds kernel steps only (train-step packages have no run-time control flow)
  const plan = /** @type {KernelStep[]} */ (manifest.targets.webgpu.train_plan);
  if (!Array.isArray(plan)) throw new PackageError('the package has a training section but no targets.webgpu.train_plan');
  const steps = plan.map((step, index) => {
    const {pipeline, layout} = pipelines[step.kernel] ?? {};
    if (!pipeline) throw new PackageError(`train plan step ${index} names kernel ${step.kernel}, which does not exist`);
    const bindGroup = device.createBindGroup({
      label: `train:${step.node}`,
      layout,
      entries: step.buffers.map((id, binding) => ({binding, resource: {buffer: buffers[id]}})),
    });
    return {pipeline, bindGroup, dispatch: step.dispatch};
  });
  const staging = new Map(manifest.training.outputs.map((o) => [o.name, device.createBuffer({
    label: `train_staging_${o.name}`,
    size: manifest.buffers[o.buffer].bytes,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  })]));
  return {steps, staging};
}

/**
 * Run one train step on a WebGPU backend.
 * @param {any} backend the WebGPUBackend (device, buffers, trainer, manifest)
 * @param {{spec: TensorSpec, data: ArrayBufferView}[]} inputs every training input, in storage form
 * @param {(queue: GPUQueue, buffer: GPUBuffer, source: ArrayBufferLike, offset: number, length: number) => void} write
 * @returns {Promise<Record<string, ArrayBuffer>>} each training output's bytes (storage form)
 * @throws {DeviceError} the device was lost or rejected the work.
 */
export async function runTrainStep(backend, inputs, write) {
  const {device, buffers, trainer, training} = backend;
  device.pushErrorScope('validation');
  for (const {spec, data} of inputs) write(device.queue, buffers[spec.buffer], data.buffer, data.byteOffset, data.byteLength);
  const encoder = device.createCommandEncoder();
  const pass = encoder.beginComputePass();
  let current = null;
  for (const {pipeline, bindGroup, dispatch} of trainer.steps) {
    if (pipeline !== current) {
      pass.setPipeline(pipeline);
      current = pipeline;
    }
    pass.setBindGroup(0, bindGroup);
    pass.dispatchWorkgroups(dispatch[0], dispatch[1] ?? 1, dispatch[2] ?? 1);
  }
  pass.end();
  for (const s of training.state) encoder.copyBufferToBuffer(buffers[s.update], 0, buffers[s.buffer], 0, s.bytes);
  for (const o of training.outputs) {
    const staging = trainer.staging.get(o.name);
    encoder.copyBufferToBuffer(buffers[o.buffer], 0, staging, 0, staging.size);
  }
  device.queue.submit([encoder.finish()]);
  const error = await device.popErrorScope();
  if (error) throw new DeviceError(`WebGPU rejected the train step: ${error.message}`);
  /** @type {Record<string, ArrayBuffer>} */
  const results = {};
  await Promise.all(training.outputs.map(async (o) => {
    const staging = trainer.staging.get(o.name);
    await staging.mapAsync(GPUMapMode.READ);
    try {
      results[o.name] = staging.getMappedRange(0, staging.size).slice(0);
    } finally {
      staging.unmap();
    }
  }));
  return results;
}

/**
 * Copy buffers of a WebGPU backend back to the host.
 * @param {GPUDevice} device
 * @param {{buffer: GPUBuffer, bytes: number}[]} sources
 * @returns {Promise<ArrayBuffer[]>} each buffer's first `bytes` bytes
 */
export async function readBuffers(device, sources) {
  const encoder = device.createCommandEncoder();
  const staging = sources.map(({buffer, bytes}) => {
    const size = Math.ceil(bytes / 4) * 4;
    const copy = device.createBuffer({size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    encoder.copyBufferToBuffer(buffer, 0, copy, 0, size);
    return copy;
  });
  device.queue.submit([encoder.finish()]);
  return Promise.all(staging.map(async (copy, i) => {
    await copy.mapAsync(GPUMapMode.READ);
    const bytes = copy.getMappedRange(0, sources[i].bytes).slice(0);
    copy.destroy();
    return bytes;
  }));
}

/**
 * Serialise tensors as a safetensors file (https://huggingface.co/docs/safetensors): an 8-byte
 * little-endian header length, a JSON header `{name: {dtype, shape, data_offsets}}` padded with spaces
 * to a multiple of 8 bytes, then the data.
 * @param {{name: string, dtype: string, shape: number[], bytes: ArrayBufferLike}[]} tensors Kiln dtypes
 *   (`float32`, `int32`, ...); `bytes` the little-endian data.
 * @param {Record<string, string>} [metadata] the header's `__metadata__` strings.
 * @returns {Uint8Array}
 */
export function encodeSafetensors(tensors, metadata = {}) {
  const header = {};
  if (Object.keys(metadata).length) header.__metadata__ = metadata;
  let offset = 0;
  for (const t of tensors) {
    header[t.name] = {dtype: DTYPES[t.dtype].safetensors, shape: t.shape, data_offsets: [offset, offset + t.bytes.byteLength]};
    offset += t.bytes.byteLength;
  }
  const json = JSON.stringify(header);
  const pad = (8 - (new TextEncoder().encode(json).length % 8)) % 8;
  const text = new TextEncoder().encode(json + ' '.repeat(pad));
  const out = new Uint8Array(8 + text.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(text.length), true);
  out.set(text, 8);
  let at = 8 + text.length;
  for (const t of tensors) {
    out.set(new Uint8Array(t.bytes), at);
    at += t.bytes.byteLength;
  }
  return out;
}
