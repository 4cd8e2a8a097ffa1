// @ts-check
// Kiln browser runtime: execution plans with control steps on WebGPU (package format 1.4: `if`, `loop`,
// `copy`, `error` steps besides kernel steps; docs/package-format.md, docs/control-flow.md).
//
// Mirrors kiln/runtime/control.py. A flat plan is one command buffer; with control steps the runtime
// records kernel steps and copies up to the next condition, submits them, reads the condition back (a
// 4-byte copy to a mappable buffer: one GPU-to-host round trip per run-time If and per Loop iteration
// whose condition the body computes) and goes on with the chosen steps. Conditions and trip counts held
// by input buffers are read from the run's inputs, with no readback.

import {KilnError, ShapeError} from './errors.js';

/** @typedef {import('./manifest').WebGPUStep} WebGPUStep */
/** @typedef {import('./manifest').KernelStep} KernelStep */
/** @typedef {import('./manifest').Loop} Loop */
/** @typedef {import('./manifest').LoopOperand} LoopOperand */
/** @typedef {import('./manifest').TensorSpec} TensorSpec */
/**
 * An input of a run: its data in storage form, or a GPUTensor (already copied into its buffer).
 * @typedef {{spec: TensorSpec, data?: ArrayBufferView, gpu?: import('./gputensor.js').GPUTensor}} RunInput
 */
/**
 * Where a run is: the encoder being recorded, its open compute pass, and the inputs' data by buffer id.
 * @typedef {object} RunState
 * @property {GPUCommandEncoder} encoder
 * @property {GPUComputePassEncoder | null} pass
 * @property {Map<number, ArrayBufferView>} host
 */

/** Most iterations a Loop without a trip count may run before the runtime gives up (a guard against hanging). */
export const MAX_ITERATIONS = 1000000;

/**
 * Whether a plan holds control steps (anything besides kernel steps).
 * @param {WebGPUStep[]} plan
 * @returns {boolean}
 */
export function isControlPlan(plan) {
  return plan.some((step) => !('kernel' in step));
}

/**
 * Every kernel step of a plan in order, those of both branches of each `if` and of each `loop` body included.
 * @param {WebGPUStep[]} plan
 * @returns {KernelStep[]}
 */
export function kernelSteps(plan) {
  /** @type {KernelStep[]} */
  const out = [];
  for (const step of plan) {
    if ('kernel' in step) out.push(step);
    else if ('if' in step) out.push(...kernelSteps(step.then), ...kernelSteps(step.else));
    else if ('loop' in step) out.push(...kernelSteps(step.loop.body));
  }
  return out;
}

