"""SmolLM2 in headless Chromium (kiln.js on WebGPU/SwiftShader and on WebAssembly): the package's chat page,
``session.generate`` and ``session.chat.completions.create``, the vendored tokenizer and chat template, and
teacher-forced logits, against the numpy reference (``../shared/models/reference/smollm2_135m_reference.npz``).

SwiftShader runs the model at about a token a second, so CI runs the capital question there; the poem (64 tokens,
102 rows) on WebGPU runs with ``pytest tests/test_llm_browser.py --extended``. WebAssembly is fast enough for both
in CI.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from browser import CHROMIUM, ConsoleLog, launch_chromium, serving_tree, sync_playwright_alone
from conftest import ROOT, SHARED_MODELS

from kiln.compiler import compile_graph
from kiln.frontend.gguf import import_gguf
from kiln.package.writer import write_package

SMOLLM2 = ROOT / "models" / "zoo" / "SmolLM2-135M-Instruct.Q4_1.gguf"
REFERENCE = SHARED_MODELS / "reference" / "smollm2_135m_reference.npz"
QUESTIONS = {"capital": "What is the capital of France? Answer in one sentence.",
             "poem": "Write a short poem about the sea."}

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)"),
    pytest.mark.skipif(not SMOLLM2.exists(), reason="run setup.sh (kiln zoo get smollm2 -o models/zoo)"),
]


def test_vendored_libraries_match_npm():
    """kiln/js/vendor's tokenizer and template libraries are byte for byte what ``npm ci`` installs from the pinned
    package-lock.json (setup.sh runs it)."""
    from tools.vendor_js import differing

    assert differing() == []


@pytest.fixture(scope="module")
def served(tmp_path_factory, smollm2_chat_package):
    """A tree of two packages served on loopback: ``chat/`` as ``kiln compile model.gguf --max-context 192 --target
    webgpu,wasm,cpu`` makes it (conftest.py's, copied), and ``tf/``, the decoder step with every row's logits
    (128-token context, both targets) next to the reference logits as raw float32 files; and Chromium."""
    root = tmp_path_factory.mktemp("llm_browser")
    shutil.copytree(smollm2_chat_package, root / "chat")
    dg = import_gguf(SMOLLM2, max_context=128)
    write_package(compile_graph(dg.graph, "webgpu,wasm", device_class="cpu", validate=False), root / "tf")
    for pkg in ("chat", "tf"):  # a page that loads nothing itself, for the scripts below
        (root / pkg / "blank.html").write_text("<!doctype html><title>blank</title>")
    ref = np.load(REFERENCE)
    for name in QUESTIONS:
        ref[f"{name}_logits"].astype("<f4").tofile(root / "tf" / f"{name}_logits.bin")
    with serving_tree(root) as url, sync_playwright_alone() as playwright:
        browser = launch_chromium(playwright)
        yield url, browser, ref
        browser.close()


def _page(served, path):
    url, browser, _ = served
    page = browser.new_context().new_page()  # a fresh context: an empty Cache API
    log = ConsoleLog(page)
    page.goto(url + path)
    return page, log


def test_chat_page_answers_paris_and_caches_the_weights(served):
    """chat.html, driven as a person would: the weights download with progress, the question typed into the page
    streams an answer naming Paris with tokens/s shown; reloading the page takes the weights from the browser's
    cache (no request for them)."""
    page, log = _page(served, "chat/chat.html")
    weights = []
    page.on("request", lambda r: weights.append(r.url) if r.url.endswith(".safetensors") else None)
    log.wait_for("#ask:not([hidden])")
    assert "MB downloaded" in page.text_content("#status") and page.evaluate("document.body.dataset.weights") == "downloaded"
    page.fill("#question", "What is the capital of France?")
    page.press("#question", "Enter")
    log.wait_for("body[data-done]", timeout=300_000)
    answer = page.text_content(".assistant")
    assert "Paris" in answer, answer
    assert "tokens/s" in page.text_content("#speed")
    assert page.get_attribute(".assistant", "data-finish") == "stop"
    fetched = len(weights)
    page.reload()
    log.wait_for("#ask:not([hidden])")
    assert page.evaluate("document.body.dataset.weights") == "cached", page.text_content("#status")
    assert len(weights) == fetched == 1
    page.context.close()


#: greedy answers through session.generate and the OpenAI-style surface, the prompts' ids, seeded sampling, and
#: the errors bad requests get (before any step runs)
GENERATE = """async ({questions, capitalTokens}) => {
  const kiln = await import('./kiln.js');
  const session = await kiln.load('./');
  const generator = await session.generator();
  const messages = (q) => [{role: 'user', content: q}];
  const ids = Object.fromEntries(Object.entries(questions).map(([k, q]) => [k, generator.encode(messages(q))]));
  const tokens = [];
  let text = '';
  for await (const c of session.generate(messages(questions.capital), {maxNewTokens: capitalTokens})) {
    tokens.push(c.token);
    text += c.text;
  }
  const stats = {...generator.stats, decode: generator.stats.decodeTokensPerS};
  const sampled = [];
  for (const seed of [7, 7]) {
    const run = [];
    for await (const c of session.generate('Once upon a time', {maxNewTokens: 3, temperature: 1, topK: 40, topP: 0.9,
      repetitionPenalty: 1.1, seed})) run.push(c.token);
    sampled.push(run);
  }
  const completion = await session.chat.completions.create({messages: messages('Say hi.'), max_tokens: 2,
    temperature: 0});
  const errors = [];
  const refuse = async (f) => {
    try { await f(); errors.push(null); } catch (e) { errors.push(`${e.name}: ${e.message}`); }
  };
  const drain = async (it) => { for await (const _ of it) { /* first step only */ } };
  await refuse(() => drain(session.generate('word '.repeat(200))));
  await refuse(() => drain(session.generate('caf\\uDCE9')));
  await refuse(() => drain(session.generate('Hi', {topP: 0})));
  await refuse(() => drain(session.generate('Hi', {temprature: 0.5})));
  await refuse(() => session.chat.completions.create({messages: messages('Hi'), n: 2}));
  await refuse(() => session.chat.completions.create({messages: [{role: 'user'}]}));
  await refuse(() => session.run({input_ids: new kiln.Tensor('int64', BigInt64Array.of(1n, 2n), [1, 2]),
                                  past_sequence_length: new kiln.Tensor('int64', BigInt64Array.of(191n), [1])}));
  return {ids, tokens, text, stats, sampled, completion, errors};
}"""


def test_browser_generation_matches_reference(served):
    """In Chromium: the vendored tokenizer and chat template give the reference prompt ids of both questions; greedy
    ``session.generate`` reproduces the capital answer token for token and streams its text; seeded sampling
    repeats; ``chat.completions.create`` answers OpenAI-shaped; bad requests are one-line errors."""
    _, _, ref = served
    page, log = _page(served, "chat/blank.html")
    want = ref["capital_generated_ids"].tolist()
    got = log.evaluate(GENERATE, {"questions": QUESTIONS, "capitalTokens": len(want)})
    for name in QUESTIONS:
        assert got["ids"][name] == ref[f"{name}_prompt_ids"].tolist()
    assert want[-1] == 2 and got["tokens"] == want[:-1]  # <|im_end|> ends the answer and is not yielded
    assert got["text"] == str(ref["capital_generated_text"])
    assert got["stats"]["promptTokens"] == len(ref["capital_prompt_ids"]) and got["stats"]["stopReason"] == "stop"
    assert got["stats"]["decode"] > 0
    assert got["sampled"][0] == got["sampled"][1] and len(got["sampled"][0]) == 3
    c = got["completion"]
    assert c["object"] == "chat.completion" and c["choices"][0]["message"]["role"] == "assistant"
    assert c["choices"][0]["finish_reason"] in ("stop", "length") and c["usage"]["completion_tokens"] <= 2
    assert c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"]
    errors = got["errors"]
    assert "exceeds the package's context of 192 tokens" in errors[0] or "fills the package's context" in errors[0]
    assert "not valid UTF-8" in errors[1]
    assert "topP must be in (0, 1]" in errors[2]
    assert "unknown generate option 'temprature'" in errors[3]
    assert "n must be 1" in errors[4]
    assert "a chat message must be" in errors[5]
    assert all(e.startswith("KilnError") for e in errors[:6]), errors
    assert errors[6].startswith("ShapeError") and "past_sequence + sequence = 193 exceed their bound 192" in errors[6]
    page.context.close()


#: the package's sampler part on this session's device: given logits, options, seeds and steps in, tokens out; and
#: a seeded sampled generation, drawn on the GPU, replayed step by step through the same sampler
SAMPLER = """async ({logits, seen, cases, prompt}) => {
  const kiln = await import('./kiln.js');
  const session = await kiln.load('./', {target: 'webgpu'});
  const sampler = await session.loadPart(session.manifest.generation.sampler);
  const draw = async (x, ids, options, seed, step) => Number((await sampler.run({
    logits: x, seen: new kiln.Tensor('int32', Int32Array.from(ids), [ids.length]),
    options: new kiln.Tensor('float32', Float32Array.from(options), [4]),
    seed: new kiln.Tensor('int32', Int32Array.of(seed | 0, step), [2])})).token.data[0]);
  const x = new kiln.Tensor('float32', Float32Array.from(logits), [1, 1, logits.length]);
  const tokens = [];
  for (const [options, seed, step] of cases) tokens.push(await draw(x, seen, options, seed, step));
  const run = [];
  for await (const c of session.generate(prompt, {maxNewTokens: 3, temperature: 1, topK: 40, topP: 0.9,
    repetitionPenalty: 1.1, seed: 5})) run.push(c.token);
  const ids = (await session.generator()).encode(prompt);
  const replay = [];
  let out = await session.run({input_ids: new kiln.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, ids.length]),
    past_sequence_length: new kiln.Tensor('int64', BigInt64Array.of(0n), [1])}, {output: 'gpu'});
  for (let n = 0; n < run.length; n++) {
    replay.push(await draw(out.logits, [...new Set([...ids, ...run.slice(0, n)])], [1, 0.9, 1.1, 40], 5, n));
    out = await session.run({input_ids: new kiln.Tensor('int64', BigInt64Array.of(BigInt(run[n])), [1, 1]),
      past_sequence_length: new kiln.Tensor('int64', BigInt64Array.of(BigInt(ids.length + n)), [1])}, {output: 'gpu'});
  }
  return {tokens, run, replay, target: sampler.target};
}"""


def test_browser_sampler_on_the_gpu(served):
    """kiln.js runs the package's sampler part on WebGPU (SwiftShader): for given logits its tokens equal the numpy
    interpreter's of the sampler graph (top-k, top-p, penalty, greedy with a penalty; several seeds and steps), and a
    seeded ``session.generate`` draws each token through it from that step's logits."""
    from kiln.frontend.sampling import sampler_graph
    from kiln.ir import interp

    rng = np.random.default_rng(11)
    vocab = 49152
    logits = (rng.normal(0, 3, vocab)).astype(np.float32)
    seen = [int(i) for i in rng.choice(vocab, 6, replace=False)]
    cases = [([0.8, 1, 1, 40], 7, 0), ([1, 0.9, 1.3, 0], 7, 1), ([0, 1, 2, 0], 3, 2), ([1.5, 0.5, 1.1, 100], -5, 9)]
    page, log = _page(served, "chat/blank.html")
    got = log.evaluate(SAMPLER, {"logits": logits.tolist(), "seen": seen, "cases": cases, "prompt": "Once upon"})
    graph = sampler_graph(vocab, 192, seen=len(seen))
    want = [int(interp.run(graph, {"logits": logits.reshape(1, 1, -1), "seen": np.asarray(seen, np.int32),
                                   "options": np.asarray(o, np.float32),
                                   "seed": np.array([seed, step], np.int32)})["token"].reshape(-1)[0])
            for o, seed, step in cases]
    assert got["target"] == "webgpu" and got["tokens"] == want
    assert len(got["run"]) == 3 and got["replay"] == got["run"]
    page.context.close()


