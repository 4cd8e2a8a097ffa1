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

/** Staging buffers for reads, kept per device (at most {@link READBACKS_KEPT}): a decoder reads a token a step. */
const READBACKS = new WeakMap();
/** the most staging buffers a device keeps for reads */
const READBACKS_KEPT = 4;

/**
 * A mappable staging buffer of at least `size` bytes on `device`, from its pool or new.
 * @param {GPUDevice} device @param {number} size @returns {GPUBuffer}
 */
function takeReadback(device, size) {
  const pool = READBACKS.get(device) ?? [];
  const at = pool.findIndex((b) => b.size >= size);
  if (at >= 0) return pool.splice(at, 1)[0];
  return device.createBuffer({label: 'kiln_read', size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
}

/** Return staging buffer `buffer` (unmapped) to `device`'s pool, or destroy it where the pool is full. */
function giveReadback(device, buffer) {
  if (!READBACKS.has(device)) READBACKS.set(device, []);
  const pool = READBACKS.get(device);
  if (pool.length < READBACKS_KEPT) pool.push(buffer);
  else buffer.destroy();
}

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
    /** @private @type {Promise<import('./tensor.js').Tensor> | null} a read recorded with the run that made it */
    this.pending = null;
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
    if (this.pending) {  // (recorded in the command buffer of the run that made it: no submission of its own)
      const pending = this.pending;
      this.pending = null;
      return pending;
    }
    const encoder = this.device.createCommandEncoder();
    const started = this.startRead(encoder, this.buffer);
    this.device.queue.submit([encoder.finish()]);
    started();
    return this.read();
  }

  /**
   * Record this tensor's read back into `encoder`, copied from `source` (the buffer it is a copy of, written
   * earlier in the same command buffer: a decoder step's `next_token`), through a staging buffer of the device's
   * pool; the next {@link GPUTensor#read} returns it (kiln/runtime/gpu.py's `GPUTensor.start_read`).
   * @param {GPUCommandEncoder} encoder @param {GPUBuffer} source
   * @returns {() => void} to call once the encoder's commands are submitted (it maps the staging buffer)
   */
  startRead(encoder, source) {
    const size = Math.max(4, Math.ceil(this.byteLength / 4) * 4);
    const staging = takeReadback(this.device, size);
    encoder.copyBufferToBuffer(source, 0, staging, 0, size);
    return () => {
      this.pending = staging.mapAsync(GPUMapMode.READ).then(() => {
        const bytes = staging.getMappedRange(0, size).slice(0);
        staging.unmap();
        giveReadback(this.device, staging);
        return fromStorage({name: 'read', dtype: this.type, storage: this.storage, shape: this.dims}, bytes);
      }, (error) => {
        staging.destroy();
        throw error;
      });
      this.pending.catch(() => undefined);  // (a read never asked for is no unhandled rejection)
    };
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
