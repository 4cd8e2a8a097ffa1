// @ts-check
// Kiln browser runtime: compute pipelines of the WebGPU backend, cached per device (kiln/runtime/pipelines.py in
// Python). Every device has a cache keyed by the SHA-256 of the kernel's WGSL, its entry point and binding layout,
// so a second session of a package, or of one sharing kernels, compiles nothing; missing pipelines compile in
// parallel with createComputePipelineAsync. A kernel's subgroup form (subgroups.js) is taken where wanted and the
// device runs them.

import {PackageError} from './errors.js';
import {kernelText} from './package.js';
import {subgroupsUsable} from './subgroups.js';

/** @typedef {import('./manifest').WebGPUKernel} WebGPUKernel */
/** @typedef {import('./package.js').PackageSource} PackageSource */

/** Pipelines a device's cache keeps at most; the oldest go first (live sessions keep theirs alive). */
export const PIPELINE_CACHE_SIZE = 1024;

/** @type {WeakMap<GPUDevice, {hits: number, misses: number, entries: Map<string, Promise<any>>}>} */
const PIPELINE_CACHES = new WeakMap();

/**
 * The pipeline cache of `device`: compiled pipelines (and their bind group layouts) keyed by the
 * SHA-256 of the kernel's WGSL, its entry point and binding layout; `hits` and `misses` count lookups.
 * @param {GPUDevice} device
 * @returns {{hits: number, misses: number, entries: Map<string, Promise<{pipeline: GPUComputePipeline, layout: GPUBindGroupLayout}>>}}
 */
export function pipelineCache(device) {
  let cache = PIPELINE_CACHES.get(device);
  if (!cache) PIPELINE_CACHES.set(device, cache = {hits: 0, misses: 0, entries: new Map()});
  return cache;
}

/**
 * Hex SHA-256 of `text` (Web Crypto; pages served over plain http from another host have none, and then
 * the text itself is the key).
 * @param {string} text
 * @returns {Promise<string>}
 */
async function sourceKey(text) {
  const subtle = globalThis.crypto?.subtle;
  if (!subtle) return text;
  const digest = new Uint8Array(await subtle.digest('SHA-256', new TextEncoder().encode(text)));
  return Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('');
}

/**
 * Read every kernel's WGSL and get its pipeline from the device's cache, compiling the missing ones
 * with `createComputePipelineAsync`, all in parallel. A kernel's subgroup form (subgroups.js) is taken where the
 * device runs them; should one not compile, its plain form is (with a console warning).
 * @param {PackageSource} source
 * @param {GPUDevice} device
 * @param {WebGPUKernel[]} kernels the target's kernels
 * @param {boolean} wanted run subgroup forms where the device can
 * @param {string} [probe] the package file of the subgroup probe (targets.webgpu.subgroup_probe), if it has forms
 * @returns {Promise<{pipeline: GPUComputePipeline, layout: GPUBindGroupLayout}[]>}
 */
export async function createPipelines(source, device, kernels, wanted, probe) {
  const cache = pipelineCache(device);
  const subgroups = Boolean(wanted && probe && device.features.has('subgroups')) && await subgroupsUsable(
    device, new TextDecoder().decode(await source.bytes(probe, 'the subgroup probe')));
  /** @param {WebGPUKernel} kernel @param {string} code */
  const pipeline = async (kernel, code) => {
    const access = [...kernel.bindings].sort((a, b) => a.binding - b.binding).map((b) => b.access);
    const key = `${await sourceKey(code)}|${kernel.entry_point}|${access.join(',')}|${kernel.dims_binding ?? ''}`;
    let entry = cache.entries.get(key);
    if (entry) {
      cache.hits++;
    } else {
      cache.misses++;
      entry = compilePipeline(device, kernel, code, access, kernel.dims_binding);
      cache.entries.set(key, entry);
      entry.catch(() => cache.entries.delete(key));
      if (cache.entries.size > PIPELINE_CACHE_SIZE) cache.entries.delete(cache.entries.keys().next().value);
    }
    return entry;
  };
  return Promise.all(kernels.map(async (kernel) => {
    if (subgroups && kernel.subgroups) {
      try {
        return await pipeline(kernel, await kernelText(source, {...kernel, source: kernel.subgroups.source}));
      } catch (error) {
        console.warn(`kiln: kernel ${kernel.name}'s subgroup form does not compile (${error.message}); ` +
          'running its plain form');
      }
    }
    return pipeline(kernel, await kernelText(source, kernel));
  }));
}

/**
 * Compile one kernel's pipeline.
 * @param {GPUDevice} device @param {WebGPUKernel} kernel @param {string} code @param {string[]} access per binding
 * @param {number} [dimsBinding] the binding of the run-time dims uniform (dims.js), if the kernel reads it
 * @returns {Promise<{pipeline: GPUComputePipeline, layout: GPUBindGroupLayout}>}
 * @throws {PackageError} the kernel does not compile on this device.
 */
async function compilePipeline(device, kernel, code, access, dimsBinding) {
  const module = device.createShaderModule({label: kernel.name, code});
  const layout = device.createBindGroupLayout({
    label: kernel.name,
    entries: [...access.map((a, binding) => ({
      binding,
      visibility: GPUShaderStage.COMPUTE,
      buffer: {type: /** @type {GPUBufferBindingType} */ (a === 'read' ? 'read-only-storage' : 'storage')},
    })), ...(dimsBinding === undefined ? [] : [
      {binding: dimsBinding, visibility: GPUShaderStage.COMPUTE, buffer: {type: /** @type {const} */ ('uniform')}}])],
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
}
