"""Kiln native on an NVIDIA GPU against ONNX Runtime's WebGPU EP and PyTorch CUDA, in one process.

Run on the lent GPU machine (recipe: ../shared/gpu/README.md)::

    source bench/gpu_enter.sh; KILN_COMMIT=<git rev-parse --short HEAD, here> python3 -m bench.gpu --out $OUT

carrying ``.gl`` and ``.whl`` made by ``bash ../shared/gpu/prepare.sh``; copy the JSON from ``$OUT`` into
``bench/results/``.

Models: MobileNetV2 (``models/``), ResNet-50 (torchvision's architecture, random weights,
exported to ONNX here), MiniLM (all-MiniLM-L6-v2's BERT architecture, 6 layers x 384, random
weights, exported to ONNX here: the GPU machine has no ``transformers``) at batch 1 x seq 128 and
batch 32 x seq 128. Contestants:

- ``kiln-native``: Kiln's WGSL through wgpu-py on Vulkan; a run includes uploading the input and
  reading the output back (like onnxruntime's ``run``);
- ``kiln-gpu-io``: the same session with GPU-resident I/O: the inputs uploaded once
  (``session.upload``), the outputs kept on the GPU (``run(feeds, output="gpu")``); a timed run is
  the run plus a device sync (``session.sync()``), like the torch rows whose input is on the GPU;
- ``kiln-tuned`` (with ``--tuning-db``): ``kiln-native`` compiled with a ``kiln tune`` database's schedules for this
  adapter (``bench/results/tuning-h200.json``: the four models' kernels tuned on the lent H200), how users
  who tune their device run it, with the CNNs' batch bound to 1 (``--dim N=1``: records are for static shapes; the
  other Kiln rows keep it a run-time dim); the row counts the kernels that found a record;
- ``ort-webgpu``: onnxruntime's WebGPU execution provider (``onnxruntime-webgpu``, Dawn), host copies included;
- ``torch-eager`` and ``torch-compile``: PyTorch CUDA, strict fp32 (TF32 off), input already on the GPU, synchronised;
- ``torch-cudagraphs``: ``torch.compile(mode="reduce-overhead")``, Inductor's kernels replayed as one CUDA graph, the
  native reference of issue 16 (with ``--precision`` other than fp32 also ``torch-cudagraphs-fp16``, autocast);
- ``torch-cudagraphs-host-io``: the same compiled module with host I/O, the peer of ``kiln-native``: a timed run copies
  the numpy inputs to the GPU (``torch.from_numpy(x).cuda()``) and the output back (``.cpu().numpy()``), as a user
  holding numpy arrays calls it.

With ``--precision fp32,fp16`` (or ``fp16-acc16``) Kiln also runs packages compiled with ``--precision fp16``
(f16 storage and arithmetic, f32 accumulation; the device needs ``shader-f16``) as ``kiln-native-fp16`` rows,
and PyTorch runs under ``torch.autocast(float16)`` as ``torch-eager-fp16``; ORT's WebGPU EP and the fp32 torch
rows stay the fp32 references. Every row's accuracy against onnxruntime CPU fp32 is reported (max and mean
absolute error, relative error, top-1 agreement for the classifiers, the smallest mean-pooled embedding cosine
for MiniLM; torch rows only where they share the ONNX weights).

Medians over ``--repeat`` runs after ``--warmup`` runs and at least ``--warmup-s`` seconds of them (the GPU's clocks
ramp up under sustained work: ``bench.common.GPU_WARMUP_S``), with the SM clock read right after (``sm_clock_mhz``,
``nvidia-smi``); first-run (cold) time and peak GPU memory
reported separately; for Kiln also the load time (``load_ms``: the package's first load in the process,
its phases, and ``reload_ms``: a second load of the same package, whose pipelines come from the
device's cache), its dispatches a run and the host's microseconds a dispatch (``host_ms``: until
``run(feeds, output="gpu")`` returns, the device idle before: feeds written, plan encoded and submitted, divided by
the dispatches); ONNX-based outputs checked against onnxruntime CPU. Prints a table and writes JSON
(``gpu-<date>.json``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import GPU_WARMUP_S, ROOT, host_ms, sm_clock_mhz, summary, time_runs, write_record
from bench.precision import accuracy, quality


def torch_model(name: str):
    """torchvision's ``name``, or :class:`MiniLM`, with random weights (seeded), in eval mode."""
    import torch

    torch.manual_seed(0)
    if name.startswith("minilm"):
        return MiniLM().eval()
    import torchvision

    return {"mobilenet_v2": torchvision.models.mobilenet_v2, "resnet50": torchvision.models.resnet50}[name](
        weights=None).eval()


