// Kiln browser runtime: tensors that stay in WebGPU buffers between runs (zero dependencies besides
// errors.js and tensor.js).
//
//   const x = await session.upload(new kiln.Tensor('float32', data, [1, 3, 224, 224]));  // a GPUTensor
//   const {features} = await first.run({input: x}, {output: 'gpu'});    // GPUTensors, nothing read back
//   const {logits} = await second.run({features}, {output: 'gpu'});     // second loaded with {device: first.device}
//   const t = await logits.read();                                     // a kiln.Tensor (one readback)
//
// Elements are kept in their storage type (package format, "Dtypes": bool, 8/16-bit and int64 as int32,
// float16 as float32), converted by `read()`.

import {KilnError, ShapeError} from './errors.js';
import {DTYPES, fromStorage, product, toStorage} from './tensor.js';

/**
 * The element type a WebGPU buffer holds for a tensor of `dtype` (package format, "Dtypes").
 * @param {string} dtype
 * @returns {string}
 */
export function storageType(dtype) {
  if (dtype === 'float32' || dtype === 'int32' || dtype === 'uint32') return dtype;
  if (dtype === 'float16') return 'float32';
  if (DTYPES[dtype]) return 'int32';
  throw new ShapeError(`GPUTensor: unknown type '${dtype}' (supported: ${Object.keys(DTYPES).join(', ')})`);
}

/** Buffer usage of every GPUTensor: bindable, and a copy source and destination. */
const USAGE = () => GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;

/** A tensor in a WebGPU buffer of one device. Made by `Session.upload` or `Session.run(feeds, {output: 'gpu'})`. */
export class GPUTensor {
  /**
   * @param {string} type the tensor's element type ('float32', 'int64', ...; see kiln.Tensor).
   * @param {GPUBuffer} buffer holds the elements in the storage type, from offset 0.
   * @param {readonly number[]} dims dimensions.
   * @param {GPUDevice} device the device owning `buffer`.
   */
  constructor(type, buffer, dims, device) {
    /** @readonly */ this.type = type;
    /** @readonly the element type the buffer holds */ this.storage = storageType(type);
    /** @readonly @type {number[]} */ this.dims = [...dims];
    /** @readonly */ this.device = device;
    /** @type {GPUBuffer | null} null once destroyed */
    this.buffer = buffer;
  }

  /**
   * A new GPUTensor of `type` and `dims` on `device` (contents zero).
   * @param {GPUDevice} device @param {string} type @param {readonly number[]} dims @param {string} [label]
   * @returns {GPUTensor}
   */
  static empty(device, type, dims, label = 'kiln_tensor') {
    const t = new GPUTensor(type, null, dims, device);
    t.buffer = device.createBuffer({label, size: Math.max(4, Math.ceil(t.byteLength / 4) * 4), usage: USAGE()});
    return t;
  }

  /**
   * Upload a kiln.Tensor into a new GPUTensor on `device`.
   * @param {GPUDevice} device @param {import('./tensor.js').Tensor} tensor
   * @returns {GPUTensor}
   * @throws {ShapeError} an int64 value outside int32's range.
   */
  static upload(device, tensor) {
    const t = GPUTensor.empty(device, tensor.type, tensor.dims);
    const data = toStorage({name: 'upload', dtype: tensor.type, storage: t.storage}, tensor.data);
    if (data.byteLength) {
      const bytes = Math.ceil(data.byteLength / 4) * 4;
      if (bytes === data.byteLength) device.queue.writeBuffer(t.buffer, 0, data.buffer, data.byteOffset, bytes);
      else {
        const padded = new Uint8Array(bytes);
        padded.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
        device.queue.writeBuffer(t.buffer, 0, padded);
      }
    }
    return t;
  }

  /** Number of elements. */
  get size() {
    return product(this.dims);
  }

  /** Bytes the elements take in the buffer (storage type). */
  get byteLength() {
    return this.size * DTYPES[this.storage].bytes;
  }

  /**
   * Copy the elements back to a new kiln.Tensor (waits for the work that writes them).
   * @returns {Promise<import('./tensor.js').Tensor>}
   * @throws {KilnError} the tensor was destroyed.
   */
  async read() {
    if (!this.buffer) throw new KilnError('read: this GPUTensor was destroyed');
    const size = Math.max(4, Math.ceil(this.byteLength / 4) * 4);
    const staging = this.device.createBuffer({label: 'kiln_read', size,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    try {
      const encoder = this.device.createCommandEncoder();
      encoder.copyBufferToBuffer(this.buffer, 0, staging, 0, size);
      this.device.queue.submit([encoder.finish()]);
      await staging.mapAsync(GPUMapMode.READ);
      const bytes = staging.getMappedRange(0, size).slice(0);
      staging.unmap();
      return fromStorage({name: 'read', dtype: this.type, storage: this.storage, shape: this.dims}, bytes);
    } finally {
      staging.destroy();
    }
  }

  /** Same as {@link GPUTensor#read}. @returns {Promise<import('./tensor.js').Tensor>} */
  download() {
    return this.read();
  }

  /** Free the buffer now; the tensor cannot be used afterwards. */
  destroy() {
    this.buffer?.destroy();
    this.buffer = null;
  }
}
