// @ts-check
// Kiln browser runtime: run-time dims of a package (format 1.4, `dynamic_dims`; docs/dynamic-shapes.md).
//
// Each dim's value comes from the fed input shapes (all inputs must agree, within the dim's bounds), or (1.7)
// from the value of an integer [1] input that names it (`value_dim`: a decoder's past_sequence_length);
// the WebGPU backend writes the values into the dims uniform (dim `index` in i32 word `index`), and
// dispatch sizes and output shapes follow from the manifest's size expressions: an int, a dim name,
// or [op, a, b] with op one of + - * // % max min, evaluated here (never with eval).

import {PackageError, ShapeError} from './errors.js';
import {shapeText} from './tensor.js';

/** @typedef {import('./manifest').Manifest} Manifest */
/** @typedef {import('./manifest').SizeExpression} SizeExpression */
/** @typedef {import('./manifest').KernelStep} KernelStep */
/** @typedef {import('./manifest').TensorSpec} TensorSpec */

const OPS = {
  '+': (a, b) => a + b, '-': (a, b) => a - b, '*': (a, b) => a * b,
  '//': (a, b) => Math.floor(a / b), '%': (a, b) => a - b * Math.floor(a / b),
  max: Math.max, min: Math.min,
};

/**
 * Evaluate a manifest size expression.
 * @param {SizeExpression} e an int, a dim name or [op, a, b]
 * @param {Record<string, number>} env dim name -> value
 * @returns {number}
 * @throws {PackageError} a malformed expression, an unknown dim or a division by zero
 */
export function evalDims(e, env) {
  if (typeof e === 'number' && Number.isInteger(e)) return e;
  if (typeof e === 'string') {
    if (!(e in env)) throw new PackageError(`size expression names unknown dim '${e}'`);
    return env[e];
  }
  if (Array.isArray(e) && e.length === 3 && Object.hasOwn(OPS, e[0])) {
    const a = evalDims(e[1], env), b = evalDims(e[2], env);
    if ((e[0] === '//' || e[0] === '%') && b === 0) throw new PackageError('size expression divides by zero');
    return OPS[e[0]](a, b);
  }
  throw new PackageError(`malformed size expression ${JSON.stringify(e)}`);
}

/**
 * Each run-time dim's value from the fed tensors' shapes (and the values of `value_dim` inputs).
 * @param {Manifest} manifest
 * @param {Record<string, {dims: number[], data?: ArrayLike<number|bigint>}>} feeds input name -> tensor (names and
 *   dtypes already checked)
 * @returns {Record<string, number>} dim name -> value
 * @throws {ShapeError} a wrong rank or static dim, inputs that disagree on a dim, a value out of bounds
 *   or not a multiple the dim requires (naming the input, the dim and its bounds), a `value_dim` input on the GPU,
 *   or dims whose sum exceeds a `dim_limits` bound
 */
