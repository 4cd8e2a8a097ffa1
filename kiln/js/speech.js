// @ts-check
// Kiln browser runtime: speech to text over a speech package (`speech.json`; `kiln compile WHISPER_FOLDER`,
// docs/speech.md), the browser twin of kiln/runtime/speech.py.
//
//   const speech = await kiln.loadSpeech('./', {onProgress});            // its four parts on one device
//   const {samples, sampleRate} = await decodeAudio(await file.arrayBuffer());   // Web Audio's decodeAudioData
//   const result = await speech.transcribe(samples, {sampleRate, timestamps: true, onSegment: (s) => ...});
//   result.text; result.stats.realTimeFactor;
//
// A speech package holds four packages: `resample` (a recording at another rate to 16 kHz), `log_mel` (up to
// 30 s of samples to its log-mel spectrogram), `encoder` (a window's spectrogram to the encoder's states) and
// `decoder` (one decoder step, with the self- and cross-attention caches as state). Transcription is Whisper's
// long-form algorithm as faster-whisper runs it over CTranslate2: the whole recording's features; 30-s windows
// from frame `seek`; each window's encoder output feeds the decoder's first step (on the GPU, never read back);
// a prompt of the previous text, <|startoftranscript|> (language and task tokens on multilingual models) and
// <|notimestamps|> without timestamps; greedy decoding or beam search with the model's token suppression and,
// with timestamps, CTranslate2's timestamp rules; segments split at consecutive timestamps, the next window from the last one.

import {KilnError, PackageError} from './errors.js';
import {Tensor} from './tensor.js';
import {GPUTensor} from './gputensor.js';
import {load} from './kiln.js';
import {checkSchema, sha256Hex} from './package.js';
import SPEECH_SCHEMA from './speech-schema.js';
import {Tokenizer} from './vendor/tokenizers.mjs';

/** The speech package format this runtime reads (its major version). */
export const SPEECH_FORMAT_MAJOR = 1;
/** The longest recording transcribed at once, seconds (as kiln/runtime/speech.py). */
export const MAX_AUDIO_S = 4 * 3600;

/**
 * @typedef {{start: number, end: number, text: string, tokens: number[]}} Segment
 * A transcribed span: seconds from the recording's start, its text and token ids (timestamps included).
 */

/** What a transcription took (milliseconds, seconds of audio, tokens). */
export class TranscriptionStats {
  constructor() {
    /** Seconds of audio. */ this.audioS = 0;
    /** Milliseconds resampling to 16 kHz (0 for 16 kHz audio). */ this.resampleMs = 0;
    /** Milliseconds computing the log-mel features. */ this.featuresMs = 0;
    /** Milliseconds in the encoder, all windows. */ this.encodeMs = 0;
    /** Milliseconds in decoder steps. */ this.decodeMs = 0;
    /** 30-s windows encoded. */ this.windows = 0;
    /** Tokens decoded (prompts excluded). */ this.tokens = 0;
    /** Milliseconds for the whole transcription. */ this.totalMs = 0;
  }

  /** Processing time over audio time (below 1: faster than real time). */
  get realTimeFactor() { return this.audioS ? this.totalMs / 1e3 / this.audioS : 0; }

  /** Decoder milliseconds per decoded token. */
  get msPerToken() { return this.tokens ? this.decodeMs / this.tokens : 0; }
}

/**
 * Decode an audio file (WAV, MP3, FLAC, OGG: whatever the browser's Web Audio decodes) to mono samples: a WAV file
 * at its own rate, others at 48 kHz (Web Audio decodes at a context's rate); Kiln resamples them to 16 kHz on the
 * device.
 * @param {ArrayBuffer | Blob} data the file's bytes.
 * @returns {Promise<{samples: Float32Array, sampleRate: number}>} channels averaged.
 * @throws {KilnError} the browser cannot decode it, or it holds no samples.
 */
