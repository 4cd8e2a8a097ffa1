"""The ``kiln`` command line: compile, run, serve (a package, or the RPC server), info.

Errors a user can cause print one line (``error: ...``) and exit with status 1;
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import click

from kiln.cli_options import parse_dims
from kiln.errors import KilnError


class KilnGroup(click.Group):
    """A click group that turns :class:`KilnError` (and unexpected errors) into one-line messages."""

    def invoke(self, ctx: click.Context):
        try:
            with warnings.catch_warnings():  # a warning is one line on stderr: "warning: ..."
                warnings.showwarning = _show_warning
                return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, BrokenPipeError):
            raise
        except KilnError as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except Exception as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback; "
                       "please report it)", err=True)
            ctx.exit(2)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    click.echo(f"warning: {message}", err=True)


@click.group(cls=KilnGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.version_option(package_name="kiln", prog_name="kiln")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Kiln: compile ONNX models to WebGPU and WebAssembly packages that run natively and in any browser."""
    ctx.obj = {"debug": debug}


@main.command("compile")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), required=True, help="Package directory to write.")
@click.option("--target", default="webgpu", show_default=True, metavar="TARGETS",
              help="Code generation targets, a comma list of webgpu, webgl2, wasm and cpu (e.g. webgpu,webgl2,wasm).")
@click.option("--dim", "dims", multiple=True, metavar="NAME=SIZE", help="Bind a symbolic dim statically, e.g. --dim N=4 (see --unbound for dims left out); a range makes it a run-time dim: "
              "--dim seq=1..512 (--dim seq=1..512@128: schedules chosen for 128; --dim H=32..960%32: multiples of 32 only); "
              "--dim batch=1.. or --dim batch=auto: no upper bound, buffers grow at run time.")
@click.option("--unbound", type=click.Choice(["auto", "grow", "static"]), default="auto", show_default=True,
              help="ONNX models: what a symbolic dim without --dim becomes. auto: a run-time dim whose buffers grow "
                   "at run time, or 1 with a warning where --train or the model needs static dims; "
                   "grow: a growable run-time dim or the error; static: 1.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it is an existing Kiln package.")
@click.option("--preset", type=click.Choice(["auto", "imagenet", "none"]), default="auto", show_default=True,
              help="Pre/post-processing for the demo page and `kiln run --image`.")
@click.option("--labels", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Class names, one a line.")
@click.option("--no-validate", is_flag=True, help="Skip naga validation of the generated WGSL.")
@click.option("--print-ir", is_flag=True, help="Print the optimised graph IR.")
@click.option("--device-class", type=click.Choice(["gpu", "cpu"]), default="gpu", show_default=True,
              help="Make the default schedules for GPUs, or for WebGPU on a CPU (SwiftShader, lavapipe).")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "fp16-acc16"]), default="fp32", show_default=True,
              help="fp16: float weights and activations stored as f16, arithmetic in f16 with f32 accumulation "
                   "(fragile ops in f32); needs WebGPU's shader-f16, webgpu target only. fp16-acc16: dot products "
                   "accumulated in f16 too. Model inputs and outputs keep their dtypes.")