export function bindDims(manifest, feeds) {
  const dims = Object.fromEntries(manifest.dynamic_dims.map((d) => [d.name, d]));
  /** @type {Record<string, number>} */
  const env = {};
  /** @type {Record<string, string>} */
  const from = {};
  for (const spec of manifest.inputs) {
    const want = spec.dynamic_shape ?? spec.shape;
    const got = feeds[spec.name].dims;
    if (got.length !== want.length) {
      throw new ShapeError(`input '${spec.name}': expected rank ${want.length} ${shapeText(want)}, got shape [${got.join(', ')}]`);
    }
    /** @type {[string, string, number][]} (where, dim, value) of each dim this input gives */
    const found = [];
    if (spec.value_dim !== undefined) {
      const data = feeds[spec.name].data;
      if (data === undefined) {
        throw new ShapeError(`input '${spec.name}' gives dim ${spec.value_dim} by its value: feed a kiln.Tensor, not a GPUTensor`);
      }
      found.push([`input '${spec.name}'`, spec.value_dim, Number(data[0])]);
    }
    want.forEach((w, axis) => {
      if (typeof w === 'string' && w in dims) found.push([`input '${spec.name}' dim ${axis}`, w, got[axis]]);
    });
    for (const [where, w, v] of found) {
      const d = dims[w];
      if (v < d.min || v > d.max) throw new ShapeError(`${where} (${w}) is ${v}, outside its bounds ${d.min}..${d.max}`);
      if (d.multiple && v % d.multiple !== 0) throw new ShapeError(`${where} (${w}) is ${v}, not a multiple of ${d.multiple}`);
      if (w in env && env[w] !== v) {
        throw new ShapeError(`inconsistent dim ${w}: ${where} is ${v} but input '${from[w]}' gave ${env[w]}`);
      }
      env[w] = v;
      from[w] = spec.name;
    }
  }
  for (const spec of manifest.inputs) {
    const want = spec.dynamic_shape ?? spec.shape;
    const expected = want.map((w) => evalDims(w, env));
    const got = feeds[spec.name].dims;
    if (expected.some((v, i) => v !== got[i])) {
      throw new ShapeError(`input '${spec.name}': expected shape [${expected.join(', ')}] (symbolic ` +
        `${shapeText(want)}), got [${got.join(', ')}]`);
    }
  }
  for (const d of manifest.dynamic_dims) {  // data-dependent dims: at their bounds until the run reads them back
    if (d.count !== undefined) env[d.name] = d.max;
  }
  for (const limit of manifest.dim_limits ?? []) {
    const total = limit.dims.reduce((sum, n) => sum + env[n], 0);
    if (total > limit.max) {
      throw new ShapeError(`dims ${limit.dims.join(' + ')} = ${total} exceed their bound ${limit.max} ` +
        `(${limit.dims.map((n) => `${n}=${env[n]}`).join(', ')})`);
    }
  }
  return env;
}

/**
 * Where a run stops to read data-dependent dims back (format 1.9, docs/dynamic-shapes.md): `[i + 1, dims]` for every
 * plan step `i` that `bind_dims` them.
 * @param {any[]} plan a target's plan
 * @returns {[number, string[]][]}
 */
export function bindPoints(plan) {
  /** @type {[number, string[]][]} */
  const points = [];
  plan.forEach((step, i) => { if (step.bind_dims?.length) points.push([i + 1, step.bind_dims]); });
  return points;
}

/**
 * A data-dependent dim's value as read back, checked against its bounds.
 * @param {{name: string, min: number, max: number}} spec its `dynamic_dims` entry @param {number} value
 * @returns {number}
 * @throws {ShapeError} the count is outside the dim's bounds (a TopK `k` beyond its axis)
 */
export function checkCount(spec, value) {
  if (!(value >= spec.min && value <= spec.max)) {
    throw new ShapeError(`data-dependent dim ${spec.name} is ${value} at run time, outside its bounds ${spec.min}..${spec.max}`);
  }
  return value;
}

/**
 * The dims uniform's contents.
 * @param {Manifest} manifest @param {Record<string, number>} env
 * @returns {Int32Array}
 */
export function dimsWords(manifest, env) {
  const dims = manifest.dynamic_dims;
  const words = new Int32Array(4 * Math.max(1, Math.ceil(dims.length / 4)));
  for (const d of dims) words[d.index] = env[d.name];
  return words;
}

/**
 * Which kernel of a plan step runs for dims `env`: 0 for the step's own, `i + 1` for its `variants[i]`, the first
 * whose `when` ranges all hold (a variant is the step's group scheduled for another part of the dims' range;
 * ignoring it computes the same values).
 * @param {{variants?: {when: Record<string, number[]>}[]}} step @param {Record<string, number>} env
 * @returns {number}
 */
export function variantIndex(step, env) {
  const variants = step.variants ?? [];
  for (let i = 0; i < variants.length; i++) {
    if (Object.entries(variants[i].when).every(([name, [lo, hi]]) => lo <= env[name] && env[name] <= hi)) return i + 1;
  }
  return 0;
}

/**
 * The plan step, or its variant, that runs for dims `env` ({@link variantIndex}).
 * @param {{variants?: {when: Record<string, number[]>}[]}} step @param {Record<string, number>} env
 * @returns {any}
 */