export async function decodeAudio(data) {
  const bytes = data instanceof Blob ? await data.arrayBuffer() : data;
  // decodeAudioData resamples to its context's rate: a WAV file's own rate (read from its header) avoids a second
  // resampling; other formats decode at 48 kHz
  const head = new DataView(bytes, 0, Math.min(bytes.byteLength, 28));
  const wav = head.byteLength >= 28 && head.getUint32(0) === 0x52494646 && head.getUint32(8) === 0x57415645;
  const rate = wav ? head.getUint32(24, true) : 48000;
  const context = new OfflineAudioContext(1, 1, rate >= 3000 && rate <= 768000 ? rate : 48000);
  let buffer;
  try {
    buffer = await context.decodeAudioData(bytes.slice(0));
  } catch (error) {
    throw new KilnError(`cannot decode the audio file: ${error?.message ?? error}`);
  }
  if (!buffer.length) throw new KilnError('the audio file is empty (no samples)');
  const samples = new Float32Array(buffer.length);
  for (let c = 0; c < buffer.numberOfChannels; c++) {
    const channel = buffer.getChannelData(c);
    for (let i = 0; i < samples.length; i++) samples[i] += channel[i] / buffer.numberOfChannels;
  }
  return {samples, sampleRate: buffer.sampleRate};
}

/**
 * Load a speech package: `speech.json`, the tokenizer and its four parts (each with {@link load}, on one device).
 * @param {string | URL} url the package directory.
 * @param {import('./kiln.js').LoadOptions} [options] passed to each part's load (target, onProgress, ...).
 * @returns {Promise<SpeechSession>}
 * @throws {PackageError} not a speech package, or one of a newer major format; (format 1.2, unless
 *   `options.verify` is false) a speech.json or tokenizer that differs from its SHA-256; what {@link load} throws.
 */
export async function loadSpeech(url, options = {}) {
  const root = new URL(url, globalThis.location?.href);
  if (!root.pathname.endsWith('/')) root.pathname += '/';
  const fetchBytes = async (/** @type {string} */ path) => {
    const response = await fetch(new URL(path, root));
    if (!response.ok) throw new PackageError(`${root}: no ${path} (HTTP ${response.status}); not a speech package?`);
    return response.arrayBuffer();
  };
  const bytes = await fetchBytes('speech.json');
  let spec;
  try {
    spec = JSON.parse(new TextDecoder('utf-8', {fatal: true}).decode(bytes));
  } catch (error) {
    throw new PackageError(`${root}speech.json is not readable JSON: ${error.message}`);
  }
  const [major, minor] = String(spec?.format).split('.').map(Number);
  if (major !== SPEECH_FORMAT_MAJOR) {
    throw new PackageError(`${root}: speech package format ${spec?.format} is not ${SPEECH_FORMAT_MAJOR}.x; recompile it`);
  }
  checkSchema(spec, `${root}speech.json`, SPEECH_SCHEMA, 'speech.json does not match its schema');
  const verify = options.verify ?? true;
  // (format 1.2) speech.json against speech.sha256, and the files beside the parts against its `files`; a package
  // that lists its files is checked whatever format it states (editing it down to 1.1 turns nothing off)
  const integrity = minor >= 2 || 'files' in spec;
  if (integrity && verify) {
    const line = new TextDecoder().decode(await fetchBytes('speech.sha256')).trim().split(/\s+/)[0] ?? '';
    const got = await sha256Hex(bytes);
    if (got !== line.toLowerCase()) {
      throw new PackageError(`${root}: speech.json SHA-256 checksum mismatch (expected ${line}, got ${got}); the ` +
        'package is corrupted or its speech.json was edited');
    }
  }
  const tokenizerBytes = await fetchBytes(spec.tokenizer);
  if (integrity && verify) {
    const entry = (spec.files ?? []).find((/** @type {{path: string}} */ f) => f.path === spec.tokenizer);
    const got = await sha256Hex(tokenizerBytes);
    if (!entry || entry.bytes !== tokenizerBytes.byteLength || entry.sha256 !== got) {
      throw new PackageError(`${root}${spec.tokenizer}: ${entry ? `SHA-256 checksum mismatch (expected ${entry.sha256}, ` +
        `got ${got})` : 'not listed in speech.json\'s files'}; the package is corrupted or was edited`);
    }
  }
  const tokenizer = new Tokenizer(JSON.parse(new TextDecoder().decode(tokenizerBytes)), {});
  /** @type {Record<string, any>} */
  const parts = {};
  for (const name of ['resample', 'log_mel', 'encoder', 'decoder']) {
    parts[name] = await load(new URL(`${spec.parts[name]}/`, root), options);
  }
  return new SpeechSession(spec, parts, tokenizer);
}

