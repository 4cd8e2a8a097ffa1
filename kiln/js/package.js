// @ts-check
// Kiln browser runtime: reading a package.
//
// A package's files come from a URL (fetched) or from memory; this module reads and checks
// `manifest.json` (format, version, the package schema, its references and digest), and reads the weights files,
// checking each one's size and SHA-256 and handing every weight tensor's bytes to a backend to upload. The schema
// is validated with @cfworker/json-schema (vendored from npm into ./vendor/json-schema/, pinned by
// kiln/js/vendor/package-lock.json; tools/vendor_js.py).

import {PackageError} from './errors.js';
import {DTYPES} from './tensor.js';
import {kernelSteps} from './control.js';
import SCHEMA from './manifest-schema.js';
import {Validator} from './vendor/json-schema/index.js';

// The manifest's types: kiln/js/manifest.d.ts, generated from the package contract's JSON Schema
// (kiln/package/manifest.schema.json) by `python -m tools.manifest_types`.
/** @typedef {import('./manifest').Manifest} Manifest */
/** @typedef {import('./manifest').Buffer} ManifestBuffer */

/** Package format name that `manifest.json` must declare. */
export const FORMAT = 'kiln-package';
/** Highest package format major version this runtime reads. */
export const FORMAT_MAJOR = 1;

/**
 * Progress of a load's weights download, reported to `load(url, {onProgress})`.
 * @typedef {object} LoadProgress
 * @property {string} file the weights file being read.
 * @property {number} loaded bytes of all weights files read so far.
 * @property {number} total bytes of all weights files.
 * @property {boolean} cached whether this file came from the browser's cache (no download).
 */

/**
 * Bytes of a load's weights by where they came from.
 * @typedef {{downloaded: number, cached: number}} WeightsOrigin
 */

/**
 * Where a package's files come from: a URL (fetched) or memory ({@link loadFiles}).
 * @typedef {object} PackageSource
 * @property {string} name  the package in messages: its directory URL, or 'in-memory package'
 * @property {string | null} url  the package directory URL; null for in-memory packages
 * @property {(path: string, what: string) => Promise<ArrayBuffer>} bytes  a file's bytes
 * @property {(path: string) => string} where  a file's name in messages
 * @property {(file: {path: string, bytes: number, sha256: string}, fresh?: boolean) =>
 *   Promise<{bytes: ArrayBuffer, cached: boolean}>} weights  a weights file's bytes: from the cache unless
 *   `fresh`, else fetched (with progress)
 * @property {(file: {path: string, bytes: number, sha256: string}, bytes: ArrayBuffer) => Promise<void>} keep
 *   store a checked weights file in the cache (replacing other versions of it)
 * @property {(file: {path: string, bytes: number, sha256: string}) => Promise<void>} forget  drop a cached file
 * @property {(p: {file: string, bytes: number, cached: boolean}) => void} progress  report a file's bytes read
 * @property {WeightsOrigin} origin  bytes of weights downloaded and taken from the cache by this load
 * @property {(folder: string) => PackageSource} part  the source of a package inside this one (a language model's
 *   `sampler`, format 1.8)
 */

/** The Cache API cache that holds packages' weights files, keyed by URL and SHA-256. */
export const WEIGHTS_CACHE = 'kiln-weights';

/**
 * A progress reporter over all of a manifest's weights files.
 * @param {((p: LoadProgress) => void) | undefined} onProgress
 * @returns {{origin: WeightsOrigin, start: (total: number) => void,
 *   progress: (p: {file: string, bytes: number, cached: boolean}) => void}}
 */
function progressReporter(onProgress) {
  let done = 0;
  let total = 0;
  const origin = {downloaded: 0, cached: 0};
  return {
    origin,
    start: (bytes) => { total = bytes; },
    progress({file, bytes, cached}) {
      done += bytes;
      onProgress?.({file, loaded: done, total: Math.max(total, done), cached});
    },
  };
}