@click.option("--tuning-db", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Use the schedules `kiln tune` recorded for the target adapter (defaults for other kernels).")
@click.option("--adapter", metavar="WORDS",
              help="With --tuning-db: the target adapter, words matching one adapter of the database "
                   "(e.g. 'nvidia h100'); default: this machine's adapter.")
@click.option("--max-context", type=click.IntRange(1), default=2048, show_default=True,
              help="GGUF language models: the most tokens the KV cache holds (prompt and answer).")
@click.option("--beams", type=click.IntRange(1, 16), default=5, show_default=True,
              help="Whisper: the widest beam search (kiln transcribe --beam) the decoder's cache holds.")
@click.option("--train", is_flag=True, help="Also build the train step (forward, loss, backward, optimizer update; "
              "docs/training.md). The batch size (--dim N=...) serves training and inference.")
@click.option("--trainable", default="*", show_default=True, metavar="PATTERNS",
              help="With --train: fnmatch patterns of the initializers to train, comma-separated (e.g. 'classifier.*').")
@click.option("--loss", type=click.Choice(["cross_entropy", "mse"]), default="cross_entropy", show_default=True,
              help="With --train: the loss of the first model output against a new 'labels' input.")
@click.option("--optimizer", type=click.Choice(["sgd", "adam", "adamw"]), default="sgd", show_default=True,
              help="With --train: the update rule (torch.optim's).")
@click.option("--lr", type=float, default=None, help="With --train: learning rate (default 0.01 for sgd, 0.001 for adam).")
@click.option("--momentum", type=float, default=0.0, show_default=True, help="With --train: SGD momentum.")
@click.option("--weight-decay", type=float, default=0.0, show_default=True,
              help="With --train: L2 penalty (sgd, adam) or decoupled weight decay (adamw).")
def compile_cmd(model: Path, out: Path, target: str, dims, unbound: str, force: bool, preset: str, labels, no_validate: bool,
                print_ir: bool, device_class: str, precision: str, tuning_db, adapter, max_context: int, beams: int,
                train: bool,
                trainable: str, loss: str, optimizer: str, lr: float | None, momentum: float,
                weight_decay: float) -> None:
    """Compile an ONNX MODEL, a GGUF language model (Llama family) or a CTranslate2 Whisper model folder into a
    package directory."""
    import time

    from kiln.compiler import compile_model, parse_targets
    from kiln.package.format import read_manifest

    targets = parse_targets(target)
    train_options = None
    if train:
        from kiln.train import OptimizerConfig, TrainOptions

        cfg = OptimizerConfig(optimizer, lr=lr if lr is not None else (0.01 if optimizer == "sgd" else 1e-3),
                              momentum=momentum, weight_decay=weight_decay)
        train_options = TrainOptions(trainable=trainable, loss=loss, optimizer=cfg)
    t0 = time.perf_counter()
    schedule = _tuned_scheduler(tuning_db, adapter, device_class)
    path = compile_model(model, out, target=target, dims=parse_dims(dims), force=force, preset=preset,
                         labels=labels, validate=not no_validate, progress=sys.stderr.isatty(),
                         device_class=device_class, schedule=schedule, train=train_options, precision=precision,
                         max_context=max_context, beams=beams, unbound=unbound)
    if schedule is not None and schedule.stale:
        click.echo(f"warning: {len(schedule.stale)} tuning record{'s' if len(schedule.stale) > 1 else ''} of "
                   f"{tuning_db} {'were' if len(schedule.stale) > 1 else 'was'} measured on code this compile does not "
                   f"generate (another Kiln version, or another --device-class's default schedules) and not used; run "
                   "kiln tune again to refresh them", err=True)
    if (path / "speech.json").is_file():  # a speech package: one line per part
        for part in ("resample", "log_mel", "encoder", "decoder"):
            _summary(read_manifest(path / part), f"{model} ({part})", path / part, targets, tuning_db, precision,
                     None)
        click.echo(f"speech package {path} ({time.perf_counter() - t0:.1f} s); kiln transcribe {path} AUDIO")
        return
    _summary(read_manifest(path), model, path, targets, tuning_db, precision, t0)
    if print_ir:
        click.echo((path / "graph.txt").read_text())


def _summary(m: dict, model, path: Path, targets: list[str], tuning_db, precision: str, t0: float | None) -> None:
    """One line: what ``kiln compile`` made of ``model``."""
    import time

    from kiln.package.format import kernel_steps

    parts = []
    for name in targets:
        tgt = m["targets"][name]
        steps = {"webgpu": "dispatches", "webgl2": "draws"}.get(name, "calls")
        tuned = sum(1 for k in tgt["kernels"] if k.get("tuned"))
        parts.append(f"{name}: {len(kernel_steps(tgt['plan']))} {steps}, {len(tgt['kernels'])} kernels"
                     + (f", {tuned} tuned" if tuning_db and name == "webgpu" else ""))
        if "train_plan" in tgt:
            parts.append(f"train step: {len(tgt['train_plan'])} dispatches, {len(m['training']['trainable'])} "
                         f"trainable tensors, {m['training']['optimizer']['name']}")
    if precision != "fp32":
        parts.append(f"precision {precision}")
    took = "" if t0 is None else f", {time.perf_counter() - t0:.1f} s"
    click.echo(f"compiled {model} -> {path} ({'; '.join(parts)}; {m['memory']['weight_bytes'] / 1e6:.1f} MB weights"
               f"{took})")


def _tuned_scheduler(tuning_db: Path | None, adapter: str | None, device_class: str):
    """The schedule chooser of ``--tuning-db`` (``None`` without one): records of the adapter that
    ``--adapter`` names (or this machine's), defaults for everything else."""
    import functools

    from kiln.te.schedule import default_schedule

    if tuning_db is None:
        if adapter is not None:
            raise click.UsageError("--adapter needs --tuning-db")
        return None
    from kiln.tune.db import TuningDB, adapter_key

    db = TuningDB(tuning_db)
    identity = db.match_adapter(adapter)
    if identity is None:
        known = "; ".join(db.adapters()) or "none"
        wanted = f"adapter {adapter!r}" if adapter else "this machine's adapter"
        click.echo(f"warning: {tuning_db} has no records for {wanted} (it has: {known}); using default schedules",
                   err=True)
    else:
        click.echo(f"using tuning records for {adapter_key(identity)}", err=True)
    return db.scheduler(identity, functools.partial(default_schedule, device_class=device_class))


def _load_npz(path: Path) -> dict:
    import numpy as np

    if not path.exists():
        raise KilnError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError) as e:
        raise KilnError(f"{path}: not a readable .npz file ({e})") from None