/** @param {Tensor | GPUTensor} t @returns {Promise<Tensor>} */
async function read(t) {
  return t instanceof GPUTensor ? t.read() : t;
}

/** @param {Record<string, Tensor | GPUTensor>} tensors GPUTensors among them are destroyed */
function free(tensors) {
  for (const t of Object.values(tensors)) if (t instanceof GPUTensor) t.destroy();
}

/** @param {number} a @param {number} b @returns {number} */
function gcd(a, b) {
  while (b) [a, b] = [b, a % b];
  return a;
}

/** A loaded speech package. Create it with {@link loadSpeech}. */
export class SpeechSession {
  /**
   * @param {any} spec speech.json @param {Record<string, any>} parts the four parts' sessions
   * @param {any} tokenizer an @huggingface/tokenizers Tokenizer of the model's tokenizer.json
   */
  constructor(spec, parts, tokenizer) {
    /** The package's `speech.json`. */ this.spec = spec;
    /** The parts' sessions: resample, log_mel, encoder, decoder. */ this.parts = parts;
    /** The target the parts run ('webgpu' or 'wasm'). */ this.target = parts.decoder.target;
    /** @private */ this.tokenizer = tokenizer;
    /** @private */ this.busy = false;
  }

  /**
   * Resample to the package's rate (16 kHz) on the device: windowed-sinc interpolation, `ceil(n * 16000 / rate)`
   * samples (kiln/frontend/audio.py; positions exact per chunk).
   * @param {Float32Array} samples @param {number} rate Hz
   * @returns {Promise<Float32Array>}
   * @throws {KilnError} a rate outside what the filter has taps for.
   */
  async resample(samples, rate) {
    const r = this.spec.resample;
    const outRate = this.spec.sample_rate;
    if (!(rate >= r.min_rate && rate <= r.max_rate)) {
      throw new KilnError(`cannot resample audio at ${rate} Hz: rates from ${r.min_rate} to ${r.max_rate} Hz ` +
        'are resampled to 16 kHz');
    }
    if (rate === outRate) return samples;
    const g = gcd(rate, outRate);
    const num = rate / g; const den = outRate / g;
    const c = r.rolloff * Math.min(1, den / num);
    const filter = new Tensor('float32', Float32Array.of(Math.PI * c, c, Math.PI * c / (2 * r.zero_crossings)), [3]);
    const ratio = new Tensor('int32', Int32Array.of(num, den), [2]);
    const lead = r.taps / 2 - 1;
    const total = Math.ceil(samples.length * den / num);
    const step = Math.max(1, Math.min(r.max_outputs, Math.floor((2 ** 31 - 1 - den) / num)));
    const out = new Float32Array(total);
    for (let first = 0; first < total; first += step) {
      const count = Math.min(step, total - first);
      // exact integers: first * num stays below 2^53 for any recording under MAX_AUDIO_S
      const position = first * num;
      const base = Math.floor(position / den); const phase = position - base * den;
      const need = Math.floor((phase + (count - 1) * num) / den) + r.taps;
      const span = new Float32Array(need);
      // span[i] = signal[base + i - lead] (zeros outside)
      const from = Math.max(0, base - lead); const to = Math.min(samples.length, base - lead + need);
      if (to > from) span.set(samples.subarray(from, to), from - (base - lead));
      const result = await this.parts.resample.run({
        audio: new Tensor('float32', span, [1, need]), samples: new Tensor('int64', BigInt64Array.of(BigInt(count)), [1]),
        ratio, phase: new Tensor('int32', Int32Array.of(phase), [1]), filter});
      out.set(/** @type {Float32Array} */ (result.resampled.data), first);
    }
    return out;
  }

