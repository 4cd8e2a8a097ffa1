"""Read the text of a scanned page with PP-OCRv4 (DBNet detection, line orientation, CTC recognition).

The three networks run through Kiln (compiled packages, natively on WebGPU through wgpu-py; lavapipe on
a machine without a GPU) or through onnxruntime, with the same pre- and post-processing (numpy, OpenCV,
pyclipper, shapely; ``pip install -e .[examples]``), so the two engines read exactly the same pixels.
The pipeline follows PaddleOCR's (``tools/infer/predict_system.py``) and RapidOCR's:

1. detection: resize so both sides are multiples of 32, normalise with ImageNet's mean and std, run
   DBNet, threshold its probability map, take each contour's minimum-area box, score it by the mean
   probability inside, expand ("unclip") it by ``area * ratio / perimeter`` (Liao et al., *Real-time
   Scene Text Detection with Differentiable Binarization*, AAAI 2020), sort boxes top to bottom then
   left to right;
2. each box is cut out with a perspective warp to an upright line image;
3. orientation: lines at height 48 (width 192) are classified 0° / 180° and flipped when 180°;
4. recognition: lines at height 48, sorted by width, in batches padded with zeros to the widest line of the
   batch (at least 320 wide) rounded up to a multiple of ``width_step``; CTC greedy decoding (Graves et al.,
   ICML 2006) over the character dictionary embedded in the recognition model's metadata (``character``:
   PaddleOCR's ``ppocr_keys_v1.txt``) plus the blank (class 0) and a space (the last class).

Kiln compiles one package per concrete input shape (the models' dims are symbolic) unless told otherwise
(``--dynamic-det``: one detector package with run-time height and width, 32..960 in multiples of 32, serves pages
of every size; docs/dynamic-shapes.md), so inputs are padded to a few shapes: batches of ``--batch`` lines (default 1; empty lines fill a short last batch) and recognition widths
rounded up to a multiple of ``--width-step`` (320: buckets 320, 640, 960, ...). Packages are cached in ``--cache`` and reused by later runs.
onnxruntime gets exactly the same padded inputs. Thresholds are RapidOCR's (box score 0.5, unclip ratio 1.6).

    python examples/ocr.py [IMAGE] [--engine kiln|onnxruntime|both] [--cache build/ocr-packages] [--dynamic-det]
                           [--scores]

prints one recognised line per text line, top to bottom (``--engine both`` also says whether Kiln's
text equals onnxruntime's).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from package_cache import cached_dynamic_package, cached_package, symbolic_dims

MODELS = (Path(__file__).resolve().parents[1] / ".." / "shared" / "models").resolve()
DET, CLS, REC = "ch_PP-OCRv4_det_infer.onnx", "ch_ppocr_mobile_v2.0_cls_infer.onnx", "ch_PP-OCRv4_rec_infer.onnx"
DEFAULT_IMAGE = MODELS / "samples" / "page.png"

#: a network: float32 NCHW batch in, its first output out
Runner = Callable[[np.ndarray], np.ndarray]


def _cv2():
    try:
        import cv2
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit("the OCR example needs opencv-python-headless, pyclipper and shapely: "
                         "pip install -e '.[examples]'") from e
    return cv2


# ---------------------------------------------------------------------------------------------- engines


def onnxruntime_runner(model: str | Path) -> Runner:
    """A runner for ``model`` on onnxruntime's CPU execution provider (needs ``onnxruntime``)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