@main.command("run")
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--image", type=click.Path(path_type=Path), help="Classify an image (packages with an image preset).")
@click.option("--inputs", "inputs", type=click.Path(path_type=Path), help=".npz of named inputs.")
@click.option("--outputs", "outputs", type=click.Path(path_type=Path), help="Write every output to this .npz.")
@click.option("--force", is_flag=True, help="Overwrite an existing --outputs file.")
@click.option("--repeat", type=click.IntRange(1), default=20, show_default=True, help="Timed runs (median printed).")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True, help="Untimed runs first.")
@click.option("--warmup-s", type=click.FloatRange(0), default=None,
              help="And more untimed runs until this many seconds have passed, so a GPU's clocks ramp up before "
                   "timing [default: 1 on a GPU adapter, 0 on a CPU one and for --target wasm/cpu].")
@click.option("--top", type=click.IntRange(1), default=5, show_default=True, help="Classes to show with --image.")
@click.option("--profile", is_flag=True, help="Also print time per kernel (WebGPU timestamp queries; wasm: wall clock).")
@click.option("--target", type=click.Choice(["webgpu", "wasm", "cpu"]), default="webgpu", show_default=True,
              help="The package's target to run: webgpu (wgpu-py), wasm (wasmtime) or cpu (native C for this machine).")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="Threads of the wasm and cpu targets (default: wasm 1, cpu every core).")
def run_cmd(package: Path, image, inputs, outputs, force: bool, repeat: int, warmup: int, warmup_s: float | None,
            top: int, profile: bool, target: str, threads: int | None) -> None:
    """Run PACKAGE natively (wgpu-py; wasmtime for --target wasm; native C for --target cpu) on an image or on
    named inputs, and time it."""
    import numpy as np

    import kiln

    if image and inputs:
        raise click.UsageError("give either --image or --inputs, not both")
    if outputs and outputs.exists() and not force:
        raise KilnError(f"{outputs} already exists; pass --force to overwrite it")
    if threads is not None and target == "webgpu":
        raise click.UsageError("--threads is for the wasm and cpu targets")
    session = kiln.load(package, target=target, **({"threads": threads} if threads is not None else {}))
    m = session.manifest
    if image:
        pre = m.get("preprocess")
        if not pre or pre.get("type") != "image":
            raise KilnError(f"{package}: package has no image preprocessing; use --inputs (or compile with --preset)")
        from kiln.runtime.imaging import load_image

        x = load_image(image, pre)
        spec = next(i for i in session.inputs if i["name"] == pre["input"])
        if x.shape[0] != spec["shape"][0]:
            x = np.repeat(x, spec["shape"][0], axis=0)
        feeds = {pre["input"]: x}
    elif inputs:
        feeds = _load_npz(inputs)
    else:
        rng = np.random.default_rng(0)
        feeds = {i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in session.inputs}
        click.echo("no --image or --inputs: running on random normal inputs")
    result = session.run(feeds)
    if warmup_s is None:
        from kiln.runtime.timing import clock_warmup_s

        warmup_s = clock_warmup_s(session.adapter_info()) if target == "webgpu" else 0.0
    times = session.benchmark(feeds, repeat=repeat, warmup=warmup, warmup_s=warmup_s)
    post = m.get("postprocess")
    if image and post and post.get("type") == "classification":
        from kiln.runtime.imaging import top_k

        labels = (session.path / post["labels"]).read_text().splitlines() if post.get("labels") else []
        logits = result[post["output"]][0]
        for idx, label, p in top_k(logits, labels, top, post.get("softmax", True)):
            click.echo(f"{p:8.4f}  {idx:5d}  {label}")
    else:
        for name, arr in result.items():
            click.echo(f"{name}: {arr.dtype}{list(arr.shape)} min {arr.min():.6g} max {arr.max():.6g} "
                       f"mean {arr.mean():.6g}")
    if outputs:
        from kiln.package.format import atomic_path

        with atomic_path(outputs) as tmp, open(tmp, "wb") as f:  # np.savez adds no .npz to a file object
            np.savez(f, **result)
        click.echo(f"wrote {', '.join(result)} to {outputs}")
    info = session.adapter_info()
    click.echo(f"median {np.median(times):.2f} ms per run over {repeat} runs "
               f"({info.get('device', '?')}, {info.get('backend_type', '?')})")
    if profile:
        _print_profile(session.profile(feeds, repeat=min(repeat, 10), warmup_s=warmup_s), m, target)