  /**
   * The log-mel spectrogram of 16 kHz samples on the device (before Whisper's normalisation, which the encoder
   * applies): `[n_mels, frames]` row-major, and its maximum. The padded signal (160 zeros appended, 200 samples
   * reflected at each end) is laid out in chunks of 3000 frames here; the arithmetic is the device's.
   * @param {Float32Array} samples
   * @returns {Promise<{mel: Float32Array, frames: number, max: number}>}
   */
  async features(samples) {
    const {n_fft: nFft, hop, frames: perChunk, n_mels: nMels} = this.spec;
    const half = nFft / 2;
    const n = samples.length + hop;
    const padded = new Float32Array(n + 2 * half);
    padded.set(samples, half);
    for (let i = 0; i < half; i++) {  // numpy's 'reflect': the edge sample is not repeated
      padded[half - 1 - i] = padded[half + 1 + i];
      padded[half + n + i] = padded[half + n - 2 - i];
    }
    const frames = Math.floor((padded.length - nFft) / hop);
    const chunks = Math.ceil(frames / perChunk);
    const mel = new Float32Array(nMels * frames);
    // [1, blocks, hop]: a chunk's frames' samples in rows of hop (kiln/runtime/speech.py's mel_blocks); a package
    // made before takes whole 30-s rows [1, width]
    const blocked = this.parts.log_mel.manifest.inputs[0].shape.length === 3;
    let max = -Infinity;
    for (let c = 0; c < chunks; c++) {
      const take = Math.min(perChunk, frames - c * perChunk);
      const blocks = take + Math.ceil(nFft / hop) - 1;
      const width = blocked ? blocks * hop : (perChunk - 1) * hop + nFft;
      const row = new Float32Array(width);
      row.set(padded.subarray(c * perChunk * hop, Math.min(padded.length, c * perChunk * hop + width)));
      const shape = blocked ? [1, blocks, hop] : [1, width];
      const out = await this.parts.log_mel.run({audio: new Tensor('float32', row, shape)});
      const data = /** @type {Float32Array} */ (out.log_mel.data);
      const stride = blocked ? take : perChunk;
      for (let m = 0; m < nMels; m++) {
        mel.set(data.subarray(m * stride, m * stride + take), m * frames + c * perChunk);
      }
      max = Math.max(max, /** @type {Float32Array} */ (out.log_mel_max.data)[0]);
    }
    return {mel, frames, max};
  }

