"""Speech to text: Kiln's Whisper against the peers a user would pick, on the same weights and the same audio.

    python -m bench.asr [--model models/zoo/whisper_tiny_en] [--clips DIR] [--precision fp32,fp16]
                        [--ct2] [--ort cpu,webgpu] [--torch] [--beam 5] [--repeat 3]

Each contestant transcribes every clip greedily without timestamps, 30-s windows prompted with the text before
(Whisper's long-form algorithm), and is timed end to end: features, encoder, decoder steps (a run's wall time; the
median of ``--repeat`` after one warm-up). The table gives each contestant's real-time factor (processing time
over audio time: lower is faster) over all clips, and milliseconds per decoded token (decoder time over tokens).

- ``kiln``: ``SpeechSession.transcribe`` on WebGPU (wgpu-py; ``--precision`` packages, default schedules for
  ``--device-class``), features, resampling and all on the device.
- ``ct2_cpu`` (``--ct2``): CTranslate2, the reference implementation (its encoder and greedy ``generate``, numpy
  features), float32 on the CPU; ``ct2_cuda`` when CTranslate2 finds CUDA.
- ``ort_cpu`` / ``ort_webgpu`` (``--ort``): onnxruntime's CPU and WebGPU EPs on the ONNX export of the same weights
  laid out as optimum's (``kiln.zoo.whisper_export``: encoder, first decoder step, decoder with past), numpy features,
  host arrays in and out; ``ort_webgpu_iobinding``: the WebGPU EP with IO binding (states and caches stay on the
  device, only the ids go up and the logits come back), its best mode. The ratio column is to the faster of the two.
- ``torch_cuda_fp32`` / ``_fp16`` (``--torch``): the same PyTorch modules, eager, on CUDA.
- ``kiln_beam5`` and ``ct2_cpu_beam5`` (``--beam 5``; with ``--ct2``): beam search over 5 hypotheses, Kiln's fp32
  package and CTranslate2's ``generate(beam_size=5)`` (the peers above decode greedily only, so beam rows have no
  ratio); their transcripts are compared with each other.

Clips: ``--clips DIR`` of 16 kHz ``.npy`` or WAV files (default: tests/speech_clips.py's, spoken by espeak-ng here;
``--save-clips DIR`` writes them as ``.npy`` for a machine without espeak-ng). Issue 17's
goal (H100): a real-time factor at least 2x better than onnxruntime's WebGPU EP.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, write_record

MODEL = ROOT / "models" / "zoo" / "whisper_tiny_en"


def load_clips(folder: Path | None) -> dict[str, np.ndarray]:
    """Clip name -> 16 kHz float32 samples: ``folder``'s ``.npy`` files (16 kHz float32, what ``--save-clips``
    writes) or 16 kHz WAV files, or the test clips spoken now (tests/speech_clips.py)."""
    if folder is None:
        from tests.speech_clips import CLIPS, make_clip

        folder = Path(tempfile.mkdtemp(prefix="kiln-asr-"))
        return {c.name: make_clip(c, folder)[1] for c in CLIPS}
    out = {p.stem: np.load(p).astype(np.float32) for p in sorted(Path(folder).glob("*.npy"))}
    for p in sorted(Path(folder).glob("*.wav")):
        import soundfile

        data, rate = soundfile.read(str(p), dtype="float32")
        if rate == 16000:
            out.setdefault(p.stem, data)
    return out


def log_mel(audio: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """Whisper's features on the CPU in numpy (what the peers' pipelines do before their encoders): the centred STFT
    (periodic Hann, 400 / 160) of the samples with 160 zeros appended, its last frame dropped, Slaney mel power,
    ``log10``, ``(max(x, max - 8) + 4) / 4``; ``[80, frames]``."""
    x = np.pad(np.concatenate([audio, np.zeros(160, np.float32)]), 200, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(x, 400)[::160][:-1]
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)).astype(np.float32)
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    mel = np.log10(np.maximum(filters @ power.T.astype(np.float32), 1e-10))
    return ((np.maximum(mel, mel.max() - 8.0) + 4.0) / 4.0).astype(np.float32)


def _timed(fn, repeat: int) -> tuple[float, object]:
    fn()  # warm-up: pipelines, caches, allocator
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), result


@functools.cache
def _kiln_package(model: Path, precision: str, device_class: str) -> tuple[Path, float]:
    """The speech package of ``model`` (compiled once per precision: greedy and beam contestants share it) and its
    compile seconds."""
    from kiln.compiler import compile_whisper

    out = Path(tempfile.mkdtemp(prefix="kiln-asr-")) / "pkg"
    t0 = time.perf_counter()
    compile_whisper(model, out, device_class=device_class, validate=False, precision=precision)
    return out, time.perf_counter() - t0


def kiln_contestant(model: Path, clips: dict, repeat: int, precision: str, device_class: str, console,
                    beam: int = 1) -> dict:
    import kiln

    out, compile_s = _kiln_package(model, precision, device_class)
    session = kiln.load(out)
    rec = {"precision": precision, "compile_s": compile_s, "adapter": session.decoder.adapter_info(), "beam": beam,
           "clips": {}}
    for name, audio in clips.items():
        def run(audio=audio):
            return session.transcribe(audio, sample_rate=16000, beam_size=beam)
        seconds, result = _timed(run, repeat)
        s = result.stats
        rec["clips"][name] = {"audio_s": s.audio_s, "wall_s": seconds, "tokens": s.tokens, "decode_ms": s.decode_ms,
                              "encode_ms": s.encode_ms, "features_ms": s.features_ms, "windows": s.windows,
                              "text": result.text}
        console.log(f"kiln {precision} beam {beam} {name}: {seconds * 1e3:.0f} ms, {s.ms_per_token:.2f} ms/token, encoder "
                    f"{s.encode_ms / s.windows:.1f} ms/window")
    return rec


class Greedy:
    """Whisper's greedy long-form loop (no timestamps) over any encoder/decoder pair: ``encode(features [1, 80,
    3000]) -> state`` and ``step(ids, state, first) -> last logits`` (which keeps its own cache)."""

    def __init__(self, model: Path):
        from tokenizers import Tokenizer

        from kiln.frontend.whisper import mel_filters, read_whisper, speech_manifest

        self.spec = speech_manifest(read_whisper(model))
        filters = mel_filters(self.spec["n_mels"])
        self.extract = lambda audio: log_mel(audio, filters)
        self.tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
        self.suppress = np.array(self.spec["suppress_ids"])
        self.begin = np.array(self.spec["suppress_ids_begin"])

    def windows(self, audio: np.ndarray):
        """The features' 30-s windows, ``[1, 80, 3000]`` each (zeros past the audio), without timestamps: one after
        the other."""
        features = self.extract(audio)
        content = features.shape[1] - 1
        for seek in range(0, content, 3000):
            size = min(3000, content - seek)
            window = np.zeros((1, 80, 3000), np.float32)
            window[0, :, :size] = features[:, seek:seek + size]
            yield window

    def prompt(self, history: list[int]) -> list[int]:
        """The text so far (its last 223 tokens), then ``<|startoftranscript|><|notimestamps|>``."""
        tk = self.spec["tokens"]
        return ([tk["sot_prev"], *history[-223:]] if history else []) + [tk["sot"], tk["no_timestamps"]]

    def transcribe(self, audio: np.ndarray, encode, step, stats: dict) -> str:
        tk = self.spec["tokens"]
        history, text = [], []
        for window in self.windows(audio):
            state = encode(window)
            prompt = self.prompt(history)
            ids, tokens = prompt, []
            t0 = time.perf_counter()
            while len(tokens) < min(224, 448 - len(prompt) + 1):
                logits = np.asarray(step(ids, state, not tokens), np.float32).copy()
                logits[self.suppress] = -np.inf
                if not tokens:
                    logits[self.begin] = -np.inf
                token = int(np.argmax(logits))
                if token == tk["eot"]:
                    break
                tokens.append(token)
                ids = [token]
            stats["decode_s"] = stats.get("decode_s", 0.0) + time.perf_counter() - t0
            stats["tokens"] = stats.get("tokens", 0) + len(tokens)
            history += tokens
            text.append(self.tokenizer.decode(tokens))
        return "".join(text).strip()


def peer_contestant(name: str, greedy: Greedy, clips: dict, repeat: int, encode, step, console) -> dict:
    rec = {"clips": {}}
    for clip, audio in clips.items():
        stats: dict = {}

        def run(audio=audio, stats=stats):
            stats.clear()
            return greedy.transcribe(audio, encode, step, stats)
        seconds, text = _timed(run, repeat)
        rec["clips"][clip] = {"audio_s": len(audio) / 16000, "wall_s": seconds, "tokens": stats["tokens"],
                              "decode_ms": stats["decode_s"] * 1e3, "text": text}
        console.log(f"{name} {clip}: {seconds * 1e3:.0f} ms, {stats['decode_s'] * 1e3 / max(stats['tokens'], 1):.2f} "
                    "ms/token")
    return rec


def ort_pair(folder: Path, provider: str):
    """onnxruntime sessions of the export and the greedy loop's ``encode``/``step``."""
    import onnxruntime as ort

    providers = {"cpu": ["CPUExecutionProvider"],
                 "webgpu": ["WebGpuExecutionProvider", "CPUExecutionProvider"]}[provider]
    enc, first, rest = (ort.InferenceSession(str(folder / f), providers=providers)
                        for f in ("encoder.onnx", "decoder.onnx", "decoder_with_past.onnx"))
    layers = sum(1 for o in first.get_outputs() if o.name.startswith("cross.")) // 2
    cache: dict = {}

    def encode(window):
        return enc.run(None, {"mel": window})[0]

    def step(ids, hidden, start):
        if start:
            out = first.run(None, {"input_ids": np.asarray([ids], np.int64), "encoder_hidden_states": hidden})
            cache["past"], cache["cross"] = out[1:1 + 2 * layers], out[1 + 2 * layers:]
        else:
            feeds = {"input_ids": np.asarray([ids], np.int64)}
            for i in range(layers):
                feeds[f"past.{i}.key"], feeds[f"past.{i}.value"] = cache["past"][2 * i], cache["past"][2 * i + 1]
                feeds[f"cross.{i}.key"], feeds[f"cross.{i}.value"] = cache["cross"][2 * i], cache["cross"][2 * i + 1]
            out = rest.run(None, feeds)
            cache["past"] = out[1:]
        return out[0][0, -1]

    return encode, step, enc.get_providers()


