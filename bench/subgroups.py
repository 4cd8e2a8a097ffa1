"""Kernels' subgroup forms against their plain forms, in one process on one device (WebGPU's ``subgroups``).

Usage: ``python -m bench.subgroups [--model SmolLM2.gguf] [--contexts 128,1024] [--models minilm_b1,...]
[--rounds 5] [--out DIR]``.

Each model is compiled once; two sessions load the package, one with ``subgroups=False`` (every kernel's plain
form: lane combines through workgroup memory) and one with ``True`` (the subgroup forms, :mod:`kiln.runtime.subgroups`),
and their runs alternate round by round. Measured per session (medians of the rounds, ms):

- a language model (``--model``, a GGUF): a decode step at each of ``--contexts`` cached tokens, ``queued`` (steps
  submitted back to back, nothing read back: the GPU's time a step where it is the bottleneck) and ``gpu`` (the
  step's dispatches timed alone with timestamp queries, summed), and greedy ``tokens/s`` generating ``--generate``
  tokens (128) after ``context - 64``;
- ONNX models of :mod:`bench.gpu` (``--models``, exported from PyTorch with random weights): a run with inputs and
  outputs on the GPU, queued, and its GPU time.

Prints a table (the ratio is plain / subgroups: above 1 the subgroup forms are faster) and writes JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import ROOT, write_record
from bench.llm import MODEL


def _queued(run, n: int, sync) -> float:
    """ms a run, ``n`` runs submitted back to back."""
    run()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        run()
    sync()
    return (time.perf_counter() - t0) * 1e3 / n


def _gpu_ms(session, feeds: dict) -> float:
    return float(sum(p["ms"] for p in session.profile(feeds, repeat=3) if p["dispatch"][0]))


#: the adapter the sessions ran on (set by :func:`_sessions`)
ADAPTER: dict = {}


def _sessions(package: Path) -> dict:
    import kiln

    made = {label: kiln.load(package, subgroups=flag) for label, flag in (("plain", False), ("subgroups", True))}
    ADAPTER.update(made["plain"].adapter_info())
    if not made["subgroups"].subgroups:
        raise SystemExit("this device runs no subgroup forms (no 'subgroup' feature, or the probe failed)")
    return made


def bench_llm(model: Path, contexts: list[int], rounds: int, n: int, tokens: int = 128) -> list[dict]:
    """Rows of the language model's decode steps and greedy generation (module docstring)."""
    from bench.llm_profile import generate_parts
    from kiln.compiler import compile_model
    from kiln.passes.split_attention import BLOCK

    out = Path(tempfile.mkdtemp(prefix="kiln-sg-")) / "pkg"
    compile_model(model, out, max_context=-(-(max(contexts) + 72) // BLOCK) * BLOCK, validate=False)
    sessions = _sessions(out)
    gen = sessions["plain"].manifest["generation"]
    rows = []
    for ctx in contexts:
        feeds = {gen["input_ids"]: np.array([[42]], np.int64), gen["cache"]["position"]: np.array([ctx - 1], np.int64)}
        got: dict[str, dict[str, list[float]]] = {k: {"queued": [], "gpu": [], "tokens/s": []} for k in sessions}
        for r in range(rounds):
            for label, s in (sessions.items() if r % 2 == 0 else reversed(sessions.items())):
                got[label]["queued"].append(_queued(lambda s=s, f=feeds: s.run(f, output="gpu"), n, s.sync))
                got[label]["gpu"].append(_gpu_ms(s, feeds))
                if tokens:
                    got[label]["tokens/s"].append(generate_parts(s, max(1, ctx - tokens // 2), tokens)[0])
        for what in ("queued", "gpu", "tokens/s")[:3 if tokens else 2]:
            rows.append({"model": model.stem, "case": f"decode @{ctx}", "measure": what,
                         **{k: float(np.median(v[what])) for k, v in got.items()}})
            print(rows[-1], flush=True)
    return rows


def bench_onnx(name: str, rounds: int, n: int) -> list[dict]:
    """Rows of one of bench.gpu's models: a GPU-resident run, queued and its GPU time."""
    import kiln
    from bench.gpu import export_onnx, model_inputs, torch_model
    from kiln.runtime.gpu import to_gpu

    d = Path(tempfile.mkdtemp(prefix="kiln-sg-"))
    onnx_path = export_onnx(torch_model(name), name, d / f"{name}.onnx")
    kiln.compile(str(onnx_path), str(d / "pkg"), target="webgpu")
    sessions = _sessions(d / "pkg")
    host = model_inputs(name, np.random.default_rng(0))
    got: dict[str, dict[str, list[float]]] = {k: {"queued": [], "gpu": []} for k in sessions}
    for r in range(rounds):
        for label, s in (sessions.items() if r % 2 == 0 else reversed(sessions.items())):
            feeds = {k: to_gpu(v, device=s.device) for k, v in host.items()}
            got[label]["queued"].append(_queued(lambda s=s, f=feeds: s.run(f, output="gpu"), n, s.sync))
            got[label]["gpu"].append(_gpu_ms(s, host))
    rows = [{"model": name, "case": "run", "measure": what, **{k: float(np.median(v[what])) for k, v in got.items()}}
            for what in ("queued", "gpu")]
    print(*rows, sep="\n", flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict:
    """Run the comparison (module docstring); returns the JSON record."""
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL, help="a GGUF language model ('' to skip)")
    ap.add_argument("--contexts", default="128,1024", help="cached tokens of the decode steps timed")
    ap.add_argument("--models", default="minilm_b1,minilm_b32", help="bench.gpu's ONNX models ('' for none)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--generate", type=int, default=128, help="greedy tokens a generation (0: none)")
    ap.add_argument("--runs", type=int, default=200, help="runs queued back to back a round")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    a = ap.parse_args(argv)
    rows: list[dict] = []
    if str(a.model) not in ("", "."):
        rows += bench_llm(a.model, [int(c) for c in a.contexts.split(",")], a.rounds, a.runs, a.generate)
    for name in filter(None, a.models.split(",")):
        rows += bench_onnx(name, a.rounds, a.runs)
    table = Table(title="subgroup forms against plain forms (medians; ratio: plain / subgroups)")
    for col in ("model", "case", "measure", "plain", "subgroups", "ratio"):
        table.add_column(col)
    for r in rows:
        ratio = r["subgroups"] / r["plain"] if r["measure"] == "tokens/s" else r["plain"] / r["subgroups"]
        r["ratio"] = ratio
        table.add_row(r["model"], r["case"], r["measure"], f"{r['plain']:.3f}", f"{r['subgroups']:.3f}", f"{ratio:.3f}")
    Console().print(table)
    record = {"bench": "subgroups", "adapter": ADAPTER, "rounds": a.rounds, "runs": a.runs, "rows": rows}
    path = write_record(record, a.out, "subgroups")
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
