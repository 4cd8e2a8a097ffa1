// @ts-check
// Kiln browser runtime: the WebGL2 backend (zero dependencies besides errors.js and package.js).
//
// Runs a package's `targets.webgl2` (docs/package-format.md): every texture of the target's
// texture plan is an R32F or R32I 2-D texture holding one buffer of the memory plan row-major;
// every kernel is a GLSL ES 3.00 fragment shader computing one output element per fragment.
// A plan step binds its input textures to texture units 0, 1, ..., and draws one full-screen
// triangle into the framebuffer of its output texture, over a viewport of the output's texels.
// Outputs are read back with readPixels from float (EXT_color_buffer_float) or integer
// render targets. See kiln.js for the backend interface this module implements.
//
// A package with run-time dims (docs/dynamic-shapes.md): the kernels read the dims from the uniform block KilnDims
// (one uniform buffer at binding point 0, written when the dims change); a step over them lays its output out as
// `elements` gives (rows of min(elements, texture_width) texels) and draws that viewport; a texture of a growable
// buffer (`grow`) is made again with more rows when the dims need them.

import {DeviceError, PackageError} from './errors.js';
import {dimsWords, evalDims, growSizes, outputShape} from './dims.js';
import {kernelText, readWeights} from './package.js';

/** @typedef {import('./manifest').Manifest} Manifest */
/** @typedef {import('./manifest').WebGL2Target} WebGL2Target */
/** @typedef {import('./manifest').TensorSpec} TensorSpec */

/** The manifest target this backend runs. */
export const target = 'webgl2';

/** The vertex shader of every kernel: one triangle covering the viewport, no vertex attributes. */
const VERTEX_SHADER = `#version 300 es
void main() {
    vec2 p = vec2(float((gl_VertexID << 1) & 2), float(gl_VertexID & 2));
    gl_Position = vec4(p * 2.0 - 1.0, 0.0, 1.0);
}
`;

/**
 * Texture formats: the typed array of their elements and the WebGL enums (names) to upload and read them.
 * @type {Record<string, {array: Float32ArrayConstructor | Int32ArrayConstructor, format: string, readFormat: string,
 *   type: string}>}
 */
const FORMATS = {
  R32F: {array: Float32Array, format: 'RED', readFormat: 'RGBA', type: 'FLOAT'},
  R32I: {array: Int32Array, format: 'RED_INTEGER', readFormat: 'RGBA_INTEGER', type: 'INT'},
};

/**
 * A fresh WebGL2 context on an offscreen canvas, or why there is none.
 * @param {WebGLPowerPreference} [powerPreference]
 * @returns {{gl: WebGL2RenderingContext | null, reason: string | null}}
 */
function createContext(powerPreference = 'high-performance') {
  let canvas;
  if (typeof OffscreenCanvas === 'function') canvas = new OffscreenCanvas(1, 1);
  else if (globalThis.document) canvas = document.createElement('canvas');
  else return {gl: null, reason: 'no canvas to create a WebGL2 context on'};
  const gl = canvas.getContext('webgl2', {
    alpha: false, antialias: false, depth: false, stencil: false, premultipliedAlpha: false,
    preserveDrawingBuffer: false, powerPreference, failIfMajorPerformanceCaveat: false,
  });
  if (!gl) return {gl: null, reason: 'canvas.getContext("webgl2") returned null (no WebGL2, or it is disabled)'};
  if (!gl.getExtension('EXT_color_buffer_float')) {
    gl.getExtension('WEBGL_lose_context')?.loseContext();
    return {gl: null, reason: 'WebGL2 lacks EXT_color_buffer_float (float render targets)'};
  }
  return {gl, reason: null};
}

/**
 * Why this browser cannot run WebGL2 packages, or null if it can: it needs a `webgl2` context
 * with the EXT_color_buffer_float extension.
 * @returns {Promise<string | null>}
 */
export async function unavailable() {
  const {gl, reason} = createContext();
  gl?.getExtension('WEBGL_lose_context')?.loseContext();
  return reason;
}

/**
 * Create a WebGL2 context and build the package's textures, programs and framebuffers.
 * @param {import('./package.js').PackageSource} source
 * @param {Manifest} manifest
 * @param {{verify: boolean, powerPreference?: WebGLPowerPreference, poison?: boolean}} options  `poison`
 *   fills every activation and output texture with NaN (int32: -1234567) before each run, so that an
 *   element no kernel writes shows up (for tests)
 * @returns {Promise<WebGL2Backend>}
 * @throws {DeviceError} no WebGL2 with float render targets, or a texture larger than MAX_TEXTURE_SIZE.
 * @throws {PackageError} a kernel that does not compile, bad weights, or a bad plan.
 */
