"""Image pre-processing and classification post-processing, as a package's manifest describes them.

Used by ``kiln run --image``; the JS runtime implements the same steps for the demo page.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError


def load_image(path: str | os.PathLike, pre: dict[str, Any]) -> np.ndarray:
    """Read an image file and preprocess it as ``pre`` (the manifest's ``preprocess``) says.

    Resize the shorter side to ``pre["resize"]`` (bilinear), centre-crop ``pre["crop"]``
    square, multiply by ``pre["scale"]``, normalise per channel with ``mean``/``std``.

    Returns:
        float32 array [1, 3, crop, crop] (NCHW).

    Raises:
        KilnError: the file is missing or not an image Pillow can read.
    """
    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    if not p.exists():
        raise KilnError(f"{p}: no such image file")
    try:
        img = Image.open(p).convert("RGB")
    except (UnidentifiedImageError, OSError) as e:
        raise KilnError(f"{p}: not an image ({e})") from None
    size, crop = int(pre["resize"]), int(pre["crop"])
    w, h = img.size
    scale = size / min(w, h)
    img = img.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BILINEAR)
    w, h = img.size
    left, top = (w - crop) // 2, (h - crop) // 2
    img = img.crop((left, top, left + crop, top + crop))
    x = np.asarray(img, dtype=np.float32) * np.float32(pre.get("scale", 1 / 255))
    x = (x - np.asarray(pre["mean"], np.float32)) / np.asarray(pre["std"], np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None]).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (float64 for accuracy)."""
    z = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def top_k(logits: np.ndarray, labels: list[str], k: int = 5, apply_softmax: bool = True) -> list[tuple[int, str, float]]:
    """The ``k`` best classes of a [C] or [1, C] score vector: ``(index, label, probability)``."""
    scores = logits.reshape(-1)
    probs = softmax(scores) if apply_softmax else scores
    order = np.argsort(-probs)[:k]
    return [(int(i), labels[i] if i < len(labels) else str(i), float(probs[i])) for i in order]
