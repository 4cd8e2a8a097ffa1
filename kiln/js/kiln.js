// Kiln browser runtime: runs a Kiln package (made by `kiln compile`) on WebGPU.
// Zero dependencies, no build step; types are given as JSDoc.
//
//   import * as kiln from './kiln.js';
//   const session = await kiln.load('./');                       // package directory URL
//   const x = new kiln.Tensor('float32', new Float32Array(3 * 224 * 224), [1, 3, 224, 224]);
//   const {logits} = await session.run({input: x});              // {name: kiln.Tensor}
//
// `loadFiles` loads a package from memory ({path: ArrayBuffer}) instead of a URL (the RPC
// runtime, rpc.js, uses it), and `Session.time` measures runs on the device.
//
// Execution matches the native runtime (kiln/runtime/native.py): one GPUBuffer per
// manifest buffer, weights uploaded once at load, one compute pipeline per kernel and one
// bind group per plan step; each run writes the inputs, records every dispatch in one
// compute pass, copies the outputs to mappable staging buffers, submits once and maps them.

/** Package format name that `manifest.json` must declare. */
export const FORMAT = 'kiln-package';
/** Highest package format major version this runtime reads. */
export const FORMAT_MAJOR = 1;

/** Base class of the errors this runtime raises for bad packages, devices or inputs. */
export class KilnError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = new.target.name;
  }
}

/** The package is missing, malformed, corrupted, or of a newer format version. */
export class PackageError extends KilnError {}

/** No WebGPU, no adapter, or the adapter lacks a limit or feature the package needs. */
export class DeviceError extends KilnError {}

/** An input is unknown, missing, or of the wrong dtype or shape. */
export class ShapeError extends KilnError {}

/**
 * @typedef {Float32Array | Int32Array | Uint32Array | Uint16Array | Int16Array | BigInt64Array | Uint8Array | Int8Array} TensorData
 * Element storage; `float16` tensors hold raw IEEE half bits in a `Uint16Array`
 * (or a `Float16Array` where the browser has one); `int64` tensors a `BigInt64Array`;
 * `bool` tensors a `Uint8Array` of 0 and 1.
 */