def ort_bound_pair(folder: Path):
    """onnxruntime's WebGPU EP with IO binding, its best mode: the encoder's states, the cross keys and values and
    the self-attention cache stay on the device (OrtValues bound from one step's outputs to the next's inputs);
    only the input ids go up and the last logits come back."""
    import onnxruntime as ort

    providers = ["WebGpuExecutionProvider", "CPUExecutionProvider"]
    enc, first, rest = (ort.InferenceSession(str(folder / f), providers=providers)
                        for f in ("encoder.onnx", "decoder.onnx", "decoder_with_past.onnx"))
    first_out = [o.name for o in first.get_outputs()]
    rest_out = [o.name for o in rest.get_outputs()]
    layers = sum(1 for n in first_out if n.startswith("cross.")) // 2
    cache: dict = {}

    def encode(window):
        binding = enc.io_binding()
        binding.bind_cpu_input("mel", window)
        binding.bind_output("encoder_hidden_states", "webgpu")
        enc.run_with_iobinding(binding)
        return binding.get_outputs()[0]

    def step(ids, hidden, start):
        session, names = (first, first_out) if start else (rest, rest_out)
        binding = session.io_binding()
        binding.bind_cpu_input("input_ids", np.asarray([ids], np.int64))
        if start:
            binding.bind_ortvalue_input("encoder_hidden_states", hidden)
        else:
            for i in range(layers):
                for kv in ("key", "value"):
                    binding.bind_ortvalue_input(f"past.{i}.{kv}", cache[f"present.{i}.{kv}"])
                    binding.bind_ortvalue_input(f"cross.{i}.{kv}", cache[f"cross.{i}.{kv}"])
        binding.bind_output("logits", "cpu")
        for n in names[1:]:
            binding.bind_output(n, "webgpu")
        session.run_with_iobinding(binding)
        out = dict(zip(names, binding.get_outputs()))
        cache.update({k: v for k, v in out.items() if k != "logits"})
        return out["logits"].numpy()[0, -1]

    return encode, step, enc.get_providers()