def _minilm_class():
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self, d: int, heads: int, ff: int):
            super().__init__()
            self.heads = heads
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
            self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

        def forward(self, x, bias):
            b, s, d = x.shape

            def split(t):
                return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5 + bias, dim=-1)
            x = self.ln1(x + self.o((att @ v).transpose(1, 2).reshape(b, s, d)))
            return self.ln2(x + self.ff2(nn.functional.gelu(self.ff1(x))))

    class MiniLM(nn.Module):
        """BERT as in all-MiniLM-L6-v2 (HF ``BertModel``'s computation, eager attention): token, position
        and segment embeddings, 6 post-LayerNorm encoder layers of 12 heads, GELU (erf) feed-forward."""

        def __init__(self, vocab: int = 30522, d: int = 384, layers: int = 6, heads: int = 12, ff: int = 1536):
            super().__init__()
            self.tok, self.pos, self.seg = nn.Embedding(vocab, d), nn.Embedding(512, d), nn.Embedding(2, d)
            self.ln = nn.LayerNorm(d, eps=1e-12)
            self.layers = nn.ModuleList(Layer(d, heads, ff) for _ in range(layers))

        def forward(self, input_ids, attention_mask, token_type_ids):
            pos = torch.arange(input_ids.shape[1], device=input_ids.device)
            x = self.ln(self.tok(input_ids) + self.pos(pos)[None] + self.seg(token_type_ids))
            bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
            for layer in self.layers:
                x = layer(x, bias)
            return x

    return MiniLM


def MiniLM():
    """A :class:`torch.nn.Module` with all-MiniLM-L6-v2's architecture and random weights."""
    return _minilm_class()()


#: every contestant, in the order they run
CONTESTANTS = ("kiln-native", "kiln-gpu-io", "ort-webgpu", "torch-eager", "torch-compile", "torch-cudagraphs",
               "torch-cudagraphs-host-io")

#: model -> (batch, seq) of the MiniLM rows
MINILM_SHAPES = {"minilm_b1": (1, 128), "minilm_b32": (32, 128)}