#: generate.js's text handling over a session that replays given tokens (the model's own runs are the tests
#: above): streamed pieces, stop strings held back and cut, abort, and OpenAI-shaped chunks
REPLAY = """async ({answer}) => {
  const kiln = await import('./kiln.js');
  const {Generator} = await import('./generate.js');
  const manifest = await (await fetch('manifest.json')).json();
  const config = manifest.generation;
  const source = {name: 'replay', bytes: async (path) => (await fetch(path)).arrayBuffer()};
  const replay = (tokens) => {
    let at = 0;
    return {
      manifest, target: 'wasm', inputs: manifest.inputs,
      run: async () => ({[config.next_token]: new kiln.Tensor('int64', BigInt64Array.from([BigInt(tokens[at++] ?? 2)]), [1, 1])}),
    };
  };
  const run = async (options) => {
    const generator = await Generator.create(replay(answer), source);
    const pieces = [];
    for await (const c of generator.generate('Hi', options)) pieces.push(c.text);
    return {pieces, stop: generator.stats.stopReason, tokens: generator.stats.newTokens};
  };
  const plain = await run({});
  const stopped = await run({stop: ['Paris.', 'France is P']});
  const controller = new AbortController();
  controller.abort();
  const aborted = await run({signal: controller.signal});
  const length = await run({maxNewTokens: 3});
  const {ChatCompletions} = await import('./generate.js');
  const chat = new ChatCompletions(() => Generator.create(replay(answer), source), 'replay');
  const chunks = [];
  for await (const c of await chat.create({messages: [{role: 'user', content: 'Hi'}], stream: true, temperature: 0,
    stream_options: {include_usage: true}})) chunks.push(c);
  return {plain, stopped, aborted, length, chunks};
}"""


