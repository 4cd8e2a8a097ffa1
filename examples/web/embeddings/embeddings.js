// Sentence embeddings in the browser: tokenize with the model's own tokenizer.json (@huggingface/tokenizers,
// vendored into ./vendor/ by `python examples/sentence_embeddings.py --web DIR`), run a Kiln MiniLM package
// with run-time dims (batch, seq) through kiln.js, mean-pool `last_hidden_state` over the attention mask and
// L2-normalise (as sentence-transformers and examples/sentence_embeddings.py do; Reimers & Gurevych,
// Sentence-BERT, EMNLP 2019), then compare the sentences by cosine similarity.
//
//   import {loadTokenizer, embed} from './embeddings.js';
//   const tokenizer = await loadTokenizer('./');                // tokenizer.json + tokenizer_config.json
//   const session = await kiln.load('../');                     // the package
//   const {embeddings, cosine} = await embed(kiln, session, tokenizer, ['A man is eating.', 'He eats.']);
//
// No bundler: plain ES modules, typed with JSDoc.

import {Tokenizer} from './vendor/tokenizers.mjs';

/**
 * @typedef {object} TextTokenizer
 * @property {Tokenizer} tokenizer the library's tokenizer of tokenizer.json.
 * @property {number} maxLength tokens per sentence after truncation, special tokens included
 *   (tokenizer.json's `truncation.max_length`, 512 when it has none).
 * @property {number} prefix special tokens the post-processor puts before the sentence ([CLS]: 1).
 * @property {number} suffix special tokens it puts after it ([SEP]: 1).
 * @property {number} padId the id padding positions get (`padding.pad_id`, else [PAD]'s).
 * @property {(text: string) => string} prepare the text as the library must see it (see {@link textFixes}).
 */

/**
 * @typedef {object} Batch
 * @property {number} batch rows (sentences, plus padding rows when the package's batch dim is larger).
 * @property {number} seq tokens per row: the longest sentence, or the package's smallest/static seq.
 * @property {BigInt64Array} inputIds [batch, seq] row-major; padding positions hold `padId`.
 * @property {BigInt64Array} attentionMask [batch, seq]: 1 on tokens, 0 on padding.
 * @property {BigInt64Array} tokenTypeIds [batch, seq] (0 for single sentences).
 * @property {number[][]} ids each sentence's token ids, unpadded.
 */

/**
 * Load a tokenizer.json (and its tokenizer_config.json) from a directory URL.
 * @param {string | URL} base URL of the directory holding both files (relative URLs resolve against the page).
 * @param {typeof fetch} [fetcher]
 * @returns {Promise<TextTokenizer>}
 * @throws {Error} a file is missing or the post-processor is not one whose special tokens this page can place.
 */
export async function loadTokenizer(base, fetcher = fetch) {
  const url = (name) => new URL(name, new URL(base, globalThis.location?.href));
  const get = async (name) => {
    const response = await fetcher(url(name));
    if (!response.ok) throw new Error(`${url(name)}: HTTP ${response.status}`);
    return response.json();
  };
  const [json, config] = await Promise.all([get('tokenizer.json'), get('tokenizer_config.json')]);
  return fromJSON(json, config);
}

/**
 * A {@link TextTokenizer} from parsed tokenizer.json and tokenizer_config.json objects.
 * @param {any} json tokenizer.json
 * @param {any} config tokenizer_config.json
 * @returns {TextTokenizer}
 * @throws {Error} a post-processor other than TemplateProcessing or BertProcessing.
 */
export function fromJSON(json, config) {
  const tokenizer = new Tokenizer(json, config);
  const post = json.post_processor;
  let prefix, suffix;
  if (post?.type === 'TemplateProcessing') {
    const at = post.single.findIndex((piece) => 'Sequence' in piece);
    prefix = at;
    suffix = post.single.length - at - 1;
  } else if (post?.type === 'BertProcessing') {
    prefix = suffix = 1;
  } else {
    throw new Error(`tokenizer.json: post-processor ${post?.type ?? 'none'} is not supported here ` +
      '(TemplateProcessing or BertProcessing)');
  }
  const maxLength = json.truncation?.max_length ?? 512;
  const padId = json.padding?.pad_id ?? tokenizer.token_to_id('[PAD]') ?? 0;
  return {tokenizer, maxLength, prefix, suffix, padId, prepare: textFixes(json.normalizer)};
}

// CJK ideographs outside the Basic Multilingual Plane that BERT's normalizer splits off as words
// (Unified Ideographs Extensions B to F and the Compatibility Ideographs Supplement; the BMP ranges
// are handled by the library).
const ASTRAL_CJK = /[\u{20000}-\u{2A6DF}\u{2A700}-\u{2B73F}\u{2B740}-\u{2B81F}\u{2B920}-\u{2CEAF}\u{2F800}-\u{2FA1F}]/gu;

