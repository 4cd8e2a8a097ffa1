// Kiln browser runtime: tensors, dtypes and the storage conversions of the package format's
// "Dtypes" section (zero dependencies besides errors.js).
//
// Kernels keep every element in 4 bytes: bool, 8-, 16- and 64-bit integers are stored as int32
// (int64 values must fit) and float16 as float32. `toStorage` converts an input on upload and
// `fromStorage` an output on readback, for every target alike.

import {ShapeError} from './errors.js';

/**
 * @typedef {Float32Array | Int32Array | Uint32Array | Uint16Array | Int16Array | BigInt64Array | Uint8Array | Int8Array} TensorData
 * Element storage; `float16` tensors hold raw IEEE half bits in a `Uint16Array`
 * (or a `Float16Array` where the browser has one); `int64` tensors a `BigInt64Array`;
 * `bool` tensors a `Uint8Array` of 0 and 1.
 */

/** @type {Record<string, {array: Function, bytes: number, safetensors: string}>} */
export const DTYPES = {
  float32: {array: Float32Array, bytes: 4, safetensors: 'F32'},
  float16: {array: globalThis.Float16Array ?? Uint16Array, bytes: 2, safetensors: 'F16'},
  int32: {array: Int32Array, bytes: 4, safetensors: 'I32'},
  uint32: {array: Uint32Array, bytes: 4, safetensors: 'U32'},
  int64: {array: BigInt64Array, bytes: 8, safetensors: 'I64'},
  bool: {array: Uint8Array, bytes: 1, safetensors: 'BOOL'},
  uint8: {array: Uint8Array, bytes: 1, safetensors: 'U8'},
  int8: {array: Int8Array, bytes: 1, safetensors: 'I8'},
  int16: {array: Int16Array, bytes: 2, safetensors: 'I16'},
  uint16: {array: Uint16Array, bytes: 2, safetensors: 'U16'},
};

const INT32_MIN = -(2n ** 31n);
const INT32_MAX = 2n ** 31n - 1n;

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/**
 * An IEEE half-precision number from its 16 bits.
 * @param {number} h the bits
 * @returns {number}
 */
function halfToFloat(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/**
 * The 16 bits of the half-precision number nearest to `f` (ties to even), as `Float16Array` would store it.
 * @param {number} f
 * @returns {number}
 */
function floatToHalf(f) {
  F32[0] = f;
  const x = U32[0];
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {  // subnormal half (or zero)
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    let half = mant >>> shift;
    const rest = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    if (rest > mid || (rest === mid && (half & 1))) half += 1;
    return sign | half;
  }
  let half = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (half & 1))) half += 1;  // may carry into the exponent: still right
  return sign | half;
}

/**
 * The bytes a tensor's buffer holds: WGSL storage buffers have no bool, 8-, 16- or 64-bit integers,
 * so such tensors are stored as int32 (the manifest's `storage`); int64 values must fit in int32.
 * float16 tensors are stored as float32 (widened exactly; packages need no shader-f16 feature).
 * @param {TensorSpec} spec the manifest's input entry
 * @param {TensorData} data the tensor's elements
 * @returns {ArrayBufferView} data in the storage element type
 * @throws {ShapeError} an int64 value outside int32's range
 */
export function toStorage(spec, data) {
  const storage = spec.storage ?? spec.dtype;
  if (storage === spec.dtype) return data;
  if (spec.dtype === 'float16' && storage === 'float32') {
    return data instanceof Uint16Array ? Float32Array.from(data, halfToFloat) : Float32Array.from(data);
  }
  if (storage !== 'int32') throw new ShapeError(`input '${spec.name}': unknown storage type ${storage}`);
  const out = new Int32Array(data.length);
  if (data instanceof BigInt64Array) {
    for (let i = 0; i < data.length; i++) {
      const v = data[i];
      if (v < INT32_MIN || v > INT32_MAX) {
        throw new ShapeError(`input '${spec.name}': int64 value ${v} at flat index ${i} does not fit in int32; ` +
          'kernels compute int64 tensors in 32 bits (WGSL and GLSL ES have no 64-bit integers)');
      }
      out[i] = Number(v);
    }
  } else {
    out.set(data);
  }
  return out;
}