export async function create(source, manifest, options) {
  const {gl, reason} = createContext(options.powerPreference);
  if (!gl) throw new DeviceError(`WebGL2 is not available: ${reason}`);
  const backend = new WebGL2Backend(gl, manifest, Boolean(options.poison));
  try {
    await backend.build(source, options.verify);
  } catch (error) {
    backend.dispose();
    throw error;
  }
  return backend;
}

/** A package in a WebGL2 context. Create it with {@link create}. */
export class WebGL2Backend {
  /**
   * Use {@link create}, which also builds the GPU objects.
   * @param {WebGL2RenderingContext} gl
   * @param {Manifest} manifest
   * @param {boolean} poison
   */
  constructor(gl, manifest, poison) {
    /** The manifest target this backend runs. */
    this.target = target;
    const debug = gl.getExtension('WEBGL_debug_renderer_info');
    /** The GPU as WebGL reports it (unmasked where the browser allows). */
    this.adapterInfo = {
      vendor: String(debug ? gl.getParameter(debug.UNMASKED_VENDOR_WEBGL) : gl.getParameter(gl.VENDOR)),
      architecture: '',
      device: String(debug ? gl.getParameter(debug.UNMASKED_RENDERER_WEBGL) : gl.getParameter(gl.RENDERER)),
      description: String(gl.getParameter(gl.VERSION)),
    };
    /** WebGL2 runs are timed with the wall clock. */
    this.timestampQuery = false;
    /** @private */ this.gl = gl;
    /** @private */ this.manifest = manifest;
    /** @private @type {WebGL2Target} */ this.spec = manifest.targets.webgl2;
    /** @private @type {WebGLTexture[]} */ this.textures = [];
    /** @private @type {WebGLProgram[]} */ this.programs = [];
    /** @private @type {Map<number, WebGLFramebuffer>} framebuffer of each output texture */
    this.framebuffers = new Map();
    /**
     * @private state copied back after every run (format 1.12 `state[].update_buffer`): the texture of the next
     * value, the state's texture and its size in texels
     * @type {{from: number, to: number, width: number, height: number}[]}
     */
    this.stateCopies = [];
    /** @private @type {{program: WebGLProgram, inputs: number[], output: number, viewport: number[]}[]} */
    this.steps = [];
    /** @private the uniform buffer of run-time dims (null for a static package) @type {WebGLBuffer | null} */
    this.dimsBuffer = null;
    /** @private the dims last written (JSON) @type {string | null} */
    this.dimsKey = null;
    /** @private each texture's rows now (a growable buffer's texture gets more; the manifest keeps the first) */
    this.heights = this.spec.textures.map((t) => t.height);
    /** @private */ this.lost = false;
    /** @private */ this.poison = poison;
    gl.canvas.addEventListener?.('webglcontextlost', (event) => {
      event.preventDefault();
      this.lost = true;
    });
  }

