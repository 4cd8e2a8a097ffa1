"""``kiln tune``: search every kernel's schedule of a model on a device and record the best in a database."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from kiln.cli_options import parse_dims
from kiln.errors import KilnError


def open_measurer(device: str, token: str | None, device_ids: tuple[int, ...]):
    """A :class:`~kiln.tune.measure.LocalMeasurer` for ``local``, else a
    :class:`~kiln.tune.measure.RemoteMeasurer` on the RPC server at ``device``."""
    from kiln.tune.measure import LocalMeasurer, RemoteMeasurer

    if device == "local":
        if device_ids:
            raise click.UsageError("--device-id needs an RPC --device")
        return LocalMeasurer()
    if not device.startswith(("ws://", "wss://", "http://", "https://")):
        raise click.BadParameter(f"{device!r}: expected 'local' or an RPC server address ws://HOST:PORT#token=...",
                                 param_hint="--device")
    return RemoteMeasurer(device, token, list(device_ids) or None)


@click.command("tune")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--db", "db_path", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Tuning database (JSON) to resume from and record into; created if missing.")
@click.option("--device", default="local", show_default=True,
              help="'local' (this machine's WebGPU adapter, natively) or an RPC server, ws://HOST:PORT#token=... "
                   "(the join URL works too): candidates are measured on its browser devices.")
@click.option("--token", help="The RPC server's token, if not in --device's #token= fragment.")
@click.option("--device-id", "device_ids", multiple=True, type=int,
              help="RPC devices to measure on (default: every device with the first device's adapter).")
@click.option("--trials", type=click.IntRange(1, 100000), default=64, show_default=True,
              help="Candidates measured per kernel (kernels already recorded with as many are skipped).")
@click.option("--minutes", type=click.FloatRange(0, min_open=True), help="Time budget of the whole run.")
@click.option("--device-class", type=click.Choice(["auto", "gpu", "cpu"]), default="auto", show_default=True,
              help="Default schedules to compare with: auto is cpu on a CPU adapter, else gpu.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=SIZE", help="Bind a symbolic dim (default 1).")
@click.option("--jobs", type=click.IntRange(1, 64), help="Processes lowering candidates (default: CPUs - 1).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the search.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the per-kernel report as JSON.")
def tune_cmd(model: Path, db_path: Path, device: str, token, device_ids, trials: int, minutes, device_class: str,
             dims, jobs, seed: int, json_out) -> None:
    """Tune MODEL's kernels on a device; the best schedules go into the --db tuning database.

    Kernels are searched in order of their share of the model's GPU time (evolutionary search
    with a cost model); every candidate's output is checked against the default schedule's.
    Then `kiln compile MODEL --tuning-db DB` uses the records (see --adapter there).
    """
    import time

    from rich.console import Console
    from rich.table import Table

    from kiln.tune.db import TuningDB, adapter_key
    from kiln.tune.tuner import Budget, estimated_speedup, tune_model

    if not model.exists():
        raise KilnError(f"{model}: no such file")
    db = TuningDB(db_path)
    measurer = open_measurer(device, token, device_ids)
    if device_class == "auto":
        device_class = "cpu" if measurer.is_cpu else "gpu"
    jobs = jobs or max(1, min(15, (os.cpu_count() or 2) - 1))
    console = Console(stderr=True)
    console.print(f"tuning {model} on {measurer.describe()}; device class {device_class}, {trials} trials per kernel"
                  + (f", {minutes:g} min" if minutes else "") + f", {jobs} lowering process(es)")
    t0 = time.monotonic()
    try:
        tasks = tune_model(model, measurer, db, Budget(trials, minutes * 60 if minutes else None),
                           device_class=device_class, dims=parse_dims(dims, ranges=False), jobs=jobs, seed=seed,
                           progress=console.is_terminal, log=console.print)
    finally:
        if hasattr(measurer, "close"):
            measurer.close()
    table = Table(title=f"{model.name} on {adapter_key(measurer.adapter)}")
    for col in ("kernel", "shape", "uses", "share", "default ms", "best ms", "speedup", "trials", "status"):
        table.add_column(col, justify="left" if col in ("kernel", "shape", "status") else "right")
    total = sum(t.profile_ms for t in tasks) or 1.0
    for t in sorted(tasks, key=lambda t: -t.profile_ms):
        r = t.result
        table.add_row(t.name, "x".join(map(str, t.shape)), str(t.uses), f"{t.profile_ms / total:.1%}",
                      f"{r['default_ms']:.4f}" if "default_ms" in r else "-",
                      f"{r['best_ms']:.4f}" if "best_ms" in r else "-",
                      f"{r['speedup']:.2f}x" if "speedup" in r else "-", str(r.get("trials", "-")),
                      r.get("status", "-") + (f": {r['reason']}" if "reason" in r else "")
                      + (" (replaced a stale record)" if r.get("replaced_stale") else ""))
    out = Console()
    if not out.is_terminal:
        out.width = 160
    out.print(table)
    click.echo(f"estimated model GPU speedup {estimated_speedup(tasks):.2f}x in {time.monotonic() - t0:.0f} s; "
               f"{len(db)} records in {db_path}")
    words = " ".join(measurer.adapter[k] for k in ("vendor", "architecture", "device") if measurer.adapter[k])
    click.echo(f"compile with: kiln compile {model} -o PACKAGE --tuning-db {db_path} --device-class {device_class}"
               + ("" if device == "local" else f" --adapter '{words}'"))
    if json_out:
        from kiln.package.format import atomic_path

        with atomic_path(json_out) as tmp:
            tmp.write_text(json.dumps([{"kernel": t.name, "signature": t.signature, "ops": t.ops, "shape": t.shape,
                                        "uses": t.uses, "profile_ms": t.profile_ms, **t.result} for t in tasks],
                                      indent=1))