  /**
   * Transcribe a recording (greedy decoding or beam search; docs/speech.md says how).
   * @param {Float32Array} samples mono samples in [-1, 1].
   * @param {{sampleRate?: number, timestamps?: boolean, language?: string, task?: 'transcribe' | 'translate',
   *   conditionOnPreviousText?: boolean, maxInitialTimestamp?: number, beamSize?: number, patience?: number,
   *   lengthPenalty?: number, onSegment?: (s: Segment) => void, signal?: AbortSignal}} [options] `sampleRate`
   *   (default 16000; others are resampled on the device), `timestamps` (segment times from the model's timestamp
   *   tokens), `language` (multilingual models, default 'en'), `task`, `conditionOnPreviousText` (default true),
   *   `maxInitialTimestamp` (seconds, default 1), `beamSize` (1: greedy, the default; up to the package's
   *   `beams`), `patience` and `lengthPenalty` (beam search, default 1), `onSegment` (each segment as it is
   *   decoded), `signal` (abort between steps).
   * @returns {Promise<{segments: Segment[], text: string, stats: TranscriptionStats}>}
   * @throws {KilnError} empty audio, a rate it cannot resample, audio over {@link MAX_AUDIO_S}, an unknown
   *   language or task, a beam size the package cannot hold, a transcription already running, or an abort.
   */
  async transcribe(samples, options = {}) {
    const {sampleRate = 16000, timestamps = false, language, task = 'transcribe', conditionOnPreviousText = true,
      maxInitialTimestamp = 1.0, beamSize = 1, patience = 1.0, lengthPenalty = 1.0, onSegment, signal} = options;
    if (!(samples instanceof Float32Array)) throw new KilnError('transcribe: the audio must be a Float32Array of samples');
    if (!samples.length) throw new KilnError('the audio is empty (no samples)');
    const beams = this.spec.beams ?? 1;
    if (!Number.isInteger(beamSize) || beamSize < 1 || beamSize > beams) {
      throw new KilnError(`beam size ${beamSize} is not from 1 to ${beams} (the decoder's cache holds ${beams} ` +
        'hypotheses; kiln compile --beams sets it)');
    }
    if (!(patience > 0) || !Number.isFinite(lengthPenalty)) {
      throw new KilnError(`patience must be > 0 and lengthPenalty finite, not ${patience}, ${lengthPenalty}`);
    }
    if (task !== 'transcribe' && task !== 'translate') {
      throw new KilnError(`task must be 'transcribe' or 'translate', not '${task}'`);
    }
    const langs = this.spec.languages ?? {};
    if (language !== undefined && !(this.spec.multilingual && language in langs)) {
      const known = this.spec.multilingual ? Object.keys(langs).sort().join(', ') : 'none: English only';
      throw new KilnError(`language '${language}' is not one of the model's (${known})`);
    }
    const seconds = samples.length / sampleRate;
    if (seconds > MAX_AUDIO_S) {
      throw new KilnError(`the audio is ${seconds.toFixed(0)} s long; at most ${MAX_AUDIO_S} s is transcribed at once ` +
        '(split it)');
    }
    if (this.busy) throw new KilnError('this speech session is already transcribing (its decoder holds one cache)');
    this.busy = true;
    const stats = new TranscriptionStats();
    stats.audioS = seconds;
    /** @type {Segment[]} */
    const segments = [];
    const t0 = performance.now();
    try {
      const audio = await this.resample(samples, sampleRate);
      stats.resampleMs = performance.now() - t0;
      const t1 = performance.now();
      const {mel, frames, max} = await this.features(audio);
      stats.featuresMs = performance.now() - t1;
      await this.windows(mel, frames, max, {timestamps, language: language ?? 'en', task, conditionOnPreviousText,
        maxInitial: Math.round(maxInitialTimestamp / this.spec.time_precision), signal,
        search: {beam: beamSize, patience, lengthPenalty}}, stats, (segment) => {
        segments.push(segment);
        onSegment?.(segment);
      });
    } finally {
      this.busy = false;
    }
    stats.totalMs = performance.now() - t0;
    return {segments, text: segments.map((s) => s.text).join('').trim(), stats};
  }

  /**
   * The windows of a recording's features, decoded one after another.
   * @private
   * @param {Float32Array} mel @param {number} frames @param {number} max
   * @param {{timestamps: boolean, language: string, task: string, conditionOnPreviousText: boolean,
   *   maxInitial: number, signal?: AbortSignal, search: {beam: number, patience: number, lengthPenalty: number}}} o
   * @param {TranscriptionStats} stats @param {(s: Segment) => void} emit
   */
  async windows(mel, frames, max, o, stats, emit) {
    const s = this.spec; const tk = s.tokens;
    const perChunk = s.frames; const nMels = s.n_mels; const perS = s.sample_rate / s.hop;
    const content = frames - 1;
    const begin = tk.timestamp_begin;
    const gpu = this.target === 'webgpu';
    /** @type {number[]} */
    const history = [];
    let seek = 0; let reset = 0;
    const window = new Float32Array(nMels * perChunk);
    while (seek < content) {
      if (o.signal?.aborted) throw new KilnError('transcription aborted');
      const size = Math.min(perChunk, content - seek);
      const offset = seek / perS;
      window.fill(0);
      for (let m = 0; m < nMels; m++) window.set(mel.subarray(m * frames + seek, m * frames + seek + size), m * perChunk);
      const te = performance.now();
      const enc = await this.parts.encoder.run({
        log_mel: new Tensor('float32', window, [1, nMels, perChunk]),
        log_mel_max: new Tensor('float32', Float32Array.of(max), [1]),
        frames: new Tensor('int64', BigInt64Array.of(BigInt(size)), [1])}, {output: gpu ? 'gpu' : 'cpu'});
      if (gpu) await this.parts.encoder.device.queue.onSubmittedWorkDone();  // the encoder's time, not the decoder's
      stats.encodeMs += performance.now() - te;
      stats.windows += 1;
      const prompt = this.prompt(history.slice(reset), o.timestamps, o.language, o.task);
      const maxNew = Math.min(s.max_context / 2, s.max_context - (prompt.length - 1));
      const tokens = o.search.beam > 1
        ? await this.decodeBeam(enc.encoder_hidden_states, prompt, o.timestamps, maxNew, o.maxInitial, o.search, stats,
          o.signal)
        : await this.decode(enc.encoder_hidden_states, prompt, o.timestamps, maxNew, o.maxInitial, stats, o.signal);
      free(enc);
      const [found, next] = split(tokens, begin, offset, size, size / perS, seek, s.time_precision, s.input_stride);
      seek = next > seek ? next : seek + size;  // a last timestamp of <|0.00|> would repeat the window for ever
      for (const segment of found) {
        const text = this.tokenizer.decode(segment.tokens.filter((t) => t < tk.eot), {skip_special_tokens: false});
        if (segment.start === segment.end || !text.trim()) continue;
        segment.text = text;
        history.push(...segment.tokens);
        emit(segment);
      }
      if (!o.conditionOnPreviousText) reset = history.length;
    }
  }