export function chosenStep(step, env) {
  const i = variantIndex(step, env);
  return i ? /** @type {any[]} */ (step.variants)[i - 1] : step;
}

/**
 * Workgroup counts of a plan step for dims `env` ([0, 0, 0]: nothing to do, skip the dispatch).
 * @param {KernelStep} step @param {Record<string, number>} env @param {number} [maxX]
 * @returns {number[]}
 */
export function stepDispatch(step, env, maxX = 65535) {
  step = chosenStep(step, env);
  if (step.groups === undefined) return step.dispatch;
  const g = evalDims(step.groups, env);
  if (g <= 0) return [0, 0, 0];
  return g <= maxX ? [g, 1, 1] : [maxX, Math.ceil(g / maxX), 1];
}

/**
 * An output's shape for dims `env`.
 * @param {TensorSpec} spec the manifest's output entry @param {Record<string, number>} env
 * @returns {number[]}
 */
export function outputShape(spec, env) {
  return (spec.dynamic_shape ?? spec.shape).map((d) => evalDims(d, env));
}

/** The most bytes a growable buffer may take (2 GiB), as kiln/runtime/dynamic.py's MAX_GROW_BYTES. */
export const MAX_GROW_BYTES = 2 ** 31 - 4;

/**
 * Bytes of each growable buffer (format 1.10, `buffers[i].grow`; docs/dynamic-shapes.md *Growable buffers*) for dims
 * `env`: buffer id -> bytes (empty for a package without growable buffers).
 * @param {Manifest} manifest @param {Record<string, number>} env
 * @returns {Map<number, number>}
 * @throws {ShapeError} a buffer over 2 GiB (dims too large for one buffer)
 */
export function growSizes(manifest, env) {
  const sizes = new Map();
  for (const b of manifest.buffers) {
    if (b.grow === undefined) continue;
    const n = evalDims(b.grow, env);
    if (n > MAX_GROW_BYTES) {
      const dims = Object.entries(env).sort().map(([k, v]) => `${k}=${v}`).join(', ');
      throw new ShapeError(`dims ${dims} need a buffer of ${(n / 2 ** 30).toFixed(2)} GiB (buffer ${b.id}); one ` +
        'buffer holds at most 2 GiB: run smaller inputs');
    }
    sizes.set(b.id, n);
  }
  return sizes;
}

/**
 * The new size of a buffer of `have` bytes that must hold `need`: at least half as large again, a multiple of 256,
 * at most {@link MAX_GROW_BYTES} (kiln/runtime/dynamic.py's `grown`).
 * @param {number} have @param {number} need
 * @returns {number}
 */
export function grownSize(have, need) {
  if (need <= have) return have;
  return Math.max(need, Math.min(Math.ceil(Math.max(need, Math.floor(have * 3 / 2)) / 256) * 256, MAX_GROW_BYTES));
}

/**
 * The arena layout of a C target (wasm) with its growable buffers at run-time `sizes` (kiln/package/arena.py's
 * `regrow`): they start where the first of them starts in `memory.offsets` and follow one another in id order, each at
 * a multiple of `memory.align`; the other buffers stay put.
 * @param {{offsets: number[], bytes: number, align?: number, slack?: number}} memory the target's memory entry
 * @param {Map<number, number>} sizes buffer id -> bytes
 * @returns {{offsets: number[], bytes: number}}
 */
export function regrow(memory, sizes) {
  const offsets = [...memory.offsets];
  if (!sizes.size) return {offsets, bytes: memory.bytes};
  const align = memory.align ?? 16;
  const ids = [...sizes.keys()].sort((a, b) => a - b);
  let at = Math.min(...ids.map((i) => offsets[i]));
  for (const i of ids) {
    offsets[i] = at;
    at += Math.ceil(Math.max(/** @type {number} */ (sizes.get(i)), 1) / align) * align;
  }
  return {offsets, bytes: at + (memory.slack ?? 0)};
}
