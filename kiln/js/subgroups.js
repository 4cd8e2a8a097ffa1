// @ts-check
// Kiln browser runtime: whether a WebGPU device runs kernels' subgroup forms (kiln/runtime/subgroups.py in Python).
//
// A kernel that combines partial values across lanes may have a second WGSL form (manifest
// targets.webgpu.kernels[].subgroups, format 1.14) that shuffles them inside subgroups (subgroupShuffleXor,
// WGSL §17.12) instead of passing them through workgroup memory. It needs the 'subgroups' feature and subgroups of
// 4 to 128 lanes that a workgroup's invocations fill in local_invocation_index order, which WGSL does not promise:
// the package's probe kernel (targets.webgpu.subgroup_probe, made by the compiler) checks it once per device.

/** words the probe kernel writes (a workgroup of 256 invocations) */
const WORDS = 256;

/**
 * Whether an adapter is a CPU implementation (SwiftShader, llvmpipe), which emulates subgroup shuffles: kernels'
 * subgroup forms are not run there unless asked for.
 * @param {GPUAdapterInfo | undefined} info
 * @returns {boolean}
 */
export function isCpuAdapter(info) {
  if (!info) return false;
  // @ts-ignore  (isFallbackAdapter is newer than the DOM typings)
  if (info.isFallbackAdapter) return true;
  return /swiftshader|llvmpipe|lavapipe/i.test([info.vendor, info.architecture, info.device, info.description].join(' '));
}

/** @type {WeakMap<GPUDevice, Promise<boolean>>} */
const CHECKED = new WeakMap();

/**
 * Whether `device` runs kernels' subgroup forms: it has the 'subgroups' feature and the package's probe kernel finds
 * subgroups of 4 to 128 lanes filled in invocation order. Checked once per device (one dispatch, a 1 KiB read); an
 * error in the probe means no.
 * @param {GPUDevice} device
 * @param {string} probe the probe's WGSL (the package file targets.webgpu.subgroup_probe)
 * @returns {Promise<boolean>}
 */
export function subgroupsUsable(device, probe) {
  if (!device.features.has('subgroups')) return Promise.resolve(false);
  let checked = CHECKED.get(device);
  if (!checked) {
    checked = runProbe(device, probe).catch(() => false);
    CHECKED.set(device, checked);
  }
  return checked;
}

/** @param {GPUDevice} device @param {string} code @returns {Promise<boolean>} */
async function runProbe(device, code) {
  device.pushErrorScope('validation');
  const out = device.createBuffer({size: 4 * WORDS, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC});
  const read = device.createBuffer({size: 4 * WORDS, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
  try {
    const pipeline = await device.createComputePipelineAsync({
      layout: 'auto', compute: {module: device.createShaderModule({code}), entryPoint: 'main'}});
    const group = device.createBindGroup({layout: pipeline.getBindGroupLayout(0),
      entries: [{binding: 0, resource: {buffer: out}}]});
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, group);
    pass.dispatchWorkgroups(1);
    pass.end();
    encoder.copyBufferToBuffer(out, 0, read, 0, 4 * WORDS);
    device.queue.submit([encoder.finish()]);
    if (await device.popErrorScope()) return false;
    await read.mapAsync(GPUMapMode.READ);
    const words = new Uint32Array(read.getMappedRange().slice(0));
    const n = words[0] >>> 8;
    return n >= 4 && n <= 128 && (n & (n - 1)) === 0 && words.every((w) => (w & 0xff) === 1 && w >>> 8 === n);
  } finally {
    out.destroy();
    read.destroy();
  }
}
