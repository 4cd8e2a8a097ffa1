"""``kiln generate`` and ``kiln chat``: a language-model package's answers streamed to the terminal."""

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


def _sampling(f):
    for option in reversed(_SAMPLING):
        f = option(f)
    return f


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
def generate_cmd(package: Path, prompt: str, raw: bool, system: str | None, max_new_tokens: int | None, **sampling) -> None:
    """Stream a language-model PACKAGE's answer to --prompt (kiln compile MODEL.gguf makes one)."""
    import kiln

    session = kiln.load(package)
    messages = prompt if raw else ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": prompt}]
    _answer(session, messages, max_new_tokens, sampling)
    click.echo(_stats_line(session), err=True)


@click.command("chat")
@click.argument("package", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--system", default=None, help="A system message opening the conversation.")
@_sampling
def chat_cmd(package: Path, system: str | None, max_new_tokens: int | None, **sampling) -> None:
    """Chat with a language-model PACKAGE in the terminal: type a message, read the streamed answer; an empty
    line, /exit or end of input (Ctrl-D) ends, /reset starts a new conversation."""
    import kiln

    session = kiln.load(package)
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
        answer = _answer(session, messages, max_new_tokens, sampling)
        messages.append({"role": "assistant", "content": answer})
        click.echo(_stats_line(session), err=True)