/** @type {Record<string, {array: Function, bytes: number, safetensors: string}>} */
const DTYPES = {
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
function toStorage(spec, data) {
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
          'the WebGPU target computes int64 tensors in 32 bits (WGSL has no 64-bit integers)');
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
 * @param {TensorSpec} spec the manifest's output entry
 * @param {ArrayBuffer} bytes the buffer's contents
 * @returns {Tensor}
 */
function fromStorage(spec, bytes) {
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
function product(dims) {
  return dims.reduce((a, b) => a * b, 1);
}

/** @param {readonly (number|string)[]} dims @returns {string} */
function shapeText(dims) {
  return `[${dims.join(', ')}]`;
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
 * @typedef {object} TensorSpec  an entry of the manifest's `inputs` or `outputs`
 * @property {string} name
 * @property {string} dtype
 * @property {string} [storage]  element type of its buffer (int32 for int64, bool, int8, uint8; format 1.1)
 * @property {number[]} shape  concrete dimensions
 * @property {(number|string)[]} symbolic_shape  dimensions with symbolic names (e.g. 'N')
 * @property {number} buffer  id of the manifest buffer holding the tensor
 */

/**
 * @typedef {object} LoadOptions
 * @property {boolean} [verify=true] check each weights file's SHA-256 against the manifest.
 * @property {string} [target='webgpu'] the manifest target to run (only 'webgpu' in browsers).
 * @property {GPUPowerPreference} [powerPreference='high-performance'] adapter preference.
 * @property {boolean} [timing=false] also request the adapter's 'timestamp-query' feature, where it
 *   has one, so that {@link Session#time} measures with GPU timestamps rather than the wall clock.
 */

/**
 * Where a package's files come from: a URL (fetched) or memory ({@link loadFiles}).
 * @typedef {object} PackageSource
 * @property {string} name  the package in messages: its directory URL, or 'in-memory package'
 * @property {string | null} url  the package directory URL; null for in-memory packages
 * @property {(path: string, what: string) => Promise<ArrayBuffer>} bytes  a file's bytes
 * @property {(path: string, what: string) => string} where  a file's name in messages
 */

/** @param {URL} root package directory URL @returns {PackageSource} */
function urlSource(root) {
  return {
    name: root.href,
    url: root.href,
    async bytes(path, what) {
      const url = new URL(path, root);
      return (await fetchOk(url, what)).arrayBuffer();
    },
    where: (path) => new URL(path, root).href,
  };
}

/**
 * @param {Map<string, ArrayBuffer | ArrayBufferView> | Record<string, ArrayBuffer | ArrayBufferView>} files
 * @returns {PackageSource}
 */
function memorySource(files) {
  const entries = files instanceof Map ? [...files] : Object.entries(files ?? {});
  /** @type {Map<string, ArrayBuffer>} */
  const byPath = new Map();
  for (const [path, data] of entries) {
    if (data instanceof ArrayBuffer) {
      byPath.set(path, data);
    } else if (ArrayBuffer.isView(data)) {
      byPath.set(path, data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength));
    } else {
      throw new PackageError(`in-memory package: file ${path} must be an ArrayBuffer or a typed array, ` +
        `got ${data?.constructor?.name ?? typeof data}`);
    }
  }
  return {
    name: 'in-memory package',
    url: null,
    async bytes(path, what) {
      const data = byPath.get(path);
      if (data === undefined) throw new PackageError(`in-memory package: no ${what} ${path}`);
      return data;
    },
    where: (path) => `${path} (in memory)`,
  };
}

/**
 * Load a package and prepare it to run: read and check the manifest, get a WebGPU device,
 * download (and verify) the weights into GPU buffers, and compile every kernel.
 *
 * @param {string | URL} url URL of the package directory (relative URLs resolve against the page).
 * @param {LoadOptions} [options]
 * @returns {Promise<Session>}
 * @throws {PackageError} unreachable, malformed, corrupted or newer-format package.
 * @throws {DeviceError} no WebGPU, no adapter, or a missing limit or feature.
 */
export async function load(url, options = {}) {
  const root = new URL(url, globalThis.location?.href);
  if (!root.pathname.endsWith('/')) root.pathname += '/';
  return loadFrom(urlSource(root), options);
}

/**
 * Load a package from memory instead of a URL: the same checks and steps as {@link load}
 * (the weights' sizes and SHA-256 are verified unless `verify` is false).
 *
 * @param {Map<string, ArrayBuffer | ArrayBufferView> | Record<string, ArrayBuffer | ArrayBufferView>} files
 *   package path ('manifest.json', 'weights.safetensors', 'kernels/k0.wgsl', ...) -> the file's bytes.
 *   Typed arrays are copied; ArrayBuffers are used as they are.
 * @param {LoadOptions} [options]
 * @returns {Promise<Session>} a session whose `url` is null.
 * @throws {PackageError} a missing, malformed or corrupted file, or a newer-format package.
 * @throws {DeviceError} no WebGPU, no adapter, or a missing limit or feature.
 */
export async function loadFiles(files, options = {}) {
  return loadFrom(memorySource(files), options);
}

/**
 * @param {PackageSource} source
 * @param {LoadOptions} options
 * @returns {Promise<Session>}
 */
async function loadFrom(source, options) {
  const {verify = true, target = 'webgpu', powerPreference = 'high-performance', timing = false} = options;
  const manifest = await readManifest(source);
  const spec = manifest.targets[target];
  if (target !== 'webgpu' || !spec) {
    throw new PackageError(`${source.name}: this runtime runs the 'webgpu' target; asked for '${target}', ` +
      `the package has: ${Object.keys(manifest.targets).join(', ') || 'none'}`);
  }
  const {adapter, device} = await requestDevice(spec, manifest.buffers, powerPreference, timing);
  try {
    return await Session.create(source, manifest, adapter, device, verify);
  } catch (error) {
    device.destroy();
    throw error;
  }
}

/**
 * @param {URL} url
 * @param {string} what description of the file for error messages
 * @returns {Promise<Response>}
 */
async function fetchOk(url, what) {
  let response;
  try {
    response = await fetch(url);
  } catch (error) {
    throw new PackageError(`cannot fetch ${what} ${url}: ${error.message}`);
  }
  if (!response.ok) {
    throw new PackageError(`cannot fetch ${what} ${url}: HTTP ${response.status} ${response.statusText}`);
  }
  return response;
}

/**
 * Read `manifest.json` and check its format, version and required sections.
 * @param {PackageSource} source
 * @returns {Promise<any>} the manifest
 */
async function readManifest(source) {
  const root = source.name;
  const url = source.where('manifest.json');
  const bytes = await source.bytes('manifest.json', 'package manifest');
  let manifest;
  try {
    manifest = JSON.parse(new TextDecoder().decode(bytes));
  } catch (error) {
    throw new PackageError(`${url}: malformed JSON (${error.message})`);
  }
  if (manifest === null || typeof manifest !== 'object' || manifest.format !== FORMAT) {
    throw new PackageError(`${url}: not a Kiln package manifest (format is not '${FORMAT}')`);
  }
  const version = String(manifest.version ?? '');
  const major = Number.parseInt(version.split('.')[0], 10);
  if (!/^\d+(\.\d+)*$/.test(version) || Number.isNaN(major)) {
    throw new PackageError(`${url}: bad format version '${version}'`);
  }
  if (major > FORMAT_MAJOR) {
    throw new PackageError(`${root}: package format ${version} is newer than this kiln.js reads ` +
      `(${FORMAT_MAJOR}.x); use the kiln.js that came with the package or upgrade Kiln`);
  }
  for (const key of ['inputs', 'outputs', 'buffers', 'targets', 'weights']) {
    if (!(key in manifest)) throw new PackageError(`${url}: manifest lacks '${key}'`);
  }
  return manifest;
}

/**
 * Request an adapter and a device with the package's features and limits.
 *
 * The manifest's `limits` are what the plan uses (largest buffer, bindings per kernel,
 * workgroup and dispatch sizes); each must be within the adapter's, or a DeviceError names
 * the limit. They are requested as they are, so the device offers exactly what the plan needs.
 *
 * @param {any} spec the manifest's target entry (features, limits, kernels, plan)
 * @param {any[]} buffers the manifest's buffers
 * @param {GPUPowerPreference} powerPreference
 * @param {boolean} timing also request 'timestamp-query' if the adapter has it
 * @returns {Promise<{adapter: GPUAdapter, device: GPUDevice}>}
 */
async function requestDevice(spec, buffers, powerPreference, timing) {
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

/** @param {ArrayBuffer} bytes @returns {Promise<string>} lowercase hex SHA-256 */
async function sha256Hex(bytes) {
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('');
}

/**
 * Parse a safetensors file: 8-byte little-endian header length N, N bytes of JSON header
 * ({name: {dtype, shape, data_offsets: [begin, end]}}, offsets relative to the end of the
 * header), then the tensor data.
 * @param {ArrayBuffer} bytes the whole file
 * @param {string} path the file's path in the package, for error messages
 * @returns {{header: Record<string, {dtype: string, shape: number[], data_offsets: [number, number]}>, dataStart: number}}
 */
function parseSafetensors(bytes, path) {
  if (bytes.byteLength < 8) throw new PackageError(`weights file ${path}: too short to be safetensors`);
  const headerBytes = new DataView(bytes).getBigUint64(0, true);
  if (headerBytes > BigInt(bytes.byteLength - 8)) {
    throw new PackageError(`weights file ${path}: safetensors header length ${headerBytes} exceeds the file`);
  }
  const dataStart = 8 + Number(headerBytes);
  let header;
  try {
    header = JSON.parse(new TextDecoder().decode(new Uint8Array(bytes, 8, Number(headerBytes))));
  } catch (error) {
    throw new PackageError(`weights file ${path}: malformed safetensors header (${error.message})`);
  }
  return {header, dataStart};
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

/**
 * A loaded package on a WebGPU device. Create it with {@link load}.
 */
export class Session {
  /**
   * @param {PackageSource} source
   * @param {any} manifest
   * @param {GPUAdapter} adapter
   * @param {GPUDevice} device
   * @param {GPUBuffer[]} buffers one per manifest buffer, indexed by buffer id
   * @param {{pipeline: GPUComputePipeline, bindGroup: GPUBindGroup, dispatch: number[]}[]} steps
   * @param {Map<string, GPUBuffer>} staging mappable copy of each output, by output name
   * @private
   */
  constructor(source, manifest, adapter, device, buffers, steps, staging) {
    /** @type {string | null} URL of the package directory; null for a package loaded with {@link loadFiles}. */
    this.url = source.url;
    /** The package's `manifest.json`, parsed (preprocess and postprocess hints included). */
    this.manifest = manifest;
    /** The target being run. */
    this.target = 'webgpu';
    /** @type {TensorSpec[]} input descriptions from the manifest */
    this.inputs = manifest.inputs;
    /** @type {TensorSpec[]} output descriptions from the manifest */
    this.outputs = manifest.outputs;
    const info = adapter.info ?? {};
    /** The adapter's vendor, architecture, device and description as the browser reports them. */
    this.adapterInfo = {
      vendor: info.vendor ?? '', architecture: info.architecture ?? '',
      device: info.device ?? '', description: info.description ?? '',
    };
    /** Whether runs can be timed with GPU timestamps ({@link Session#time}). */
    this.timestampQuery = device.features.has('timestamp-query');
    /** @private */ this.device = device;
    /** @private */ this.buffers = buffers;
    /** @private */ this.steps = steps;
    /** @private */ this.staging = staging;
    /** @private @type {Promise<unknown>} runs are serialised: the staging buffers are shared */
    this.queue = Promise.resolve();
    /** @private @type {GPUDeviceLostInfo | null} */
    this.lost = null;
    device.lost.then((info) => { this.lost = info; });
  }

  /**
   * Build the session's GPU objects; see {@link load}.
   * @param {PackageSource} source @param {any} manifest @param {GPUAdapter} adapter @param {GPUDevice} device
   * @param {boolean} verify
   * @returns {Promise<Session>}
   * @private
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

    const [pipelines] = await Promise.all([
      createPipelines(source, device, spec.kernels),
      uploadWeights(source, manifest, device, buffers, verify),
    ]);

    device.pushErrorScope('validation');
    const steps = spec.plan.map((step, index) => {
      const {pipeline, layout} = pipelines[step.kernel] ?? {};
      if (!pipeline) throw new PackageError(`${root}: plan step ${index} names kernel ${step.kernel}, which does not exist`);
      const bindGroup = device.createBindGroup({
        label: step.node,
        layout,
        entries: step.buffers.map((id, binding) => ({binding, resource: {buffer: buffers[id]}})),
      });
      return {pipeline, bindGroup, dispatch: step.dispatch};
    });
    const staging = new Map(manifest.outputs.map((o) => [o.name, device.createBuffer({
      label: `staging_${o.name}`,
      size: manifest.buffers[o.buffer].bytes,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    })]));
    await throwScopeError(device, PackageError, `${root}: invalid execution plan`);
    return new Session(source, manifest, adapter, device, buffers, steps, staging);
  }

  /**
   * Run the model.
   *
   * @param {Record<string, Tensor>} feeds input name -> tensor of the manifest's dtype and shape.
   * @returns {Promise<Record<string, Tensor>>} output name -> new tensor (copied out of GPU memory).
   * @throws {ShapeError} unknown, missing, wrongly typed or wrongly shaped input.
   * @throws {DeviceError} the device was lost or rejected the work.
   */
  async run(feeds) {
    const checked = this.checkFeeds(feeds);
    const result = this.queue.then(() => this.execute(checked));
    this.queue = result.catch(() => undefined);
    return result;
  }

  /**
   * Time the model's compute on the device: the inputs are written once, then each of
   * `warmup + repeat` runs records every dispatch in one compute pass, submits it alone and
   * waits until the device has finished it (no uploads or readbacks are timed).
   *
   * With `clock: 'auto'` and a device that has 'timestamp-query' (load with `{timing: true}`),
   * each time is the GPU time between the start and the end of the compute pass, from
   * timestamps written by the device (browsers may round them, Chrome to 0.1 ms).
   * Otherwise each time is the wall clock from submit until `onSubmittedWorkDone` resolves.
   *
   * @param {Record<string, Tensor>} feeds as for {@link Session#run}.
   * @param {{repeat?: number, warmup?: number, clock?: 'auto' | 'wall'}} [options]
   *   `repeat` timed runs (integer >= 1, default 10) after `warmup` untimed runs (>= 0, default 1).
   * @returns {Promise<{clock: 'timestamp-query' | 'wall', times: number[], wall: number[]}>}
   *   `times`: milliseconds per timed run on `clock`; `wall`: wall-clock milliseconds of the same runs.
   * @throws {ShapeError} a bad feed (see {@link Session#run}).
   * @throws {KilnError} `repeat`, `warmup` or `clock` out of range.
   * @throws {DeviceError} the device was lost or rejected the work.
   */
  async time(feeds, options = {}) {
    const {repeat = 10, warmup = 1, clock = 'auto'} = options;
    if (!Number.isInteger(repeat) || repeat < 1) throw new KilnError(`time: repeat must be an integer >= 1, got ${repeat}`);
    if (!Number.isInteger(warmup) || warmup < 0) throw new KilnError(`time: warmup must be an integer >= 0, got ${warmup}`);
    if (clock !== 'auto' && clock !== 'wall') throw new KilnError(`time: clock must be 'auto' or 'wall', got '${clock}'`);
    const checked = this.checkFeeds(feeds);
    const useTimestamps = clock === 'auto' && this.timestampQuery;
    const result = this.queue.then(() => this.measure(checked, repeat, warmup, useTimestamps));
    this.queue = result.catch(() => undefined);
    return result;
  }

  /** Free the session's GPU buffers and device; the session cannot run afterwards. */
  destroy() {
    this.device.destroy();
  }

  /**
   * @param {Record<string, Tensor>} feeds
   * @returns {{spec: TensorSpec, data: ArrayBufferView}[]} one per manifest input, in manifest order, its data
   *   converted to the buffer's storage type
   * @private
   */
  checkFeeds(feeds) {
    if (feeds === null || typeof feeds !== 'object') {
      throw new ShapeError(`run() takes an object {inputName: Tensor}, got ${feeds === null ? 'null' : typeof feeds}`);
    }
    const names = this.inputs.map((i) => i.name);
    const quoted = names.map((n) => `'${n}'`).join(', ');
    const unknown = Object.keys(feeds).filter((n) => !names.includes(n));
    if (unknown.length) {
      throw new ShapeError(`unknown input${unknown.length > 1 ? 's' : ''} ${unknown.map((n) => `'${n}'`).join(', ')}; ` +
        `the model's inputs are ${quoted}`);
    }
    return this.inputs.map((spec) => {
      const expected = `${spec.dtype}${shapeText(spec.shape)}`;
      const tensor = feeds[spec.name];
      if (tensor === undefined) throw new ShapeError(`missing input '${spec.name}' (${expected})`);
      if (!(tensor instanceof Tensor)) {
        throw new ShapeError(`input '${spec.name}': expected a kiln.Tensor (${expected}), got ${tensor?.constructor?.name ?? typeof tensor}`);
      }
      if (tensor.type !== spec.dtype) {
        throw new ShapeError(`input '${spec.name}': expected dtype ${spec.dtype}, got ${tensor.type}`);
      }
      if (tensor.dims.length !== spec.shape.length || tensor.dims.some((d, i) => d !== spec.shape[i])) {
        throw new ShapeError(`input '${spec.name}': expected shape ${shapeText(spec.shape)} ` +
          `(symbolic ${shapeText(spec.symbolic_shape ?? spec.shape)}), got ${shapeText(tensor.dims)}`);
      }
      return {spec, data: toStorage(spec, tensor.data)};
    });
  }

  /**
   * @param {{spec: TensorSpec, data: ArrayBufferView}[]} checked
   * @returns {Promise<Record<string, Tensor>>}
   * @private
   */
  async execute(checked) {
    this.checkLost();
    const {device} = this;
    device.pushErrorScope('validation');
    this.writeInputs(checked);
    const encoder = device.createCommandEncoder();
    this.encodePass(encoder);
    for (const output of this.outputs) {
      const staging = this.staging.get(output.name);
      encoder.copyBufferToBuffer(this.buffers[output.buffer], 0, staging, 0, staging.size);
    }
    device.queue.submit([encoder.finish()]);
    await throwScopeError(device, DeviceError, 'WebGPU rejected the run');
    const results = {};
    await Promise.all(this.outputs.map(async (output) => {
      const staging = this.staging.get(output.name);
      await staging.mapAsync(GPUMapMode.READ);
      try {
        results[output.name] = fromStorage(output, staging.getMappedRange(0, staging.size));
      } finally {
        staging.unmap();
      }
    }));
    return results;
  }

  /** @private @throws {DeviceError} the device was lost */
  checkLost() {
    if (this.lost) throw new DeviceError(`the WebGPU device was lost (${this.lost.reason}): ${this.lost.message}`);
  }

  /** @param {{spec: TensorSpec, data: ArrayBufferView}[]} checked inputs in storage form @private */
  writeInputs(checked) {
    for (const {spec, data} of checked) {
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
    for (const {pipeline, bindGroup, dispatch} of this.steps) {
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
   * @param {{spec: TensorSpec, data: ArrayBufferView}[]} checked
   * @param {number} repeat @param {number} warmup @param {boolean} useTimestamps
   * @returns {Promise<{clock: 'timestamp-query' | 'wall', times: number[], wall: number[]}>}
   * @private
   */
  async measure(checked, repeat, warmup, useTimestamps) {
    this.checkLost();
    const {device} = this;
    device.pushErrorScope('validation');
    this.writeInputs(checked);
    let querySet = null, resolve = null, readback = null;
    if (useTimestamps) {
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
    const code = new TextDecoder().decode(await source.bytes(kernel.source, `kernel ${kernel.name}`));
    const module = device.createShaderModule({label: kernel.name, code});
    const layout = device.createBindGroupLayout({
      label: kernel.name,
      entries: kernel.bindings.map((b) => ({
        binding: b.binding,
        visibility: GPUShaderStage.COMPUTE,
        buffer: {type: b.access === 'read' ? 'read-only-storage' : 'storage'},
      })),
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

/**
 * Read each weights file, check its size and (with `verify`) SHA-256, and upload its
 * tensors into their buffers. Files are processed one at a time to bound memory use.
 * @param {PackageSource} source
 * @param {any} manifest
 * @param {GPUDevice} device
 * @param {GPUBuffer[]} buffers
 * @param {boolean} verify
 */
async function uploadWeights(source, manifest, device, buffers, verify) {
  const root = source.name;
  if (verify && !globalThis.crypto?.subtle) {
    throw new PackageError('cannot verify the weights: crypto.subtle needs a secure context ' +
      '(https:// or localhost); serve the package from one, or load with {verify: false}');
  }
  const files = manifest.weights.files;
  const byFile = new Map(files.map((f) => [f.path, []]));
  for (const b of manifest.buffers) {
    if (b.kind !== 'weight') continue;
    if (!byFile.has(b.file)) throw new PackageError(`${root}: weight ${b.tensor} is in ${b.file}, which the manifest does not list`);
    byFile.get(b.file).push(b);
  }
  for (const file of files) {
    const bytes = await source.bytes(file.path, 'weights file');
    if (bytes.byteLength !== file.bytes) {
      throw new PackageError(`weights file ${file.path}: size mismatch (expected ${file.bytes} bytes, ` +
        `got ${bytes.byteLength}); the package is corrupted or incomplete`);
    }
    if (verify) {
      const digest = await sha256Hex(bytes);
      if (digest !== file.sha256) {
        throw new PackageError(`weights file ${file.path}: SHA-256 checksum mismatch (expected ${file.sha256}, ` +
          `got ${digest}); the package is corrupted or was edited`);
      }
    }
    const {header, dataStart} = parseSafetensors(bytes, file.path);
    device.pushErrorScope('validation');
    for (const b of byFile.get(file.path)) {
      const entry = header[b.tensor];
      if (!entry) throw new PackageError(`weights file ${file.path}: no tensor '${b.tensor}'`);
      const dtype = DTYPES[b.dtype];
      if (!dtype || entry.dtype !== dtype.safetensors) {
        throw new PackageError(`weights file ${file.path}: tensor '${b.tensor}' is ${entry.dtype}, the manifest says ${b.dtype}`);
      }
      const [begin, end] = entry.data_offsets;
      if (!(begin >= 0 && begin <= end && dataStart + end <= bytes.byteLength && end - begin <= b.bytes)) {
        throw new PackageError(`weights file ${file.path}: tensor '${b.tensor}' has bad data offsets [${begin}, ${end}] ` +
          `(buffer ${b.id} holds ${b.bytes} bytes)`);
      }
      writePadded(device.queue, buffers[b.id], bytes, dataStart + begin, end - begin);
    }
    await throwScopeError(device, PackageError, `weights file ${file.path}: cannot upload`);
  }
}

/**
 * @typedef {object} ImagePreprocess  the manifest's `preprocess` entry for images
 * @property {'image'} type
 * @property {number} resize  the shorter side is resized to this many pixels (bilinear)
 * @property {number} crop  then a centred square of this many pixels is cut out
 * @property {number} [scale=1/255]  pixel values (0..255) are multiplied by this
 * @property {number[]} [mean=[0, 0, 0]]  per-channel (RGB) mean subtracted after scaling
 * @property {number[]} [std=[1, 1, 1]]  per-channel (RGB) standard deviation divided by last
 * @property {'NCHW'} layout
 */

/**
 * Turn an image into a model input as the package's `preprocess` entry describes: resize the
 * shorter side to `resize` pixels (bilinear, through a 2D canvas), cut out the centred
 * `crop` x `crop` square, multiply by `scale`, subtract `mean` and divide by `std` per RGB
 * channel. Resized sizes round to the nearest pixel and the crop offset rounds down, as
 * PIL-based reference pipelines do; the canvas smooths like PIL's antialiased bilinear
 * filter to within a level or two of 255 on average.
 *
 * @param {ImageBitmap | HTMLImageElement | HTMLCanvasElement | OffscreenCanvas | HTMLVideoElement | VideoFrame} image
 *   a decoded image (for an `<img>`, wait for `img.decode()` first).
 * @param {ImagePreprocess} preprocess the manifest's `preprocess` entry.
 * @returns {Tensor} float32 tensor of shape [1, 3, crop, crop] (NCHW).
 * @throws {KilnError} an unsupported preprocess entry or an image without pixels.
 */
export function preprocessImage(image, preprocess) {
  const {type, resize, crop, scale = 1 / 255, mean = [0, 0, 0], std = [1, 1, 1], layout = 'NCHW'} = preprocess ?? {};
  if (type !== 'image' || layout !== 'NCHW' || !(resize > 0) || !(crop > 0)) {
    throw new KilnError(`preprocessImage: unsupported preprocess entry ${JSON.stringify(preprocess)} ` +
      `(need type 'image', layout 'NCHW', positive resize and crop)`);
  }
  const width = image.naturalWidth || image.videoWidth || image.displayWidth || image.width;
  const height = image.naturalHeight || image.videoHeight || image.displayHeight || image.height;
  if (!(width > 0 && height > 0)) throw new KilnError('preprocessImage: the image has no pixels (not decoded yet?)');
  const ratio = resize / Math.min(width, height);
  const resizedWidth = Math.round(width * ratio);
  const resizedHeight = Math.round(height * ratio);
  const left = Math.floor((resizedWidth - crop) / 2);
  const top = Math.floor((resizedHeight - crop) / 2);
  const canvas = typeof OffscreenCanvas === 'function'
    ? new OffscreenCanvas(crop, crop)
    : Object.assign(document.createElement('canvas'), {width: crop, height: crop});
  const context = canvas.getContext('2d', {willReadFrequently: true});
  context.imageSmoothingEnabled = true;
  // 'low' is plain bilinear; 'medium' also filters when shrinking, as PIL's bilinear resize does
  context.imageSmoothingQuality = 'medium';
  context.drawImage(image, -left, -top, resizedWidth, resizedHeight);
  const rgba = context.getImageData(0, 0, crop, crop).data;
  const plane = crop * crop;
  const data = new Float32Array(3 * plane);
  for (let c = 0; c < 3; c++) {
    const offset = c * plane;
    const m = mean[c];
    const s = std[c];
    for (let i = 0; i < plane; i++) data[offset + i] = (rgba[4 * i + c] * scale - m) / s;
  }
  return new Tensor('float32', data, [1, 3, crop, crop]);
}

/**
 * The `k` highest-scoring classes of a logits vector, best first.
 * @param {Float32Array | number[]} logits class scores (one row).
 * @param {number} [k=5] how many classes to return (at most `logits.length`).
 * @param {boolean} [softmax=true] turn logits into probabilities first; otherwise `prob` is the raw score.
 * @returns {{index: number, prob: number}[]}
 */
export function topK(logits, k = 5, softmax = true) {
  const n = logits.length;
  let probs = Array.from(logits);
  if (softmax) {
    const max = probs.reduce((a, b) => Math.max(a, b), -Infinity);
    const exps = probs.map((x) => Math.exp(x - max));
    const sum = exps.reduce((a, b) => a + b, 0);
    probs = exps.map((e) => e / sum);
  }
  const order = Array.from({length: n}, (_, i) => i).sort((a, b) => probs[b] - probs[a]);
  return order.slice(0, Math.max(0, Math.min(k, n))).map((index) => ({index, prob: probs[index]}));
}
