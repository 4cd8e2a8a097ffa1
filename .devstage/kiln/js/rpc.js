// Kiln RPC device: joins a `kiln serve --rpc` server over WebSocket and runs what it is sent.
// Zero dependencies besides kiln.js; the protocol is in docs/rpc-protocol.md.
//
//   import {join} from './rpc.js';
//   const device = await join({token});                   // ws(s)://<this page's host>/device
//   device.addEventListener('status', (e) => console.log(e.detail));
//
// Requests are handled one at a time, in order, so that timed runs never overlap other work.
// `measure` requests (kernel candidates from `kiln tune`) are answered by measure.js.

import * as kiln from './kiln.js';
import {KernelMeasurer} from './measure.js';

/** Protocol version this page speaks (sent in `hello`). */
export const PROTOCOL_VERSION = 1;

const MAGIC = 'KRPC';

/** Tensor element types and their typed arrays (float16: raw half bits where Float16Array is missing). */
const ARRAYS = {
  float32: Float32Array,
  float16: globalThis.Float16Array ?? Uint16Array,
  int32: Int32Array,
  uint32: Uint32Array,
};

/** Adapter limits reported in `hello` (spec names). */
const LIMITS = [
  'maxBufferSize', 'maxStorageBufferBindingSize', 'maxStorageBuffersPerShaderStage',
  'maxComputeWorkgroupsPerDimension', 'maxComputeInvocationsPerWorkgroup', 'maxComputeWorkgroupSizeX',
  'maxComputeWorkgroupSizeY', 'maxComputeWorkgroupSizeZ', 'maxComputeWorkgroupStorageSize',
];

/** @param {number} n @returns {number} `n` rounded up to a multiple of 8 */
const align8 = (n) => (n + 7) & ~7;

/**
 * Frame a message: 'KRPC', u32 LE header length, JSON header, padding to 8, then each blob padded to 8.
 * @param {Record<string, any>} header with `type` and `id`; `blobs` is set to the blobs' byte lengths.
 * @param {Uint8Array[]} [blobs]
 * @returns {ArrayBuffer}
 */
export function encode(header, blobs = []) {
  const head = new TextEncoder().encode(JSON.stringify({...header, blobs: blobs.map((b) => b.byteLength)}));
  let size = 8 + align8(head.byteLength);
  for (const blob of blobs) size += align8(blob.byteLength);
  const out = new Uint8Array(size);
  out.set(new TextEncoder().encode(MAGIC), 0);
  new DataView(out.buffer).setUint32(4, head.byteLength, true);
  out.set(head, 8);
  let offset = 8 + align8(head.byteLength);
  for (const blob of blobs) {
    out.set(blob, offset);
    offset += align8(blob.byteLength);
  }
  return out.buffer;
}

/**
 * Parse a message framed by {@link encode}.
 * @param {ArrayBuffer} buffer
 * @returns {{header: Record<string, any>, blobs: Uint8Array[]}} blobs view `buffer` (8-byte aligned).
 * @throws {Error} a malformed message.
 */
export function decode(buffer) {
  if (!(buffer instanceof ArrayBuffer) || buffer.byteLength < 8) throw new Error('message too short or not binary');
  const bytes = new Uint8Array(buffer);
  if (new TextDecoder().decode(bytes.subarray(0, 4)) !== MAGIC) throw new Error('bad magic');
  const size = new DataView(buffer).getUint32(4, true);
  if (size < 1 || 8 + size > buffer.byteLength) throw new Error(`bad header length ${size}`);
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + size)));
  if (header === null || typeof header !== 'object' || typeof header.type !== 'string' ||
      !Number.isInteger(header.id) || !Array.isArray(header.blobs)) {
    throw new Error('malformed header');
  }
  let offset = 8 + align8(size);
  const blobs = header.blobs.map((length) => {
    if (!Number.isInteger(length) || length < 0 || offset + length > buffer.byteLength) {
      throw new Error(`bad blob length ${length}`);
    }
    const blob = new Uint8Array(buffer, offset, length);
    offset += align8(length);
    return blob;
  });
  if (offset !== buffer.byteLength) throw new Error(`message is ${buffer.byteLength} bytes, its header implies ${offset}`);
  return {header, blobs};
}