def _print_profile(rows: list[dict], manifest: dict, target: str = "webgpu", limit: int = 15) -> None:
    """A table of the slowest kernels: total GPU ms over their dispatches, share, schedule."""
    from rich.console import Console
    from rich.table import Table

    total = sum(r["ms"] for r in rows) or 1.0
    by_kernel: dict[str, list[dict]] = {}
    for r in rows:
        by_kernel.setdefault(r["kernel"], []).append(r)
    kernels = {k["name"]: k for k in manifest["targets"][target]["kernels"]}
    table = Table(title=f"{'GPU' if target == 'webgpu' else 'CPU'} time per kernel ({rows[0]['clock'] if rows else '-'}): {total:.3f} ms in "
                        f"{len(rows)} dispatches")
    for col in ("kernel", "dispatches", "ms", "share", "schedule"):
        table.add_column(col, justify="right" if col in ("dispatches", "ms", "share") else "left")
    ranked = sorted(by_kernel.items(), key=lambda kv: -sum(r["ms"] for r in kv[1]))
    for name, rs in ranked[:limit]:
        ms = sum(r["ms"] for r in rs)
        sched = kernels.get(name, {}).get("schedule", {})
        tile = "x".join(f"{sp['factor']}@{sp['axis']}" for sp in sched.get("splits", [])) or "1"
        where = f" wg{sched.get('workgroup_size', '?')}" if target == "webgpu" else ""
        table.add_row(name, str(len(rs)), f"{ms:.3f}", f"{ms / total:.1%}", f"tile {tile} u{sched.get('unroll', 1)}{where}")
    Console().print(table)


@main.command("serve")
@click.argument("package", type=click.Path(path_type=Path), required=False)
@click.option("--rpc", is_flag=True, help="Start the RPC server instead: browser tabs join it, Python drives them.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind (loopback by default; browsers give WebGPU only to https:// or loopback pages).")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Port (0: any free port)  [default: 8000, or 9090 with --rpc]")
@click.option("--open", "open_browser", is_flag=True, help="Open the page in the default web browser.")
@click.option("--max-message-mib", type=click.IntRange(1, 4096), default=256, show_default=True,
              help="With --rpc: the largest message (a package upload is one) in MiB.")
def serve_cmd(package: Path | None, rpc: bool, host: str, port: int | None, open_browser: bool,
              max_message_mib: int) -> None:
    """Serve PACKAGE over HTTP; its index.html runs the model in the browser on WebGPU.

    With --rpc (and no PACKAGE), start the RPC server: it prints a token and a join URL; browser
    tabs that open the URL become devices that Python programs drive with kiln.rpc.connect().
    """
    if rpc:
        if package is not None:
            raise click.UsageError("--rpc serves no package; upload packages from Python (kiln.rpc.connect(...).load)")
        _serve_rpc(host, 9090 if port is None else port, open_browser, max_message_mib << 20)
        return
    if package is None:
        raise click.UsageError("give a PACKAGE to serve, or --rpc to start the RPC server")
    from kiln.runtime.serve import serve

    serve(package, host=host, port=8000 if port is None else port, open_browser=open_browser)