  /**
   * @private
   * @param {number[]} previous @param {boolean} timestamps @param {string} language @param {string} task
   * @returns {number[]}
   */
  prompt(previous, timestamps, language, task) {
    const s = this.spec; const tk = s.tokens;
    const prompt = previous.length ? [tk.sot_prev, ...previous.slice(-(s.max_context / 2 - 1))] : [];
    prompt.push(tk.sot);
    if (s.multilingual) prompt.push(s.languages[language], tk[task]);
    if (!timestamps) prompt.push(tk.no_timestamps);
    return prompt;
  }

  /**
   * One decoder step: `ids` `[B, T]` after `cached` tokens (its outputs stay on the GPU with WebGPU).
   * @private
   * @param {number[][]} ids @param {number} cached @param {Tensor | GPUTensor} memory the encoder's output, or none
   * @returns {Promise<Record<string, Tensor | GPUTensor>>}
   */
  step(ids, cached, memory) {
    return this.parts.decoder.run({
      input_ids: new Tensor('int64', BigInt64Array.from(ids.flat(), BigInt), [ids.length, ids[0].length]),
      past_sequence_length: new Tensor('int64', BigInt64Array.of(BigInt(cached)), [1]),
      encoder_hidden_states: memory}, {output: this.target === 'webgpu' ? 'gpu' : 'cpu'});
  }

  /**
   * Greedy decoding of one window: the prompt, then up to `maxNew` tokens (the end token excluded).
   * @private
   * @param {Tensor | GPUTensor} states the encoder's output @param {number[]} prompt @param {boolean} timestamps
   * @param {number} maxNew @param {number} maxInitial @param {TranscriptionStats} stats @param {AbortSignal} [signal]
   * @returns {Promise<number[]>}
   */
  async decode(states, prompt, timestamps, maxNew, maxInitial, stats, signal) {
    const empty = new Tensor('float32', new Float32Array(0), [1, 0, this.spec.width]);
    /** @type {number[]} */
    const generated = [];
    let ids = prompt; let cached = 0; let memory = states;
    const t0 = performance.now();
    try {
      while (generated.length < maxNew) {
        if (signal?.aborted) throw new KilnError('transcription aborted');
        const out = await this.step([ids], cached, memory);
        cached += ids.length;
        memory = empty;
        let token;
        if (timestamps || !generated.length) {
          const logits = /** @type {Float32Array} */ ((await read(out.logits)).data);
          token = argmax(suppressed(logits, generated, timestamps, maxInitial, this.spec));
        } else {
          token = Number((await read(out.next_token)).data.at(-1));
        }
        free(out);
        if (token === this.spec.tokens.eot) break;
        generated.push(token);
        ids = [token];
      }
    } finally {
      stats.decodeMs += performance.now() - t0;
      stats.tokens += generated.length;
    }
    return generated;
  }

