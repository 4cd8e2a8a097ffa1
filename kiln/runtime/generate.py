"""Token-by-token generation over a language-model package (``generation`` in the manifest, format 1.6).

The package is one decoder step (docs/package-format.md, *Generation*): new token ids and the number of tokens
already cached in; logits and each row's arg max (``next_token``) out. The KV cache is the package's state
(format 1.7): buffers sized for the context bound that the step updates in place, never fed nor read back.
:class:`Generator` drives it: the prompt (text, or chat messages through the package's chat template) is tokenized
with HF ``tokenizers`` from the package's ``tokenizer.json``, prefilled in chunks of at most ``max_tokens``, then
each decode step feeds one token. Greedy decoding reads back only ``next_token`` (8 bytes a step) and, on WebGPU,
runs steps ahead (:attr:`Generator.run_ahead`, 1: the next step, fed the token on the device, is submitted before
the host waits for the token, so the host encodes a step while the GPU runs the one before). Sampling
(temperature, top-k, top-p, repetition penalty; seeded) runs the package's sampler on the GPU
(:mod:`kiln.frontend.sampling`, format 1.8) and reads back only the id on WebGPU; on the C targets (wasm, cpu),
whose logits are host memory already, and for older packages, it samples the last row of logits on the host.

Text streams as it is decoded (:class:`TextStream`, the rule of HF text-generation-inference): the last few
tokens are decoded with and without the newest one and the new characters yielded, except while they end inside a
UTF-8 character (a replacement character). The browser runtime (kiln/js/generate.js) does the same.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError
from kiln.package.format import read_package_text
from kiln.runtime.chat import render_chat


@dataclass
class SamplingOptions:
    """How the next token is chosen.

    Attributes:
        temperature: 0 (default) is greedy (the arg max, on the device); > 0 samples from ``softmax(logits / T)``.
        top_k: keep the ``k`` most likely tokens (0: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches ``p`` (1: all).
        repetition_penalty: CTRL's penalty (Keskar et al. 2019) on tokens already in prompt or answer: a positive
            logit is divided by it, a negative one multiplied (1: none).
        seed: the sampler's random seed (same seed, same answer).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def check(self) -> None:
        """Raises KilnError for a value outside its range."""
        if not self.temperature >= 0:
            raise KilnError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise KilnError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise KilnError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise KilnError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        """Whether the device's arg max decides (no host sampling, no penalty)."""
        return self.temperature == 0 and self.repetition_penalty == 1.0


def sample(logits: np.ndarray, options: SamplingOptions, seen: list[int], rng: np.random.Generator) -> int:
    """The next token id from one row of ``logits`` (float32 ``[vocab]``) under ``options``.

    The penalty applies to ``seen`` (prompt and answer so far); then temperature, top-k and top-p filter
    (in that order, as HF transformers' logits processors do) and a token is drawn with ``rng``.
    """
    x = logits.astype(np.float64)
    if options.repetition_penalty != 1.0 and seen:
        ids = np.unique(np.asarray(seen))
        x[ids] = np.where(x[ids] > 0, x[ids] / options.repetition_penalty, x[ids] * options.repetition_penalty)
    if options.temperature == 0:
        return int(np.argmax(x))
    x = x / options.temperature
    if 0 < options.top_k < x.size:
        kth = np.partition(x, -options.top_k)[-options.top_k]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x - x.max())
    p /= p.sum()
    if options.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        keep = np.cumsum(p[order]) - p[order] < options.top_p  # the smallest prefix reaching top_p
        mask = np.zeros_like(p, bool)
        mask[order[keep]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return int(rng.choice(p.size, p=p))


@dataclass
class GenerationStats:
    """Timings of the last :meth:`Generator.generate` (ms, tokens, tokens/s)."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    #: why the answer ended, as OpenAI's ``finish_reason`` and kiln.js's ``stopReason``: ``stop`` (a stop token or a
    #: stop string) or ``length`` (``max_new_tokens``)
    stop_reason: str = ""

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens prefilled per second."""
        return self.prompt_tokens / (self.prefill_ms / 1e3) if self.prefill_ms else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens generated per second after the first (each a decode step)."""
        return (self.new_tokens - 1) / (self.decode_ms / 1e3) if self.decode_ms and self.new_tokens > 1 else 0.0


@dataclass
class Chunk:
    """One streamed piece of an answer: the token generated and the text it completes (may be empty while a
    UTF-8 character is incomplete)."""

    token: int
    text: str
    stats: GenerationStats = field(default_factory=GenerationStats)


class TextStream:
    """Incremental detokenization, linear in the answer's length (decoding the whole answer each token is
    quadratic): :meth:`push` decodes the tokens since the last emitted text with and without the newest token and
    returns the difference, or ``""`` while it ends inside a UTF-8 character (HF text-generation-inference's
    ``decode_token``).

    Args:
        decode: token ids -> text (``tokenizer.decode(ids, skip_special_tokens=True)``).
    """

    def __init__(self, decode):
        self.decode = decode
        self.ids: list[int] = []
        self.prefix = self.read = 0

    def push(self, token: int) -> str:
        """The text ``token`` completes ("" while a character is split across tokens)."""
        self.ids.append(token)
        before = self.decode(self.ids[self.prefix:self.read]) if self.read > self.prefix else ""
        after = self.decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""


def _first_stop(text: str, stops: list[str]) -> int:
    """Where the first of ``stops`` starts in ``text``, or -1."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else -1