def _serve_rpc(host: str, port: int, open_browser: bool, max_message_bytes: int) -> None:
    """Run the RPC server until Ctrl-C, logging joins, departures and refused or closed connections."""
    import asyncio
    import logging
    import threading
    import webbrowser

    from kiln.rpc.server import RpcServer, _is_loopback

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    logging.getLogger("kiln.rpc.websockets").setLevel(logging.WARNING)
    server = RpcServer(host, port, max_message_bytes=max_message_bytes)

    async def main() -> None:
        await server.start()
        click.echo(f"Kiln RPC server at {server.url} (Ctrl-C to stop)\n"
                   f"token: {server.token}\n"
                   f"join:  {server.join_url}   (open in a browser with WebGPU; one tab = one device)\n"
                   f"drive: kiln.rpc.connect({server.url!r}, {server.token!r})")
        sys.stdout.flush()
        if not _is_loopback(host):
            click.echo(f"note: bound to {host}: browsers on other machines get WebGPU only from https:// or "
                       "loopback pages; reach this server through a tunnel (ssh -L, adb reverse) and open "
                       "http://127.0.0.1:PORT/ there", err=True)
        if open_browser:
            threading.Thread(target=webbrowser.open, args=(server.join_url,), daemon=True).start()
        await server.serve_forever()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass


from kiln.tune.cli import tune_cmd  # the command lives with the tuner

main.add_command(tune_cmd)

from kiln.cli_generate import chat_cmd, generate_cmd, transcribe_cmd
from kiln.zoo.cli import zoo_cmd  # the command lives with the zoo

main.add_command(zoo_cmd)
main.add_command(generate_cmd)
main.add_command(chat_cmd)
main.add_command(transcribe_cmd)


def _speech_info(package: Path, as_json: bool) -> None:
    """``kiln info`` of a speech package: speech.json's model and each part's size."""
    from kiln.package.format import kernel_steps, read_manifest
    from kiln.runtime.speech import read_speech_manifest

    spec = read_speech_manifest(package)
    parts = {name: read_manifest(package / folder) for name, folder in spec["parts"].items()}
    if as_json:
        click.echo(json.dumps({**{k: v for k, v in spec.items() if k not in ("suppress_ids", "tokens")},
                               "parts": {n: {"memory": m["memory"], "targets": sorted(m["targets"])}
                                         for n, m in parts.items()}}, indent=1))
        return
    click.echo(f"speech package {package}: {spec['architecture']} (format {spec['format']}), width {spec['width']}, "
               f"vocabulary {spec['vocab']}, {spec['n_mels']} mel bins, "
               + ("multilingual" if spec["multilingual"] else "English only")
               + f"; beam search up to {spec.get('beams', 1)}")
    for name, m in parts.items():
        steps = ", ".join(f"{t} {len(kernel_steps(s['plan']))} steps" for t, s in m["targets"].items())
        click.echo(f"  {name:<9} {_fmt_bytes(m['memory']['weight_bytes']):>10} weights; {steps}")
    click.echo(f"kiln info {package}/PART for a part's kernels; kiln transcribe {package} AUDIO")


def _dim_text(d: dict) -> str:
    """A ``dynamic_dims`` entry as ``kiln info`` shows it: ``seq=1..512@64``, ``batch=1..@64 (growable)``, with why an
    inferred bound holds and whether the dim is data-dependent."""
    if d.get("grow"):
        bound = f"..{d['max']}" if "inferred" in d else ".."
        note = f" (growable; bound inferred from {d['inferred']})" if "inferred" in d else " (growable)"
    else:
        bound, note = f"..{d['max']}", ""
    return f"{d['name']}={d['min']}{bound}@{d['opt']}{note}" + (" (data-dependent)" if "count" in d else "")


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