def model_inputs(name: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Fresh random inputs of a benchmark model, by ONNX input name."""
    if name in MINILM_SHAPES:
        b, s = MINILM_SHAPES[name]
        mask = np.ones((b, s), np.int64)
        mask[:, s * 3 // 4:] = 0  # padded tails, as a batch of sentences has
        return {"input_ids": rng.integers(0, 30522, (b, s)).astype(np.int64), "attention_mask": mask,
                "token_type_ids": np.zeros((b, s), np.int64)}
    return {"input": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}


def export_onnx(module, name: str, path: Path) -> Path:
    """Export ``module`` to ONNX opset 17 at ``path`` (batch, and MiniLM's sequence, symbolic)."""
    import torch

    if name in MINILM_SHAPES:
        feeds = model_inputs(name, np.random.default_rng(0))
        args = tuple(torch.from_numpy(v) for v in feeds.values())
        axes = {k: {0: "batch", 1: "seq"} for k in feeds}
        kwargs = {"input_names": list(feeds), "output_names": ["last_hidden_state"], "opset_version": 17,
                  "dynamic_axes": {**axes, "last_hidden_state": {0: "batch", 1: "seq"}}}
    else:
        args = (torch.randn(1, 3, 224, 224),)
        kwargs = {"input_names": ["input"], "output_names": ["logits"], "opset_version": 17,
                  "dynamic_axes": {"input": {0: "N"}, "logits": {0: "N"}}}
    try:
        torch.onnx.export(module, args, str(path), dynamo=False, **kwargs)
    except TypeError:
        torch.onnx.export(module, args, str(path), **kwargs)
    return path


def tuned_schedules(db_path: Path):
    """The compiler's schedule chooser from tuning database ``db_path`` (``kiln tune``'s records for this machine's
    adapter, the default gpu schedules for kernels without one).

    Raises:
        RuntimeError: the database has no records for this adapter."""
    import functools

    from kiln.te.schedule import default_schedule
    from kiln.tune.db import TuningDB

    db = TuningDB(db_path)
    identity = db.match_adapter(None)
    if identity is None:
        raise RuntimeError(f"{db_path} has no records for this machine's adapter")
    return db.scheduler(identity, functools.partial(default_schedule, device_class="gpu"))


def bench_model(name: str, onnx_path: Path, module, args, console: Console) -> dict:
    """All contestants on one model; returns ``{contestant: result or {"error": ...}}``."""
    import onnxruntime as ort

    import kiln

    feeds = model_inputs(name, np.random.default_rng(0))
    dims = dict(zip(("batch", "seq"), MINILM_SHAPES[name])) if name in MINILM_SHAPES else {}
    expected = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    kind = "embedding" if name in MINILM_SHAPES else "classifier"

    def acc(got):
        return accuracy(got, expected, kind, feeds.get("attention_mask"))

    rows: dict[str, dict] = {}

    def attempt(contestant: str, fn):
        console.print(f"[bold]{name}[/] {contestant} ...")
        try:
            rows[contestant] = fn()
        except Exception as e:  # noqa: BLE001  (one failing contestant must not stop the run)
            rows[contestant] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
            console.print(traceback.format_exc(limit=3))

    def run_kiln(state: dict, precision: str = "fp32", tuned: bool = False):
        tmp = state["tmp"] = tempfile.TemporaryDirectory()  # kept for the kiln-gpu-io row
        t0 = time.perf_counter()
        # (tuning records are for static shapes: the tuned row binds the CNNs' batch, a run-time dim otherwise)
        pkg = kiln.compile(onnx_path, Path(tmp.name) / "pkg", dims={"N": 1, **dims} if tuned and not dims else dims,
                           precision=precision, **({"schedule": tuned_schedules(args.tuning_db)} if tuned else {}))
        t1 = time.perf_counter()
        session = kiln.load(pkg)
        load_s = time.perf_counter() - t0
        load_ms = {**session.load_ms, "wall": (time.perf_counter() - t1) * 1e3}
        t2 = time.perf_counter()
        again = kiln.load(pkg)
        reload_ms = {**again.load_ms, "wall": (time.perf_counter() - t2) * 1e3, "pipeline_hits": again.pipeline_hits}
        del again
        out = session.outputs[0]["name"]
        accuracy_row = acc(session.run(feeds)[out])
        cold, times = time_runs(lambda: session.run(feeds), args.repeat, args.warmup, warmup_s=args.warmup_s)
        clock = sm_clock_mhz()
        host = host_ms(session, feeds, min(args.repeat, 20))
        info = session.adapter_info()
        mem = sum(b["bytes"] for b in session.manifest["buffers"])
        # (warmup_s: the host timing's idle gaps above let the clocks fall, so ramp them again)
        prof = session.profile(feeds, repeat=args.profile_repeat, warmup_s=args.warmup_s) \
            if args.profile_repeat > 0 else []
        by_kernel: dict[str, float] = {}
        for r in prof:
            by_kernel[r["kernel"]] = by_kernel.get(r["kernel"], 0.0) + r["ms"]
        top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:12]
        if prof:
            console.print(f"  kiln GPU time {sum(by_kernel.values()):.3f} ms ({prof[0]['clock']}); slowest kernels: "
                          + ", ".join(f"{k} {ms:.3f}" for k, ms in top))
        console.print(f"  kiln load {load_ms['wall']:.0f} ms (device {load_ms['device']:.0f}, pipelines "
                      f"{load_ms['pipelines']:.0f}); second load {reload_ms['wall']:.0f} ms "
                      f"({reload_ms['pipeline_hits']} cached pipelines)")
        state["session"] = session
        state["device"] = f"{info.get('device')} ({info.get('backend_type')})"
        kernels = session.manifest["targets"]["webgpu"]["kernels"]
        tuned_row = {"tuned_kernels": sum(1 for k in kernels if k.get("tuned")), "kernels": len(kernels)} if tuned else {}
        return {**summary(times, cold), "compile_load_s": load_s, **accuracy_row, "precision": precision, **tuned_row,
                "load_ms": load_ms, "reload_ms": reload_ms,
                "gpu_bytes": mem, "device": state["device"],
                "dispatches": len(session.steps), "host_ms": host, "sm_clock_mhz": clock,
                "host_us_per_dispatch": host * 1e3 / max(1, len(session.steps)),
                "gpu_ms": sum(by_kernel.values()), "profile": prof}

    def run_ort_webgpu():
        t0 = time.perf_counter()
        s = ort.InferenceSession(str(onnx_path), providers=["WebGpuExecutionProvider"])
        load_s = time.perf_counter() - t0
        accuracy_row = acc(s.run(None, feeds)[0])
        cold, times = time_runs(lambda: s.run(None, feeds), args.repeat, args.warmup, warmup_s=args.warmup_s)
        return {**summary(times, cold), "compile_load_s": load_s, **accuracy_row, "sm_clock_mhz": sm_clock_mhz(),
                "providers": s.get_providers(), "device": "Dawn"}

    def run_torch(compiled: bool, half: bool = False, mode: str | None = None, host_io: bool = False):
        def go():
            import torch

            torch.backends.cuda.matmul.allow_tf32 = False  # strict fp32, like the WGSL contestants
            torch.backends.cudnn.allow_tf32 = False
            m = module.cuda()
            xs = [torch.from_numpy(v).cuda() for v in feeds.values()]
            fn = (torch.compile(m, mode=mode) if mode else torch.compile(m)) if compiled else m
            torch.cuda.reset_peak_memory_stats()
            with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16, enabled=half):
                if host_io:  # (.cpu() waits for the run)
                    cold, times = time_runs(lambda: fn(*(torch.from_numpy(v).cuda() for v in feeds.values()))
                                            .cpu().numpy(), args.repeat, args.warmup, warmup_s=args.warmup_s)
                else:
                    cold, times = time_runs(lambda: fn(*xs), args.repeat, args.warmup, sync=torch.cuda.synchronize,
                                            warmup_s=args.warmup_s)
                clock = sm_clock_mhz()
                out = fn(*xs).float().cpu().numpy()
            res = {**summary(times, cold), "gpu_bytes": int(torch.cuda.max_memory_allocated()), "sm_clock_mhz": clock,
                   "device": torch.cuda.get_device_name()}
            if args.same_weights:
                res.update(acc(out))
            return res
        return go

    def run_kiln_gpu_io():
        session = kiln_state["session"]
        gpu_feeds = session.upload(feeds)
        out = session.outputs[0]["name"]
        accuracy_row = acc(session.run(gpu_feeds, output="gpu")[out].numpy())

        def once():
            session.run(gpu_feeds, output="gpu")
            session.sync()
        cold, times = time_runs(once, args.repeat, args.warmup, warmup_s=args.warmup_s)
        return {**summary(times, cold), **accuracy_row, "device": kiln_state["device"], "sm_clock_mhz": sm_clock_mhz()}

    def release(state: dict) -> None:
        """Drop a run_kiln state's session and delete its package folder."""
        state.pop("session", None)
        if "tmp" in state:
            state.pop("tmp").cleanup()

    kiln_state: dict = {}
    chosen = args.contestants.split(",")
    if "kiln-native" in chosen or "kiln-gpu-io" in chosen:
        attempt("kiln-native", lambda: run_kiln(kiln_state))
        if "kiln-gpu-io" in chosen and "session" in kiln_state:
            attempt("kiln-gpu-io", run_kiln_gpu_io)
        release(kiln_state)
        if args.tuning_db is not None:
            state = {}
            attempt("kiln-tuned", lambda st=state: run_kiln(st, tuned=True))
            release(state)
        for precision in args.precision.split(","):
            if precision != "fp32":
                state: dict = {}
                attempt(f"kiln-native-{precision}", lambda p=precision, st=state: run_kiln(st, p))
                release(state)
    if "ort-webgpu" in chosen:
        attempt("ort-webgpu", run_ort_webgpu)
    if "torch-eager" in chosen:
        attempt("torch-eager", run_torch(False))
        if any(p != "fp32" for p in args.precision.split(",")):
            attempt("torch-eager-fp16", run_torch(False, half=True))
    if "torch-compile" in chosen and not args.no_compile:
        attempt("torch-compile", run_torch(True))
    if "torch-cudagraphs" in chosen and not args.no_compile:
        attempt("torch-cudagraphs", run_torch(True, mode="reduce-overhead"))
        if any(p != "fp32" for p in args.precision.split(",")):
            attempt("torch-cudagraphs-fp16", run_torch(True, half=True, mode="reduce-overhead"))
    if "torch-cudagraphs-host-io" in chosen and not args.no_compile:
        attempt("torch-cudagraphs-host-io", run_torch(True, mode="reduce-overhead", host_io=True))
    if "kiln-native" not in chosen:
        rows.pop("kiln-native", None)
    return rows


