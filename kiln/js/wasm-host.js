// Kiln browser runtime: the worker that runs a single-threaded WebAssembly backend off the page's thread (wasm.js's
// WorkerBackend starts it as a module worker and forwards each call), so that a run outliving the time limit is
// stopped by terminating this worker while the page stays responsive.
//
// Messages from wasm.js, each answered by {type: 'done', value} or {type: 'error', name, message} (`name`: the
// error's class, a KilnError's or the engine's):
//   {type: 'init', module, manifest, poison}   instantiate the module (WasmBackend.single); value: null
//   {type: 'write', bytes, weights}             copy weights [{buffer: {id}, offset, length}] of one weights file's
//       `bytes` into their buffers; value: null
//   {type: 'run', inputs, dims}                 WasmBackend.run; value: {results (their buffers moved back), bound:
//       the dims after the run (data-dependent dims bound) or null}
//   {type: 'time', inputs, options}             WasmBackend.time, posting {type: 'tick'} after each run (wasm.js
//       restarts the time limit); value: its timings
//   {type: 'moveRows', moves}                   WasmBackend.moveRows; value: null

import {KilnError} from './errors.js';
import {WasmBackend} from './wasm.js';

/** @type {WasmBackend | null} */
let backend = null;

/**
 * Answer one request.
 * @param {any} data @returns {Promise<{value: any, transfer: Transferable[]}>}
 */
async function answer(data) {
  if (data.type === 'init') {
    backend = await WasmBackend.single(data.module, data.manifest);
    backend.poison = Boolean(data.poison);
    return {value: null, transfer: []};
  }
  if (!backend) throw new KilnError(`wasm worker: '${data.type}' before 'init'`);
  switch (data.type) {
    case 'write':
      backend.writeWeights(data.weights.map((/** @type {any} */ w) => ({...w, bytes: data.bytes})));
      return {value: null, transfer: []};
    case 'run': {
      const dims = data.dims ? {...data.dims} : null;
      const results = await backend.run(data.inputs, {dims});
      return {value: {results, bound: dims}, transfer: Object.values(results)};
    }
    case 'time':
      return {value: await backend.time(data.inputs, {...data.options, onRun: () => self.postMessage({type: 'tick'})}),
        transfer: []};
    case 'moveRows':
      backend.moveRows(data.moves);
      return {value: null, transfer: []};
    default:
      throw new KilnError(`wasm worker: unknown request '${data.type}'`);
  }
}

self.onmessage = async ({data}) => {
  try {
    const {value, transfer} = await answer(data);
    self.postMessage({type: 'done', value}, {transfer});
  } catch (error) {
    self.postMessage({type: 'error', name: String(error?.name ?? 'Error'), message: String(error?.message ?? error)});
  }
};