/**
 * Describe this browser's WebGPU adapter for `hello`.
 * @returns {Promise<{adapter: Record<string, string>, features: string[], limits: Record<string, number>}>}
 * @throws {kiln.DeviceError} no WebGPU or no adapter.
 */
export async function describeAdapter() {
  if (!globalThis.navigator?.gpu) {
    throw new kiln.DeviceError('WebGPU is not available in this browser (navigator.gpu is missing); use a recent ' +
      'Chrome, Edge or Safari, or Firefox with WebGPU enabled, from https:// or localhost');
  }
  const adapter = await navigator.gpu.requestAdapter({powerPreference: 'high-performance'});
  if (!adapter) throw new kiln.DeviceError('no WebGPU adapter available (requestAdapter() returned null)');
  const info = adapter.info ?? {};
  const limits = {};
  for (const name of LIMITS) if (typeof adapter.limits[name] === 'number') limits[name] = adapter.limits[name];
  return {
    adapter: {vendor: info.vendor ?? '', architecture: info.architecture ?? '', device: info.device ?? '',
      description: info.description ?? ''},
    features: [...adapter.features].sort(),
    limits,
  };
}

/**
 * @param {{name: string, dtype: string, shape: number[]}[]} specs
 * @param {Uint8Array[]} blobs
 * @returns {Record<string, kiln.Tensor>}
 */
function toTensors(specs, blobs) {
  if (!Array.isArray(specs) || specs.length !== blobs.length) throw new kiln.ShapeError('tensors and blobs differ in number');
  const tensors = {};
  specs.forEach(({name, dtype, shape}, i) => {
    const ArrayType = ARRAYS[dtype];
    if (!ArrayType) throw new kiln.ShapeError(`tensor '${name}': unsupported dtype '${dtype}'`);
    const blob = blobs[i];
    const data = new ArrayType(blob.buffer, blob.byteOffset, blob.byteLength / ArrayType.BYTES_PER_ELEMENT);
    tensors[name] = new kiln.Tensor(dtype, data, shape);
  });
  return tensors;
}

/**
 * A tab joined to a server: answers `load`, `run`, `time`, `unload` and `measure` requests.
 * Emits `status` events (detail: a line of text), `request` events after each answer (detail:
 * {type, handled}) and a `close` event (detail: {code, reason}).
 */
export class RpcDevice extends EventTarget {
  /** @param {WebSocket} socket an open socket whose `welcome` has arrived @param {number} id */
  constructor(socket, id) {
    super();
    /** The server's number for this device. */
    this.id = id;
    /** @private */ this.socket = socket;
    /** @private @type {Map<number, kiln.Session>} loaded packages by the server's package id */
    this.sessions = new Map();
    /** @private */ this.work = Promise.resolve();
    /** Requests answered so far. */
    this.handled = 0;
    /** @private @type {KernelMeasurer | null} made at the first `measure` request */
    this.measurer = null;
    socket.addEventListener('message', (event) => {
      this.work = this.work.then(() => this.handle(event.data));
    });
    socket.addEventListener('close', (event) => {
      for (const session of this.sessions.values()) session.destroy();
      this.sessions.clear();
      this.measurer?.device.destroy();
      this.dispatchEvent(new CustomEvent('close', {detail: {code: event.code, reason: event.reason}}));
    });
  }

  /** Leave the server and free every loaded package. */
  close() {
    this.socket.close(1000, 'page closed');
  }

  /** @param {string} text @private */
  status(text) {
    this.dispatchEvent(new CustomEvent('status', {detail: text}));
  }

  /** @param {ArrayBuffer} data @private */
  async handle(data) {
    let message;
    try {
      message = decode(data);
    } catch (error) {
      this.socket.close(1008, `malformed message from the server: ${error.message}`.slice(0, 120));
      return;
    }
    const {header, blobs} = message;
    let reply;
    try {
      reply = await this.answer(header, blobs);
    } catch (error) {
      console.warn(`request ${header.id} (${header.type}) failed:`, error);
      reply = {header: {type: 'error', error: {name: error?.name ?? 'Error', message: error?.message ?? String(error)}}};
    }
    this.handled += 1;
    this.dispatchEvent(new CustomEvent('request', {detail: {type: header.type, handled: this.handled}}));
    if (this.socket.readyState === WebSocket.OPEN) {
      this.socket.send(encode({...reply.header, id: header.id}, reply.blobs ?? []));
    }
  }