def _held_back(text: str, stops: list[str]) -> int:
    """Characters at the end of ``text`` that may begin a stop string (not yielded yet)."""
    return max((k for s in stops for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])),
               default=0)


class GenerationMixin:
    """``generate`` and ``generator`` of the sessions of every runtime (native WebGPU, wasm, cpu)."""

    def generate(self, prompt, max_new_tokens: int | None = None, **sampling):
        """Stream a language-model package's answer to ``prompt`` (text or chat messages), token by token:
        :meth:`kiln.runtime.generate.Generator.generate` (``max_new_tokens`` default: until the context is full;
        ``stop`` strings; sampling keywords: ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``,
        ``seed``). ``session.generator.stats`` then holds the timings.

        Raises:
            KilnError: not a language-model package; what ``Generator.generate`` raises.
        """
        return self.generator.generate(prompt, max_new_tokens, **sampling)

    def reorder_state(self, order) -> None:
        """Reorder the hypotheses of the package's state for beam search: batch entry ``b`` of every state tensor
        with more than one (a self-attention cache ``[beams, H, context, hd]``) becomes the entry ``order[b]`` was,
        for ``b < len(order)``; state of one batch entry (a cross-attention cache all hypotheses share) is kept.
        CTranslate2's ``Decoder::update_state``, HF transformers' ``_reorder_cache``. Only the moved entries are
        copied, on the device, through a scratch buffer (so ``order`` may swap entries).

        Args:
            order: ints, each in ``[0, entries)``; ``[0] * B`` copies the first entry to ``B`` hypotheses.

        Raises:
            KilnError: a package without such state, or an order entry out of range.
        """
        self._move_rows(state_row_moves(self.manifest, order))

    def _move_rows(self, moves: list[tuple[int, int, list[tuple[int, int]]]]) -> None:
        raise NotImplementedError

    @property
    def generator(self) -> Generator:
        """The :class:`Generator` of :meth:`generate` (made on first use)."""
        if getattr(self, "_generator", None) is None:
            self._generator = Generator(self)
        return self._generator


