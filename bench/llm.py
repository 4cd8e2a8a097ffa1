"""Language-model speed: prefill and decode tokens/s of a GGUF package, Kiln against PyTorch, in one run.

Usage::

    python -m bench.llm [--model models/zoo/SmolLM2-135M-Instruct.Q4_1.gguf] [--prompts 128,512]
                        [--contexts 128,1024] [--repeat 10] [--warmup 3] [--warmup-s 1.5] [--device-class gpu]
                        [--precision fp32,fp16]
                        [--torch | --torch-all] [--ort] [--no-sampled]
                        [--out bench/results]

Kiln: ``kiln compile MODEL.gguf`` (WebGPU, packed weights), natively through wgpu-py. Prefill: one step of
``P`` prompt tokens with an empty cache, timed to the last row's arg max read back. Decode: one step of one
token after a cache of ``C - 1`` tokens (the package's state, kept in place: the work does not depend on its
values), only ``next_token`` read back, as ``session.generate`` does; tokens/s is 1000 / median ms. Decode
generate: greedy answers streamed by ``session.generate`` around each context (:func:`generate_decode`: the position
moves each step, and the next step is queued while a token is read). Decode
sampled: the same step, then a draw with temperature 0.7, top-p 0.9, top-k 50 and repetition penalty 1.1 over
``C`` seen ids, by the package's sampler on the GPU (the id read back) and, for comparison, on the host (the
logits read back, numpy), as packages without a sampler do.
PyTorch (``--torch``, needs CUDA): a plain fp32 Llama of the same weights (dequantized with
``gguf.quants.dequantize``) with a static KV cache, eager; ``--torch-all``: fp32 and fp16, each eager and under
``torch.compile``. Also recorded: load time (package to first
runnable session), the package's weight bytes and its device buffer bytes at these bounds.

``--ort``: onnxruntime's WebGPU EP (``onnxruntime-webgpu``, Dawn) on the 4-bit ONNX export of the same weights (what
transformers.js runs; see :func:`ort_webgpu_contestant`); carry its wheel in ``.whl`` on the lent GPU.

Prints a table and writes ``llm-<date>.json`` with the adapter, versions and the commit.

On the lent GPU the model (98 MB) is over a call's carry limit (64 MiB with the working tree), and a machine is
given back 30 s after a call, so parts carried in several calls do not meet. Carry its header instead
(``python -m bench.gguf_stand_in header MODEL .llm/smollm2.header``, 1.8 MB) and write a stand-in there
(``python -m bench.gguf_stand_in fill .llm/smollm2.header /tmp/llm/smollm2.gguf``; the real layout with random
weights, which no kernel's work depends on), then pass ``--model /tmp/llm/smollm2.gguf``. To time the previous
commit in the same lease, carry a copy of its ``kiln/`` (``git archive HEAD kiln | tar -x -C base``) and run the
bench from ``base/`` with ``PYTHONPATH=/tmp/site:..``.
Issue 15's goals (H100): decode >= 750 tokens/s at context 1024 and >= 2x onnxruntime's WebGPU EP.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import GPU_WARMUP_S, ROOT, summary, time_runs, write_record
from kiln.passes.split_attention import BLOCK

MODEL = ROOT / "models" / "zoo" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def kiln_contestant(model: Path, prompts: list[int], contexts: list[int], repeat: int, warmup: int,
                    device_class: str, console: Console, precision: str = "fp32", sampled: bool = True,
                    run_ahead: tuple[int, ...] = (), rounds: int = 3, warmup_s: float = GPU_WARMUP_S) -> dict:
    """Kiln's prefill and decode timings (ms) at each prompt length and context, for a package compiled with
    ``precision`` (``fp16``: f16 activations and KV cache, the packed weights' scales as they are); with
    ``sampled`` also decode steps that sample (:func:`sampled_decode`); ``run_ahead``: :func:`generate_decode`'s."""
    import kiln
    from kiln.compiler import compile_model
    from kiln.runtime.dynamic import StepSizes

    # (a multiple of the split attention's block, kiln.passes.split_attention: no zero rows padded to its last block)
    max_context = -(-(max(prompts + contexts) + GENERATED // 2 + 8) // BLOCK) * BLOCK
    out = Path(tempfile.mkdtemp(prefix="kiln-llm-")) / "pkg"
    t0 = time.perf_counter()
    compile_model(model, out, max_context=max_context, device_class=device_class, validate=False, precision=precision)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    session = kiln.load(out)
    load_s = time.perf_counter() - t0
    gen = session.manifest["generation"]
    rng = np.random.default_rng(0)
    plan = session.manifest["targets"]["webgpu"]["plan"]
    sizes = StepSizes(plan, "groups")
    rec = {"precision": precision, "plan_steps": len(plan),
           # a decode step runs the steps with workgroups at its dims (attention's alternatives: one or the other)
           "dispatches": {str(c): sum(1 for d in sizes.dispatches({"sequence": 1, "past_sequence": c - 1})[1] if d[0])
                          for c in contexts},
           "compile_s": compile_s, "load_s": load_s, "weight_bytes": session.manifest["memory"]["weight_bytes"],
           "device_bytes": sum(b["bytes"] for b in session.manifest["buffers"]),
           "adapter": session.adapter_info(), "prefill": {}, "decode": {},
           # how the host records a step's dispatches (kiln.runtime.record: a loop in C, else Python)
           "dispatch_loop": "c" if session._raw and session._raw.plan is not None else "python"}

    def feeds(tokens: int, past: int) -> dict:
        """A step of ``tokens`` after ``past`` cached ones (the cache is the package's state, kept in place)."""
        return {gen["input_ids"]: rng.integers(100, 40000, (1, tokens)).astype(np.int64),
                gen["cache"]["position"]: np.array([past], np.int64)}

    def step(f: dict) -> None:
        out = session.run(f, output="gpu")
        out[gen["next_token"]].numpy()
        for t in out.values():
            t.release()

    for p in prompts:
        f = feeds(p, 0)
        cold, times = time_runs(lambda f=f: step(f), repeat, warmup, warmup_s=warmup_s)
        rec["prefill"][p] = {**summary(times, cold), "tokens_per_s": p / (np.median(times) / 1e3)}
        console.log(f"kiln {precision} prefill {p}: {np.median(times):.2f} ms")
    for c in contexts:
        f = feeds(1, c - 1)
        cold, times = time_runs(lambda f=f: step(f), repeat, warmup, warmup_s=warmup_s)
        rec["decode"][c] = {**summary(times, cold), "tokens_per_s": 1e3 / np.median(times)}
        console.log(f"kiln {precision} decode at {c}: {np.median(times):.2f} ms")
    rec["generate"] = generate_decode(session, contexts, console, precision, rounds=rounds, run_ahead=run_ahead)
    if sampled:
        rec["decode_sampled"] = sampled_decode(session, feeds, contexts, repeat, warmup, console, precision,
                                               warmup_s)
    return rec


#: tokens ``generate_decode`` generates per answer (half of them before the context it is named after, half after)
GENERATED = 64


def generate_decode(session, contexts: list[int], console: Console, precision: str, rounds: int = 3,
                    run_ahead: tuple[int, ...] = ()) -> dict:
    """Greedy decode tokens/s as ``session.generate`` streams an answer (the position moving every step, steps
    queued while a token is read: :class:`kiln.runtime.generate.Generator`): a prompt of ``C - 32`` random token
    ids, then :data:`GENERATED` tokens (fewer if the model chose its end token), the median of ``rounds``. With
    ``run_ahead`` depths, each round generates once per depth (``Generator.run_ahead``, interleaved, the same
    prompt) and ``by_run_ahead`` holds each depth's figures; the main figures are the generator's default depth."""
    rng = np.random.default_rng(2)
    gen = session.generator
    default = gen.run_ahead
    depths = list(dict.fromkeys([default, *run_ahead]))
    out = {}
    for c in contexts:
        rates: dict[int, list[float]] = {d: [] for d in depths}
        tokens: dict[int, list[int]] = {d: [] for d in depths}
        try:
            for _ in range(rounds + 1):  # (the first compiles nothing new but warms the step at every position)
                ids = rng.integers(100, 40000, max(1, c - GENERATED // 2)).tolist()
                for d in depths:
                    gen.run_ahead = d
                    for _ in session.generate(ids, GENERATED):
                        pass
                    rates[d].append(gen.stats.decode_tokens_per_s)
                    tokens[d].append(gen.stats.new_tokens)
        finally:
            gen.run_ahead = default
        each = {d: {"tokens_per_s": float(np.median(rates[d][1:])), "samples": rates[d][1:], "new_tokens": tokens[d][1:]}
                for d in depths}
        out[c] = {**each[default], "run_ahead": default}
        if run_ahead:
            out[c]["by_run_ahead"] = {str(d): v for d, v in each.items()}
        console.log(f"kiln {precision} generate at {c}: " + ", ".join(
            f"{v['tokens_per_s']:.1f} tokens/s (run ahead {d})" for d, v in each.items()))
    return out


#: the sampling options the ``decode sampled`` rows use (a chat UI's usual settings)
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.1}


def sampled_decode(session, feeds, contexts: list[int], repeat: int, warmup: int, console: Console,
                   precision: str, warmup_s: float = GPU_WARMUP_S) -> dict:
    """Decode steps that sample (``SAMPLING``, ``context`` ids penalised) instead of taking the arg max: the step
    plus the package's sampler on the GPU reading back the id (``device``), or the step plus reading back the
    logits and :func:`kiln.runtime.generate.sample` in numpy (``host``, what a package without a sampler does)."""
    from kiln.runtime.generate import SamplingOptions, sample

    gen = session.manifest["generation"]
    sampler = session.generator.sampler()
    opts = SamplingOptions(**SAMPLING)
    rng = np.random.default_rng(1)
    out: dict = {}
    for c in contexts:
        f = feeds(1, c - 1)
        seen = rng.choice(40000, min(c, 40000), replace=False).tolist()
        sfeeds = {"seen": np.asarray(seen, np.int32), "seed": np.array([1, 0], np.int32),
                  "options": np.array([opts.temperature, opts.top_p, opts.repetition_penalty, opts.top_k], np.float32)}

        def on_device(f=f, sfeeds=sfeeds):
            res = session.run(f, output="gpu")
            sampler.run({**sfeeds, "logits": res[gen["logits"]]})["token"].reshape(-1)
            for t in res.values():
                t.release()

        def on_host(f=f, seen=seen):
            res = session.run(f, output="gpu")
            sample(res[gen["logits"]].numpy().reshape(-1), opts, seen, rng)
            for t in res.values():
                t.release()

        out[c] = {}
        for name, fn in (("device", on_device), ("host", on_host)):
            cold, times = time_runs(fn, repeat, warmup, warmup_s=warmup_s)
            out[c][name] = {**summary(times, cold), "tokens_per_s": 1e3 / np.median(times)}
            console.log(f"kiln {precision} sampled decode at {c}, sampler on the {name}: {np.median(times):.2f} ms")
    return out


def torch_contestant(model: Path, prompts: list[int], contexts: list[int], repeat: int, warmup: int,
                     console: Console, dtype: str = "float32", compiled: bool = False,
                     warmup_s: float = GPU_WARMUP_S) -> dict:
    """A plain PyTorch Llama (static KV cache) of the GGUF's dequantized weights, on CUDA, in ``dtype``
    (``float32`` or ``float16``), eager or under ``torch.compile`` (``compiled``: the step's tensor work compiled
    once per shape, inductor's default mode; the cache a static buffer written in place)."""
    import gguf
    import torch

    r = gguf.GGUFReader(str(model))
    f = {k: r.fields[k].contents() for k in r.fields if k.startswith("llama.")}
    dev = "cuda"
    dt = getattr(torch, dtype)
    w = {t.name: torch.tensor(gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32), device=dev).to(dt)
         for t in r.tensors}
    layers, heads, kv = f["llama.block_count"], f["llama.attention.head_count"], f["llama.attention.head_count_kv"]
    d = f["llama.embedding_length"]
    hd, eps, base = d // heads, f["llama.attention.layer_norm_rms_epsilon"], f["llama.rope.freq_base"]
    ctx = max(prompts + contexts) + 8
    inv = base ** (-torch.arange(0, hd, 2, dtype=torch.float64, device=dev) / hd)
    ang = torch.arange(ctx, dtype=torch.float64, device=dev)[:, None] * inv[None]
    cos, sin = torch.cos(ang).to(dt), torch.sin(ang).to(dt)
    kc = torch.zeros(layers, kv, ctx, hd, device=dev, dtype=dt)
    vc = torch.zeros(layers, kv, ctx, hd, device=dev, dtype=dt)
    head = w.get("output.weight", w["token_embd.weight"])

    def rms(x, g):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * g

    def rope(x, pos):  # adjacent pairs (GGUF's layout)
        c, s = cos[pos][:, None], sin[pos][:, None]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).flatten(-2)

    def step(ids, start: int):
        t = ids.shape[0]
        pos = torch.arange(start, start + t, device=dev)
        x = w["token_embd.weight"][ids]
        for i in range(layers):
            p = f"blk.{i}."
            h = rms(x, w[p + "attn_norm.weight"])
            q = rope((h @ w[p + "attn_q.weight"].T).view(t, heads, hd), pos).transpose(0, 1)
            k = rope((h @ w[p + "attn_k.weight"].T).view(t, kv, hd), pos).transpose(0, 1)
            v = (h @ w[p + "attn_v.weight"].T).view(t, kv, hd).transpose(0, 1)
            kc[i, :, start:start + t] = k
            vc[i, :, start:start + t] = v
            kk = kc[i, :, :start + t].repeat_interleave(heads // kv, 0)
            vv = vc[i, :, :start + t].repeat_interleave(heads // kv, 0)
            a = torch.nn.functional.scaled_dot_product_attention(q[None], kk[None], vv[None], is_causal=start == 0)
            x = x + a[0].transpose(0, 1).reshape(t, d) @ w[p + "attn_output.weight"].T
            h = rms(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            x = x + (torch.nn.functional.silu(g) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        return (rms(x[-1:], w["output_norm.weight"]) @ head.T).argmax(-1)

    core = torch.compile(step, dynamic=False) if compiled else step

    @torch.no_grad()
    def forward(ids, start):
        return core(ids, start).item()

    rec = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": dtype,
           "compiled": compiled, "prefill": {}, "decode": {}}
    sync = torch.cuda.synchronize
    for p in prompts:
        ids = torch.randint(100, 40000, (p,), device=dev)
        cold, times = time_runs(lambda ids=ids: forward(ids, 0), repeat, warmup, sync=sync, warmup_s=warmup_s)
        rec["prefill"][p] = {**summary(times, cold), "tokens_per_s": p / (np.median(times) / 1e3)}
    for c in contexts:
        ids = torch.randint(100, 40000, (1,), device=dev)
        cold, times = time_runs(lambda ids=ids, c=c: forward(ids, c - 1), repeat, warmup, sync=sync, warmup_s=warmup_s)
        rec["decode"][c] = {**summary(times, cold), "tokens_per_s": 1e3 / np.median(times)}
        console.log(f"torch {dtype}{' compiled' if compiled else ''} decode at {c}: {np.median(times):.2f} ms")
    return rec


def ort_webgpu_contestant(model: Path, prompts: list[int], contexts: list[int], repeat: int, warmup: int,
                          console: Console, warmup_s: float = GPU_WARMUP_S) -> dict:
    """onnxruntime's WebGPU EP (``onnxruntime-webgpu``, Dawn) on the 4-bit ONNX export of the same weights: what
    transformers.js runs (``kiln.zoo.llama_export``: the decoder with ``past_key_values.*`` inputs, then
    onnxruntime's own ``MatMulNBits`` quantizer, blocks of 32 with zero points; made here, ~40 s). Prefill: ``P``
    tokens with an empty cache, logits read back. Decode: one token after ``C - 1`` cached rows; with IO binding
    the cache lives on the device (``mode: "iobinding"``) and only the logits come back, else (when the EP's
    device tensors are unavailable) the cache goes through host arrays (``mode: "host"``)."""
    import onnxruntime as ort

    from kiln.zoo.llama_export import export_decoder, quantize_4bit

    work = Path(tempfile.mkdtemp(prefix="kiln-llm-ort-"))
    t0 = time.perf_counter()
    c = export_decoder(model, work / "fp32.onnx")
    quantize_4bit(work / "fp32.onnx", work / "q4.onnx")
    export_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    session = ort.InferenceSession(str(work / "q4.onnx"), providers=["WebGpuExecutionProvider"])
    load_s = time.perf_counter() - t0
    names = [f"past_key_values.{i}.{p}" for i in range(c["layers"]) for p in ("key", "value")]
    outs = [o.name for o in session.get_outputs()]
    rng = np.random.default_rng(0)
    rec = {"export_s": export_s, "load_s": load_s, "providers": session.get_providers(), "version": ort.__version__,
           "prefill": {}, "decode": {}, "mode": "host"}

    def feeds(tokens: int, past: int) -> dict:
        return {"input_ids": rng.integers(100, 40000, (1, tokens)).astype(np.int64),
                "attention_mask": np.ones((1, past + tokens), np.int64),
                "position_ids": np.arange(past, past + tokens, dtype=np.int64)[None],
                **{n: rng.standard_normal((1, c["kv_heads"], past, c["head_dim"])).astype(np.float32) for n in names}}

    for p in prompts:
        f = feeds(p, 0)
        cold, times = time_runs(lambda f=f: session.run(["logits"], f), repeat, warmup, warmup_s=warmup_s)
        rec["prefill"][p] = {**summary(times, cold), "tokens_per_s": p / (np.median(times) / 1e3)}
        console.log(f"ort-webgpu prefill {p}: {np.median(times):.2f} ms")
    for ctx in contexts:
        f = feeds(1, ctx - 1)
        try:  # the cache on the device: bound once, outputs other than the logits left there
            binding = session.io_binding()
            for k, v in f.items():
                binding.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, "webgpu", 0) if k in names else
                                            ort.OrtValue.ortvalue_from_numpy(v))
            binding.bind_output("logits", "cpu")
            for o in outs[1:]:
                binding.bind_output(o, "webgpu")

            def run(binding=binding):
                session.run_with_iobinding(binding)
                binding.get_outputs()[0].numpy()

            run()
            rec["mode"] = "iobinding"
        except Exception as e:  # noqa: BLE001 (any EP failure: report it, time the host path)
            console.log(f"ort-webgpu: no device-resident cache ({type(e).__name__}: {e}); host arrays instead")
            rec["iobinding_error"] = f"{type(e).__name__}: {e}"

            def run(f=f):
                session.run(["logits"], f)
        cold, times = time_runs(run, repeat, warmup, warmup_s=warmup_s)
        rec["decode"][ctx] = {**summary(times, cold), "tokens_per_s": 1e3 / np.median(times)}
        console.log(f"ort-webgpu decode at {ctx}: {np.median(times):.2f} ms ({rec['mode']})")
    return rec


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--prompts", default="128,512")
    ap.add_argument("--contexts", default="128,1024")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--warmup-s", type=float, default=GPU_WARMUP_S,
                    help="and more untimed runs until this many seconds have passed (the GPU's clocks ramp up)")
    ap.add_argument("--device-class", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--precision", default="fp32", help="Kiln packages to run: fp32, fp16 or fp32,fp16 (fp16 rows are "
                                                         "kiln_fp16; the device needs shader-f16)")
    ap.add_argument("--torch", action="store_true", help="also PyTorch fp32 eager on CUDA")
    ap.add_argument("--torch-all", action="store_true",
                    help="also PyTorch fp32 and fp16, eager and torch.compile, on CUDA")
    ap.add_argument("--ort", action="store_true", help="also onnxruntime's WebGPU EP on the q4 ONNX export")
    ap.add_argument("--rounds", type=int, default=3, help="answers generated per context for the generate rows")
    ap.add_argument("--run-ahead", default="", help="also time generation with these run-ahead depths, e.g. 0,1,3 "
                    "(Generator.run_ahead; interleaved with the default's rounds)")
    ap.add_argument("--no-sampled", dest="sampled", action="store_false",
                    help="skip the decode steps that sample (the sampler on the GPU against sampling on the host)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    a = ap.parse_args(argv)
    console = Console(stderr=True)
    prompts = [int(x) for x in a.prompts.split(",")]
    contexts = [int(x) for x in a.contexts.split(",")]
    record = {"model": a.model.name, "repeat": a.repeat, "warmup": a.warmup, "warmup_s": a.warmup_s}
    for precision in a.precision.split(","):
        record["kiln" if precision == "fp32" else f"kiln_{precision}"] = kiln_contestant(
            a.model, prompts, contexts, a.repeat, a.warmup, a.device_class, console, precision, a.sampled,
            tuple(int(x) for x in a.run_ahead.split(",") if x), a.rounds, a.warmup_s)
    if a.torch or a.torch_all:
        for dtype in ("float32", "float16") if a.torch_all else ("float32",):
            for compiled in (False, True) if a.torch_all else (False,):
                name = f"torch_{'compile' if compiled else 'eager'}_fp{dtype[-2:]}"
                record[name] = torch_contestant(a.model, prompts, contexts, a.repeat, a.warmup, console, dtype,
                                                compiled, a.warmup_s)
    if a.ort:
        record["ort_webgpu_q4"] = ort_webgpu_contestant(a.model, prompts, contexts, a.repeat, a.warmup, console,
                                                        a.warmup_s)
    table = Table(title=f"{a.model.name}: tokens/s (median of {a.repeat})")
    table.add_column("contestant")
    for p in prompts:
        table.add_column(f"prefill {p}", justify="right")
    for c in contexts:
        table.add_column(f"decode @{c}", justify="right")
    for name in ("kiln", "kiln_fp16", "torch_eager_fp32", "torch_compile_fp32", "torch_eager_fp16", "torch_compile_fp16",
                 "ort_webgpu_q4"):
        if name in record:
            r = record[name]
            table.add_row(name, *[f"{r['prefill'][p]['tokens_per_s']:.0f}" for p in prompts],
                          *[f"{r['decode'][c]['tokens_per_s']:.1f}" for c in contexts])
        if name in record and "generate" in record[name]:
            g = record[name]["generate"]
            table.add_row(f"{name} generate (greedy, {GENERATED} tokens)", *["" for _ in prompts],
                          *[f"{g[c]['tokens_per_s']:.1f}" for c in contexts])
        for where in ("device", "host"):
            if name in record and "decode_sampled" in record[name]:
                d = record[name]["decode_sampled"]
                table.add_row(f"{name} sampled, sampler on the {where}", *["" for _ in prompts],
                              *[f"{d[c][where]['tokens_per_s']:.1f}" for c in contexts])
    Console().print(table)
    if "ort_webgpu_q4" in record and "kiln" in record:
        o, k = record["ort_webgpu_q4"], record["kiln"]
        ratios = {**{f"prefill {p}": k["prefill"][p]["tokens_per_s"] / o["prefill"][p]["tokens_per_s"] for p in prompts},
                  **{f"decode @{c}": k["decode"][c]["tokens_per_s"] / o["decode"][c]["tokens_per_s"] for c in contexts}}
        record["kiln_over_ort_webgpu"] = ratios
        Console().print("kiln / ort-webgpu (" + o["mode"] + "): " + ", ".join(f"{n} {r:.2f}x" for n, r in ratios.items()))
    for name in ("kiln", "kiln_fp16"):
        if name in record:
            k = record[name]
            Console().print(f"{name}: {k['dispatches']} dispatches a decode step (by context), compile {k['compile_s']:.1f} s, load "
                            f"{k['load_s']:.2f} s, weights {k['weight_bytes'] / 1e6:.1f} MB, device buffers "
                            f"{k['device_bytes'] / 1e6:.1f} MB")
    path = write_record(record, a.out, "llm")
    Console().print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