  /**
   * @param {Record<string, any>} header @param {Uint8Array[]} blobs
   * @returns {Promise<{header: Record<string, any>, blobs?: Uint8Array[]}>}
   * @private
   */
  async answer(header, blobs) {
    const {type, package: id} = header;
    if (type === 'measure') {
      this.status(`measuring ${header.candidates.length} kernel candidate(s)\u2026`);
      if (!this.measurer || this.measurer.lost) this.measurer = await KernelMeasurer.create();
      const {clock, results, samples} = await this.measurer.measure(header, blobs);
      this.status(`measured ${results.length} kernel candidate(s): ${clock}`);
      return {header: {type: 'measured', clock, results}, blobs: samples};
    }
    if (type === 'load') {
      this.status(`loading package ${id} (${blobs.reduce((n, b) => n + b.byteLength, 0)} bytes)\u2026`);
      const files = new Map(header.files.map((path, i) => [path, blobs[i]]));
      this.sessions.get(id)?.destroy();
      const session = await kiln.loadFiles(files, {verify: true, timing: true});
      this.sessions.set(id, session);
      this.status(`package ${id} loaded: ${session.manifest.name}`);
      return {header: {type: 'loaded', timestamp_query: session.timestampQuery}};
    }
    const session = this.sessions.get(id);
    if (!session) throw new kiln.KilnError(`no package ${id} is loaded on this device`);
    if (type === 'run') {
      this.status(`running package ${id}\u2026`);
      const outputs = await session.run(toTensors(header.inputs, blobs));
      const specs = Object.entries(outputs).map(([name, t]) => ({name, dtype: t.type, shape: t.dims}));
      const out = Object.values(outputs).map((t) => new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength));
      this.status(`ran package ${id}`);
      return {header: {type: 'result', outputs: specs}, blobs: out};
    }
    if (type === 'time') {
      this.status(`timing package ${id} (${header.repeat} runs)\u2026`);
      const {clock, times, wall} = await session.time(toTensors(header.inputs, blobs),
        {repeat: header.repeat, warmup: header.warmup, clock: header.clock});
      this.status(`timed package ${id}: ${clock}`);
      return {header: {type: 'timing', clock, times_ms: times, wall_ms: wall}};
    }
    if (type === 'unload') {
      session.destroy();
      this.sessions.delete(id);
      this.status(`package ${id} unloaded`);
      return {header: {type: 'unloaded'}};
    }
    throw new kiln.KilnError(`unknown request type '${type}'`);
  }
}

/**
 * Join a Kiln RPC server as a device.
 *
 * @param {{token: string, server?: string | URL}} options `token`: the server's token;
 *   `server`: its http(s):// address (default: this page's origin).
 * @returns {Promise<RpcDevice>} once the server has welcomed this device.
 * @throws {kiln.DeviceError} no WebGPU adapter.
 * @throws {kiln.KilnError} the server refused the token or closed the connection.
 */
export async function join({token, server = globalThis.location?.href}) {
  if (!token) throw new kiln.KilnError('no token: open the join URL that `kiln serve --rpc` printed');
  const description = await describeAdapter();
  const url = new URL('/device', server);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  url.search = new URLSearchParams({token}).toString();
  url.hash = '';
  const socket = new WebSocket(url);
  socket.binaryType = 'arraybuffer';
  const id = await new Promise((resolve, reject) => {
    const fail = (event) => reject(new kiln.KilnError(
      `the server refused this device or closed the connection (${event.code ?? 'no code'}` +
      `${event.reason ? `: ${event.reason}` : ''}); check the token in the URL`));
    socket.addEventListener('close', fail, {once: true});
    socket.addEventListener('open', () => {
      socket.send(encode({type: 'hello', id: 0, protocol: PROTOCOL_VERSION, ...description,
        user_agent: navigator.userAgent}));
    }, {once: true});
    socket.addEventListener('message', (event) => {
      try {
        const {header} = decode(event.data);
        if (header.type !== 'welcome' || !Number.isInteger(header.device)) throw new Error(`got '${header.type}'`);
        socket.removeEventListener('close', fail);
        resolve(header.device);
      } catch (error) {
        socket.close(1008, 'expected welcome');
        reject(new kiln.KilnError(`the server did not welcome this device (${error.message})`));
      }
    }, {once: true});
  });
  return new RpcDevice(socket, id);
}