class KilnRunner:
    """Runs one ONNX model through Kiln: a package per concrete input shape, compiled on first use into
    ``cache`` and reused (:func:`package_cache.cached_package`); a session per shape, loaded once.

    Args:
        model: the ``.onnx`` file (one float32 input).
        cache: directory of the packages (created; holds nothing but Kiln packages).
        device_class: ``cpu`` or ``gpu``, the schedules' target (see :func:`kiln.compile`).
        log: called with a line for each package compiled.
    """

    def __init__(self, model: str | Path, cache: str | Path, device_class: str = "cpu",
                 log: Callable[[str], None] | None = None):
        self.model, self.cache, self.device_class, self.log = Path(model), Path(cache), device_class, log
        (self.input_name,) = symbolic_dims(model)
        self._sessions: dict[tuple[int, ...], object] = {}

    def package(self, shape: tuple[int, ...]) -> Path:
        """The package for inputs of ``shape`` (compiled now unless cached). Raises ``kiln.ShapeError`` for a
        shape of the wrong rank, and what :func:`kiln.compile` raises."""
        return cached_package(self.model, self.cache, {self.input_name: shape}, self.device_class, self.log)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Run the model on ``x`` (float32, the model's input rank); returns its first output."""
        import kiln

        key = tuple(x.shape)
        if key not in self._sessions:
            self._sessions[key] = kiln.load(self.package(key))
        session = self._sessions[key]
        return next(iter(session.run({self.input_name: np.ascontiguousarray(x, np.float32)}).values()))


class DynamicDetRunner:
    """Runs the detector for pages of any size from ONE Kiln package with run-time height and width (multiples of
    32 from 32 to ``max_side``, as :func:`det_preprocess` makes them; docs/dynamic-shapes.md), compiled on first use
    into ``cache`` (:func:`package_cache.cached_dynamic_package`) instead of one package per page size.

    Args:
        model: the detector's ``.onnx`` file (input ``[N, 3, H, W]``; N is bound to 1).
        cache: directory of the packages.
        max_side: the largest height and width (a multiple of 32; :func:`det_preprocess`'s default limit is 960).
        device_class: ``cpu`` or ``gpu``, the schedules' target.
        log: called with a line when the package is compiled.

    Raises ``kiln.ShapeError`` (when run) for a page larger than ``max_side`` or a side that is not a multiple of 32.
    """

    def __init__(self, model: str | Path, cache: str | Path, max_side: int = 960, device_class: str = "cpu",
                 log: Callable[[str], None] | None = None):
        (self.input_name, keys), = symbolic_dims(model).items()
        n, _, h, w = keys
        self.dims = {n: 1, h: (32, max_side, max_side, 32), w: (32, max_side, max_side, 32)}
        self.model, self.cache, self.device_class, self.log = Path(model), Path(cache), device_class, log
        self._session = None

    def package(self) -> Path:
        """The package (compiled now unless cached)."""
        return cached_dynamic_package(self.model, self.cache, self.dims, self.device_class, self.log)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Run the detector on ``x`` (float32 [1, 3, H, W]); returns its probability map [1, 1, H, W]."""
        import kiln

        if self._session is None:
            self._session = kiln.load(self.package())
        return next(iter(self._session.run({self.input_name: np.ascontiguousarray(x, np.float32)}).values()))


@dataclass
class Engine:
    """The three networks of the pipeline, each a :data:`Runner`."""

    det: Runner
    cls: Runner
    rec: Runner


def make_engine(name: str, models: str | Path = MODELS, cache: str | Path = "build/ocr-packages",
                device_class: str = "cpu", log: Callable[[str], None] | None = None,
                dynamic_det: int | None = None) -> Engine:
    """``kiln`` (packages in ``cache``, schedules for ``device_class``; with ``dynamic_det``, one detector package
    for pages up to ``dynamic_det`` pixels a side, :class:`DynamicDetRunner`) or ``onnxruntime``.
    Raises ``ValueError`` for another name."""
    models = Path(models)
    if name == "onnxruntime":
        return Engine(*(onnxruntime_runner(models / f) for f in (DET, CLS, REC)))
    if name == "kiln":
        engine = Engine(*(KilnRunner(models / f, cache, device_class, log) for f in (DET, CLS, REC)))
        if dynamic_det:
            engine.det = DynamicDetRunner(models / DET, cache, dynamic_det, device_class, log)
        return engine
    raise ValueError(f"engine must be 'kiln' or 'onnxruntime', not {name!r}")


def rec_characters(model: str | Path = MODELS / REC) -> list[str]:
    """The recognition model's classes: ``""`` (the CTC blank, class 0), the ``character`` dictionary from the
    model's metadata (one character a line), then ``" "``. Raises ``ValueError`` if the metadata lacks it."""
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(model), load_external_data=False).metadata_props}
    if "character" not in meta:
        raise ValueError(f"{model}: no 'character' dictionary in the model's metadata")
    return [""] + meta["character"].splitlines() + [" "]


