"""Fine-tune a new last layer of MobileNetV2 on a handful of images, on the device (Kiln eager mode).

The convolutional trunk runs as a compiled Kiln package (the ONNX model cut before its classifier, so it
outputs the 1280 pooled features); a new ``nn.Linear(1280, classes)`` head is trained on those features by
Adam in eager mode. The new classes are random crops (with flips) of the sample photos, a few for training
and different ones held out. Prints the loss curve and the held-out accuracy before and after.

    python examples/finetune_mobilenet.py [--train 6] [--test 4] [--steps 60] [--build build/mobilenet_features]

This is the Python counterpart of the browser fine-tuning demo of issue 5 (compiled training, see docs/eager.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import kiln
from kiln import nn, optim

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "mobilenet_v2_imagenet.onnx"
SAMPLES = (ROOT / ".." / "shared" / "models" / "samples").resolve()
CLASSES = ("chelsea", "coffee", "astronaut", "camera")
MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


def feature_package(build: Path) -> Path:
    """MobileNetV2 up to the classifier's input (the 1280 pooled features), compiled once into ``build``."""
    import onnx
    import onnx.utils

    if (build / "manifest.json").exists():
        return build
    model = onnx.load(str(MODEL))
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    build.parent.mkdir(parents=True, exist_ok=True)
    cut = build.parent / "mobilenet_v2_features.onnx"
    onnx.utils.extract_model(str(MODEL), str(cut), [model.graph.input[0].name], [gemm.input[0]])
    device_class = kiln.eager.device.runtime().device_class
    return kiln.compile(str(cut), str(build), force=True, preset="none", device_class=device_class)


def crop_images(name: str, n: int, rng: np.random.Generator, size: int = 224) -> list:
    """``n`` random crops (40-90% of the shorter side, random place, random flip) of sample ``name``, as
    ``size`` x ``size`` RGB PIL images."""
    from PIL import Image

    img = Image.open(SAMPLES / f"{name}.png").convert("RGB")
    w, h = img.size
    out = []
    for _ in range(n):
        s = int(min(w, h) * rng.uniform(0.4, 0.9))
        x0, y0 = int(rng.integers(0, w - s + 1)), int(rng.integers(0, h - s + 1))
        c = img.crop((x0, y0, x0 + s, y0 + s)).resize((size, size), Image.BILINEAR)
        if rng.random() < 0.5:
            c = c.transpose(Image.FLIP_LEFT_RIGHT)
        out.append(c)
    return out


def normalize(images: list) -> np.ndarray:
    """RGB images preprocessed for MobileNetV2 (ImageNet mean/std, NCHW): float32 [n, 3, H, W]."""
    return np.stack([((np.asarray(c, np.float32) / 255 - MEAN) / STD).transpose(2, 0, 1) for c in images]).astype(
        np.float32)


def crops(name: str, n: int, rng: np.random.Generator, size: int = 224) -> np.ndarray:
    """``n`` random crops (40-90% of the shorter side, random place, random flip) of sample ``name``, preprocessed
    for MobileNetV2 (``size`` x ``size``, ImageNet mean/std, NCHW): float32 [n, 3, size, size]."""
    return normalize(crop_images(name, n, rng, size))


def features(session, images: np.ndarray) -> np.ndarray:
    """The trunk's features of each image: float32 [n, 1280]."""
    name = session.inputs[0]["name"]
    out = session.outputs[0]["name"]
    return np.concatenate([session.run({name: im[None]})[out].reshape(1, -1) for im in images])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=6, help="training crops per class")
    ap.add_argument("--test", type=int, default=4, help="held-out crops per class")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--build", type=Path, default=ROOT / "build" / "mobilenet_features")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    kiln.manual_seed(args.seed)
    session = kiln.load(feature_package(args.build))
    xs, ys = {}, {}
    for split, n in (("train", args.train), ("test", args.test)):
        feats, labels = [], []
        for k, name in enumerate(CLASSES):
            feats.append(features(session, crops(name, n, rng)))
            labels += [k] * n
        xs[split], ys[split] = kiln.tensor(np.concatenate(feats)), kiln.tensor(np.array(labels))
        print(f"{split}: {len(labels)} crops of {len(CLASSES)} classes, features {tuple(xs[split].shape)}")
    head = nn.Linear(xs["train"].shape[1], len(CLASSES))
    opt = optim.Adam(head.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    def accuracy() -> float:
        with kiln.no_grad():
            return float((head(xs["test"]).argmax(1) == ys["test"]).float().mean().item())

    print(f"held-out accuracy before training: {accuracy():.2f} (chance {1 / len(CLASSES):.2f})")
    for step in range(1, args.steps + 1):
        opt.zero_grad()
        loss = loss_fn(head(xs["train"]), ys["train"])
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == 1:
            print(f"step {step:3d}  loss {loss.item():.4f}")
    print(f"held-out accuracy after {args.steps} steps: {accuracy():.2f}")


if __name__ == "__main__":
    main()
