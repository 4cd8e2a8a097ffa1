// Kiln browser runtime: image pre-processing and classification post-processing, as a
// package's `preprocess` and `postprocess` entries describe them (zero dependencies besides
// errors.js and tensor.js).

import {KilnError} from './errors.js';
import {Tensor} from './tensor.js';

/**
 * @typedef {object} ImagePreprocess  the manifest's `preprocess` entry for images
 * @property {'image'} type
 * @property {number} resize  the shorter side is resized to this many pixels (bilinear)
 * @property {number} crop  then a centred square of this many pixels is cut out
 * @property {number} [scale=1/255]  pixel values (0..255) are multiplied by this
 * @property {number[]} [mean=[0, 0, 0]]  per-channel (RGB) mean subtracted after scaling
 * @property {number[]} [std=[1, 1, 1]]  per-channel (RGB) standard deviation divided by last
 * @property {'NCHW'} layout
 */

/**
 * Turn an image into a model input as the package's `preprocess` entry describes: resize the
 * shorter side to `resize` pixels (bilinear, through a 2D canvas), cut out the centred
 * `crop` x `crop` square, multiply by `scale`, subtract `mean` and divide by `std` per RGB
 * channel. Resized sizes round to the nearest pixel and the crop offset rounds down, as
 * PIL-based reference pipelines do; the canvas smooths like PIL's antialiased bilinear
 * filter to within a level or two of 255 on average.
 *
 * @param {ImageBitmap | HTMLImageElement | HTMLCanvasElement | OffscreenCanvas | HTMLVideoElement | VideoFrame} image
 *   a decoded image (for an `<img>`, wait for `img.decode()` first).
 * @param {ImagePreprocess} preprocess the manifest's `preprocess` entry.
 * @returns {Tensor} float32 tensor of shape [1, 3, crop, crop] (NCHW).
 * @throws {KilnError} an unsupported preprocess entry or an image without pixels.
 */
export function preprocessImage(image, preprocess) {
  const {type, resize, crop, scale = 1 / 255, mean = [0, 0, 0], std = [1, 1, 1], layout = 'NCHW'} = preprocess ?? {};
  if (type !== 'image' || layout !== 'NCHW' || !(resize > 0) || !(crop > 0)) {
    throw new KilnError(`preprocessImage: unsupported preprocess entry ${JSON.stringify(preprocess)} ` +
      `(need type 'image', layout 'NCHW', positive resize and crop)`);
  }
  const width = image.naturalWidth || image.videoWidth || image.displayWidth || image.width;
  const height = image.naturalHeight || image.videoHeight || image.displayHeight || image.height;
  if (!(width > 0 && height > 0)) throw new KilnError('preprocessImage: the image has no pixels (not decoded yet?)');
  const ratio = resize / Math.min(width, height);
  const resizedWidth = Math.round(width * ratio);
  const resizedHeight = Math.round(height * ratio);
  const left = Math.floor((resizedWidth - crop) / 2);
  const top = Math.floor((resizedHeight - crop) / 2);
  const canvas = typeof OffscreenCanvas === 'function'
    ? new OffscreenCanvas(crop, crop)
    : Object.assign(document.createElement('canvas'), {width: crop, height: crop});
  const context = canvas.getContext('2d', {willReadFrequently: true});
  context.imageSmoothingEnabled = true;
  // 'low' is plain bilinear; 'medium' also filters when shrinking, as PIL's bilinear resize does
  context.imageSmoothingQuality = 'medium';
  context.drawImage(image, -left, -top, resizedWidth, resizedHeight);
  const rgba = context.getImageData(0, 0, crop, crop).data;
  const plane = crop * crop;
  const data = new Float32Array(3 * plane);
  for (let c = 0; c < 3; c++) {
    const offset = c * plane;
    const m = mean[c];
    const s = std[c];
    for (let i = 0; i < plane; i++) data[offset + i] = (rgba[4 * i + c] * scale - m) / s;
  }
  return new Tensor('float32', data, [1, 3, crop, crop]);
}

/**
 * The `k` highest-scoring classes of a logits vector, best first.
 * @param {Float32Array | number[]} logits class scores (one row).
 * @param {number} [k=5] how many classes to return (at most `logits.length`).
 * @param {boolean} [softmax=true] turn logits into probabilities first; otherwise `prob` is the raw score.
 * @returns {{index: number, prob: number}[]}
 */
export function topK(logits, k = 5, softmax = true) {
  const n = logits.length;
  let probs = Array.from(logits);
  if (softmax) {
    const max = probs.reduce((a, b) => Math.max(a, b), -Infinity);
    const exps = probs.map((x) => Math.exp(x - max));
    const sum = exps.reduce((a, b) => a + b, 0);
    probs = exps.map((e) => e / sum);
  }
  const order = Array.from({length: n}, (_, i) => i).sort((a, b) => probs[b] - probs[a]);
  return order.slice(0, Math.max(0, Math.min(k, n))).map((index) => ({index, prob: probs[index]}));
}
