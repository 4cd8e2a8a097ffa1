"""Where a decode step's time goes: GPU time per kernel (timestamp queries) against the step's wall clock.

Usage: ``python -m bench.llm_profile [--model M.gguf] [--context 1024] [--prompt 0] [--precision fp32]
[--device-class gpu]``; prints the step's dispatches, wall-clock ms, summed GPU ms and the kernels that take the
most GPU time. ``--prompt P`` profiles a prefill step of ``P`` tokens (an empty cache) instead of a decode step.

The step's wall clock is split as well (medians, ms):

- ``wall``: a step as ``session.generate`` runs it (``run(output="gpu")``, then ``next_token`` read back);
- ``moving``: the same with the position one further every step (the dims, and so the dispatches, evaluated again);
- ``host``: until ``run(output="gpu")`` returns (the dims bound, the plan encoded and submitted; no waiting);
- ``queued``: steps submitted back to back with nothing read back, per step: the larger of the host's and the
  GPU's time per step (a GPU-bound step shows its GPU time here).

``--skip PREFIX,...`` then times steps queued back to back with the dispatches of the kernels whose names start
with each prefix (``k006``: a kernel of this build, as the table lists them) left out, each prefix and all together
(wrong results, timing only): an upper bound on what fusing those kernels away could save.

Then the host's time in ``session.generate``'s greedy loop by part (``--generate N`` tokens after a prompt of
``context - N / 2`` tokens, the last of 3 answers; 0 skips it): every call of the runtime's parts timed (µs a
token): ``_run`` (a whole step's ``run``) and within it ``_bind_dims`` (the run-time dims bound, dispatches
evaluated), ``_split_feeds``, ``_encode_chunks`` (the C loop), wgpu's ``finish``/``submit``/``write_buffer``,
``gpu.empty`` (the returned tensors); and ``result(wait)``, the host waiting for the token: a loop with time to
wait is GPU-bound.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import GPU_WARMUP_S, host_ms, time_runs
from bench.llm import MODEL


def main(argv: list[str] | None = None) -> None:
    """Profile one decode step and print the summary."""
    import kiln
    from kiln.compiler import compile_model

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--prompt", type=int, default=0, help="profile a prefill of this many tokens instead")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--device-class", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--generate", type=int, default=128, help="tokens a generation for the host's parts (0: skip)")
    ap.add_argument("--skip", default="", help="kernel name prefixes whose dispatches to leave out, timing only")
    a = ap.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="kiln-llm-")) / "pkg"
    from kiln.passes.split_attention import BLOCK  # (whole blocks: the split pads no zero rows)

    compile_model(a.model, out, max_context=-(-(max(a.context, a.prompt) + 8) // BLOCK) * BLOCK,
                  device_class=a.device_class, validate=False,
                  precision=a.precision)
    s = kiln.load(out)
    gen = s.manifest["generation"]
    if a.prompt:
        feeds = {gen["input_ids"]: np.full((1, a.prompt), 42, np.int64), gen["cache"]["position"]: np.array([0], np.int64)}
    else:  # one token after a.context - 1 cached ones (the cache, the package's state, stays in place)
        feeds = {gen["input_ids"]: np.array([[42]], np.int64),
                 gen["cache"]["position"]: np.array([a.context - 1], np.int64)}
    walls = split(s, gen, feeds)
    # (warmup_s: the clocks ramped up again after split's gaps)
    prof = [p for p in s.profile(feeds, repeat=5, warmup_s=GPU_WARMUP_S) if p["dispatch"][0]]  # (steps with no workgroups this step: none)
    total: dict[str, float] = {}
    count: dict[str, int] = {}
    for p in prof:
        total[p["kernel"]] = total.get(p["kernel"], 0.0) + p["ms"]
        count[p["kernel"]] = count.get(p["kernel"], 0) + 1
    what = f"prefill of {a.prompt} tokens" if a.prompt else f"decode step at context {a.context}"
    print(f"{what} ({a.precision}): {len(prof)} dispatches, GPU {sum(total.values()):.2f} ms (each dispatch "
          "alone), " + ", ".join(f"{k} {v:.3f} ms" for k, v in walls.items()))
    for k, v in sorted(total.items(), key=lambda x: -x[1])[:12]:
        print(f"  {k:48s} x{count[k]:4d} {v:8.3f} ms")
    if a.skip and not a.prompt:
        for label, (ms, dispatches) in skipped(s, feeds, a.skip.split(",")).items():
            print(f"queued without {label}: {ms:.3f} ms a step, {dispatches} dispatches")
    if a.generate and not a.prompt and a.device_class == "gpu":
        rate, parts = generate_parts(s, max(1, a.context - a.generate // 2), a.generate)
        print(f"generate, {a.generate} tokens from context {max(1, a.context - a.generate // 2)}: {rate:.1f} tokens/s; "
              "host us a token: " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))


def skipped(session, feeds: dict, prefixes: list[str], n: int = 300, rounds: int = 5) -> dict[str, tuple[float, int]]:
    """Per-step ms (the best of ``rounds`` of ``n`` steps queued back to back, fixed dims) and dispatches with the
    steps of kernels named ``prefix*`` given no workgroups (the recording loop skips them), for no prefix (``none``),
    each prefix and all of them. Uses the session's recorded counts (``_table``: the C loop's), so the plan keeps
    its dims; results are wrong while they are skipped."""
    gen = session.manifest["generation"]
    want = [gen["next_token"]]
    session.run(feeds, output="gpu", outputs=want)[want[0]].numpy()
    if session._table is None:
        raise SystemExit("--skip needs the C dispatch loop (kiln.runtime.record) and run-time dims")
    counts, table = session._table
    names = np.array(session.step_names)
    live = table[:, 0] > 0

    def queued(mask) -> tuple[float, int]:
        edited = table.copy()
        edited[mask] = 0
        session._table = (counts, edited)
        try:
            best = []
            for _ in range(rounds):
                session.sync()
                t0 = time.perf_counter()
                for _ in range(n):
                    session.run(feeds, output="gpu", outputs=want)
                session.sync()
                best.append((time.perf_counter() - t0) * 1e3 / n)
        finally:
            session._table = (counts, table)
        return min(best), int((live & ~mask).sum())

    masks = {"none": np.zeros(len(names), bool)}
    masks.update({p: np.char.startswith(names, p) for p in prefixes})
    if len(prefixes) > 1:
        masks[" and ".join(prefixes)] = np.any([np.char.startswith(names, p) for p in prefixes], axis=0)
    return {label: queued(m) for label, m in masks.items()}


@contextlib.contextmanager
def _timed(parts: dict[str, float], targets: list[tuple[object, str, str]]):
    """Wrap each ``(owner, attribute, label)`` callable so that its calls add their seconds to ``parts[label]``."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]

    def wrap(f, label):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                parts[label] = parts.get(label, 0.0) + time.perf_counter() - t
        return timed

    try:
        for (owner, name, label), (_, _, f) in zip(targets, saved):
            setattr(owner, name, wrap(f, label))
        yield
    finally:
        for owner, name, f in saved:
            setattr(owner, name, f)