/**
 * @param {URL} root package directory URL
 * @param {{cache?: boolean, onProgress?: (p: LoadProgress) => void}} [options] `cache` (default true): keep
 *   weights files in the Cache API (where the page has one: a secure context) and read them from there next time.
 * @returns {PackageSource & {start: (total: number) => void}}
 */
export function urlSource(root, options = {}) {
  const {cache = true, onProgress} = options;
  const reporter = progressReporter(onProgress);
  const store = () => (cache && globalThis.caches ? globalThis.caches.open(WEIGHTS_CACHE).catch(() => null) : null);
  const key = (file) => `${new URL(file.path, root).href}?sha256=${file.sha256}`;
  return {
    name: root.href,
    url: root.href,
    async bytes(path, what) {
      const url = new URL(path, root);
      return (await fetchOk(url, what)).arrayBuffer();
    },
    where: (path) => new URL(path, root).href,
    origin: reporter.origin,
    start: reporter.start,
    progress: reporter.progress,
    async weights(file, fresh = false) {
      const cached = fresh ? undefined : await (await store())?.match(key(file)).catch(() => undefined);
      if (cached) {
        const bytes = await cached.arrayBuffer();
        reporter.progress({file: file.path, bytes: bytes.byteLength, cached: true});
        return {bytes, cached: true};
      }
      const response = await fetchOk(new URL(file.path, root), 'weights file');
      return {bytes: await readBody(response, file, reporter.progress), cached: false};
    },
    async keep(file, bytes) {
      const c = await store();
      if (!c) return;
      try {
        const base = new URL(file.path, root).href;
        for (const old of await c.keys()) if (old.url.split('?')[0] === base) await c.delete(old);
        await c.put(key(file), new Response(bytes, {headers: {'Content-Type': 'application/octet-stream'}}));
      } catch {
        // a full or unavailable cache only means the next visit downloads again
      }
    },
    async forget(file) {
      await (await store())?.delete(key(file)).catch(() => false);
    },
    part: (folder) => urlSource(new URL(`${folder}/`, root), {cache}),
  };
}

/**
 * A response body read in chunks, reporting progress; the manifest's size bounds it.
 * @param {Response} response
 * @param {{path: string, bytes: number}} file
 * @param {(p: {file: string, bytes: number, cached: boolean}) => void} progress
 * @returns {Promise<ArrayBuffer>}
 */
async function readBody(response, file, progress) {
  if (!response.body) {
    const bytes = await response.arrayBuffer();
    progress({file: file.path, bytes: bytes.byteLength, cached: false});
    return bytes;
  }
  const out = new Uint8Array(file.bytes);
  const reader = response.body.getReader();
  let at = 0;
  for (;;) {
    const {done, value} = await reader.read();
    if (done) break;
    if (at + value.byteLength > out.byteLength) {
      await reader.cancel();
      throw new PackageError(`weights file ${file.path}: size mismatch (expected ${file.bytes} bytes, got more); ` +
        'the package is corrupted or incomplete');
    }
    out.set(value, at);
    at += value.byteLength;
    progress({file: file.path, bytes: value.byteLength, cached: false});
  }
  return at === out.byteLength ? out.buffer : out.buffer.slice(0, at);
}

/**
 * @param {Map<string, ArrayBuffer | ArrayBufferView> | Record<string, ArrayBuffer | ArrayBufferView>} files
 * @param {(p: LoadProgress) => void} [onProgress]
 * @returns {PackageSource & {start: (total: number) => void}}
 */