/**
 * What the text needs before @huggingface/tokenizers 0.2.0 sees it, so that its ids equal the Rust
 * `tokenizers` library's (which the model's tokenizer.json was written for): for a BertNormalizer,
 * - with `lowercase`: JavaScript's `toLowerCase` maps a word-final 'Σ' to 'ς' (Unicode final-sigma rule)
 *   where Rust lowercases character by character to 'σ'; mapping 'Σ' to 'σ' first gives Rust's result;
 * - with `handle_chinese_chars`: the library tests UTF-16 code units, so ideographs outside the BMP are
 *   not split off; putting spaces around them first does what Rust's normalizer does.
 * (Both are exact: the normalizer would produce the same characters and spaces itself.)
 * @param {any} normalizer tokenizer.json's `normalizer`
 * @returns {(text: string) => string}
 */
export function textFixes(normalizer) {
  const berts = normalizer?.type === 'Sequence' ? normalizer.normalizers : [normalizer];
  const bert = berts.find((n) => n?.type === 'BertNormalizer');
  if (!bert) return (text) => text;
  return (text) => {
    let out = text;
    if (bert.lowercase ?? true) out = out.replaceAll('\u03A3', '\u03C3');
    if (bert.handle_chinese_chars ?? true) out = out.replace(ASTRAL_CJK, ' $& ');
    return out;
  };
}

/**
 * Tokenize one sentence as tokenizer.json says: special tokens added, truncated to `maxLength` tokens
 * (the sentence's last tokens dropped, its special tokens kept).
 * @param {TextTokenizer} tok
 * @param {string} text
 * @param {number} [maxLength=tok.maxLength] a tighter bound (e.g. the package's largest seq).
 * @returns {{ids: number[], attentionMask: number[], tokenTypeIds: number[]}}
 */
export function encode(tok, text, maxLength = tok.maxLength) {
  const e = tok.tokenizer.encode(tok.prepare(text), {return_token_type_ids: true});
  const cut = (values) => values.length <= maxLength ? values
    : [...values.slice(0, maxLength - tok.suffix), ...values.slice(values.length - tok.suffix)];
  if (maxLength < tok.prefix + tok.suffix + 1) throw new Error(`maxLength ${maxLength} leaves no room for a token`);
  return {ids: cut(e.ids), attentionMask: cut(e.attention_mask), tokenTypeIds: cut(e.token_type_ids)};
}

/**
 * Tokenize sentences into one padded batch (padding on the right, attention mask 0 there).
 * @param {TextTokenizer} tok
 * @param {string[]} sentences
 * @param {{maxLength?: number, minSeq?: number, minBatch?: number}} [options] `maxLength` caps tokens per
 *   sentence; `seq` is at least `minSeq`; rows of padding are added up to `minBatch` rows.
 * @returns {Batch}
 * @throws {Error} no sentences.
 */
export function encodeBatch(tok, sentences, {maxLength = tok.maxLength, minSeq = 1, minBatch = 1} = {}) {
  if (!sentences.length) throw new Error('no sentences to tokenize');
  const rows = sentences.map((s) => encode(tok, s, maxLength));
  const batch = Math.max(rows.length, minBatch);
  const seq = Math.max(minSeq, ...rows.map((r) => r.ids.length));
  const inputIds = new BigInt64Array(batch * seq).fill(BigInt(tok.padId));
  const attentionMask = new BigInt64Array(batch * seq);
  const tokenTypeIds = new BigInt64Array(batch * seq);
  rows.forEach((r, b) => {
    for (let i = 0; i < r.ids.length; i++) {
      inputIds[b * seq + i] = BigInt(r.ids[i]);
      attentionMask[b * seq + i] = BigInt(r.attentionMask[i]);
      tokenTypeIds[b * seq + i] = BigInt(r.tokenTypeIds[i]);
    }
  });
  return {batch, seq, inputIds, attentionMask, tokenTypeIds, ids: rows.map((r) => r.ids)};
}

/**
 * Mean of `hidden` [batch, seq, dim] over the positions where `mask` is 1, L2-normalised per row.
 * @param {Float32Array} hidden [batch, seq, dim]
 * @param {BigInt64Array | ArrayLike<number | bigint>} mask [batch, seq]
 * @param {number[]} dims [batch, seq, dim]
 * @param {number} [rows=dims[0]] rows to pool (the first ones; the rest are padding rows).
 * @returns {Float32Array} [rows, dim] unit vectors (a row whose mask is all 0 stays 0).
 */