def generate_parts(session, prompt: int, tokens: int) -> tuple[float, dict[str, float]]:
    """Greedy tokens/s of the last of 3 answers of ``tokens`` after ``prompt`` random ids, and the host's µs a
    token in each part (module docstring), largest first."""
    import wgpu.backends.wgpu_native._api as api

    from kiln.runtime import gpu, native

    rng = np.random.default_rng(2)
    logits = session.manifest["generation"]["logits"]
    vocab = next(o["shape"][-1] for o in session.manifest["outputs"] if o["name"] == logits)
    parts: dict[str, float] = {}
    S = native.Session
    targets = [(S, n, n) for n in ("_run", "_bind_dims", "_split_feeds", "_encode_chunks")] + [
        (gpu.PendingRead, "result", "result(wait)"), (gpu, "empty", "gpu.empty"),
        (api.GPUCommandEncoder, "finish", "finish"), (api.GPUQueue, "submit", "submit"),
        (api.GPUQueue, "write_buffer", "write_buffer")]
    with _timed(parts, targets):
        for _ in range(3):
            parts.clear()
            ids = rng.integers(min(100, vocab - 1), min(40000, vocab), prompt).tolist()
            for _ in session.generate(ids, tokens):
                pass
    n = session.generator.stats.new_tokens
    return session.generator.stats.decode_tokens_per_s, {k: v / n * 1e6 for k, v in sorted(parts.items(),
                                                                                       key=lambda x: -x[1])}


def split(s, gen: dict, feeds: dict, n: int = 40) -> dict[str, float]:
    """The step's wall clock, and its parts (module docstring), medians in ms."""
    def step(f: dict) -> None:
        out = s.run(f, output="gpu")
        out[gen["next_token"]].numpy()

    _, wall = time_runs(lambda: step(feeds), n, 3, warmup_s=GPU_WARMUP_S)  # (the GPU's clocks ramped up)
    pos = int(feeds[gen["cache"]["position"]][0])
    moved = itertools.count()
    _, moving = time_runs(lambda: step({**feeds, gen["cache"]["position"]: np.array([pos + next(moved) % 8], np.int64)}),
                          n, 0)
    host = host_ms(s, feeds, n)
    t0 = time.perf_counter()
    for _ in range(n):
        s.run(feeds, output="gpu")
    s.sync()
    queued = (time.perf_counter() - t0) * 1e3 / n
    return {"wall": float(np.median(wall)), "moving": float(np.median(moving)), "host": host,
            "queued": queued}


if __name__ == "__main__":
    main()