export function memorySource(files, onProgress = undefined) {
  const entries = files instanceof Map ? [...files] : Object.entries(files ?? {});
  /** @type {Map<string, ArrayBuffer>} */
  const byPath = new Map();
  for (const [path, data] of entries) {
    if (data instanceof ArrayBuffer) {
      byPath.set(path, data);
    } else if (ArrayBuffer.isView(data)) {
      const copy = data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength);
      byPath.set(path, /** @type {ArrayBuffer} */ (copy));
    } else {
      throw new PackageError(`in-memory package: file ${path} must be an ArrayBuffer or a typed array, ` +
        `got ${/** @type {any} */ (data)?.constructor?.name ?? typeof data}`);
    }
  }
  const reporter = progressReporter(onProgress);
  /** @type {(path: string, what: string) => Promise<ArrayBuffer>} */
  const bytes = async (path, what) => {
    const data = byPath.get(path);
    if (data === undefined) throw new PackageError(`in-memory package: no ${what} ${path}`);
    return data;
  };
  return {
    name: 'in-memory package',
    url: null,
    bytes,
    where: (path) => `${path} (in memory)`,
    origin: reporter.origin,
    start: reporter.start,
    progress: reporter.progress,
    async weights(file) {
      const data = await bytes(file.path, 'weights file');
      reporter.progress({file: file.path, bytes: data.byteLength, cached: false});
      return {bytes: data, cached: false};
    },
    keep: async () => undefined,
    forget: async () => undefined,
    part: (folder) => memorySource(new Map([...byPath].filter(([path]) => path.startsWith(`${folder}/`))
      .map(([path, data]) => [path.slice(folder.length + 1), data]))),
  };
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
 * Read `manifest.json` and check its format and version, then the whole of it against the package schema
 * ({@link checkSchema}) and its references ({@link checkReferences}).
 * A package of format 1.8 or later also has `manifest.sha256` (the manifest's SHA-256 in sha256sum's format), which
 * `verify` checks the manifest's bytes against.
 * @param {PackageSource} source
 * @param {boolean} [verify=true] check the manifest's SHA-256 (format 1.8)
 * @returns {Promise<Manifest>} the manifest
 * @throws {PackageError} unreachable, malformed, newer-format, of another shape than the schema's or inconsistent, or
 *   (format 1.8) without manifest.sha256 or with a manifest whose SHA-256 differs from it.
 */
export async function readManifest(source, verify = true) {
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
  checkSchema(manifest, url);
  if (verify && hasIntegrity(manifest)) {
    let line;
    try {
      line = new TextDecoder().decode(await source.bytes(MANIFEST_DIGEST, 'manifest digest'));
    } catch (error) {
      throw new PackageError(`${root}: no ${MANIFEST_DIGEST} (a package of format 1.8 or later has one; ` +
        `${error.message}); the package is incomplete`);
    }
    const want = line.trim().split(/\s+/)[0].toLowerCase();
    const got = await sha256Hex(bytes);
    if (got !== want) {
      throw new PackageError(`${url}: SHA-256 checksum mismatch (expected ${want}, got ${got}); the package is ` +
        'corrupted or its manifest was edited');
    }
  }
  checkReferences(manifest, url);
  // format 1.4 dtypes (bfloat16, float8, 4- and 2-bit, uint64) run on the native runtimes only
  for (const t of [...manifest.inputs, ...manifest.outputs]) {
    if (!(t.dtype in DTYPES)) {
      throw new PackageError(`${root}: ${t.name} is a ${t.dtype} tensor, which kiln.js does not support yet ` +
        '(the native Python runtimes do)');
    }
  }
  return manifest;
}

/** @type {Map<object, Validator>} a validator per schema, made on first use */
const validators = new Map();

/**
 * Check a parsed JSON file against a JSON Schema (draft 2020-12) of the package contract, as the Python runtimes do
 * (kiln/package/manifest.py): the manifest against kiln/package/manifest.schema.json (as kiln/js/manifest-schema.js,
 * the default), speech.json against its own. So a file of the wrong shape (an edited or damaged package, or a buggy
 * compiler's) is refused here, not met as a TypeError deep in a backend.
 * @param {any} value the parsed file @param {string} url its name in messages
 * @param {object} [schema=SCHEMA] @param {string} [what] the message's start (the file and its schema)
 * @throws {PackageError} one line naming the JSON path of the innermost failure and the problem.
 */