  /**
   * Check the limits, create the textures, compile the programs and upload the weights (internal: {@link create}
   * calls it).
   * @param {import('./package.js').PackageSource} source
   * @param {boolean} verify
   */
  async build(source, verify) {
    const {gl, spec, manifest} = this;
    const root = source.name;
    for (const [name, needed] of Object.entries(spec.limits ?? {})) {
      const have = gl.getParameter(gl[name]);
      if (typeof have === 'number' && have < needed) {
        throw new DeviceError(`WebGL2 device '${this.adapterInfo.device}' has ${name}=${have}, the package needs ${needed}`);
      }
    }
    for (const [index, t] of spec.textures.entries()) {
      if (!FORMATS[t.format]) throw new PackageError(`${root}: texture ${index} has unknown format ${t.format}`);
      if (!manifest.buffers[t.buffer]) throw new PackageError(`${root}: texture ${index} names buffer ${t.buffer}, which does not exist`);
      this.textures.push(this.createTexture(t.format, t.width, t.height));
    }
    const error = gl.getError();
    if (error === gl.OUT_OF_MEMORY) throw new DeviceError('out of GPU memory creating the package\'s textures');
    if (error !== gl.NO_ERROR) throw new PackageError(`${root}: cannot create the package's textures (WebGL error ${error})`);

    const texts = await Promise.all(spec.kernels.map((kernel) => kernelText(source, kernel)));
    this.compilePrograms(texts);
    await readWeights(source, manifest, verify, (file, weights) => {
      for (const w of weights) {
        const index = spec.textures.findIndex((t) => t.buffer === w.buffer.id);
        if (index < 0) continue;  // a weight no kernel reads
        const Array = FORMATS[spec.textures[index].format].array;
        const aligned = w.offset % 4 === 0 ? w.bytes : w.bytes.slice(w.offset, w.offset + w.length);
        this.upload(index, new Array(aligned, aligned === w.bytes ? w.offset : 0, w.length / 4));
      }
      if (gl.getError() !== gl.NO_ERROR) throw new PackageError(`weights file ${file}: cannot upload`);
    });
    this.steps = spec.plan.map((step, index) => {
      const program = this.programs[step.kernel];
      if (!program) throw new PackageError(`${root}: plan step ${index} names kernel ${step.kernel}, which does not exist`);
      const textures = [...step.inputs, step.output];
      if (textures.some((t) => !this.textures[t])) {
        throw new PackageError(`${root}: plan step ${index} names a texture that does not exist`);
      }
      this.framebuffer(step.output);
      return {program, inputs: step.inputs, output: step.output, viewport: step.viewport};
    });
    this.stateCopies = (manifest.state ?? []).filter((s) => s.update_buffer !== undefined).map((s) => {
      const to = this.ioTexture(s);
      const from = this.ioTexture({...s, buffer: s.update_buffer});
      const [a, b] = [spec.textures[to], spec.textures[from]];
      return {from, to, width: Math.min(a.width, b.width), height: Math.min(a.height, b.height)};
    });
    if (manifest.dynamic_dims?.length) {
      this.dimsBuffer = gl.createBuffer();
      gl.bindBuffer(gl.UNIFORM_BUFFER, this.dimsBuffer);
      gl.bufferData(gl.UNIFORM_BUFFER, dimsWords(manifest, {}).byteLength, gl.DYNAMIC_DRAW);
      gl.bindBufferBase(gl.UNIFORM_BUFFER, 0, this.dimsBuffer);
    }
  }

  /**
   * Make run-time dims `env` current (a static package: nothing): write the uniform block, grow the textures of
   * growable buffers that need more rows, and lay out each step's viewport. Steps left without elements draw nothing.
   * @param {Record<string, number> | null | undefined} env @private
   * @throws {DeviceError} a texture would need more rows than MAX_TEXTURE_SIZE.
   */
  setDims(env) {
    if (!env || !this.dimsBuffer) return;
    const key = JSON.stringify(env);
    if (key === this.dimsKey) return;
    const {gl, spec, manifest} = this;
    gl.bindBuffer(gl.UNIFORM_BUFFER, this.dimsBuffer);
    gl.bufferSubData(gl.UNIFORM_BUFFER, 0, dimsWords(manifest, env));
    const sizes = growSizes(manifest, env);
    const most = gl.getParameter(gl.MAX_TEXTURE_SIZE);
    for (const [index, t] of spec.textures.entries()) {
      if (!t.grow) continue;
      const rows = Math.max(1, Math.ceil(/** @type {number} */ (sizes.get(t.buffer)) / 4 / t.width));
      if (rows <= this.heights[index]) continue;
      const height = Math.min(Math.max(rows, Math.ceil(this.heights[index] * 3 / 2)), most);
      if (rows > most) {
        const dims = Object.entries(env).sort().map(([k, v]) => `${k}=${v}`).join(', ');
        throw new DeviceError(`dims ${dims} need a texture of ${t.width}x${rows} texels, more than this device's ` +
          `MAX_TEXTURE_SIZE ${most}: run smaller inputs`);
      }
      this.replaceTexture(index, height);
    }
    spec.plan.forEach((step, i) => {
      if (step.elements === undefined) return;
      const n = evalDims(step.elements, env);
      const w = Math.min(n, spec.texture_width);
      this.steps[i].viewport = n ? [w, Math.ceil(n / w)] : [0, 0];
    });
    this.dimsKey = key;
  }