def torch_pair(model: Path, dtype: str):
    import torch

    from kiln.zoo.whisper_export import whisper_modules

    enc, dec, _ = whisper_modules(model)
    dt = getattr(torch, dtype)
    enc, dec = enc.to("cuda", dt), dec.to("cuda", dt)
    cache: dict = {}

    @torch.no_grad()
    def encode(window):
        return enc(torch.tensor(window, device="cuda", dtype=dt))

    @torch.no_grad()
    def step(ids, hidden, start):
        x = torch.tensor([ids], device="cuda")
        if start:
            logits, cache["past"], cache["cross"] = dec(x, hidden=hidden)
        else:
            logits, cache["past"], _ = dec(x, past=cache["past"], cross=cache["cross"])
        return logits[0, -1].float().cpu().numpy()

    return encode, step


def ct2_contestant(model: Path, greedy: Greedy, clips: dict, repeat: int, device: str, console, beam: int = 1) -> dict:
    """CTranslate2 (the reference implementation): its encoder, then its own greedy ``generate`` of each window
    (``suppress_blank``, the model's ``suppress_ids``, the same prompt; beam search with ``beam`` > 1), float32."""
    import ctranslate2

    ref = ctranslate2.models.Whisper(str(model), device=device, compute_type="float32")
    rec = {"device": device, "beam": beam, "clips": {}}
    for clip, audio in clips.items():
        stats: dict = {}

        def run(audio=audio, stats=stats):
            stats.clear()
            history, text = [], []
            for window in greedy.windows(audio):
                encoded = ref.encode(ctranslate2.StorageView.from_array(window), to_cpu=device == "cpu")
                t0 = time.perf_counter()
                result = ref.generate(encoded, [greedy.prompt(history)], beam_size=beam, max_length=448)[0]
                tokens = result.sequences_ids[0]
                stats["decode_s"] = stats.get("decode_s", 0.0) + time.perf_counter() - t0
                stats["tokens"] = stats.get("tokens", 0) + len(tokens)
                history += tokens
                text.append(greedy.tokenizer.decode(tokens))
            return "".join(text).strip()
        seconds, text = _timed(run, repeat)
        rec["clips"][clip] = {"audio_s": len(audio) / 16000, "wall_s": seconds, "tokens": stats["tokens"],
                              "decode_ms": stats["decode_s"] * 1e3, "text": text}
        console.log(f"ct2 {device} beam {beam} {clip}: {seconds * 1e3:.0f} ms")
    return rec


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--clips", type=Path, default=None)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--device-class", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--ct2", action="store_true")
    ap.add_argument("--ort", default="", help="onnxruntime EPs: cpu, webgpu or cpu,webgpu")
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--beam", type=int, default=1, help="also time beam search of this width (kiln, and ct2)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--save-clips", type=Path, default=None, help="write the clips as .npy files here and stop")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    a = ap.parse_args(argv)
    console = Console(stderr=True)
    clips = load_clips(a.clips)
    if a.save_clips:
        a.save_clips.mkdir(parents=True, exist_ok=True)
        for name, audio in clips.items():
            np.save(a.save_clips / f"{name}.npy", audio)
        return {}
    record: dict = {"model": a.model.name, "repeat": a.repeat,
                    "clips": {k: round(len(v) / 16000, 2) for k, v in clips.items()}}
    for precision in filter(None, a.precision.split(",")):
        record["kiln" if precision == "fp32" else f"kiln_{precision}"] = kiln_contestant(
            a.model, clips, a.repeat, precision, a.device_class, console)
    greedy = Greedy(a.model)
    if a.beam > 1:
        record[f"kiln_beam{a.beam}"] = kiln_contestant(a.model, clips, a.repeat, "fp32", a.device_class, console,
                                                       a.beam)
    if a.ct2:
        record["ct2_cpu"] = ct2_contestant(a.model, greedy, clips, a.repeat, "cpu", console)
        if a.beam > 1:
            record[f"ct2_cpu_beam{a.beam}"] = ct2_contestant(a.model, greedy, clips, a.repeat, "cpu", console, a.beam)
        try:
            record["ct2_cuda"] = ct2_contestant(a.model, greedy, clips, a.repeat, "cuda", console)
        except Exception as e:  # noqa: BLE001 (no CUDA build or libraries: say so)
            console.log(f"ct2 cuda: {type(e).__name__}: {e}")
    # PyTorch before onnxruntime: once onnxruntime's WebGPU EP (Dawn) has run, the process's CUDA work can fail
    if a.torch:
        for dtype in ("float32", "float16"):
            encode, step = torch_pair(a.model, dtype)
            record[f"torch_cuda_fp{dtype[-2:]}"] = peer_contestant(f"torch {dtype}", greedy, clips, a.repeat, encode,
                                                                   step, console)
    if a.ort:
        from kiln.zoo.whisper_export import export_onnx

        folder = export_onnx(a.model, Path(tempfile.mkdtemp(prefix="kiln-asr-onnx-")))
        for ep in a.ort.split(","):
            encode, step, providers = ort_pair(folder, ep)
            record[f"ort_{ep}"] = {**peer_contestant(f"ort {ep}", greedy, clips, a.repeat, encode, step, console),
                                   "providers": providers}
            if ep == "webgpu":
                try:
                    encode, step, providers = ort_bound_pair(folder)
                    record["ort_webgpu_iobinding"] = {**peer_contestant("ort webgpu iobinding", greedy, clips,
                                                                        a.repeat, encode, step, console),
                                                      "providers": providers}
                except Exception as e:  # noqa: BLE001 (an EP without device outputs: say so)
                    console.log(f"ort webgpu iobinding: {type(e).__name__}: {e}")
    table = Table(title=f"{a.model.name}: {len(clips)} clips, {sum(record['clips'].values()):.1f} s of audio "
                        f"(median of {a.repeat})")
    for col in ("contestant", "real-time factor", "ms / token", "x faster than ort_webgpu's best"):
        table.add_column(col, justify="right" if col != "contestant" else "left")
    totals = {}
    for name, rec in record.items():
        if not isinstance(rec, dict) or "clips" not in rec or name == "clips":
            continue
        c = rec["clips"].values()
        audio, wall = sum(x["audio_s"] for x in c), sum(x["wall_s"] for x in c)
        tokens = sum(x.get("tokens", 0) for x in c)
        rec["real_time_factor"] = wall / audio
        rec["ms_per_token"] = sum(x.get("decode_ms", 0) for x in c) / tokens if tokens else None
        totals[name] = rec["real_time_factor"]
    for name, rtf in totals.items():
        base = min((totals[n] for n in ("ort_webgpu", "ort_webgpu_iobinding") if n in totals), default=None)
        ms = record[name]["ms_per_token"]
        ratio = f"{base / rtf:.2f}" if base and record[name].get("beam", 1) == 1 else "-"
        table.add_row(name, f"{rtf:.4f}", f"{ms:.2f}" if ms else "-", ratio)
    Console().print(table)
    texts = {name: " ".join(record[name]["clips"][c]["text"] for c in clips) for name in totals}
    if "kiln" in texts:
        record["same_text_as_kiln"] = {name: t == texts["kiln"] for name, t in texts.items() if "beam" not in name}
        Console().print("transcripts equal to kiln's: " + ", ".join(f"{n} {'yes' if v else 'NO'}"
                                                                  for n, v in record["same_text_as_kiln"].items()))
    beams = (f"kiln_beam{a.beam}", f"ct2_cpu_beam{a.beam}")
    if all(b in texts for b in beams):
        record["beam_same_text_as_ct2"] = texts[beams[0]] == texts[beams[1]]
        Console().print(f"beam {a.beam} transcripts, kiln's equal to ct2's: "
                        f"{'yes' if record['beam_same_text_as_ct2'] else 'NO'}")
    if "ort_webgpu" in totals and "kiln" in totals:
        record["kiln_over_ort_webgpu"] = totals["ort_webgpu"] / totals["kiln"]
    if "ort_webgpu_iobinding" in totals and "kiln" in totals:
        record["kiln_over_ort_webgpu_iobinding"] = totals["ort_webgpu_iobinding"] / totals["kiln"]
    path = write_record(record, a.out, "asr")
    Console().print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