def state_row_moves(manifest: dict[str, Any], order) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """The copies :meth:`GenerationMixin.reorder_state` makes: per state tensor of more than one batch entry,
    ``(buffer id, bytes per entry, [(destination entry, source entry), ...])`` for the entries that change.

    Raises:
        KilnError: a package without such state, or an order entry out of range.
    """
    order = [int(i) for i in order]
    rows = [s for s in manifest.get("state", []) if s["shape"][0] > 1]
    if not rows:
        raise KilnError(f"{manifest.get('name', 'the package')}: no state of several hypotheses to reorder (compile "
                        "the decoder with beams > 1)")
    out = []
    for s in rows:
        n = s["shape"][0]
        if len(order) > n or any(not 0 <= i < n for i in order):
            raise KilnError(f"reorder_state: order {order} does not fit state {s['name']!r} of {n} hypotheses")
        pairs = [(b, src) for b, src in enumerate(order) if b != src]
        if pairs:
            out.append((s["buffer"], s["bytes"] // n, pairs))
    return out


def host_array(t) -> np.ndarray:
    """An output as a host array (a GPUTensor is read back; the CPU runtimes return arrays)."""
    return t.numpy() if hasattr(t, "numpy") else t


def release_tensors(tensors) -> None:
    """Free GPU tensors now (arrays of the CPU runtimes need nothing; a release twice is harmless)."""
    for t in tensors:
        if hasattr(t, "release"):
            t.release()


class Generator:
    """Generation over a session of a language-model package.

    Args:
        session: a session (:class:`kiln.runtime.native.Session`, or the wasm and cpu sessions) of a package
            with a ``generation`` section. A session holds one cache: one generation at a time.

    Raises:
        KilnError: the package is not a language model, or one made by an older Kiln (format 1.6: recompile it).
    """

    def __init__(self, session):
        from tokenizers import Tokenizer

        gen = session.manifest.get("generation")
        if gen is None:
            raise KilnError(f"{session.path}: not a language-model package (its manifest has no 'generation'; "
                            "compile a GGUF model: kiln compile MODEL.gguf)")
        self.session = session
        self.config = gen
        self.tokenizer = Tokenizer.from_str(read_package_text(session.path, session.manifest, gen["tokenizer"],
                                                              "tokenizer"))
        self.eos = set(gen["eos_token_ids"])
        if not isinstance(gen["cache"], dict):
            raise KilnError(f"{session.path}: a language-model package of format 1.6 (its KV cache is fed back); "
                            "recompile it with this Kiln (kiln compile MODEL.gguf)")
        self.stats = GenerationStats()
        self._busy = False  # the session holds one cache: one generation at a time
        self._gpu = hasattr(session, "upload")  # a WebGPU session: outputs stay on the device until read
        self._sampler = None  # the sampler package's session (:meth:`sampler`)
        #: greedy decoding on WebGPU: decode steps queued ahead of the token the host waits for, each fed the token
        #: of the step before on the device (1: the host encodes step n + 1 while the GPU runs step n; that many
        #: steps are computed in vain when a token ends the answer); 0 (or False): one step at a time. (Deeper
        #: queues measured no faster for SmolLM2 on an H200: ``bench.llm --run-ahead``.)
        self.run_ahead = 1

    def encode(self, prompt: str | list[dict[str, str]] | list[int]) -> list[int]:
        """Token ids of ``prompt``: text as it is, chat messages through the package's chat template, or token ids
        (ints, as HF ``generate``'s ``input_ids``) as they are.

        Raises:
            KilnError: a prompt that is none of these, text that is not valid Unicode (lone surrogates), or a token
                id outside the vocabulary.
        """
        if isinstance(prompt, list) and prompt and all(isinstance(i, (int, np.integer)) and not isinstance(i, bool)
                                                       for i in prompt):
            vocab = self.tokenizer.get_vocab_size(with_added_tokens=True)
            bad = [int(i) for i in prompt if not 0 <= i < vocab]
            if bad:
                raise KilnError(f"token id {bad[0]} of the prompt is outside the vocabulary of {vocab} tokens")
            return [int(i) for i in prompt]
        if isinstance(prompt, list):
            text = render_chat(self.config["chat_template"], prompt)
        elif isinstance(prompt, str):
            text = prompt
        else:
            raise KilnError(f"a prompt is a string or a list of chat messages, not {type(prompt).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise KilnError(f"the prompt is not valid UTF-8 text ({e.reason} at character {e.start})") from None
        ids = self.tokenizer.encode(text).ids
        bos = self.config.get("bos_token_id")
        return ([bos] if bos is not None and (not ids or ids[0] != bos) else []) + ids

    def _step(self, ids, cached: int, greedy: bool = False) -> dict[str, Any]:
        """One decoder step: ``ids`` (a list, or a GPUTensor ``[1, n]`` of ids on the session's device) after ``cached``
        tokens already in the cache (which it updates); ``greedy``: on WebGPU only ``next_token`` is wanted (the
        logits stay in the session's buffer, not copied out), its read back started with the step."""
        feeds = {self.config["input_ids"]: ids if hasattr(ids, "buffer") else np.asarray(ids, np.int64)[None],
                 self.config["cache"]["position"]: np.asarray([cached], np.int64)}
        if not self._gpu:
            return self.session.run(feeds)
        token = self.config["next_token"]
        return self.session.run(feeds, output="gpu", outputs=[token] if greedy else None,
                                read=[token] if greedy else ())

    def sampler(self):
        """The session of the package's sampler (``generation.sampler``, format 1.8: token sampling on the GPU,
        :mod:`kiln.frontend.sampling`) on this session's device, opened on first use; None where the host samples
        (the wasm and cpu targets, whose logits are host memory already, and older packages)."""
        if self._sampler is None and self._gpu and self.config.get("sampler"):
            from kiln.runtime import open_session

            self._sampler = open_session(Path(self.session.path) / self.config["sampler"], "webgpu",
                                         device=self.session.device)
        return self._sampler

    def _sample_on_device(self, sampler, logits, opts: SamplingOptions, seen: list[int], key: int, step: int) -> int:
        """The next token from ``logits`` (the decoder's output, on the GPU) by the sampler package: penalty,
        temperature, top-k, top-p and a Gumbel-max draw keyed by (``key``, ``step``); reads back the id only."""
        ids = list(dict.fromkeys(seen)) if opts.repetition_penalty != 1.0 else seen[:1]  # each penalised id once
        feeds = {"logits": logits, "seen": np.asarray(ids, np.int32),
                 "options": np.array([opts.temperature, opts.top_p, opts.repetition_penalty, opts.top_k], np.float32),
                 "seed": np.array([key, step], np.uint32).view(np.int32)}
        return int(np.asarray(sampler.run(feeds)["token"]).reshape(-1)[0])

    def generate(self, prompt: str | list[dict[str, str]] | list[int], max_new_tokens: int | None = None, *,
                 options: SamplingOptions | None = None, stop: list[str] | tuple[str, ...] = (),
                 **sampling: Any) -> Iterator[Chunk]:
        """Stream the answer to ``prompt`` token by token.

        Args:
            prompt: text, chat messages ``[{"role": "user", "content": ...}]`` (the chat template adds the
                assistant's turn), or token ids (a list of ints, used as they are).
            max_new_tokens: the most tokens to generate (default: until the context is full).
            options, sampling: a :class:`SamplingOptions`, or its fields as keywords (``temperature=0.7``).
            stop: strings that end the answer (not yielded; as OpenAI's ``stop``).

        Yields:
            :class:`Chunk` per generated token; a stop token ends the answer (and is not yielded). ``self.stats``
            then holds the prefill and decode timings.

        Raises:
            KilnError: bad options, an empty prompt, or a prompt plus ``max_new_tokens`` longer than the
                package's context (``max_context``); at the first token, another generation still running on this
                session (it holds one KV cache).
        """
        try:
            opts = options or SamplingOptions(**sampling)
        except TypeError:
            known = ", ".join(SamplingOptions.__dataclass_fields__)
            raise KilnError(f"unknown sampling option in {sorted(sampling)}; known: {known}") from None
        opts.check()
        if max_new_tokens is not None and max_new_tokens < 1:
            raise KilnError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        stops = [stop] if isinstance(stop, str) else list(stop)
        if not all(isinstance(x, str) and x for x in stops):
            raise KilnError(f"stop must be non-empty strings, got {stop!r}")
        ids = self.encode(prompt)
        limit = self.config["max_context"]
        if not ids:
            raise KilnError("the prompt is empty (no tokens)")
        if len(ids) >= limit:
            raise KilnError(f"the prompt ({len(ids)} tokens) fills the package's context of {limit} tokens "
                            "(kiln compile --max-context)")
        if max_new_tokens is None:
            max_new_tokens = limit - len(ids)
        if len(ids) + max_new_tokens > limit:
            raise KilnError(f"the prompt ({len(ids)} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the "
                            f"package's context of {limit} tokens (kiln compile --max-context)")
        return self._stream(ids, max_new_tokens, opts, stops)  # errors above come at the call, not the first token

    def _stream(self, ids: list[int], max_new_tokens: int, opts: SamplingOptions,
                stops: list[str]) -> Iterator[Chunk]:
        if self._busy:
            raise KilnError("a generation is already running on this session (it holds one KV cache); finish or "
                            "close it first")
        self._busy = True
        rng = np.random.default_rng(opts.seed)
        sampler = None if opts.greedy else self.sampler()
        key = int(rng.integers(0, 2**32)) if opts.seed is None else opts.seed % 2**32  # the device draw's seed
        stats = self.stats = GenerationStats(prompt_tokens=len(ids))
        chunk = self.config["max_tokens"]
        out: dict[str, Any] = {}
        seen = list(ids)
        stream = TextStream(lambda t: self.tokenizer.decode(t, skip_special_tokens=True))
        text = ""  # the answer's text, of which ``shown`` characters were yielded (the rest may start a stop string)
        shown = 0
        ahead: deque[dict[str, Any]] = deque()  # decode steps submitted before this token is read (greedy, WebGPU)
        depth = int(self.run_ahead)
        chunks = getattr(self.session, "submit_chunks", None) if opts.greedy and depth else None
        try:
            t0 = time.perf_counter()
            for start in range(0, len(ids), chunk):  # prefill, in chunks the package's steps take
                release_tensors(out.values())
                out = self._step(ids[start:start + chunk], start, opts.greedy)
            if chunks is not None:  # a step queued ahead keeps the GPU busy: one command buffer a step costs less
                self.session.submit_chunks = 1
            for n in range(max_new_tokens):
                if opts.greedy and self._gpu:
                    # The token stays on the device: its read is submitted, then the steps ahead, each fed the token
                    # of the one before, so the GPU has work queued while the host waits and encodes (``depth``
                    # wasted steps when this token ends the answer). The prefill's next_token has a row per prompt
                    # token: it is read first.
                    pending = out[self.config["next_token"]].read_async()
                    while n and len(ahead) < depth and n + len(ahead) + 1 < max_new_tokens:
                        last = ahead[-1] if ahead else out  # (its token is n + len(ahead), fed at that position)
                        ahead.append(self._step(last[self.config["next_token"]], len(ids) + n + len(ahead), True))
                    token = int(pending.result().reshape(-1)[-1])
                elif opts.greedy:
                    token = int(host_array(out[self.config["next_token"]]).reshape(-1)[-1])
                elif sampler is not None:
                    token = self._sample_on_device(sampler, out[self.config["logits"]], opts, seen, key, n)
                else:
                    logits = host_array(out[self.config["logits"]])
                    token = sample(logits.reshape(-1, logits.shape[-1])[-1], opts, seen, rng)
                if n:  # a decode step's outputs go back to the device's buffer pool for the next step's (no
                    out = {}  # allocation; a buffer the step ahead still reads is safe there: work runs in order)
                else:
                    release_tensors(out.values())  # (the prefill's logits: a row per prompt token)
                now = time.perf_counter()
                if n == 0:
                    stats.prefill_ms = (now - t0) * 1e3
                    t1 = now
                else:
                    stats.decode_ms = (now - t1) * 1e3
                if token in self.eos:
                    stats.stop_reason = "stop"
                    break
                stats.new_tokens += 1
                seen.append(token)
                text += stream.push(token)
                at = _first_stop(text, stops)
                if at >= 0:
                    text = text[:at]
                    stats.stop_reason = "stop"
                safe = len(text) if at >= 0 else len(text) - _held_back(text, stops)
                yield Chunk(token, text[shown:max(shown, safe)], stats)
                shown = max(shown, safe)
                if at >= 0:
                    break
                if ahead:
                    out = ahead.popleft()
                elif n + 1 < max_new_tokens:
                    out = self._step([token], len(ids) + n, opts.greedy)
            else:
                stats.stop_reason = "length"
        finally:
            release_tensors(out.values())
            for step in ahead:
                release_tensors(step.values())
            if chunks is not None:
                self.session.submit_chunks = chunks
            self._busy = False