  /**
   * Beam search over one window (kiln/runtime/speech.py's `_decode_beam`, CTranslate2's BeamSearch::search): each
   * step's log-probabilities (after the same suppression as greedy decoding) added to each hypothesis' sum, the
   * best `2 * beam` continuations; of the first `beam`, one ending (the end token or the step limit) is finished
   * and replaced by the next that does not end. Done at `round(beam * patience)` finished hypotheses; the best by
   * sum / length ** lengthPenalty. The decoder's self-attention cache is reordered after each step.
   * @private
   * @param {Tensor | GPUTensor} states @param {number[]} prompt @param {boolean} timestamps @param {number} maxNew
   * @param {number} maxInitial @param {{beam: number, patience: number, lengthPenalty: number}} search
   * @param {TranscriptionStats} stats @param {AbortSignal} [signal]
   * @returns {Promise<number[]>}
   */
  async decodeBeam(states, prompt, timestamps, maxNew, maxInitial, search, stats, signal) {
    const {beam, patience, lengthPenalty} = search;
    const eot = this.spec.tokens.eot;
    const empty = new Tensor('float32', new Float32Array(0), [1, 0, this.spec.width]);
    const candidates = 2 * beam; const enough = Math.max(1, Math.round(beam * patience));
    /** @type {[number, number[]][]} */
    const finished = [];
    /** @type {number[][]} */
    let alive = [[]];
    let sums = [0];
    const t0 = performance.now();
    /** @type {number[]} */
    let best = [];
    try {
      let out = await this.step([prompt], 0, states);
      let cached = prompt.length;
      for (let s = 0; s < maxNew; s++) {
        if (signal?.aborted) throw new KilnError('transcription aborted');
        const logits = /** @type {Float32Array} */ ((await read(out.logits)).data);
        free(out);
        const vocab = logits.length / alive.length;
        const total = new Float32Array(logits.length);
        alive.forEach((seq, b) => {
          const row = logSoftmax(suppressed(logits.subarray(b * vocab, (b + 1) * vocab), seq, timestamps, maxInitial,
            this.spec));
          for (let i = 0; i < vocab; i++) total[b * vocab + i] = row[i] + sums[b];
        });
        const top = topIndices(total, candidates);
        const last = s + 1 === maxNew;
        const keep = []; let spare = beam;
        for (let k = 0; k < Math.min(beam, top.length); k++) {
          let pick = k;
          const token = top[k] % vocab;
          if (token === eot || last) {
            const seq = alive[Math.floor(top[k] / vocab)];
            finished.push([total[top[k]], token === eot ? seq : [...seq, token]]);
            for (let j = spare; j < top.length; j++) {
              if (top[j] % vocab !== eot) {
                pick = j; spare = j + 1;
                break;
              }
            }
          }
          keep.push(top[pick]);
        }
        if (last || finished.length >= enough) break;
        alive = keep.map((i) => [...alive[Math.floor(i / vocab)], i % vocab]);
        sums = keep.map((i) => total[i]);
        await this.parts.decoder.reorderState(keep.map((i) => Math.floor(i / vocab)));
        out = await this.step(alive.map((seq) => [seq[seq.length - 1]]), cached, empty);
        cached += 1;
      }
      /** @param {[number, number[]]} f */
      const normalised = ([score, seq]) => seq.length ? score / seq.length ** lengthPenalty : -Infinity;
      let chosen = null;
      for (const f of finished) if (!chosen || normalised(f) > normalised(chosen)) chosen = f;
      best = chosen ? chosen[1] : [];
    } finally {
      stats.decodeMs += performance.now() - t0;
    }
    stats.tokens += best.length;
    return best;
  }
}

/**
 * The best `count` entries of `x`, best first (ties: the lower index), without sorting all of it.
 * @param {Float32Array} x @param {number} count @returns {number[]}
 */
function topIndices(x, count) {
  /** @type {number[]} */
  const best = [];  // kept sorted, best first
  const worse = (a, b) => x[a] < x[b] || (x[a] === x[b] && a > b);
  for (let i = 0; i < x.length; i++) {
    if (best.length === count && !worse(best[count - 1], i)) continue;
    let at = best.length < count ? best.length : count - 1;
    best[at] = i;
    while (at > 0 && worse(best[at - 1], best[at])) {
      [best[at - 1], best[at]] = [best[at], best[at - 1]];
      at--;
    }
  }
  return best;
}