  /**
   * Make texture `index` (of a growable buffer) again with `height` rows (its contents are not kept: state textures
   * never grow, state shapes being static) and point its framebuffer at it.
   * @param {number} index @param {number} height @private
   */
  replaceTexture(index, height) {
    const {gl} = this;
    const t = this.spec.textures[index];
    gl.deleteTexture(this.textures[index]);
    this.textures[index] = this.createTexture(t.format, t.width, height);
    this.heights[index] = height;
    const fb = this.framebuffers.get(index);
    if (fb) {
      gl.bindFramebuffer(gl.FRAMEBUFFER, fb);
      gl.framebufferTexture2D(gl.FRAMEBUFFER, gl.COLOR_ATTACHMENT0, gl.TEXTURE_2D, this.textures[index], 0);
    }
    if (gl.getError() === gl.OUT_OF_MEMORY) throw new DeviceError('out of GPU memory growing a texture');
  }

  /**
   * A new R32F or R32I texture of `width` x `height` texels, nearest sampling.
   * @param {string} format @param {number} width @param {number} height @returns {WebGLTexture} @private
   */
  createTexture(format, width, height) {
    const {gl} = this;
    const texture = gl.createTexture();
    gl.bindTexture(gl.TEXTURE_2D, texture);
    gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MIN_FILTER, gl.NEAREST);
    gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MAG_FILTER, gl.NEAREST);
    gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_WRAP_S, gl.CLAMP_TO_EDGE);
    gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_WRAP_T, gl.CLAMP_TO_EDGE);
    gl.texStorage2D(gl.TEXTURE_2D, 1, gl[format], width, height);
    return texture;
  }

  /**
   * Compile and link one program per kernel (all shaders first, so drivers can compile in parallel).
   * @param {string[]} texts fragment shader sources, one per kernel
   * @private
   */
  compilePrograms(texts) {
    const {gl, spec} = this;
    const vertex = gl.createShader(gl.VERTEX_SHADER);
    gl.shaderSource(vertex, VERTEX_SHADER);
    gl.compileShader(vertex);
    const fragments = texts.map((text) => {
      const shader = gl.createShader(gl.FRAGMENT_SHADER);
      gl.shaderSource(shader, text);
      gl.compileShader(shader);
      return shader;
    });
    this.programs = fragments.map((fragment) => {
      const program = gl.createProgram();
      gl.attachShader(program, vertex);
      gl.attachShader(program, fragment);
      gl.linkProgram(program);
      return program;
    });
    if (!gl.getShaderParameter(vertex, gl.COMPILE_STATUS)) {
      throw new DeviceError(`WebGL2 cannot compile Kiln's vertex shader: ${gl.getShaderInfoLog(vertex)}`);
    }
    for (const [i, program] of this.programs.entries()) {
      const kernel = spec.kernels[i];
      if (!gl.getShaderParameter(fragments[i], gl.COMPILE_STATUS)) {
        throw new PackageError(`kernel ${kernel.name} does not compile on this device: ` +
          `${kernel.source}: ${gl.getShaderInfoLog(fragments[i])}`);
      }
      if (!gl.getProgramParameter(program, gl.LINK_STATUS)) {
        throw new PackageError(`kernel ${kernel.name} does not link on this device: ${gl.getProgramInfoLog(program)}`);
      }
      gl.useProgram(program);
      kernel.inputs.forEach((input, unit) => gl.uniform1i(gl.getUniformLocation(program, input.name), unit));
      const block = gl.getUniformBlockIndex(program, 'KilnDims');  // run-time dims: binding point 0
      if (block !== gl.INVALID_INDEX) gl.uniformBlockBinding(program, block, 0);
      gl.deleteShader(fragments[i]);
    }
    gl.deleteShader(vertex);
  }

  /**
   * The framebuffer drawing into texture `index` (made once).
   * @param {number} index @returns {WebGLFramebuffer} @private
   */
  framebuffer(index) {
    let fb = this.framebuffers.get(index);
    if (fb) return fb;
    const {gl} = this;
    fb = gl.createFramebuffer();
    gl.bindFramebuffer(gl.FRAMEBUFFER, fb);
    gl.framebufferTexture2D(gl.FRAMEBUFFER, gl.COLOR_ATTACHMENT0, gl.TEXTURE_2D, this.textures[index], 0);
    const status = gl.checkFramebufferStatus(gl.FRAMEBUFFER);
    if (status !== gl.FRAMEBUFFER_COMPLETE) {
      throw new DeviceError(`WebGL2 cannot render into a ${this.spec.textures[index].format} texture ` +
        `(framebuffer status 0x${status.toString(16)})`);
    }
    this.framebuffers.set(index, fb);
    return fb;
  }

  /**
   * Write `data` (at most the texture's texels, row-major) into texture `index` from texel 0.
   * @param {number} index @param {Float32Array | Int32Array} data @private
   */
  upload(index, data) {
    const {gl} = this;
    const t = this.spec.textures[index];
    const {format, type} = FORMATS[t.format];
    const width = Math.min(data.length, t.width);  // the tensor's own row width (see kiln/codegen/webgl2/glsl.py)
    if (!width) return;
    const rows = Math.floor(data.length / width);
    const rest = data.length - rows * width;
    gl.bindTexture(gl.TEXTURE_2D, this.textures[index]);
    gl.pixelStorei(gl.UNPACK_ALIGNMENT, 4);
    if (rows) gl.texSubImage2D(gl.TEXTURE_2D, 0, 0, 0, width, rows, gl[format], gl[type], data, 0);
    if (rest) gl.texSubImage2D(gl.TEXTURE_2D, 0, 0, rows, rest, 1, gl[format], gl[type], data, rows * width);
  }

  /**
   * The texture holding a manifest input, output or state tensor in its storage type.
   * @param {TensorSpec} spec the manifest's input or output entry (or a state entry: name, dtype, buffer)
   * @returns {number} @private
   */
  ioTexture(spec) {
    const format = (spec.storage ?? spec.dtype) === 'float32' ? 'R32F' : 'R32I';
    const index = this.spec.textures.findIndex((t) => t.buffer === spec.buffer && t.format === format);
    if (index < 0) throw new PackageError(`the webgl2 target has no ${format} texture for '${spec.name}'`);
    return index;
  }

  /** @private @throws {DeviceError} the context was lost */
  checkLost() {
    if (this.lost || this.gl.isContextLost()) throw new DeviceError('the WebGL2 context was lost');
  }

  /** @param {{spec: TensorSpec, data: ArrayBufferView}[]} inputs in storage form @private */
  writeInputs(inputs) {
    for (const {spec, data} of inputs) {
      const index = this.ioTexture(spec);
      const Array = FORMATS[this.spec.textures[index].format].array;
      const values = data instanceof Array ? data
        : new Array(/** @type {ArrayBuffer} */ (data.buffer), data.byteOffset, data.byteLength / 4);
      this.upload(index, values);
    }
  }

  /** Fill every activation and output texture with NaN (float) or -1234567 (int32). @private */
  fillPoison() {
    const {gl, manifest} = this;
    for (const [index, t] of this.spec.textures.entries()) {
      const kind = manifest.buffers[t.buffer].kind;
      if (kind !== 'activation' && kind !== 'output') continue;
      gl.bindFramebuffer(gl.DRAW_FRAMEBUFFER, this.framebuffer(index));
      if (t.format === 'R32F') gl.clearBufferfv(gl.COLOR, 0, [NaN, NaN, NaN, NaN]);
      else gl.clearBufferiv(gl.COLOR, 0, [-1234567, -1234567, -1234567, -1234567]);
    }
  }

  /** Draw every plan step, then copy each next state value into its state's texture. @private */
  draw() {
    const {gl} = this;
    let current = null;
    for (const {program, inputs, output, viewport} of this.steps) {
      if (!viewport[0]) continue;  // run-time dims left the step no elements
      if (program !== current) {
        gl.useProgram(program);
        current = program;
      }
      gl.bindFramebuffer(gl.DRAW_FRAMEBUFFER, this.framebuffer(output));
      gl.viewport(0, 0, viewport[0], viewport[1]);
      for (let unit = 0; unit < inputs.length; unit++) {
        gl.activeTexture(gl.TEXTURE0 + unit);
        gl.bindTexture(gl.TEXTURE_2D, this.textures[inputs[unit]]);
      }
      gl.drawArrays(gl.TRIANGLES, 0, 3);
      // unbind the inputs: the next step may draw into one of them (a feedback loop while bound)
      for (let unit = inputs.length - 1; unit >= 0; unit--) {
        gl.activeTexture(gl.TEXTURE0 + unit);
        gl.bindTexture(gl.TEXTURE_2D, null);
      }
    }
    for (const {from, to, width, height} of this.stateCopies) {  // (WebGL2 kernels cannot update a texture in place)
      gl.bindFramebuffer(gl.READ_FRAMEBUFFER, this.framebuffer(from));
      gl.activeTexture(gl.TEXTURE0);
      gl.bindTexture(gl.TEXTURE_2D, this.textures[to]);
      gl.copyTexSubImage2D(gl.TEXTURE_2D, 0, 0, 0, 0, 0, width, height);
      gl.bindTexture(gl.TEXTURE_2D, null);
    }
  }

  /**
   * Read `count` elements of texture `index` (rows of min(count, width) texels).
   * @param {number} index @param {number} count @returns {ArrayBuffer} storage bytes @private
   */
  read(index, count) {
    const {gl} = this;
    const t = this.spec.textures[index];
    const {array: Array, readFormat, type} = FORMATS[t.format];
    const out = new Array(count);
    if (!count) return out.buffer;
    const width = Math.min(count, t.width);
    const rows = Math.ceil(count / width);
    const rgba = new Array(width * rows * 4);
    gl.bindFramebuffer(gl.READ_FRAMEBUFFER, this.framebuffer(index));
    gl.readPixels(0, 0, width, rows, gl[readFormat], gl[type], rgba);
    for (let i = 0; i < count; i++) out[i] = rgba[4 * i];
    return out.buffer;
  }

  /**
   * Run the plan once.
   * @param {{spec: TensorSpec, data: ArrayBufferView}[]} inputs every manifest input, its data in storage form
   * @param {{dims?: Record<string, number> | null}} [options] run-time dims bound from the inputs (kiln.js)
   * @returns {Promise<Record<string, ArrayBuffer>>} each output's elements in its storage type
   * @throws {DeviceError} the context was lost or WebGL reported an error.
   */
  async run(inputs, options = {}) {
    this.checkLost();
    const {gl} = this;
    const env = options.dims;
    this.setDims(env);
    if (this.poison) this.fillPoison();
    this.writeInputs(inputs);
    this.draw();
    /** @type {Record<string, ArrayBuffer>} */
    const results = {};
    for (const output of this.manifest.outputs) {
      const count = (env ? outputShape(output, env) : output.shape).reduce((a, b) => a * b, 1);
      results[output.name] = this.read(this.ioTexture(output), count);
    }
    const error = gl.getError();
    if (error !== gl.NO_ERROR) throw new DeviceError(`WebGL2 rejected the run (WebGL error 0x${error.toString(16)})`);
    return results;
  }

  /**
   * Time the draws: inputs written once, then `warmup + repeat` runs of every plan step, each
   * waited for by reading one texel of the last step's output (readPixels waits for the GPU).
   * @param {{spec: TensorSpec, data: ArrayBufferView}[]} inputs in storage form
   * @param {{repeat: number, warmup: number, dims?: Record<string, number> | null}} options
   * @returns {Promise<{clock: 'wall', times: number[], wall: number[]}>} milliseconds
   * @throws {DeviceError} the context was lost or WebGL reported an error.
   */
  async time(inputs, {repeat, warmup, dims}) {
    this.checkLost();
    const {gl} = this;
    this.setDims(dims);
    this.writeInputs(inputs);
    const last = this.spec.plan.at(-1)?.output;
    const times = [];
    for (let i = 0; i < warmup + repeat; i++) {
      const start = performance.now();
      this.draw();
      if (last !== undefined) this.read(last, 1);
      const elapsed = performance.now() - start;
      if (i >= warmup) times.push(elapsed);
    }
    const error = gl.getError();
    if (error !== gl.NO_ERROR) throw new DeviceError(`WebGL2 rejected the timed runs (WebGL error 0x${error.toString(16)})`);
    return {clock: 'wall', times, wall: [...times]};
  }

  /** Free the textures, programs and framebuffers, and the context. */
  dispose() {
    const {gl} = this;
    for (const t of this.textures) gl.deleteTexture(t);
    if (this.dimsBuffer) gl.deleteBuffer(this.dimsBuffer);
    for (const p of this.programs) gl.deleteProgram(p);
    for (const fb of this.framebuffers.values()) gl.deleteFramebuffer(fb);
    this.textures = [];
    this.programs = [];
    this.framebuffers.clear();
    gl.getExtension('WEBGL_lose_context')?.loseContext();
  }
}