export function meanPool(hidden, mask, [batch, seq, dim], rows = batch) {
  const out = new Float32Array(rows * dim);
  const sum = new Float64Array(dim);
  for (let b = 0; b < rows; b++) {
    sum.fill(0);
    let count = 0;
    for (let s = 0; s < seq; s++) {
      if (Number(mask[b * seq + s]) === 0) continue;
      count++;
      const at = (b * seq + s) * dim;
      for (let d = 0; d < dim; d++) sum[d] += hidden[at + d];
    }
    let norm = 0;
    for (let d = 0; d < dim; d++) {
      sum[d] /= Math.max(count, 1e-9);
      norm += sum[d] * sum[d];
    }
    norm = Math.max(Math.sqrt(norm), 1e-12);
    for (let d = 0; d < dim; d++) out[b * dim + d] = sum[d] / norm;
  }
  return out;
}

/**
 * Cosine similarities of unit vectors: their dot products.
 * @param {Float32Array} embeddings [n, dim] unit vectors
 * @param {number} dim
 * @returns {Float32Array} [n, n]
 */
export function cosineMatrix(embeddings, dim) {
  const n = embeddings.length / dim;
  const out = new Float32Array(n * n);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      let dot = 0;
      for (let d = 0; d < dim; d++) dot += embeddings[i * dim + d] * embeddings[j * dim + d];
      out[i * n + j] = dot;
    }
  }
  return out;
}

/**
 * Each axis of a package input as [smallest, largest] size: a run-time dim's bounds, or a static size twice.
 * @param {any} manifest the package's manifest (`session.manifest`)
 * @param {string} name an input's name
 * @returns {[number, number][]}
 * @throws {Error} no such input, or an axis that is a size expression rather than one dim.
 */
export function inputBounds(manifest, name) {
  const spec = manifest.inputs.find((s) => s.name === name);
  if (!spec) throw new Error(`the package has no input '${name}' (it has: ${manifest.inputs.map((s) => s.name)})`);
  const dyn = Object.fromEntries((manifest.dynamic_dims ?? []).map((d) => [d.name, [d.min, d.max]]));
  return (spec.dynamic_shape ?? spec.shape).map((d, axis) => {
    if (typeof d === 'number') return [d, d];
    if (typeof d === 'string' && d in dyn) return dyn[d];
    throw new Error(`input '${name}' axis ${axis} is ${JSON.stringify(d)}, not a dim this page can fill`);
  });
}

/**
 * Embed sentences with a loaded MiniLM-like package (inputs input_ids, attention_mask and optionally
 * token_type_ids, int64 [batch, seq]; output last_hidden_state float32 [batch, seq, dim]). Sentences are
 * run in batches of the package's largest batch, each padded to its longest sentence (at least the
 * package's smallest seq) and truncated to the tokenizer's and the package's largest seq.
 * @param {any} kiln the kiln.js module
 * @param {any} session a kiln.js Session of the package
 * @param {TextTokenizer} tok
 * @param {string[]} sentences
 * @returns {Promise<{embeddings: Float32Array, dim: number, cosine: Float32Array, ids: number[][],
 *   batches: {batch: number, seq: number}[]}>} `embeddings` [n, dim] unit vectors, `cosine` [n, n],
 *   `ids` each sentence's token ids, `batches` the shapes that ran.
 * @throws {Error} no sentences; and what `session.run` throws (kiln.ShapeError, kiln.DeviceError).
 */
export async function embed(kiln, session, tok, sentences) {
  if (!sentences.length) throw new Error('no sentences to embed');
  const [[minBatch, maxBatch], [minSeq, maxSeq]] = inputBounds(session.manifest, 'input_ids');
  const names = new Set(session.inputs.map((s) => s.name));
  const maxLength = Math.min(tok.maxLength, maxSeq);
  const parts = [], ids = [], batches = [];
  let dim = 0;
  for (let start = 0; start < sentences.length; start += maxBatch) {
    const chunk = sentences.slice(start, start + maxBatch);
    const b = encodeBatch(tok, chunk, {maxLength, minSeq, minBatch});
    const shape = [b.batch, b.seq];
    const feeds = {
      input_ids: new kiln.Tensor('int64', b.inputIds, shape),
      attention_mask: new kiln.Tensor('int64', b.attentionMask, shape),
    };
    if (names.has('token_type_ids')) feeds.token_type_ids = new kiln.Tensor('int64', b.tokenTypeIds, shape);
    const {last_hidden_state: hidden} = await session.run(feeds);
    dim = hidden.dims[2];
    parts.push(meanPool(hidden.data, b.attentionMask, hidden.dims, chunk.length));
    ids.push(...b.ids);
    batches.push({batch: b.batch, seq: b.seq});
  }
  const embeddings = new Float32Array(sentences.length * dim);
  parts.reduce((at, p) => (embeddings.set(p, at), at + p.length), 0);
  return {embeddings, dim, cosine: cosineMatrix(embeddings, dim), ids, batches};
}