def test_browser_text_streaming_and_stop_strings(served):
    """generate.js's text over replayed reference tokens: the streamed pieces join to the reference answer; a stop
    string cuts the answer before it, and none of its characters were streamed (held back while they might start
    it); an aborted signal ends after the first token; maxNewTokens ends with 'length'; the OpenAI chunks open with
    the assistant's role, carry the text, end with finish_reason and then usage."""
    _, _, ref = served
    page, log = _page(served, "chat/blank.html")
    answer = ref["poem_generated_ids"].tolist()
    got = log.evaluate(REPLAY, {"answer": answer})
    text = str(ref["poem_generated_text"])
    assert "".join(got["plain"]["pieces"]) == text and got["plain"]["stop"] in ("stop", "length")
    cap = [*ref["capital_generated_ids"].tolist()]
    got = log.evaluate(REPLAY, {"answer": cap})
    assert "".join(got["plain"]["pieces"]) == "The capital of France is Paris." and got["plain"]["stop"] == "stop"
    assert "".join(got["stopped"]["pieces"]) == "The capital of " and got["stopped"]["stop"] == "stop"
    assert not any("France" in p for p in got["stopped"]["pieces"])
    assert got["aborted"]["tokens"] == 1 and got["aborted"]["stop"] == "abort"
    assert got["length"]["tokens"] == 3 and got["length"]["stop"] == "length"
    chunks = got["chunks"]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "replay" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == \
        "The capital of France is Paris."
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == len(cap) - 1
    page.context.close()


