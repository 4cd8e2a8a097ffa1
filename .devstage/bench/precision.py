"""Accuracy and speed of Kiln's fp16 compute (``--precision fp16``) against fp32, on real models.

Usage::

    python -m bench.precision [--models mobilenet_v2,minilm] [--precisions fp32,fp16,fp16-acc16]
                              [--repeat 5] [--warmup 1] [--device-class auto|cpu|gpu] [--out bench/results]

For each model and precision, Kiln runs natively (wgpu-py) and is compared with onnxruntime CPU in
fp32 on the same inputs: MobileNetV2 (trained weights) on the four reference images of
``../shared/models/reference/mobilenet_v2_imagenet.npz`` as one batch of 4 (top-1 agreement with
onnxruntime), MiniLM (all-MiniLM-L6-v2) on its reference sentences (cosine similarity of the
mean-pooled sentence embeddings with onnxruntime's). Reported per row: max and mean absolute error,
relative error (max absolute error over the reference's largest magnitude), top-1 agreement or the
smallest embedding cosine, and median milliseconds per run (after warm-up; upload and readback
included) with the ratio to Kiln fp32. Prints a table and writes JSON (``precision-<date>.json``).
On the GPU machine ``python -m bench.gpu --precision fp32,fp16`` reports the same metrics next to the
other contestants.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, summary, time_runs, write_record

SHARED = ROOT.parent / "shared" / "models"
IMAGES = ("chelsea", "coffee", "astronaut", "camera")


def accuracy(got: np.ndarray, ref: np.ndarray, kind: str = "", mask: np.ndarray | None = None) -> dict:
    """Error of ``got`` against ``ref`` (float arrays of one shape).

    Returns:
        ``max_abs_error``, ``mean_abs_error``, ``rel_error`` (max abs error / max |ref|); for ``kind``
        ``classifier`` (``[N, classes]`` logits) also ``top1_agree`` and ``top1_of``; for ``embedding``
        (``[batch, seq, dim]`` hidden states, ``mask`` the ``[batch, seq]`` attention mask) ``cosine_min``
        and ``cosine_mean`` of the mask-mean-pooled embeddings.
    """
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    err = np.abs(got - ref)
    out = {"max_abs_error": float(err.max()), "mean_abs_error": float(err.mean()),
           "rel_error": float(err.max() / max(np.abs(ref).max(), 1e-30)),
           "finite": bool(np.isfinite(got).all())}
    if kind == "classifier":
        g, r = got.reshape(len(got), -1).argmax(1), ref.reshape(len(ref), -1).argmax(1)
        out.update(top1_agree=int((g == r).sum()), top1_of=len(r))
    elif kind == "embedding":
        m = (np.ones(got.shape[:2]) if mask is None else np.asarray(mask, np.float64))[..., None]
        eg, er = (got * m).sum(1) / m.sum(1), (ref * m).sum(1) / m.sum(1)
        cos = (eg * er).sum(1) / np.linalg.norm(eg, axis=1) / np.linalg.norm(er, axis=1)
        out.update(cosine_min=float(cos.min()), cosine_mean=float(cos.mean()))
    return out


def quality(r: dict) -> str:
    """The model-level agreement of an :func:`accuracy` result, as a table cell."""
    if "top1_agree" in r:
        return f"top-1 {r['top1_agree']}/{r['top1_of']}"
    if "cosine_min" in r:
        return f"cos {r['cosine_min']:.6f}"
    return "-"


def load_model(name: str, models: Path, rng: np.random.Generator):
    """``(onnx path, feeds, dims, kind, mask)`` of benchmark model ``name`` (``mobilenet_v2`` or ``minilm``)."""
    if name == "mobilenet_v2":
        path = ROOT / "models" / "mobilenet_v2_imagenet.onnx"
        ref = models / "reference" / "mobilenet_v2_imagenet.npz"
        if ref.exists():
            with np.load(ref) as z:
                x = np.concatenate([z[f"{n}_input"] for n in IMAGES])
        else:
            x = rng.standard_normal((4, 3, 224, 224)).astype(np.float32)
        return path, {"input": x}, {"N": len(x)}, "classifier", None
    if name == "minilm":
        path = models / "all_minilm_l6_v2.onnx"
        with np.load(models / "reference" / "all_minilm_l6_v2_inputs.npz") as z:
            feeds = {k: z[k] for k in z.files}
        b, s = feeds["input_ids"].shape
        return path, feeds, {"batch": b, "seq": s}, "embedding", feeds["attention_mask"]
    raise SystemExit(f"unknown model {name!r} (known: mobilenet_v2, minilm)")


def device_class() -> str:
    """``cpu`` when wgpu-py's adapter is a CPU (lavapipe, SwiftShader), else ``gpu``."""
    from kiln.runtime import gpu

    return "cpu" if gpu.adapter().info.get("adapter_type") == "CPU" else "gpu"


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the JSON record."""
    import onnxruntime as ort

    import kiln

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mobilenet_v2,minilm", help="comma list of mobilenet_v2, minilm")
    ap.add_argument("--precisions", default="fp32,fp16,fp16-acc16", help="comma list of fp32, fp16, fp16-acc16")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device-class", default="auto", choices=("auto", "cpu", "gpu"),
                    help="default schedules for (auto: cpu on a CPU adapter such as lavapipe)")
    ap.add_argument("--models-dir", type=Path, default=SHARED, help="the shared models folder (MiniLM, references)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    console = Console(width=140)
    dclass = device_class() if args.device_class == "auto" else args.device_class
    rng = np.random.default_rng(0)
    results: dict[str, dict] = {}
    device = ""
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path, feeds, dims, kind, mask = load_model(name, args.models_dir, rng)
            ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
            results[name] = {}
            for prec in args.precisions.split(","):
                console.print(f"[bold]{name}[/] {prec} ...")
                t0 = time.perf_counter()
                session = kiln.load(kiln.compile(path, Path(tmp) / f"{name}-{prec}", dims=dims, precision=prec,
                                                 device_class=dclass))
                load_s = time.perf_counter() - t0
                info = session.adapter_info()
                device = f"{info.get('device')} ({info.get('backend_type')})"
                out = session.outputs[0]["name"]
                acc = accuracy(session.run(feeds)[out], ref, kind, mask)
                cold, times = time_runs(lambda s=session, f=feeds: s.run(f), args.repeat, args.warmup)
                m = session.manifest["memory"]
                results[name][prec] = {**acc, **summary(times, cold), "compile_load_s": load_s,
                                       "weight_bytes": m["weight_bytes"], "activation_bytes": m["activation_bytes"]}
    table = Table(title=f"Kiln fp16 vs fp32 against onnxruntime CPU fp32 ({device}, {dclass} schedules; "
                        f"median ms of {args.repeat} runs after {args.warmup} warm-up)")
    for col in ("model", "precision", "max abs err", "mean abs err", "rel err", "agreement", "median ms",
                "vs fp32", "weights MiB", "activations MiB"):
        table.add_column(col, justify="left" if col in ("model", "precision", "agreement") else "right")
    for model, rows in results.items():
        base = rows.get("fp32", {}).get("median_ms")
        for prec, r in rows.items():
            table.add_row(model, prec, f"{r['max_abs_error']:.2e}", f"{r['mean_abs_error']:.2e}",
                          f"{r['rel_error']:.2e}", quality(r), f"{r['median_ms']:.1f}",
                          f"{r['median_ms'] / base:.2f}" if base else "-", f"{r['weight_bytes'] / 2**20:.1f}",
                          f"{r['activation_bytes'] / 2**20:.1f}")
    console.print(table)
    record = {"benchmark": "precision", "device": device, "device_class": dclass, "repeat": args.repeat,
              "warmup": args.warmup, "results": results}
    path = write_record(record, args.out, "precision")
    console.print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