def main(argv: list[str] | None = None) -> dict:
    """Run the GPU benchmark; returns the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mobilenet_v2,resnet50,minilm_b1,minilm_b32",
                    help="comma list of mobilenet_v2, resnet50, minilm_b1, minilm_b32")
    ap.add_argument("--repeat", type=int, default=50, help="timed runs per contestant")
    ap.add_argument("--warmup", type=int, default=10, help="untimed runs before them")
    ap.add_argument("--warmup-s", type=float, default=GPU_WARMUP_S,
                    help="and more untimed runs until this many seconds have passed (the GPU's clocks ramp up)")
    ap.add_argument("--profile-repeat", type=int, default=10,
                    help="Kiln's per-dispatch GPU profile: runs per dispatch (0 skips it, e.g. for smoke runs on lavapipe)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--tuning-db", type=Path, default=None,
                    help="also a kiln-tuned row (fp32): the package compiled with this kiln tune database's schedules")
    ap.add_argument("--contestants", default=",".join(CONTESTANTS),
                    help="comma list of " + ", ".join(CONTESTANTS) + " (default: all; only the torch rows and the "
                    "resnet50/minilm exports need torch, so kiln-native,kiln-gpu-io,ort-webgpu --models mobilenet_v2 "
                    "runs without it)")
    ap.add_argument("--precision", default="fp32", metavar="LIST",
                    help="Kiln precisions, a comma list of fp32, fp16, fp16-acc16: each other than fp32 adds a "
                         "kiln-native-<precision> row (kiln compile --precision; needs shader-f16) and a "
                         "torch-eager-fp16 (autocast) row; accuracy against onnxruntime CPU fp32 in every row")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    console = Console(width=180)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        needs_torch = any(c.startswith("torch") for c in args.contestants.split(","))
        for name in args.models.split(","):
            module = torch_model(name) if needs_torch or name != "mobilenet_v2" else None
            if name == "mobilenet_v2":
                onnx_path = ROOT / "models" / "mobilenet_v2_imagenet.onnx"
                args.same_weights = False  # the shipped ONNX has trained weights, the module random ones
            else:
                onnx_path = export_onnx(module, name, Path(tmp) / f"{name}.onnx")
                args.same_weights = True
            results[name] = bench_model(name, onnx_path, module, args, console)
    table = Table(title=f"fp32 unless named (batch 1 unless named), median ms of {args.repeat} runs after "
                        f"{args.warmup} warm-up runs and {args.warmup_s:g} s; errors against onnxruntime CPU fp32")
    for col in ("model", "contestant", "median ms", "min ms", "cold ms", "load ms", "reload ms", "GPU MiB",
                "dispatches", "host us/disp", "SM MHz", "max err", "rel err", "agreement", "kiln / this",
                "kiln gpu-io / this"):
        table.add_column(col, justify="left" if col in ("model", "contestant") else "right")
    for model, rows in results.items():
        kiln_ms = rows.get("kiln-native", {}).get("median_ms")
        gpu_io_ms = rows.get("kiln-gpu-io", {}).get("median_ms")
        for contestant, r in rows.items():
            if "error" in r:
                table.add_row(model, contestant, "error: " + r["error"][:60], *[""] * 13)
                continue
            ratio = kiln_ms / r["median_ms"] if kiln_ms else float("nan")
            ratio_gpu = gpu_io_ms / r["median_ms"] if gpu_io_ms else float("nan")
            table.add_row(model, contestant, f"{r['median_ms']:.3f}", f"{r['min_ms']:.3f}", f"{r['cold_ms']:.1f}",
                          f"{r['load_ms']['wall']:.0f}" if "load_ms" in r else "-",
                          f"{r['reload_ms']['wall']:.0f}" if "reload_ms" in r else "-",
                          f"{r['gpu_bytes'] / 2**20:.1f}" if "gpu_bytes" in r else "-",
                          str(r.get("dispatches", "-")),
                          f"{r['host_us_per_dispatch']:.1f}" if "host_us_per_dispatch" in r else "-",
                          str(r.get("sm_clock_mhz") or "-"),
                          f"{r['max_abs_error']:.1e}" if "max_abs_error" in r else "-",
                          f"{r['rel_error']:.1e}" if "rel_error" in r else "-", quality(r), f"{ratio:.2f}",
                          f"{ratio_gpu:.2f}")
    console.print(table)
    record = {"benchmark": "gpu", "repeat": args.repeat, "warmup": args.warmup, "warmup_s": args.warmup_s,
              "precision": args.precision,
              "results": results}
    path = write_record(record, args.out, "gpu")
    console.print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
