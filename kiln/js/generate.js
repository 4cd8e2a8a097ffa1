// @ts-check
// Kiln browser runtime: token-by-token generation over a language-model package (the manifest's `generation`
// section, package format 1.7; `kiln compile MODEL.gguf`). Loaded by kiln.js on the first `session.generate`
// or `session.chat.completions.create`; it is the one module that uses libraries, both vendored into the
// package (kiln/js/vendor, pinned by its package-lock.json): @huggingface/tokenizers for tokenizer.json and
// @huggingface/jinja for the chat template.
//
//   for await (const chunk of session.generate([{role: 'user', content: 'Hi'}], {maxNewTokens: 64})) {
//     out.textContent += chunk.text;                  // chunk.stats.decodeTokensPerS: tokens/s so far
//   }
//   const chunks = await session.chat.completions.create({messages, stream: true, max_tokens: 64});
//   for await (const c of chunks) out.textContent += c.choices[0]?.delta.content ?? '';   // OpenAI-shaped
//
// The package is one decoder step: new token ids and the number of tokens already cached in; logits and each
// row's arg max (`next_token`) out. The KV cache is the package's state: buffers sized for the context bound,
// updated in place by each step, never fed nor read back. The prompt is prefilled in chunks of at most
// `max_tokens`, then each decode step feeds one token. Greedy decoding reads back only `next_token`; sampling
// (seeded) runs the package's sampler on the GPU, reading back only the id (WebGPU, format 1.8), or reads back
// the last row of logits and draws here (WebAssembly, whose logits are in memory already).

import {KilnError} from './errors.js';
import {Tensor} from './tensor.js';
import {GPUTensor} from './gputensor.js';
import {Tokenizer} from './vendor/tokenizers.mjs';
import {Template} from './vendor/jinja.mjs';

/**
 * @typedef {import('./manifest').Generation} GenerationConfig
 * @typedef {import('./package.js').PackageSource} PackageSource
 * @typedef {{role: string, content: string | {type: string, text?: string}[]}} ChatMessage
 */

/**
 * How the next token is chosen (as kiln/runtime/generate.py's SamplingOptions).
 * @typedef {object} SamplingOptions
 * @property {number} [temperature=0] 0: greedy (the device's arg max); > 0: sample from softmax(logits / T).
 * @property {number} [topK=0] keep the k likeliest tokens (0: all).
 * @property {number} [topP=1] keep the smallest set of likeliest tokens whose probability reaches p (1: all).
 * @property {number} [repetitionPenalty=1] CTRL's penalty (Keskar et al. 2019) on tokens of prompt and answer:
 *   a positive logit is divided by it, a negative one multiplied (1: none).
 * @property {number} [seed] the sampler's seed (same seed, same answer); default: random.
 */

/**
 * @typedef {SamplingOptions & {maxNewTokens?: number, stop?: string[], signal?: AbortSignal}} GenerateOptions
 * `maxNewTokens` (default: until the context is full) bounds the answer; a `stop` string ends it (the string is not yielded); an
 * aborted `signal` ends it after the step under way (stopReason 'abort').
 */

/** Timings of one generation (milliseconds, tokens, tokens/s). */
export class GenerationStats {
  constructor(promptTokens = 0) {
    /** Prompt tokens (prefilled). */ this.promptTokens = promptTokens;
    /** Tokens generated so far. */ this.newTokens = 0;
    /** Milliseconds from the start to the first token (the prefill). */ this.prefillMs = 0;
    /** Milliseconds from the first token to the last. */ this.decodeMs = 0;
    /** Why it ended: 'stop' (a stop token or string), 'length' (maxNewTokens) or 'abort'; '' while running. */
    this.stopReason = '';
  }

  /** Prompt tokens prefilled per second. */
  get prefillTokensPerS() {
    return this.prefillMs ? this.promptTokens / (this.prefillMs / 1e3) : 0;
  }

  /** Tokens generated per second after the first (each a decode step). */
  get decodeTokensPerS() {
    return this.decodeMs && this.newTokens > 1 ? (this.newTokens - 1) / (this.decodeMs / 1e3) : 0;
  }
}