/**
 * A tensor of `spec.dtype` from the bytes of its buffer (storage element type `spec.storage`).
 * @param {{dtype: string, storage?: string, shape: number[]}} spec the manifest's output entry (or a training
 *   state entry)
 * @param {ArrayBuffer} bytes the buffer's contents
 * @returns {Tensor}
 */
export function fromStorage(spec, bytes) {
  const storage = spec.storage ?? spec.dtype;
  const count = product(spec.shape);
  const stored = new DTYPES[storage].array(bytes.slice(0, count * DTYPES[storage].bytes));
  if (storage === spec.dtype) return new Tensor(spec.dtype, stored, spec.shape);
  const Out = DTYPES[spec.dtype].array;
  let data;
  if (spec.dtype === 'float16') data = Out === Uint16Array ? Uint16Array.from(stored, floatToHalf) : Out.from(stored);
  else if (spec.dtype === 'int64') data = BigInt64Array.from(stored, (v) => BigInt(v));
  else if (spec.dtype === 'bool') data = Uint8Array.from(stored, (v) => (v !== 0 ? 1 : 0));
  else data = Out.from(stored);
  return new Tensor(spec.dtype, data, spec.shape);
}

/** @param {readonly number[]} dims @returns {number} */
export function product(dims) {
  return dims.reduce((a, b) => a * b, 1);
}

/**
 * A shape as error messages show it: `[N, 3, 224, 224]` (a manifest's size expression as its JSON), as
 * kiln/runtime/feeds.py's `shape_text`.
 * @param {readonly (number | string | object)[]} dims @returns {string}
 */
export function shapeText(dims) {
  return `[${dims.map((d) => (typeof d === 'object' ? JSON.stringify(d) : String(d))).join(', ')}]`;
}

/** A dense n-dimensional array: element type, flat row-major data and dimensions. */
export class Tensor {
  /**
   * @param {string} type element type: 'float32', 'float16', 'int32', 'uint32', 'int64', 'bool', 'uint8', 'int8',
   *   'uint16' or 'int16'.
   * @param {TensorData} data row-major elements, a typed array matching `type`.
   * @param {readonly number[]} dims dimensions; their product must equal `data.length`.
   * @throws {ShapeError} unknown type, data of another array type, or a size mismatch.
   */
  constructor(type, data, dims) {
    const dtype = DTYPES[type];
    if (!dtype) {
      throw new ShapeError(`Tensor: unknown type '${type}' (supported: ${Object.keys(DTYPES).join(', ')})`);
    }
    if (!(data instanceof dtype.array)) {
      throw new ShapeError(`Tensor: ${type} data must be a ${dtype.array.name}, got ${data?.constructor?.name ?? typeof data}`);
    }
    if (!Array.isArray(dims) || !dims.every((d) => Number.isInteger(d) && d >= 0)) {
      throw new ShapeError(`Tensor: dims must be an array of non-negative integers, got ${JSON.stringify(dims)}`);
    }
    if (product(dims) !== data.length) {
      throw new ShapeError(`Tensor: dims ${shapeText(dims)} need ${product(dims)} elements, data has ${data.length}`);
    }
    /** @readonly */ this.type = type;
    /** @readonly */ this.data = data;
    /** @readonly @type {number[]} */ this.dims = [...dims];
  }

  /** Number of elements. */
  get size() {
    return this.data.length;
  }
}

/**
 * An entry of the manifest's `inputs` or `outputs` (name, dtype, storage, shape, symbolic_shape, buffer, ...):
 * kiln/js/manifest.d.ts, generated from the package contract's JSON Schema.
 * @typedef {import('./manifest').TensorSpec} TensorSpec
 */

