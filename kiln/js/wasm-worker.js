// Kiln browser runtime: one worker thread of the WebAssembly backend (wasm.js starts it as a module worker).
//
// Messages from wasm.js:
//   {type: 'init', module, memory, control, index, workers, steps}  instantiate the threaded module over the
//       shared `memory` and point its stack pointer at worker `index`'s stack (its kiln_worker_stack export);
//       `steps` is the plan as [{export, ptrs, total}]; answers {type: 'ready', dims} (`dims`: the
//       address of the module's run-time dims array, from its kiln_dims export; 0 without one)
//   {type: 'run', tiles, kernels, ptrs, first, last}  compute this worker's share of steps [first, last) (default: every
//       step), tiles [floor(total*index/workers), floor(total*(index+1)/workers)), meeting the other workers at a
//       barrier (the shared Int32Array `control`: [arrived, generation]) after each step; `tiles` and `kernels`
//       (run-time dims changed), when not null, replace every step's total and kernel export (a plan step's
//       variant); `ptrs` (growable buffers moved, format 1.10), when not null, every step's buffer addresses;
//       answers {type: 'done'} or {type: 'error', message}

let exports = null;
let control = null;
let index = 0;
let workers = 1;
let steps = [];

/** Wait until every worker has arrived (a sense-reversing barrier on `control`). */
function barrier() {
  const generation = Atomics.load(control, 1);
  if (Atomics.add(control, 0, 1) === workers - 1) {
    Atomics.store(control, 0, 0);
    Atomics.add(control, 1, 1);
    Atomics.notify(control, 1);
  } else {
    while (Atomics.load(control, 1) === generation) Atomics.wait(control, 1, generation);
  }
}

self.onmessage = async ({data}) => {
  if (data.type === 'init') {
    try {
      const instance = await WebAssembly.instantiate(data.module, {env: {memory: data.memory}});
      exports = instance.exports;
      // this worker's own stack (every instance's __stack_pointer starts at the same address; libm's sinf and cosf
      // keep values there)
      const stack = exports.kiln_worker_stack(data.index);
      if (!stack) throw new Error(`the threaded module has no stack for worker ${data.index} (too many threads)`);
      exports.__stack_pointer.value = stack;
      control = new Int32Array(data.control);
      ({index, workers, steps} = data);
      const missing = steps.find((s) => typeof exports[s.export] !== 'function');
      if (missing) throw new Error(`the threaded module has no export ${missing.export}`);
      self.postMessage({type: 'ready', dims: typeof exports.kiln_dims === 'function' ? exports.kiln_dims() : 0});
    } catch (error) {
      self.postMessage({type: 'error', message: `wasm worker ${data.index}: ${error.message}`});
    }
    return;
  }
  if (data.type === 'run') {
    if (data.tiles) steps.forEach((s, i) => { s.total = data.tiles[i]; });
    if (data.ptrs) steps.forEach((s, i) => { s.ptrs = data.ptrs[i]; });
    if (data.kernels) {
      const missing = data.kernels.find((name) => typeof exports[name] !== 'function');
      if (missing) {
        self.postMessage({type: 'error', message: `the threaded module has no export ${missing}`});
        return;
      }
      steps.forEach((s, i) => { s.export = data.kernels[i]; });
    }
    let failure = null;
    const first = data.first ?? 0, last = data.last ?? steps.length;
    for (let i = first; i < last; i++) {
      const {export: name, ptrs, total} = steps[i];
      const begin = Math.floor(total * index / workers);
      const end = Math.floor(total * (index + 1) / workers);
      if (end > begin && failure === null) {
        try {
          exports[name](...ptrs, begin, end);
        } catch (error) {  // keep meeting the barriers, or the other workers would wait forever
          failure = `wasm worker ${index}: kernel ${name} failed: ${error.message}`;
        }
      }
      if (i < last - 1) barrier();
    }
    self.postMessage(failure === null ? {type: 'done'} : {type: 'error', message: failure});
  }
};