/** Runs a plan with control steps on a WebGPU backend's device and buffers. */
export class ControlRunner {
  /**
   * @param {GPUDevice} device
   * @param {GPUBuffer[]} buffers the package's buffers, by id
   * @param {WebGPUStep[]} plan the target's plan
   * @param {{pipeline: GPUComputePipeline, bindGroup: GPUBindGroup, dispatch: number[]}[]} steps the bound
   *   kernel steps, in {@link kernelSteps} order
   */
  constructor(device, buffers, plan, steps) {
    this.device = device;
    this.buffers = buffers;
    this.plan = plan;
    this.steps = steps;
    /** @private */ this.index = new Map(kernelSteps(plan).map((step, i) => [step, i]));
    /** @private */ this.staging = device.createBuffer({label: 'kiln_condition', size: 4,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    /** GPU-to-host condition reads in the last run. */
    this.readbacks = 0;
  }

  /**
   * Record and submit the plan, starting with `encoder`; returns the encoder the caller finishes (with its
   * output copies) and submits.
   * @param {GPUCommandEncoder} encoder
   * @param {RunInput[]} inputs every input in storage form (or a GPUTensor), already written
   * @returns {Promise<GPUCommandEncoder>}
   * @throws {KilnError} a branch that cannot run with the compiled shapes was taken, or a Loop without a
   *   trip count ran MAX_ITERATIONS iterations.
   * @throws {ShapeError} a Loop with scan outputs ran a different number of iterations than they were sized for.
   */
  async execute(encoder, inputs) {
    /** @type {RunState} */
    const state = {encoder, pass: null, host: new Map(inputs.map(({spec, data}) => [spec.buffer, data]))};
    this.readbacks = 0;
    await this.run(state, this.plan);
    this.endPass(state);
    return state.encoder;
  }

  /**
   * Wall-clock milliseconds of whole runs (the plan, submitted and waited for), inputs written once.
   * @param {RunInput[]} inputs in storage form (or GPUTensors), already written
   * @param {{repeat: number, warmup: number}} options
   * @returns {Promise<{clock: 'wall', times: number[], wall: number[]}>}
   */
  async time(inputs, {repeat, warmup}) {
    const times = [];
    for (let i = 0; i < warmup + repeat; i++) {
      const start = performance.now();
      const encoder = await this.execute(this.device.createCommandEncoder(), inputs);
      this.device.queue.submit([encoder.finish()]);
      await this.device.queue.onSubmittedWorkDone();
      if (i >= warmup) times.push(performance.now() - start);
    }
    return {clock: 'wall', times, wall: times.slice()};
  }

  /** @param {RunState} state @private */
  endPass(state) {
    if (state.pass) {
      state.pass.end();
      state.pass = null;
    }
  }

  /** @param {RunState} state @private */
  submit(state) {
    this.endPass(state);
    this.device.queue.submit([state.encoder.finish()]);
    state.encoder = this.device.createCommandEncoder();
  }

  /**
   * @param {RunState} state @param {number} src @param {number} dst @param {number} bytes @param {number} [dstOffset]
   * @private
   */
  copy(state, src, dst, bytes, dstOffset = 0) {
    if (!bytes || src === dst) return;
    this.endPass(state);
    state.encoder.copyBufferToBuffer(this.buffers[src], 0, this.buffers[dst], dstOffset, bytes);
  }

  /**
   * Write one int32 after everything recorded so far (queue writes land before later submissions).
   * @param {RunState} state @param {number} buffer @param {number} value @private
   */
  write(state, buffer, value) {
    this.submit(state);
    this.device.queue.writeBuffer(this.buffers[buffer], 0, new Int32Array([value]));
  }

  /**
   * The first element (int32 storage: bool, int32, int64) of a buffer once what is recorded has run.
   * @param {RunState} state @param {number} buffer
   * @private @returns {Promise<number>}
   */
  async read(state, buffer) {
    const host = state.host.get(buffer);
    if (host) return new Int32Array(host.buffer, host.byteOffset, 1)[0];
    this.endPass(state);
    state.encoder.copyBufferToBuffer(this.buffers[buffer], 0, this.staging, 0, 4);
    this.submit(state);
    this.readbacks++;
    await this.staging.mapAsync(GPUMapMode.READ);
    try {
      return new Int32Array(this.staging.getMappedRange(0, 4))[0];
    } finally {
      this.staging.unmap();
    }
  }

  /**
   * A Loop's trip count or condition: a constant, a buffer's first element, or `fallback` when absent.
   * @param {RunState} state @param {LoopOperand | null | undefined} spec @param {number | null} fallback
   * @private @returns {Promise<number | null>}
   */
  async operand(state, spec, fallback) {
    if (spec === null || spec === undefined) return fallback;
    return 'value' in spec ? Number(spec.value) : this.read(state, spec.buffer);
  }

  /** @param {RunState} state @param {WebGPUStep[]} steps @private */
  async run(state, steps) {
    for (const step of steps) {
      if ('kernel' in step) {
        const {pipeline, bindGroup, dispatch} = this.steps[this.index.get(step)];
        if (!state.pass) state.pass = state.encoder.beginComputePass();
        state.pass.setPipeline(pipeline);
        state.pass.setBindGroup(0, bindGroup);
        state.pass.dispatchWorkgroups(dispatch[0], dispatch[1] ?? 1, dispatch[2] ?? 1);
      } else if ('copy' in step) {
        this.copy(state, ...step.copy);
      } else if ('if' in step) {
        await this.run(state, (await this.read(state, step.if)) ? step.then : step.else);
      } else if ('loop' in step) {
        await this.loop(state, step.loop, step.node ?? 'Loop');
      } else if ('error' in step) {
        throw new KilnError(step.error);
      } else {
        throw new KilnError(`unknown plan step ${Object.keys(step).join(',')} (a newer package format?)`);
      }
    }
  }

  /** @param {RunState} state @param {Loop} spec @param {string} node @private */
  async loop(state, spec, node) {
    const trips = await this.operand(state, spec.trip_count, null);
    let go = Boolean(await this.operand(state, spec.cond, 1));
    const {carried, scan, rows} = spec;
    for (const [init, , , out, bytes] of carried) this.copy(state, init, out, bytes);
    let i = 0;
    while (go && (trips === null || i < trips)) {
      if (i >= MAX_ITERATIONS) throw new KilnError(`Loop '${node}': ${MAX_ITERATIONS} iterations and its condition is still true`);
      if (scan.length && i >= rows) {
        throw new ShapeError(`Loop '${node}': runs more than the ${rows} iterations its scan outputs were sized for`);
      }
      for (const [, bodyIn, , out, bytes] of carried) this.copy(state, out, bodyIn, bytes);
      if (spec.iteration !== null) this.write(state, spec.iteration, i);
      if (spec.cond_in !== null) this.write(state, spec.cond_in, go ? 1 : 0);
      await this.run(state, spec.body);
      for (const [, , bodyOut, out, bytes] of carried) this.copy(state, bodyOut, out, bytes);
      for (const [bodyOut, out, bytes] of scan) this.copy(state, bodyOut, out, bytes, i * bytes);
      if (spec.cond_out !== null) go = Boolean(await this.read(state, spec.cond_out));
      i++;
    }
    if (scan.length && i !== rows) {
      throw new ShapeError(`Loop '${node}': ran ${i} iterations but its scan outputs were sized for ${rows} at ` +
        'compile time (the trip count); a loop whose condition ends it early has data-dependent outputs');
    }
  }
}
