"""``kiln generate`` and ``kiln chat``: a language-model package's answers streamed to the terminal;
``kiln transcribe``: a speech package's transcript."""

from __future__ import annotations

import sys
from pathlib import Path

import click

_SAMPLING = [
    click.option("--max-new-tokens", type=click.IntRange(1), default=None,
                 help="The most tokens an answer may have (default: until the package's context is full)."),
    click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True,
                 help="0: greedy (the arg max, on the device); > 0: sample from softmax(logits / T)."),
    click.option("--top-k", type=click.IntRange(0), default=0, show_default=True, help="Sample among the k likeliest (0: all)."),
    click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
                 help="Sample among the likeliest tokens whose probability reaches p."),
    click.option("--repetition-penalty", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True,
                 help="CTRL's penalty on tokens already seen (1: none)."),
    click.option("--seed", type=int, default=None, help="The sampler's seed (same seed, same answer)."),
]


_RUNTIME = [
    click.option("--target", type=click.Choice(["webgpu", "wasm", "cpu"]), default="webgpu", show_default=True,
                 help="The package's target to run: webgpu (wgpu-py), wasm (wasmtime) or cpu (native C for this machine)."),
    click.option("--threads", type=click.IntRange(1), default=None,
                 help="Threads of the wasm and cpu targets (default: wasm 1, cpu every core)."),
]


def _sampling(f):
    for option in reversed(_RUNTIME + _SAMPLING):
        f = option(f)
    return f


def _runtime(f):
    for option in reversed(_RUNTIME):
        f = option(f)
    return f


def _load(package: Path, target: str, threads: int | None):
    """The session of ``package``'s ``target`` (``threads`` for wasm and cpu)."""
    import kiln

    if threads is not None and target == "webgpu":
        raise click.UsageError("--threads is for the wasm and cpu targets")
    return kiln.load(package, target=target, **({"threads": threads} if threads is not None else {}))


def _answer(session, prompt, max_new_tokens: int | None, sampling: dict) -> str:
    """Stream one answer to stdout; return its text."""
    parts = []
    for chunk in session.generate(prompt, max_new_tokens, **sampling):
        click.echo(chunk.text, nl=False)
        sys.stdout.flush()
        parts.append(chunk.text)
    click.echo()
    return "".join(parts)


def _stats_line(session) -> str:
    s = session.generator.stats
    return (f"[{s.prompt_tokens} prompt tokens at {s.prefill_tokens_per_s:.1f} tokens/s; {s.new_tokens} new at "
            f"{s.decode_tokens_per_s:.1f} tokens/s; stopped: {s.stop_reason}]")


@click.command("generate")
@click.argument("package", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--prompt", required=True, help="The user's message (the chat template applies), or the raw text with --raw.")
@click.option("--raw", is_flag=True, help="Continue the prompt text as it is, without the chat template.")
@click.option("--system", default=None, help="A system message before the prompt.")
@_sampling
def generate_cmd(package: Path, prompt: str, raw: bool, system: str | None, max_new_tokens: int | None,
                 target: str, threads: int | None, **sampling) -> None:
    """Stream a language-model PACKAGE's answer to --prompt (kiln compile MODEL.gguf makes one)."""
    session = _load(package, target, threads)
    messages = prompt if raw else ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": prompt}]
    _answer(session, messages, max_new_tokens, sampling)
    click.echo(_stats_line(session), err=True)


@click.command("chat")
@click.argument("package", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--system", default=None, help="A system message opening the conversation.")
@_sampling
def chat_cmd(package: Path, system: str | None, max_new_tokens: int | None, target: str, threads: int | None,
             **sampling) -> None:
    """Chat with a language-model PACKAGE in the terminal: type a message, read the streamed answer; an empty
    line, /exit or end of input (Ctrl-D) ends, /reset starts a new conversation. A conversation that outgrows
    the package's context is refused with the error, and the conversation goes on (or /reset)."""
    from kiln.errors import KilnError

    session = _load(package, target, threads)
    click.echo(f"kiln chat: {package} ({session.manifest.get('name', '')}); /reset, /exit", err=True)
    opening = [{"role": "system", "content": system}] if system else []
    messages = list(opening)
    while True:
        try:
            line = input("> ")
        except EOFError:
            click.echo()
            return
        if line.strip() in ("", "/exit", "/quit"):
            return
        if line.strip() == "/reset":
            messages = list(opening)
            continue
        messages.append({"role": "user", "content": line})
        try:
            answer = _answer(session, messages, max_new_tokens, sampling)
        except KilnError as e:  # (raised before any token: nothing was printed)
            messages.pop()
            click.echo(f"error: {e}; /reset starts a new conversation", err=True)
            continue
        messages.append({"role": "assistant", "content": answer})
        click.echo(_stats_line(session), err=True)


def _clock(seconds: float) -> str:
    m, s = divmod(seconds, 60.0)
    h, m = divmod(int(m), 60)
    return (f"{h}:" if h else "") + f"{m:02d}:{s:06.3f}"


@click.command("transcribe")
@click.argument("package", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("audio", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--timestamps", is_flag=True, help="Segment timestamps from the model's timestamp tokens.")
@click.option("--language", default=None, help="The spoken language's code (multilingual models; default en).")
@click.option("--task", type=click.Choice(["transcribe", "translate"]), default="transcribe", show_default=True,
              help="translate: to English (multilingual models).")
@click.option("--no-condition", is_flag=True, help="Do not prompt each 30-s window with the text before it.")
@click.option("--beam", "beam", type=click.IntRange(1), default=1, show_default=True,
              help="Beam search with this many hypotheses (1: greedy decoding; faster-whisper's default is 5).")
@_runtime
def transcribe_cmd(package: Path, audio: Path, timestamps: bool, language: str | None, task: str, no_condition: bool,
                   beam: int, target: str, threads: int | None) -> None:
    """Transcribe AUDIO (WAV, FLAC, OGG, MP3) with a speech PACKAGE (kiln compile WHISPER_FOLDER makes one), printing
    segments as they are decoded; the real-time factor goes to stderr."""
    session = _load(package, target, threads)
    if not hasattr(session, "transcribe"):
        raise click.UsageError(f"{package} is not a speech package (no speech.json)")

    def show(seg) -> None:
        text = seg.text.strip()
        click.echo(f"[{_clock(seg.start)} --> {_clock(seg.end)}] {text}" if timestamps else text)
        sys.stdout.flush()

    result = session.transcribe(audio, timestamps=timestamps, language=language, task=task,
                                condition_on_previous_text=not no_condition, beam_size=beam, on_segment=show)
    s = result.stats
    click.echo(f"[{s.audio_s:.1f} s of audio in {s.total_ms / 1e3:.2f} s: real-time factor {s.real_time_factor:.3f}; "
               f"{s.windows} windows, encoder {s.encode_ms:.0f} ms; {s.tokens} tokens at {s.ms_per_token:.1f} "
               "ms/token]", err=True)