@main.command("info")
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest summary as JSON.")
def info_cmd(package: Path, as_json: bool) -> None:
    """Print a package's inputs, outputs, kernels, and weight and activation bytes (a speech package: its model and
    parts; `kiln info PKG/PART` for a part's kernels)."""
    from kiln.package.format import kernel_steps, read_manifest

    if (package / "speech.json").is_file():
        _speech_info(package, as_json)
        return
    m = read_manifest(package)
    mem = m["memory"]
    if as_json:
        click.echo(json.dumps({**{k: m[k] for k in ("name", "version", "inputs", "outputs", "memory", "dims")},
                               "precision": m.get("precision", "fp32")}, indent=1))
        return
    click.echo(f"package {package}: {m.get('name')} (format {m['version']}, {m.get('generator', '?')})")
    click.echo(f"precision: {m.get('precision', 'fp32')}" + (" (float weights and activations in f16; needs shader-f16)"
                                                              if m.get("precision", "fp32") != "fp32" else ""))
    for kind in ("inputs", "outputs"):
        click.echo(f"{kind}:")
        for io in m[kind]:
            sym = io["symbolic_shape"]
            click.echo(f"  {io['name']}: {io['dtype']}{io['shape']}" + (f"  (symbolic {sym})" if sym != io["shape"] else ""))
    if m.get("dims"):
        click.echo("dims: " + ", ".join(f"{k}={v}" for k, v in m["dims"].items()))
    if m.get("dynamic_dims"):
        click.echo("run-time dims: " + ", ".join(_dim_text(d) for d in m["dynamic_dims"]))
        grows = [b for b in m["buffers"] if "grow" in b]
        if grows:
            click.echo(f"growable buffers: {len(grows)} of {len(m['buffers'])} grow with the dims at run time "
                       f"(first size {_fmt_bytes(sum(b['bytes'] for b in grows))})")
    for name, tgt in m["targets"].items():
        uses: dict[int, int] = {}
        as_variant: dict[int, int] = {}  # steps running the kernel for some dims (docs/dynamic-shapes.md, variants)
        for s in kernel_steps(tgt["plan"]):
            uses[s["kernel"]] = uses.get(s["kernel"], 0) + 1
            for v in s.get("variants", ()):
                as_variant[v["kernel"]] = as_variant.get(v["kernel"], 0) + 1
        extra = (f", features {tgt['features']}" if tgt.get("features") else "")
        if name == "wasm":
            extra += (f", {_fmt_bytes(tgt['bytes'])} module, {_fmt_bytes(tgt['memory']['bytes'])} memory"
                      + (", threads" if tgt.get("threads") else ""))
        if name == "cpu":
            extra += f", {_fmt_bytes(tgt['bytes'])} of C, {_fmt_bytes(tgt['memory']['bytes'])} memory"
        click.echo(f"target {name}: {len(tgt['kernels'])} kernels, {len(kernel_steps(tgt['plan']))} "
                   f"{ {'webgpu': 'dispatches', 'webgl2': 'draws'}.get(name, 'calls')}{extra}")
        for i, k in enumerate(tgt["kernels"]):
            tuned = f"  tuned {k['tuning'].get('speedup', 1):.2f}x" if k.get("tuned") else ""
            variant = f" (+{as_variant[i]} as a variant)" if i in as_variant else ""
            click.echo(f"  {k['name']:<40} {'+'.join(k['ops']):<28} x{uses.get(i, 0)}{variant}{tuned}")
        tuned = [k for k in tgt["kernels"] if k.get("tuned")]
        if tuned:
            adapters = sorted({k["tuning"].get("adapter", "?") for k in tuned})
            click.echo(f"  tuned: {len(tuned)} of {len(tgt['kernels'])} kernels, for {'; '.join(adapters)}")
    nweights = sum(1 for b in m["buffers"] if b["kind"] == "weight")
    nact = sum(1 for b in m["buffers"] if b["kind"] == "activation")
    click.echo(f"weights: {_fmt_bytes(mem['weight_bytes'])} in {nweights} tensors")
    saved = 1 - mem["activation_bytes"] / mem["activation_bytes_unshared"] if mem["activation_bytes_unshared"] else 0
    click.echo(f"activations: {_fmt_bytes(mem['activation_bytes'])} planned in {nact} shared buffers "
               f"(unshared: {_fmt_bytes(mem['activation_bytes_unshared'])}, {saved:.0%} saved)")
    click.echo(f"inputs+outputs: {_fmt_bytes(mem['io_bytes'])}")


def run() -> None:
    """Console entry point: :func:`main` with quiet handling of closed pipes (``kiln info | head``)."""
    from kiln.runtime.gpu import runtime_dir

    os.environ.setdefault("XDG_RUNTIME_DIR", runtime_dir())
    try:
        main()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    run()