# ---------------------------------------------------------------------------------------------- detection


def det_preprocess(image: np.ndarray, limit_side_len: int = 960) -> np.ndarray:
    """``image`` (uint8 HxWx3, BGR) -> float32 [1, 3, H', W']: scaled down so its longer side is at most
    ``limit_side_len``, each side rounded to a multiple of 32 (at least 32), ``(x / 255 - mean) / std`` with
    ImageNet's mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225) (PaddleOCR's ``DetResizeForTest``)."""
    cv2 = _cv2()
    h, w = image.shape[:2]
    ratio = min(1.0, limit_side_len / max(h, w))
    rh, rw = (max(32, round(s * ratio / 32) * 32) for s in (h, w))
    x = cv2.resize(image, (rw, rh)).astype(np.float32) / 255.0
    x = (x - np.float32([0.485, 0.456, 0.406])) / np.float32([0.229, 0.224, 0.225])
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def _mini_box(contour: np.ndarray) -> tuple[np.ndarray, float]:
    """The minimum-area rectangle around ``contour`` as 4 points (top-left, top-right, bottom-right,
    bottom-left) and its shorter side."""
    cv2 = _cv2()
    rect = cv2.minAreaRect(contour)
    p = sorted(cv2.boxPoints(rect).tolist(), key=lambda q: q[0])
    tl, bl = (p[0], p[1]) if p[1][1] > p[0][1] else (p[1], p[0])
    tr, br = (p[2], p[3]) if p[3][1] > p[2][1] else (p[3], p[2])
    return np.array([tl, tr, br, bl], np.float32), min(rect[1])


def _box_score(prob: np.ndarray, box: np.ndarray) -> float:
    """Mean of ``prob`` inside the polygon ``box`` (PaddleOCR's ``box_score_fast``)."""
    cv2 = _cv2()
    h, w = prob.shape
    x0, y0 = np.clip(np.floor(box.min(0)), 0, [w - 1, h - 1]).astype(int)
    x1, y1 = np.clip(np.ceil(box.max(0)), 0, [w - 1, h - 1]).astype(int)
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), np.uint8)
    cv2.fillPoly(mask, (box - [x0, y0]).reshape(1, -1, 2).astype(np.int32), 1)
    return cv2.mean(prob[y0:y1 + 1, x0:x1 + 1], mask)[0]