/**
 * A small seeded generator of uniform floats in [0, 1): Mulberry32 (Tommy Ettinger, public domain), enough
 * for drawing tokens; not the sequence numpy draws, so a seed gives other samples than the Python runtime.
 * @param {number} seed
 * @returns {() => number}
 */
export function seededRandom(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * The next token from one row of logits under `options` (the same filters, in the same order, as
 * kiln/runtime/generate.py's `sample` and HF transformers' logits processors): the repetition penalty on `seen`,
 * then temperature, top-k and top-p, then a draw with `random`.
 * @param {Float32Array} logits [vocab]
 * @param {SamplingOptions} options checked (see {@link checkSampling})
 * @param {Iterable<number>} seen token ids of prompt and answer
 * @param {() => number} random uniform in [0, 1)
 * @returns {number} the token id
 */
export function sample(logits, options, seen, random) {
  const {temperature = 0, topK = 0, topP = 1, repetitionPenalty = 1} = options;
  const x = Float64Array.from(logits);
  if (repetitionPenalty !== 1) {
    for (const id of new Set(seen)) x[id] = x[id] > 0 ? x[id] / repetitionPenalty : x[id] * repetitionPenalty;
  }
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  if (temperature === 0) return best;
  const top = x[best];
  /** @type {number[]} candidate ids, likeliest first when filtered */
  let ids;
  if (topK > 0 && topK < x.length || topP < 1) {
    ids = Array.from(x.keys()).sort((a, b) => x[b] - x[a] || a - b);
    if (topK > 0 && topK < ids.length) {
      const kth = x[ids[topK - 1]];
      let end = topK;
      while (end < ids.length && x[ids[end]] === kth) end++;  // ties with the k-th stay (numpy's rule)
      ids = ids.slice(0, end);
    }
  } else {
    ids = Array.from(x.keys());
  }
  let p = ids.map((id) => Math.exp((x[id] - top) / temperature));
  let total = p.reduce((s, v) => s + v, 0);
  if (topP < 1) {
    let mass = 0;
    let end = 0;
    while (end < p.length && mass < topP * total) mass += p[end++];  // the smallest prefix reaching top_p
    ids = ids.slice(0, end);
    p = p.slice(0, end);
    total = mass;
  }
  let u = random() * total;
  for (let i = 0; i < ids.length; i++) {
    u -= p[i];
    if (u < 0) return ids[i];
  }
  return ids[ids.length - 1];
}

/**
 * Check sampling options; returns them with defaults filled in.
 * @param {SamplingOptions} options
 * @returns {Required<Omit<SamplingOptions, 'seed'>> & {seed?: number}}
 * @throws {KilnError} a value out of range.
 */
export function checkSampling(options) {
  const {temperature = 0, topK = 0, topP = 1, repetitionPenalty = 1, seed} = options;
  if (!(temperature >= 0)) throw new KilnError(`temperature must be >= 0, got ${temperature}`);
  if (!Number.isInteger(topK) || topK < 0) throw new KilnError(`topK must be an integer >= 0, got ${topK}`);
  if (!(topP > 0 && topP <= 1)) throw new KilnError(`topP must be in (0, 1], got ${topP}`);
  if (!(repetitionPenalty > 0)) throw new KilnError(`repetitionPenalty must be > 0, got ${repetitionPenalty}`);
  if (seed !== undefined && !Number.isInteger(seed)) throw new KilnError(`seed must be an integer, got ${seed}`);
  return {temperature, topK, topP, repetitionPenalty, seed};
}

const GENERATE_KEYS = ['maxNewTokens', 'stop', 'signal', 'temperature', 'topK', 'topP', 'repetitionPenalty', 'seed'];

/**
 * Incremental detokenization (the rule of HF text-generation-inference's `decode_token`): the text of the
 * answer's last few tokens is decoded with and without the newest one and the difference is the new text,
 * except while it ends inside a UTF-8 character (a replacement character), when nothing is emitted yet.
 * Linear in the answer's length (decoding the whole answer each token is quadratic).
 */
class TextStream {
  /** @param {(ids: number[]) => string} decode */
  constructor(decode) {
    this.decode = decode;
    /** @type {number[]} */ this.ids = [];
    this.prefix = 0;
    this.read = 0;
  }

  /** @param {number} token @returns {string} the text it completes ('' while a character is split) */
  push(token) {
    this.ids.push(token);
    const before = this.decode(this.ids.slice(this.prefix, this.read));
    const after = this.decode(this.ids.slice(this.prefix));
    if (after.length > before.length && !after.endsWith('\uFFFD')) {
      this.prefix = this.read;
      this.read = this.ids.length;
      return after.slice(before.length);
    }
    return '';
  }
}

/** Generation over a session of a language-model package. Made by `session.generator()` (kiln.js). */
export class Generator {
  /**
   * Load the package's tokenizer and chat template.
   * @param {any} session a kiln.js Session of a package with a `generation` section
   * @param {PackageSource} source where the session's package files come from
   * @returns {Promise<Generator>}
   * @throws {KilnError} the package is not a language model. @throws {PackageError} tokenizer.json is missing.
   */
  static async create(session, source) {
    const config = session.manifest.generation;
    if (!config) {
      throw new KilnError(`${source.name}: not a language-model package (its manifest has no 'generation'; ` +
        'compile a GGUF model: kiln compile MODEL.gguf)');
    }
    const json = JSON.parse(new TextDecoder().decode(await source.bytes(config.tokenizer, 'tokenizer')));
    return new Generator(session, config, new Tokenizer(json, {}), new Template(config.chat_template));
  }

  /**
   * Use {@link Generator.create}.
   * @param {any} session @param {GenerationConfig} config
   * @param {any} tokenizer an @huggingface/tokenizers Tokenizer @param {any} template an @huggingface/jinja Template
   */
  constructor(session, config, tokenizer, template) {
    this.session = session;
    /** The manifest's `generation` section. */ this.config = config;
    /** The @huggingface/tokenizers Tokenizer of the package's tokenizer.json. */ this.tokenizer = tokenizer;
    /** @private */ this.template = template;
    /** @private */ this.eos = new Set(config.eos_token_ids);
    if (Array.isArray(config.cache)) {
      throw new KilnError('a language-model package of format 1.6 (its KV cache is fed back): recompile it with ' +
        'this Kiln (kiln compile MODEL.gguf)');
    }
    /** Timings of the running or last generation. */ this.stats = new GenerationStats();
    /** @private */ this.busy = false;
    /**
     * Greedy decoding on WebGPU queues the next step, fed the token on the device, before the token is read back
     * (the GPU runs step n + 1 while the host waits for token n); false: one step at a time.
     */
    this.runAhead = true;
    /** @private @type {Promise<any> | null} */ this.samplerPromise = null;
  }

  /**
   * The prompt text of chat messages (the package's chat template, with the assistant's turn opened).
   * @param {ChatMessage[]} messages
   * @returns {string}
   * @throws {KilnError} a message without a string role or text content.
   */
  applyChatTemplate(messages) {
    const plain = messages.map((m) => {
      const content = Array.isArray(m?.content)
        ? m.content.filter((part) => part?.type === 'text').map((part) => part.text).join('') : m?.content;
      if (!m || typeof m.role !== 'string' || typeof content !== 'string') {
        throw new KilnError(`a chat message must be {role: string, content: string}, got ${JSON.stringify(m)}`);
      }
      return {role: m.role, content};
    });
    return this.template.render({messages: plain, add_generation_prompt: true});
  }

  /**
   * Token ids of a prompt: text as it is, or chat messages through the chat template.
   * @param {string | ChatMessage[]} prompt
   * @returns {number[]}
   * @throws {KilnError} neither text nor messages, or text with a lone surrogate (not valid UTF-8).
   */
  encode(prompt) {
    let text;
    if (Array.isArray(prompt)) text = this.applyChatTemplate(prompt);
    else if (typeof prompt === 'string') text = prompt;
    else throw new KilnError(`a prompt is a string or an array of chat messages, not ${typeof prompt}`);
    const lone = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.exec(text);
    if (lone) throw new KilnError(`the prompt is not valid UTF-8 text (a lone surrogate at character ${lone.index})`);
    const ids = this.tokenizer.encode(text, {add_special_tokens: false}).ids;
    const bos = this.config.bos_token_id;
    return (bos !== null && bos !== undefined && ids[0] !== bos ? [bos] : []).concat(ids);
  }

  /**
   * Check a request and tokenize its prompt; errors come here, before any step runs.
   * @param {string | ChatMessage[]} prompt
   * @param {GenerateOptions} [options]
   * @returns {{ids: number[], maxNewTokens: number, stop: string[], signal?: AbortSignal,
   *   sampling: ReturnType<typeof checkSampling>}}
   * @throws {KilnError} an unknown or bad option, an empty prompt, or a prompt plus `maxNewTokens` longer than
   *   the package's context (`max_context`).
   */
  prepare(prompt, options = {}) {
    const unknown = Object.keys(options).filter((k) => !GENERATE_KEYS.includes(k));
    if (unknown.length) throw new KilnError(`unknown generate option '${unknown[0]}'; known: ${GENERATE_KEYS.join(', ')}`);
    const {stop = [], signal} = options;
    let {maxNewTokens} = options;
    if (maxNewTokens !== undefined && (!Number.isInteger(maxNewTokens) || maxNewTokens < 1)) {
      throw new KilnError(`maxNewTokens must be an integer >= 1, got ${maxNewTokens}`);
    }
    if (!Array.isArray(stop) || stop.some((s) => typeof s !== 'string' || !s)) {
      throw new KilnError('stop must be an array of non-empty strings');
    }
    const sampling = checkSampling(options);
    const ids = this.encode(prompt);
    if (!ids.length) throw new KilnError('the prompt is empty (no tokens)');
    const limit = this.config.max_context;
    if (ids.length >= limit) {
      throw new KilnError(`the prompt (${ids.length} tokens) fills the package's context of ${limit} tokens ` +
        '(kiln compile --max-context)');
    }
    maxNewTokens ??= limit - ids.length;
    if (ids.length + maxNewTokens > limit) {
      throw new KilnError(`the prompt (${ids.length} tokens) plus maxNewTokens (${maxNewTokens}) exceeds the ` +
        `package's context of ${limit} tokens (kiln compile --max-context)`);
    }
    return {ids, maxNewTokens, stop, signal, sampling};
  }

  /**
   * Stream the answer to `prompt` token by token.
   * @param {string | ChatMessage[]} prompt text, or chat messages (the template opens the assistant's turn).
   * @param {GenerateOptions} [options]
   * @returns {AsyncGenerator<{token: number, text: string, stats: GenerationStats}>} a chunk per generated
   *   token (`text` may be '' while a character is split across tokens); a stop token ends the answer and is
   *   not yielded. Breaking out of the loop ends the generation. One generation runs on a session at a time
   *   (it holds one cache).
   * @throws {KilnError} as {@link Generator#prepare}, or another generation running on this session.
   */
  async *generate(prompt, options = {}) {
    yield* this.stream(this.prepare(prompt, options));
  }

  /**
   * The steps of a prepared request (see {@link Generator#prepare}).
   * @param {ReturnType<Generator['prepare']>} request
   * @returns {AsyncGenerator<{token: number, text: string, stats: GenerationStats}>}
   */
  async *stream(request) {
    if (this.busy) throw new KilnError('a generation is already running on this session; finish or stop it first');
    this.busy = true;
    const {ids, maxNewTokens, stop, signal, sampling} = request;
    const onGPU = this.session.target === 'webgpu';
    const random = seededRandom(sampling.seed ?? crypto.getRandomValues(new Uint32Array(1))[0]);
    const greedy = sampling.temperature === 0 && sampling.repetitionPenalty === 1;
    const sampler = greedy || !onGPU || !this.config.sampler ? null : await this.sampler();
    const key = sampling.seed === undefined ? crypto.getRandomValues(new Uint32Array(1))[0]
      : ((sampling.seed % 2 ** 32) + 2 ** 32) % 2 ** 32;  // the device draw's seed, as the Python runtime's
    const stats = this.stats = new GenerationStats(ids.length);
    const chunk = this.config.max_tokens;
    /** @type {Record<string, Tensor | GPUTensor>} */
    let out = {};
    /** @type {Promise<Record<string, Tensor | GPUTensor>> | Record<string, Tensor | GPUTensor> | null} */
    let ahead = null;  // the next decode step, queued before this token is read (greedy on WebGPU)
    const seen = [...ids];
    const text = new TextStream((t) => (t.length ? this.tokenizer.decode(t, {skip_special_tokens: true}) : ''));
    let answer = '';  // text decoded, of which `shown` characters were yielded (the rest may start a stop string)
    let shown = 0;
    try {
      const t0 = performance.now();
      let t1 = t0;
      for (let start = 0; start < ids.length; start += chunk) {  // prefill, in chunks the package's steps take
        free(out);
        out = await this.step(ids.slice(start, start + chunk), start, onGPU, greedy);
      }
      for (let n = 0; n < maxNewTokens; n++) {
        let token;
        if (greedy) {
          // On WebGPU the token stays on the device: its read back was recorded in its step's command buffer, and
          // the next step is fed with it, so that the GPU runs step n + 1 while the token comes back (one wasted
          // step when it ends the answer).
          // The prefill's next_token has a row per prompt token: the first decode step waits for it.
          const pending = read(out[this.config.next_token]);
          if (onGPU && this.runAhead && n > 0 && n + 1 < maxNewTokens) {
            ahead = this.step(/** @type {GPUTensor} */ (out[this.config.next_token]), ids.length + n, onGPU, true);
            ahead.catch(() => undefined);  // (handled: awaited below, or settled in finally if the read fails)
          }
          token = Number((await pending).data.at(-1));
          if (ahead) ahead = await ahead;  // (submitted: the token's tensor may go)
        } else {
          token = sampler ? await sampleOnDevice(sampler, out[this.config.logits], sampling, seen, key, n)
            : sample(lastRow(await read(out[this.config.logits])), sampling, seen, random);
        }
        free(out);
        out = {};
        const now = performance.now();
        if (n === 0) {
          stats.prefillMs = now - t0;
          t1 = now;
        } else {
          stats.decodeMs = now - t1;
        }
        if (this.eos.has(token)) {
          stats.stopReason = 'stop';
          break;
        }
        stats.newTokens++;
        seen.push(token);
        answer += text.push(token);
        const stopAt = firstStop(answer, stop);
        if (stopAt >= 0) {
          answer = answer.slice(0, stopAt);
          stats.stopReason = 'stop';
        }
        const safe = stopAt >= 0 ? answer.length : answer.length - heldBack(answer, stop);
        yield {token, text: answer.slice(shown, Math.max(shown, safe)), stats};
        shown = Math.max(shown, safe);
        if (stats.stopReason) break;
        if (signal?.aborted) {
          stats.stopReason = 'abort';
          break;
        }
        if (ahead) {
          out = /** @type {Record<string, Tensor | GPUTensor>} */ (ahead);
          ahead = null;
        } else if (n + 1 < maxNewTokens) {
          out = await this.step([token], ids.length + n, onGPU, greedy);
        }
      }
      if (!stats.stopReason) stats.stopReason = 'length';
    } finally {
      // the step queued ahead first: until it is submitted it may still copy from a tensor of `out`
      if (ahead) free(await Promise.resolve(ahead).catch(() => ({})));
      free(out);
      this.busy = false;
    }
  }

  /**
   * The session of the package's sampler (`generation.sampler`, format 1.8: sampling on the GPU,
   * kiln/frontend/sampling.py) on this session's device, loaded on first use.
   * @returns {Promise<any>} a kiln.js Session
   */
  sampler() {
    if (!this.samplerPromise) {
      this.samplerPromise = this.session.loadPart(this.config.sampler);
      this.samplerPromise.catch(() => { this.samplerPromise = null; });
    }
    return this.samplerPromise;
  }

  /**
   * One decoder step: `ids` after `cached` tokens already in the cache (which it updates in place).
   * @private
   * @param {number[] | GPUTensor} ids token ids, or a GPUTensor `[1, n]` of them (a step's next_token)
   * @param {number} cached @param {boolean} onGPU
   * @param {boolean} [greedy] on WebGPU only next_token is wanted: the logits stay in the session's buffer, and
   *   the token's read back is recorded with the step (kiln/runtime/generate.py's `_step`)
   * @returns {Promise<Record<string, Tensor | GPUTensor>>} the logits and next_token (GPUTensors on WebGPU;
   *   next_token alone for a greedy step there)
   */
  async step(ids, cached, onGPU, greedy = false) {
    const feeds = {
      [this.config.input_ids]: ids instanceof GPUTensor ? ids
        : new Tensor('int64', BigInt64Array.from(ids, BigInt), [1, ids.length]),
      [this.config.cache.position]: new Tensor('int64', BigInt64Array.of(BigInt(cached)), [1]),
    };
    if (!onGPU) return this.session.run(feeds);
    const token = this.config.next_token;
    return this.session.run(feeds, greedy ? {output: 'gpu', outputs: [token], read: [token]} : {output: 'gpu'});
  }
}

/**
 * The next token by the sampler package from the decoder's logits on the GPU (the penalty, temperature, top-k,
 * top-p and a Gumbel-max draw keyed by `key` and `step`, as kiln/runtime/generate.py's `_sample_on_device`); only
 * the id is read back.
 * @param {any} sampler a kiln.js Session of the sampler package
 * @param {Tensor | GPUTensor} logits [1, 1, vocab]
 * @param {ReturnType<typeof checkSampling>} sampling @param {number[]} seen prompt and answer ids
 * @param {number} key a uint32 seed @param {number} step the decode step
 * @returns {Promise<number>}
 */
async function sampleOnDevice(sampler, logits, sampling, seen, key, step) {
  const ids = sampling.repetitionPenalty !== 1 ? [...new Set(seen)] : seen.slice(0, 1);  // each penalised id once
  const out = await sampler.run({
    logits,
    seen: new Tensor('int32', Int32Array.from(ids), [ids.length]),
    options: new Tensor('float32', Float32Array.of(sampling.temperature, sampling.topP, sampling.repetitionPenalty,
      sampling.topK), [4]),
    seed: new Tensor('int32', Int32Array.of(key | 0, step), [2]),
  });
  return Number(out.token.data[0]);
}

/** @param {Tensor | GPUTensor} t @returns {Promise<Tensor>} */
async function read(t) {
  return t instanceof GPUTensor ? t.read() : t;
}

/** @param {Tensor} logits [..., vocab] @returns {Float32Array} the last row */
function lastRow(logits) {
  const vocab = logits.dims[logits.dims.length - 1];
  const data = /** @type {Float32Array} */ (logits.data);
  return data.subarray(data.length - vocab);
}

/** @param {Record<string, Tensor | GPUTensor>} tensors GPUTensors among them are destroyed */
function free(tensors) {
  for (const t of Object.values(tensors)) if (t instanceof GPUTensor) t.destroy();
}

/** @param {string} text @param {string[]} stops @returns {number} where the first stop string starts, or -1 */
function firstStop(text, stops) {
  let at = -1;
  for (const s of stops) {
    const i = text.indexOf(s);
    if (i >= 0 && (at < 0 || i < at)) at = i;
  }
  return at;
}

/** @param {string} text @param {string[]} stops @returns {number} characters at the end that may begin a stop string */
function heldBack(text, stops) {
  let held = 0;
  for (const s of stops) {
    for (let k = Math.min(s.length - 1, text.length); k > held; k--) {
      if (text.endsWith(s.slice(0, k))) {
        held = k;
        break;
      }
    }
  }
  return held;
}

/**
 * The OpenAI-style chat surface (`session.chat.completions.create`), the web's convention since WebLLM:
 * requests and chunks shaped as OpenAI's Chat Completions API.
 */
export class ChatCompletions {
  /** @param {() => Promise<Generator>} generator @param {string} model the name chunks report */
  constructor(generator, model) {
    /** @private */ this.generator = generator;
    /** @private */ this.model = model;
  }

  /**
   * Answer chat messages.
   * @param {object} request
   * @param {ChatMessage[]} request.messages the conversation; the template opens the assistant's turn.
   * @param {boolean} [request.stream=false] yield `chat.completion.chunk`s as tokens come.
   * @param {number} [request.max_tokens] the most tokens of the answer (default: until the context is full).
   * @param {number} [request.temperature=1] OpenAI's default; 0 is greedy.
   * @param {number} [request.top_p=1]
   * @param {number} [request.top_k=0] (WebLLM's extension) keep the k likeliest tokens.
   * @param {number} [request.repetition_penalty=1] (WebLLM's extension)
   * @param {number} [request.seed]
   * @param {string | string[]} [request.stop] up to 4 strings that end the answer.
   * @param {number} [request.n=1] only 1 is supported.
   * @param {{include_usage?: boolean}} [request.stream_options] `include_usage`: a last chunk with `usage`.
   * @param {AbortSignal} [request.signal] (not OpenAI's) stops the answer: finish_reason 'abort'.
   * @param {string} [request.model] the name chunks report (default: the package's model).
   * @returns {Promise<any>} with `stream`, an async iterable of chunks
   *   `{id, object: 'chat.completion.chunk', created, model, choices: [{index: 0, delta: {role?, content?},
   *   finish_reason: null | 'stop' | 'length' | 'abort', logprobs: null}]}` (and with `include_usage`, a
   *   last chunk with `choices: []` and `usage`); otherwise a `chat.completion` whose `usage` counts tokens and
   *   whose `usage.extra` has `prefill_tokens_per_s` and `decode_tokens_per_s` (as WebLLM's).
   * @throws {KilnError} a malformed request, n != 1, an unsupported field, or what `session.generate` refuses.
   */
  async create(request) {
    if (!request || typeof request !== 'object' || !Array.isArray(request.messages)) {
      throw new KilnError('chat.completions.create takes {messages: [{role, content}], ...}');
    }
    const known = ['messages', 'stream', 'max_tokens', 'temperature', 'top_p', 'top_k', 'repetition_penalty', 'seed',
      'stop', 'n', 'stream_options', 'signal', 'model'];
    const unknown = Object.keys(request).filter((k) => !known.includes(k));
    if (unknown.length) throw new KilnError(`chat.completions.create: unsupported field '${unknown[0]}'; supported: ${known.join(', ')}`);
    if ((request.n ?? 1) !== 1) throw new KilnError(`chat.completions.create: n must be 1, got ${request.n}`);
    const stop = request.stop === undefined || request.stop === null ? []
      : Array.isArray(request.stop) ? request.stop : [request.stop];
    if (stop.length > 4) throw new KilnError(`chat.completions.create: at most 4 stop strings, got ${stop.length}`);
    const generator = await this.generator();
    const prepared = generator.prepare(request.messages, {
      maxNewTokens: request.max_tokens ?? undefined, temperature: request.temperature ?? 1, topP: request.top_p ?? 1,
      topK: request.top_k ?? 0, repetitionPenalty: request.repetition_penalty ?? 1, seed: request.seed ?? undefined,
      stop, signal: request.signal,
    });
    const meta = {id: `chatcmpl-${crypto.getRandomValues(new Uint32Array(2)).join('')}`,
      created: Math.floor(Date.now() / 1000), model: request.model ?? this.model};
    const usage = () => {
      const s = generator.stats;
      return {prompt_tokens: s.promptTokens, completion_tokens: s.newTokens, total_tokens: s.promptTokens + s.newTokens,
        extra: {prefill_tokens_per_s: s.prefillTokensPerS, decode_tokens_per_s: s.decodeTokensPerS,
          prefill_ms: s.prefillMs, decode_ms: s.decodeMs}};
    };
    if (!request.stream) {
      let content = '';
      for await (const c of generator.stream(prepared)) content += c.text;
      return {...meta, object: 'chat.completion', choices: [{index: 0, message: {role: 'assistant', content},
        finish_reason: generator.stats.stopReason, logprobs: null}], usage: usage()};
    }
    const chunk = (choices, extra = {}) => ({...meta, object: 'chat.completion.chunk', choices, ...extra});
    const includeUsage = Boolean(request.stream_options?.include_usage);
    return (async function* chunks() {
      yield chunk([{index: 0, delta: {role: 'assistant', content: ''}, finish_reason: null, logprobs: null}]);
      for await (const c of generator.stream(prepared)) {
        if (c.text) yield chunk([{index: 0, delta: {content: c.text}, finish_reason: null, logprobs: null}]);
      }
      yield chunk([{index: 0, delta: {}, finish_reason: generator.stats.stopReason, logprobs: null}]);
      if (includeUsage) yield chunk([], {usage: usage()});
    })();
  }
}