@pytest.mark.parametrize("name,target,threads", [pytest.param("poem", "webgpu", None, marks=pytest.mark.extended),
                                                 ("capital", "wasm", 1), ("poem", "wasm", 2)])
def test_browser_greedy_answers(served, name, target, threads):
    """A reference answer, greedy, token for token in Chromium: on WebAssembly (one thread, and two worker threads
    over shared memory: the page is cross-origin isolated) both answers; on WebGPU the poem with --extended (minutes on
    SwiftShader; the capital answer is in test_browser_generation_matches_reference)."""
    _, _, ref = served
    page, log = _page(served, "chat/blank.html")
    want = ref[f"{name}_generated_ids"].tolist()
    got = log.evaluate("""async ({question, n, target, threads}) => {
      const kiln = await import('./kiln.js');
      const session = await kiln.load('./', {target, ...(threads ? {threads} : {})});
      const tokens = [];
      let text = '';
      for await (const c of session.generate([{role: 'user', content: question}], {maxNewTokens: n})) {
        tokens.push(c.token);
        text += c.text;
      }
      return {tokens, text, threads: session.adapterInfo.device};
    }""", {"question": QUESTIONS[name], "n": len(want), "target": target, "threads": threads})
    ended = want[-1] == 2
    assert got["tokens"] == (want[:-1] if ended else want)
    assert got["text"] == str(ref[f"{name}_generated_text"])
    if target == "wasm":
        assert got["threads"] == f"{threads} thread{'s' if threads > 1 else ''}", got["threads"]
    page.context.close()


TEACHER_FORCED = """async ({name, ids, target}) => {
  const kiln = await import('./kiln.js');
  const session = await kiln.load('./', {target});
  const feeds = {input_ids: new kiln.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, ids.length]),
                 past_sequence_length: new kiln.Tensor('int64', BigInt64Array.of(0n), [1])};
  const {logits} = await session.run(feeds);
  const want = new Float32Array(await (await fetch(`${name}_logits.bin`)).arrayBuffer());
  const vocab = logits.dims[2];
  let maxErr = 0;
  const top1 = [];
  for (let r = 0; r < ids.length; r++) {
    let best = 0, bestWant = 0;
    for (let v = 0; v < vocab; v++) {
      const g = logits.data[r * vocab + v], w = want[r * vocab + v];
      maxErr = Math.max(maxErr, Math.abs(g - w));
      if (g > logits.data[r * vocab + best]) best = v;
      if (w > want[r * vocab + bestWant]) bestWant = v;
    }
    top1.push(best === bestWant);
  }
  return {maxErr, top1, shape: logits.dims, target: session.target};
}"""


@pytest.mark.parametrize("name,target", [("capital", "webgpu"), pytest.param("poem", "webgpu", marks=pytest.mark.extended),
                                         ("capital", "wasm"), ("poem", "wasm")])
def test_browser_teacher_forced_logits(served, name, target):
    """Every position's logits of a reference sequence (prompt + greedy answer, one prefill) in Chromium within 3e-2
    of the numpy fp32 reference, with the same top-1 token everywhere, on WebGPU and on WebAssembly (the page is
    cross-origin isolated: worker threads over shared memory)."""
    _, _, ref = served
    rows = len(ref[f"{name}_logits"])
    ids = np.concatenate([ref[f"{name}_prompt_ids"], ref[f"{name}_generated_ids"]])[:rows].tolist()
    page, log = _page(served, "tf/blank.html")
    got = log.evaluate(TEACHER_FORCED, {"name": name, "ids": ids, "target": target})
    assert got["target"] == target
    assert got["shape"] == [1, rows, 49152]
    assert got["maxErr"] < 3e-2, got["maxErr"]
    assert all(got["top1"]), json.dumps(got["top1"])
    page.context.close()
