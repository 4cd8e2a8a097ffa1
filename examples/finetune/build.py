"""Build the browser fine-tuning demo: MobileNetV2 with a new classifier for a few new classes, compiled
as a train-step package (only the classifier trainable, Adam), plus labelled images for its ``train.html``.

    python examples/finetune/build.py -o build/finetune [--size 128] [--batch 8] [--train 4] [--test 3] [--force]
    kiln serve build/finetune      # then open http://127.0.0.1:8000/train.html

The new classes are random crops (with flips) of the sample photos (``../shared/models/samples``), cut
by ``examples/finetune_mobilenet.py`` (the eager-mode Python counterpart): ``--train`` crops per class
to train on and ``--test`` other crops held out. They are written as PNGs under ``data/`` with
``data/index.json`` listing them; the page normalises them (ImageNet mean/std), trains with
``session.trainStep``, draws the loss curve, and measures held-out accuracy before and after.
MobileNetV2 is fully convolutional up to its global pooling, so the demo runs it at ``--size`` pixels
(128 by default) to train faster; the torchvision weights still give good features there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

import kiln
from kiln.train import OptimizerConfig, TrainOptions

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
from finetune_mobilenet import CLASSES, MEAN, MODEL, STD, crop_images

HEAD = ("classifier.1.weight", "classifier.1.bias")


def new_head_model(classes: int, size: int, seed: int = 0, model: Path = MODEL) -> onnx.ModelProto:
    """MobileNetV2 with a new ``classes``-way classifier (PyTorch ``nn.Linear``'s default initialisation,
    uniform in ``+-1/sqrt(1280)``) and a ``size`` x ``size`` input (the batch dim stays ``N``)."""
    m = onnx.load(str(model))
    rng = np.random.default_rng(seed)
    for i, t in enumerate(m.graph.initializer):
        if t.name in HEAD:
            fan_in = 1280
            shape = (classes, fan_in) if t.name.endswith("weight") else (classes,)
            bound = 1 / np.sqrt(fan_in)
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(
                rng.uniform(-bound, bound, shape).astype(np.float32), t.name))
    dims = m.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_value = dims[3].dim_value = size
    m.graph.output[0].type.tensor_type.shape.dim[1].dim_value = classes
    del m.graph.value_info[:]  # stale shapes; Kiln infers its own
    return m


def write_data(out: Path, train: int, test: int, size: int, seed: int = 0) -> dict:
    """Crops of each class of :data:`CLASSES` as PNGs under ``out/data`` and ``out/data/index.json``:
    ``{classes, size, mean, std, train: [{file, label}], test: [{file, label}]}``."""
    rng = np.random.default_rng(seed)
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    index: dict = {"classes": list(CLASSES), "size": size, "mean": MEAN.tolist(), "std": STD.tolist(),
                   "train": [], "test": []}
    for split, n in (("train", train), ("test", test)):
        for label, name in enumerate(CLASSES):
            for k, img in enumerate(crop_images(name, n, rng, size)):
                file = f"data/{split}_{name}_{k}.png"
                img.save(out / file)
                index[split].append({"file": file, "label": label})
    (data / "index.json").write_text(json.dumps(index, indent=1))
    return index


def build(out: Path, *, size: int = 128, batch: int = 8, train: int = 4, test: int = 3, lr: float = 1e-3,
          optimizer: str = "adam", device_class: str = "gpu", seed: int = 0, force: bool = False) -> Path:
    """Compile the demo's package into ``out`` and write its images; returns ``out``."""
    out = Path(out)
    model = out.parent / f".{out.name}-mobilenet_v2_{len(CLASSES)}.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(new_head_model(len(CLASSES), size, seed), str(model))
    try:
        kiln.compile(str(model), str(out), force=force, dims={"N": batch}, device_class=device_class, preset="none",
                     train=TrainOptions(trainable="classifier.*", loss="cross_entropy",
                                        optimizer=OptimizerConfig(optimizer, lr=lr)))
    finally:
        model.unlink()
    write_data(out, train, test, size, seed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "build" / "finetune")
    ap.add_argument("--size", type=int, default=128, help="image side in pixels")
    ap.add_argument("--batch", type=int, default=8, help="images per train step (the package's N)")
    ap.add_argument("--train", type=int, default=4, help="training crops per class")
    ap.add_argument("--test", type=int, default=3, help="held-out crops per class")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="adam")
    ap.add_argument("--device-class", choices=["gpu", "cpu"], default="gpu")
    ap.add_argument("--force", action="store_true", help="replace an existing package")
    args = ap.parse_args()
    out = build(args.output, size=args.size, batch=args.batch, train=args.train, test=args.test, lr=args.lr,
                optimizer=args.optimizer, device_class=args.device_class, force=args.force)
    print(f"wrote {out}; serve it with: kiln serve {out}  (then open /train.html)")


if __name__ == "__main__":
    main()