/** @param {Float32Array} x @returns {Float32Array} log(softmax(x)), -Infinity staying -Infinity */
function logSoftmax(x) {
  let top = -Infinity;
  for (const v of x) if (v > top) top = v;
  let sum = 0;
  for (const v of x) sum += Math.exp(v - top);
  const norm = top + Math.log(sum);
  return x.map((v) => v - norm);
}

/** @param {Float32Array} x @returns {number} the first index of the largest value */
function argmax(x) {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

/**
 * The logits with what may not come next at -Infinity (kiln/runtime/speech.py's `_suppressed`): the model's
 * suppress_ids, suppress_ids_begin first, and with timestamps CTranslate2's ApplyTimestampRules.
 * @param {Float32Array} logits @param {number[]} generated @param {boolean} timestamps @param {number} maxInitial
 * @param {any} spec @returns {Float32Array}
 */
export function suppressed(logits, generated, timestamps, maxInitial, spec) {
  const x = Float32Array.from(logits);
  const tk = spec.tokens;
  for (const i of spec.suppress_ids) x[i] = -Infinity;
  if (!generated.length) for (const i of spec.suppress_ids_begin) x[i] = -Infinity;
  if (!timestamps) return x;
  const eot = tk.eot; const begin = tk.timestamp_begin;
  x[tk.no_timestamps] = -Infinity;
  let check = true;
  if (!generated.length) {
    x.fill(-Infinity, 0, begin);
    x.fill(-Infinity, begin + maxInitial + 1);
    check = false;
  } else {
    const last = generated[generated.length - 1];
    if (last >= begin) {
      const penultimate = generated.length > 1 ? generated[generated.length - 2] : last;
      if (penultimate >= begin) {
        x.fill(-Infinity, begin);
        check = false;
      } else {
        x.fill(-Infinity, 0, eot);
        x.fill(-Infinity, begin, last);
      }
    } else {
      const stamps = generated.filter((t) => t >= begin);
      if (stamps.length) x.fill(-Infinity, begin, stamps[stamps.length - 1] + 1);
    }
  }
  if (check) {
    let textBest = -Infinity;
    for (let i = 0; i < begin; i++) if (x[i] > textBest) textBest = x[i];
    let top = -Infinity;
    for (let i = begin; i < x.length; i++) if (x[i] > top) top = x[i];
    let mass = -Infinity;
    if (Number.isFinite(top)) {
      let sum = 0;
      for (let i = begin; i < x.length; i++) sum += Math.exp(x[i] - top);
      mass = top + Math.log(sum);
    }
    if (mass > textBest) x.fill(-Infinity, 0, begin);
  }
  return x;
}

/**
 * A window's tokens as segments and the next seek (frames): faster-whisper's `_split_segments_by_timestamps`.
 * @param {number[]} tokens @param {number} begin @param {number} offset @param {number} size
 * @param {number} duration @param {number} seek @param {number} precision @param {number} stride
 * @returns {[Segment[], number]}
 */
function split(tokens, begin, offset, size, duration, seek, precision, stride) {
  const singleEnd = tokens.length >= 2 && tokens[tokens.length - 2] < begin && tokens[tokens.length - 1] >= begin;
  const pairs = [];
  for (let i = 1; i < tokens.length; i++) if (tokens[i] >= begin && tokens[i - 1] >= begin) pairs.push(i);
  if (pairs.length) {
    const cuts = singleEnd ? [...pairs, tokens.length] : pairs;
    /** @type {Segment[]} */
    const out = [];
    let last = 0;
    for (const cut of cuts) {
      const part = tokens.slice(last, cut);
      out.push({start: offset + (part[0] - begin) * precision, end: offset + (part[part.length - 1] - begin) * precision,
        text: '', tokens: part});
      last = cut;
    }
    return [out, singleEnd ? seek + size : seek + (tokens[last - 1] - begin) * stride];
  }
  let end = duration;
  const stamps = tokens.filter((t) => t >= begin);
  if (stamps.length && stamps[stamps.length - 1] !== begin) end = (stamps[stamps.length - 1] - begin) * precision;
  return [[{start: offset, end: offset + end, text: '', tokens}], seek + size];
}