export function checkSchema(value, url, schema = SCHEMA, what = 'the manifest does not match the package schema') {
  let validator = validators.get(schema);
  if (!validator) validators.set(schema, validator = new Validator(/** @type {any} */ (schema), '2020-12', true));
  const result = validator.validate(value);
  if (!result.valid) {
    const error = result.errors[result.errors.length - 1];
    const at = (error?.instanceLocation ?? '#').replace(/^#/, '') || '/';
    const why = String(error?.error ?? 'invalid').replace(/\s+/g, ' ').slice(0, 300);
    throw new PackageError(`${url}: ${what} at ${at}: ${why}`);
  }
}

/**
 * Check what refers to what in a manifest (as kiln/package/format.py's `check_references`): buffer ids of the
 * inputs, outputs, state and plan steps exist, each I/O buffer holds its tensor, plan steps run kernels that exist
 * with as many buffers as they bind and dispatch within the target's limits, weights buffers name weights files,
 * and the wasm target's buffers lie inside its memory after the arena; so no backend indexes past a list or a
 * memory because of an inconsistent (edited or damaged) package.
 * @param {any} manifest parsed manifest.json @param {string} url its name in messages
 * @throws {PackageError} one line naming the JSON path and the problem.
 */
export function checkReferences(manifest, url) {
  const fail = (what) => {
    throw new PackageError(`${url}: ${what} (the package is inconsistent)`);
  };
  const {buffers} = manifest;
  if (!Array.isArray(buffers)) fail('buffers is not a list');
  const n = buffers.length;
  const buffer = (ref, path) => {
    if (!Number.isInteger(ref) || ref < 0 || ref >= n) {
      fail(`${path}: buffer ${JSON.stringify(ref)} does not exist (there are ${n})`);
    }
    return buffers[ref];
  };
  buffers.forEach((b, i) => {
    if (b?.id !== i || !Number.isInteger(b?.bytes) || b.bytes < 0 || b.bytes % 4) {
      fail(`buffers[${i}] is not buffer ${i} of a size in whole 4-byte words`);
    }
  });
  for (const kind of ['inputs', 'outputs']) {
    if (!Array.isArray(manifest[kind])) fail(`${kind} is not a list`);
    manifest[kind].forEach((t, i) => {
      const b = buffer(t?.buffer, `${kind}[${i}].buffer`);
      const shape = Array.isArray(t.shape) ? t.shape : [];
      const need = shape.reduce((a, d) => a * Math.max(Number(d) || 0, 0), 1) *
        (DTYPES[t.storage ?? t.dtype]?.bytes ?? 4);
      if (b.bytes < need) {
        fail(`${kind}[${i}] (${t.name}): buffer ${t.buffer} holds ${b.bytes} bytes, the tensor needs ${need}`);
      }
    });
  }
  (Array.isArray(manifest.state) ? manifest.state : []).forEach((st, i) => buffer(st?.buffer, `state[${i}].buffer`));
  const files = new Set((manifest.weights?.files ?? []).map((f) => f?.path));
  buffers.forEach((b, i) => {
    if (b.kind === 'weight' && !files.has(b.file)) {
      fail(`buffers[${i}].file: ${JSON.stringify(b.file)} is not one of the weights files`);
    }
  });
  for (const [name, target] of Object.entries(manifest.targets ?? {})) {
    if (!target || !Array.isArray(target.kernels)) continue;
    const {kernels} = target;
    const most = target.limits?.maxComputeWorkgroupsPerDimension ?? 65535;
    kernelSteps(Array.isArray(target.plan) ? target.plan : []).forEach((step, j) => {
      const k = step.kernel;
      if (!Number.isInteger(k) || k < 0 || k >= kernels.length) {
        fail(`targets.${name}.plan: step ${j} runs kernel ${JSON.stringify(k)}, which does not exist ` +
          `(there are ${kernels.length})`);
      }
      const refs = Array.isArray(step.buffers) ? step.buffers : [];
      refs.forEach((r) => buffer(r, `targets.${name}.plan[${j}].buffers`));
      const kernel = kernels[k];
      const want = Array.isArray(kernel?.bindings) ? kernel.bindings.length : kernel?.params;
      if (Number.isInteger(want) && refs.length !== want) {
        fail(`targets.${name}.plan: step ${j} binds ${refs.length} buffers to kernel ${k}, which takes ${want}`);
      }
      const dispatch = /** @type {any} */ (step).dispatch;
      if (Array.isArray(dispatch) && !dispatch.every((d) => Number.isInteger(d) && d >= 0 && d <= most)) {
        fail(`targets.${name}.plan: step ${j} dispatches ${JSON.stringify(dispatch)}, beyond ${most} workgroups ` +
          'a dimension');
      }
    });
    const memory = /** @type {any} */ (target).memory;
    if (memory && Array.isArray(memory.offsets)) {
      const {offsets, bytes: size = 0, arena = 0} = memory;
      if (offsets.length !== n) fail(`targets.${name}.memory.offsets: ${offsets.length} offsets for ${n} buffers`);
      offsets.forEach((offset, i) => {
        if (!Number.isInteger(offset) || offset < arena || offset + buffers[i].bytes > size) {
          fail(`targets.${name}.memory.offsets[${i}]: buffer ${i} (${buffers[i].bytes} bytes at ${offset}) lies ` +
            `outside the memory after the arena (${arena}..${size})`);
        }
      });
    }
  }
}

/** The manifest's SHA-256 file (format 1.8), as kiln/package/format.py's MANIFEST_DIGEST. */
export const MANIFEST_DIGEST = 'manifest.sha256';

/**
 * Whether a manifest's format (1.8 and later) covers every file with a checksum: manifest.sha256 for the manifest,
 * `files` for the rest (the weights in `weights.files`).
 * @param {Manifest} manifest @returns {boolean}
 */
export function hasIntegrity(manifest) {
  const [major, minor] = String(manifest.version).split('.').map(Number);
  return major > 1 || (major === 1 && minor >= 8);
}

/**
 * A source whose `bytes` checks every file against the manifest's `files` table (format 1.8: kernels, wasm
 * modules, the tokenizer; a file it does not list is refused); older packages' sources come back as they are.
 * @param {PackageSource} source @param {Manifest} manifest
 * @returns {PackageSource}
 */
export function verifyingSource(source, manifest) {
  if (!hasIntegrity(manifest)) return source;
  const files = new Map((manifest.files ?? []).map((f) => [f.path, f]));
  /** @type {PackageSource} */
  const checked = Object.create(source);
  checked.bytes = async (path, what) => {
    const data = await source.bytes(path, what);
    const entry = files.get(path);
    if (!entry) {
      throw new PackageError(`${source.where(path)}: ${what} is not listed in the manifest's files (the package ` +
        'was edited)');
    }
    const digest = await sha256Hex(data);
    if (data.byteLength !== entry.bytes || digest !== entry.sha256) {
      throw new PackageError(`${source.where(path)}: ${what}: SHA-256 checksum mismatch (expected ${entry.sha256}, ` +
        `got ${digest}); the package is corrupted or was edited`);
    }
    return data;
  };
  return checked;
}

/**
 * @param {ArrayBuffer} bytes @returns {Promise<string>} lowercase hex SHA-256
 * @throws {PackageError} the page has no WebCrypto (not a secure context: https, or http on localhost)
 */
export async function sha256Hex(bytes) {
  if (!globalThis.crypto?.subtle) {
    throw new PackageError('checking SHA-256 checksums needs WebCrypto, which only secure contexts have (https, or ' +
      'http on localhost); serve the page so, or load with {verify: false}');
  }
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
export function parseSafetensors(bytes, path) {
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
  if (header === null || typeof header !== 'object' || Array.isArray(header)) {
    throw new PackageError(`weights file ${path}: the safetensors header is not a JSON object`);
  }
  return {header, dataStart};
}

/**
 * Write `byteLength` bytes of `source` from `sourceOffset` to the start of `buffer`,
 * padding to WebGPU's 4-byte write granularity.
 * @param {GPUQueue} queue

/**
 * One weight tensor's bytes, ready to upload into its buffer.
 * @typedef {object} WeightData
 * @property {ManifestBuffer} buffer  the manifest's buffer entry (`id`, `bytes`, `dtype` = storage type, `shape`, ...)
 * @property {ArrayBuffer} bytes  the whole weights file
 * @property {number} offset  where the tensor's data starts in `bytes`
 * @property {number} length  the tensor's data in bytes (at most `buffer.bytes`)
 */

/**
 * Read each weights file, check its size and (with `verify`) SHA-256, and hand its tensors to
 * `upload`. Files are processed one at a time to bound memory use.
 * @param {PackageSource} source
 * @param {Manifest} manifest
 * @param {boolean} verify
 * @param {(file: string, weights: WeightData[]) => (void | Promise<void>)} upload  called once per file
 * @throws {PackageError} a missing, corrupted or malformed weights file, or a tensor that does not match the manifest
 */
export async function readWeights(source, manifest, verify, upload) {
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
  /** @type {(file: {bytes: number, sha256: string}, bytes: ArrayBuffer) => Promise<string | null>} why a file
   * is not what the manifest says, or null */
  const wrong = async (file, bytes) => {
    if (bytes.byteLength !== file.bytes) {
      return `size mismatch (expected ${file.bytes} bytes, got ${bytes.byteLength}); the package is corrupted or incomplete`;
    }
    const digest = verify ? await sha256Hex(bytes) : file.sha256;
    return digest === file.sha256 ? null
      : `SHA-256 checksum mismatch (expected ${file.sha256}, got ${digest}); the package is corrupted or was edited`;
  };
  /** @type {any} */ (source).start?.(files.reduce((n, f) => n + f.bytes, 0));
  for (const file of files) {
    let {bytes, cached} = await source.weights(file);
    let problem = await wrong(file, bytes);
    if (problem && cached) {  // a damaged cache entry: drop it and download the file
      await source.forget(file);
      ({bytes, cached} = await source.weights(file, true));
      problem = await wrong(file, bytes);
    }
    if (problem) throw new PackageError(`weights file ${file.path}: ${problem}`);
    source.origin[cached ? 'cached' : 'downloaded'] += bytes.byteLength;
    if (!cached) await source.keep(file, bytes);
    const {header, dataStart} = parseSafetensors(bytes, file.path);
    const weights = byFile.get(file.path).map((b) => {
      const entry = Object.hasOwn(header, b.tensor) ? header[b.tensor] : undefined;
      if (entry === null || typeof entry !== 'object') {
        throw new PackageError(`weights file ${file.path}: no tensor '${b.tensor}'`);
      }
      const dtype = DTYPES[b.dtype];
      if (!dtype || entry.dtype !== dtype.safetensors) {
        throw new PackageError(`weights file ${file.path}: tensor '${b.tensor}' is ${entry.dtype}, the manifest says ${b.dtype}`);
      }
      const offsets = entry.data_offsets;
      const [begin, end] = Array.isArray(offsets) && offsets.length === 2 ? offsets : [NaN, NaN];
      if (!(Number.isSafeInteger(begin) && Number.isSafeInteger(end) && begin >= 0 && begin <= end &&
            dataStart + end <= bytes.byteLength && end - begin <= b.bytes)) {
        throw new PackageError(`weights file ${file.path}: tensor '${b.tensor}' has bad data offsets [${begin}, ${end}] ` +
          `(buffer ${b.id} holds ${b.bytes} bytes)`);
      }
      return {buffer: b, bytes, offset: dataStart + begin, length: end - begin};
    });
    await upload(file.path, weights);
  }
}

/**
 * A kernel source file of the package as text.
 * @param {PackageSource} source
 * @param {{name: string, source: string}} kernel the manifest's kernel entry
 * @returns {Promise<string>}
 */
export async function kernelText(source, kernel) {
  return new TextDecoder().decode(await source.bytes(kernel.source, `kernel ${kernel.name}`));
}