def _unclip(box: np.ndarray, ratio: float) -> np.ndarray:
    """``box`` grown by ``area * ratio / perimeter`` with rounded corners (pyclipper), as points [K, 2]."""
    import pyclipper
    from shapely.geometry import Polygon

    poly = Polygon(box)
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(box.tolist(), pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    paths = offset.Execute(poly.area * ratio / poly.length)
    return np.array(paths[0] if paths else box, np.float32).reshape(-1, 2)


def db_postprocess(prob: np.ndarray, size: tuple[int, int], thresh: float = 0.3, box_thresh: float = 0.5,
                   unclip_ratio: float = 1.6, max_candidates: int = 1000, min_size: int = 3) -> np.ndarray:
    """DBNet's probability map ``prob`` (float32 [H', W']) -> text boxes float32 [K, 4, 2] in the pixels of the
    original image of ``size`` (height, width): pixels above ``thresh``, contours, minimum-area boxes scored by
    their mean probability (kept above ``box_thresh``), unclipped by ``unclip_ratio``, clipped to the image,
    sorted top to bottom, then left to right within 10 pixels (PaddleOCR's defaults)."""
    cv2 = _cv2()
    (h, w), (mh, mw) = size, prob.shape
    contours = cv2.findContours((prob > thresh).astype(np.uint8) * 255, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)[-2]
    boxes = []
    for contour in contours[:max_candidates]:
        box, side = _mini_box(contour)
        if side < min_size or _box_score(prob, box) < box_thresh:
            continue
        box, side = _mini_box(_unclip(box, unclip_ratio).reshape(-1, 1, 2))
        if side < min_size + 2:
            continue
        box[:, 0] = np.clip(np.round(box[:, 0] / mw * w), 0, w - 1)
        box[:, 1] = np.clip(np.round(box[:, 1] / mh * h), 0, h - 1)
        if np.linalg.norm(box[0] - box[1]) <= 3 or np.linalg.norm(box[0] - box[3]) <= 3:
            continue
        boxes.append(box)
    boxes.sort(key=lambda b: (b[0][1], b[0][0]))
    for i in range(len(boxes) - 1):  # one line: tops within 10 px, left to right
        for j in range(i, -1, -1):
            if abs(boxes[j + 1][0][1] - boxes[j][0][1]) < 10 and boxes[j + 1][0][0] < boxes[j][0][0]:
                boxes[j], boxes[j + 1] = boxes[j + 1], boxes[j]
            else:
                break
    return np.array(boxes, np.float32).reshape(-1, 4, 2)


def crop_line(image: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The quadrilateral ``box`` (float32 [4, 2], clockwise from top-left) of ``image`` warped to an upright
    rectangle (bicubic, edges replicated); turned 90° when it is at least 1.5 times taller than wide."""
    cv2 = _cv2()
    w = int(max(np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[2] - box[3])))
    h = int(max(np.linalg.norm(box[0] - box[3]), np.linalg.norm(box[1] - box[2])))
    m = cv2.getPerspectiveTransform(box, np.float32([[0, 0], [w, 0], [w, h], [0, h]]))
    line = cv2.warpPerspective(image, m, (w, h), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC)
    return np.rot90(line) if h >= 1.5 * w else line


# ---------------------------------------------------------------------------------------------- lines


def line_tensor(line: np.ndarray, width: int, max_width: int | None = None) -> np.ndarray:
    """A line image (uint8 HxWx3) -> float32 [3, 48, width]: resized to height 48 keeping its aspect ratio (at
    most ``max_width`` or ``width`` wide), ``(x / 255 - 0.5) / 0.5``, zero-padded on the right."""
    cv2 = _cv2()
    h, w = line.shape[:2]
    rw = min(max_width or width, width, math.ceil(48 * w / h))
    x = cv2.resize(line, (max(rw, 1), 48)).astype(np.float32).transpose(2, 0, 1) / 255.0
    out = np.zeros((3, 48, width), np.float32)
    out[:, :, :rw] = (x - 0.5) / 0.5
    return out


def _batches(n: int, batch: int):
    for start in range(0, n, batch):
        yield range(start, min(start + batch, n))


def _stack(tensors: list[np.ndarray], batch: int) -> np.ndarray:
    """Stack into [batch, ...], empty (zero) entries after the given ones."""
    x = np.zeros((batch, *tensors[0].shape), np.float32)
    x[:len(tensors)] = tensors
    return x


def classify_orientation(lines: list[np.ndarray], cls: Runner, batch: int = 1,
                         thresh: float = 0.9) -> list[np.ndarray]:
    """Each line flipped by 180° where the orientation network says 180° with probability above ``thresh``."""
    out = list(lines)
    for idx in _batches(len(lines), batch):
        probs = cls(_stack([line_tensor(lines[i], 192) for i in idx], batch))
        for i, p in zip(idx, probs):
            if p.argmax() == 1 and p[1] > thresh:
                out[i] = np.ascontiguousarray(lines[i][::-1, ::-1])
    return out


def ctc_greedy_decode(probs: np.ndarray, characters: list[str]) -> tuple[str, float]:
    """Per-step class probabilities float32 [T, C] -> (text, mean probability of its characters): the most
    likely class per step, repeats merged, blanks (class 0) dropped; score 0 for an empty text."""
    best, p = probs.argmax(1), probs.max(1)
    keep = best != 0
    keep[1:] &= best[1:] != best[:-1]
    text = "".join(characters[c] for c in best[keep])
    return text, float(p[keep].mean()) if keep.any() else 0.0


def recognize(lines: list[np.ndarray], rec: Runner, characters: list[str], batch: int = 1,
              width_step: int = 320) -> list[tuple[str, float]]:
    """(text, score) of each line: lines sorted by aspect ratio, batched, each batch at the width of its widest
    line (at least 320) rounded up to a multiple of ``width_step``, run through ``rec`` and CTC-decoded."""
    ratios = [ln.shape[1] / ln.shape[0] for ln in lines]
    order = np.argsort(ratios, kind="stable")
    out: list[tuple[str, float]] = [("", 0.0)] * len(lines)
    for idx in _batches(len(lines), batch):
        members = order[list(idx)]
        widest = max(320, max(math.ceil(48 * ratios[i]) for i in members))
        width = math.ceil(widest / width_step) * width_step
        probs = rec(_stack([line_tensor(lines[i], width) for i in members], batch))
        for i, p in zip(members, probs):
            out[i] = ctc_greedy_decode(p, characters)
    return out


@dataclass
class Line:
    """One recognised text line: its text, mean character probability and box (float32 [4, 2], image pixels)."""

    text: str
    score: float
    box: np.ndarray


def read_image(path: str | Path) -> np.ndarray:
    """An image file as uint8 HxWx3 BGR, OpenCV's and PaddleOCR's channel order (grey and RGBA images converted;
    read with Pillow). Raises ``FileNotFoundError``, or ``PIL.UnidentifiedImageError`` for a file that is not an
    image."""
    from PIL import Image

    if not Path(path).is_file():
        raise FileNotFoundError(f"no image at {path}")
    with Image.open(path) as im:
        return np.ascontiguousarray(np.asarray(im.convert("RGB"))[:, :, ::-1])


def ocr(image: np.ndarray, engine: Engine, characters: list[str], batch: int = 1, width_step: int = 320,
        text_score: float = 0.5) -> list[Line]:
    """Text lines of ``image`` (uint8 HxWx3 BGR), top to bottom, those scored below ``text_score`` left out."""
    prob = engine.det(det_preprocess(image))[0, 0]
    boxes = db_postprocess(prob, image.shape[:2])
    if len(boxes) == 0:
        return []
    lines = classify_orientation([crop_line(image, b) for b in boxes], engine.cls, batch)
    texts = recognize(lines, engine.rec, characters, batch, width_step)
    return [Line(t, s, b) for (t, s), b in zip(texts, boxes) if s >= text_score and t.strip()]


def main(argv: list[str] | None = None) -> int:
    """The command line: prints each line's text (``--scores``: with its score)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("image", nargs="?", help="image file (default: samples/page.png in --models)")
    ap.add_argument("--engine", choices=["kiln", "onnxruntime", "both"], default="kiln")
    ap.add_argument("--models", default=str(MODELS), help="directory of the three PP-OCR models")
    ap.add_argument("--cache", default="build/ocr-packages", help="directory of Kiln's compiled packages")
    ap.add_argument("--device-class", choices=["cpu", "gpu"], default="cpu",
                    help="Kiln's schedules: cpu for lavapipe/SwiftShader, gpu for GPUs")
    ap.add_argument("--batch", type=int, default=1,
                    help="lines per batch (Kiln compiles a package per batch size and width bucket)")
    ap.add_argument("--width-step", type=int, default=320,
                    help="recognition widths are rounded up to a multiple of this (one package per width)")
    ap.add_argument("--dynamic-det", action="store_true",
                    help="one detector package with run-time height and width (32..960, multiples of 32) for pages "
                         "of any size, instead of one package per page size")
    ap.add_argument("--scores", action="store_true", help="print each line's score too")
    args = ap.parse_args(argv)
    image = read_image(args.image or Path(args.models) / "samples" / "page.png")
    characters = rec_characters(Path(args.models) / REC)
    results = {}
    for name in (["kiln", "onnxruntime"] if args.engine == "both" else [args.engine]):
        engine = make_engine(name, args.models, args.cache, args.device_class,
                             log=lambda s: print(s, file=sys.stderr), dynamic_det=960 if args.dynamic_det else None)
        t0 = time.perf_counter()
        results[name] = ocr(image, engine, characters, args.batch, args.width_step)
        print(f"# {name}: {len(results[name])} lines in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    lines = next(iter(results.values()))
    for line in lines:
        print(f"{line.score:.3f}  {line.text}" if args.scores else line.text)
    if args.engine == "both":
        same = [ln.text for ln in results["kiln"]] == [ln.text for ln in results["onnxruntime"]]
        print(f"# kiln and onnxruntime read {'the same' if same else 'DIFFERENT'} text", file=sys.stderr)
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
