"""The GGUF frontend and packed-weight kernels: SmolLM2-135M-Instruct (Q4_1) against its numpy reference.

The reference (``../shared/models/reference/smollm2_135m_reference.npz``) holds the logits at every position of
two chat sequences, from a plain numpy fp32 forward pass over the GGUF's dequantized weights; the model comes
from ``kiln zoo get smollm2`` (setup.sh puts it in models/zoo).
"""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from conftest import ROOT, SHARED_MODELS
from test_fuzz_gguf import tiny_llama

import kiln
from kiln.compiler import compile_graph
from kiln.errors import KilnError, ModelFormatError, ShapeError
from kiln.frontend.gguf import import_gguf, read_gguf
from kiln.frontend.gguf.reader import pack_blocks
from kiln.ir import ops
from kiln.ir.graph import Builder, Graph, Value
from kiln.package.writer import write_package

SMOLLM2 = ROOT / "models" / "zoo" / "SmolLM2-135M-Instruct.Q4_1.gguf"
REFERENCE = SHARED_MODELS / "reference" / "smollm2_135m_reference.npz"
needs_model = pytest.mark.skipif(not SMOLLM2.exists(), reason="run setup.sh (kiln zoo get smollm2 -o models/zoo)")


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_packed_layout_matches_gguf_dequantize(rng, kind):
    """Kiln's repacking of GGUF blocks dequantizes (numpy semantics of the primitive) to what llama.cpp's own
    ``gguf.quants.dequantize`` gives, on fresh weights quantized by ``gguf.quants.quantize``."""
    n, k = 5, 96
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 3, (n, 1))).astype(np.float32)
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    raw = gguf.quants.quantize(w, qtype)
    want = gguf.quants.dequantize(raw, qtype).astype(np.float32)
    t = pack_blocks(raw, kind, n, k)
    got = ops.get("MatMulNBits").evaluate([np.eye(k, dtype=np.float32), t.packed, t.scales], t.attrs)[0].T
    np.testing.assert_array_equal(got, want)


def _package(tmp_path, graph, target="webgpu", **kw):
    compiled = compile_graph(graph, target, device_class="cpu", **kw)
    return kiln.load(write_package(compiled, tmp_path / "pkg"), target=target)


@pytest.mark.parametrize("fmt,bits,target", [("f16x2", 4, "webgpu"), ("f32", 4, "webgpu"), ("f16x2", 8, "webgpu"),
                                             ("f16x2", 4, "wasm"), ("f16x2", 4, "cpu"), ("f16x2", 8, "cpu")])
def test_packed_kernels_native(tmp_path, rng, fmt, bits, target):
    """MatMulNBits and GatherBlockQuantized on WebGPU (wgpu), wasm and cpu against their numpy semantics, fresh
    packed weights with every bit pattern, f16 scales with subnormal and zero values."""
    n, k, m = 72, 128, 7
    attrs = {"K": k, "N": n, "bits": bits, "block_size": 32, "scale_format": fmt}
    packed = rng.integers(-2**31, 2**31, (n, k * bits // 32), dtype=np.int64).astype(np.int32)
    if fmt == "f16x2":
        halves = rng.standard_normal((n, k // 32, 2)).astype(np.float16)
        halves[0, 0] = [np.float16(3e-6), np.float16(0)]  # a subnormal scale and a zero offset
        halves[1, 1] = [np.float16(-6.1e-5), np.float16(-0.0)]  # a negative subnormal scale, a negative zero offset
        halves[2, 2] = [np.float16(6.1035e-5), np.float16(-5e-7)]  # the smallest normal, a negative subnormal
        scales = [halves.view(np.uint16).astype(np.uint32)[..., 0] | (halves.view(np.uint16).astype(np.uint32)[..., 1]
                                                                       << 16)]
        scales = [scales[0].view(np.int32)]
    else:
        scales = [rng.standard_normal((n, k // 32)).astype(np.float32), rng.standard_normal((n, k // 32)).astype(
            np.float32)]
    g = Graph(name="packed")
    x = Value("x", "float32", (m, k))
    ids = Value("ids", "int64", (2, 2))
    g.inputs = [x, ids]
    b = Builder(g)
    consts = [b.const(packed)] + [b.const(s) for s in scales]
    y = b.op("MatMulNBits", [x, *consts], **attrs)
    e = b.op("GatherBlockQuantized", [consts[0], ids, *consts[1:]], **attrs)
    g.outputs = [y, e]
    xv = rng.standard_normal((m, k)).astype(np.float32)
    iv = np.array([[0, n - 1], [-1, 5]])
    want_y = ops.get("MatMulNBits").evaluate([xv, packed, *scales], attrs)[0]
    want_e = ops.get("GatherBlockQuantized").evaluate([packed, iv, *scales], attrs)[0]
    session = _package(tmp_path, g, target)
    out = session.run({"x": xv, "ids": iv})
    if target in ("wasm", "cpu"):  # the dequantizing product runs as vectors (kiln_f32x4_half_lo of the preludes)
        kernels = session.manifest["targets"][target]["kernels"]
        assert all(k["vectorized"] for k in kernels if k["ops"] == ["MatMulNBits"])
    np.testing.assert_allclose(out[y.name], want_y, rtol=1e-4, atol=1e-3 * np.abs(want_y).max())
    np.testing.assert_array_equal(out[e.name], want_e)


@pytest.fixture(scope="module")
def smollm2_gguf():
    """SmolLM2's GGUF file, read once for the module's tests (4-5 s a read; the weights stay packed, read-only)."""
    return read_gguf(SMOLLM2)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory, smollm2_gguf):
    """SmolLM2 compiled for WebGPU with a 128-token context (lavapipe schedules), and the reference."""
    dg = import_gguf(SMOLLM2, max_context=128, model=smollm2_gguf)
    compiled = compile_graph(dg.graph, "webgpu", device_class="cpu", validate=False)
    session = kiln.load(write_package(compiled, tmp_path_factory.mktemp("smollm2") / "pkg"))
    return dg, session, np.load(REFERENCE), {}


def _teacher_forced(smollm2, name):
    """One prefill over prompt + greedy answer (kept for the tests that need it: it takes seconds on lavapipe)."""
    _, session, ref, runs = smollm2
    if name not in runs:
        rows = len(ref[f"{name}_logits"])
        ids = np.concatenate([ref[f"{name}_prompt_ids"], ref[f"{name}_generated_ids"]])[:rows]
        runs[name] = session.run(_feeds(ids))
    return runs[name]


def _feeds(ids, cached=0):
    """A decoder step's feeds: ``ids`` after ``cached`` tokens already in the package's cache (its state)."""
    return {"input_ids": np.asarray(ids, np.int64)[None], "past_sequence_length": np.array([cached], np.int64)}


@needs_model
@pytest.mark.parametrize("name", ["capital", "poem"])
def test_smollm2_teacher_forced_logits_native(smollm2, name):
    """Every position's logits of both reference chat sequences within 3e-2 of the numpy fp32 reference, with the
    same top-1 token everywhere (one prefill over prompt + greedy answer)."""
    ref = smollm2[2]
    want = ref[f"{name}_logits"].astype(np.float32)
    got = _teacher_forced(smollm2, name)["logits"][0]
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 3e-2
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


@needs_model
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_smollm2_teacher_forced_logits_gpu_schedules(tmp_path, precision, smollm2_gguf):
    """The capital sequence again, compiled with the schedules and fusions for GPUs (what a real GPU runs: matmul
    prologues, shared tiles, reduce lanes, row kernels; slow on lavapipe, so one sequence): fp32 within the same
    bounds; ``--precision fp16`` (f16 activations and KV cache) with the same top-1 token everywhere and its logits
    within 0.25 (measured: 0.12 at most, 0.014 on average). Its last rows are then decoded one token a step. fp32 runs
    the kernels' subgroup forms (lane combines shuffled within subgroups, as on GPUs; kiln.runtime.subgroups), fp16
    the plain forms."""
    ref = np.load(REFERENCE)
    dg = import_gguf(SMOLLM2, max_context=128, model=smollm2_gguf)
    compiled = compile_graph(dg.graph, "webgpu", device_class="gpu", validate=False, precision=precision)
    names = [k.name for k in compiled.kernels]
    assert any("sigmoid" in n and "matmulnbits" in n for n in names), names  # SwiGLU's product as a prologue
    session = kiln.load(write_package(compiled, tmp_path / "pkg"), poison=True, subgroups=precision == "fp32")
    assert any("subgroups" in k for k in session.manifest["targets"]["webgpu"]["kernels"])
    assert session.subgroups is (precision == "fp32" and "subgroup" in session.device.features)
    rows = len(ref["capital_logits"])
    ids = np.concatenate([ref["capital_prompt_ids"], ref["capital_generated_ids"]])[:rows]
    got = session.run(_feeds(ids))["logits"][0]
    want = ref["capital_logits"].astype(np.float32)
    assert np.abs(got - want).max() < (3e-2 if precision == "fp32" else 0.25)
    if precision == "fp16":
        assert np.abs(got - want).mean() < 3e-2
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
    # the last rows again as decode steps of one token: the plan's decode alternatives run (attention in one row
    # kernel, RMSNorm's reduction in the projections' kernels; kiln.codegen.webgpu.build), the prefill above did not
    plan = session.manifest["targets"]["webgpu"]["plan"]
    assert any(v["groups"] == 0 for s in plan for v in s.get("variants", ())), "no decode alternatives"
    for row in range(rows - 3, rows):
        out = session.run(_feeds(ids[row:row + 1], row))
        step = out["logits"][0, 0]
        assert np.abs(step - want[row]).max() < (3e-2 if precision == "fp32" else 0.25), row
        assert step.argmax() == want[row].argmax() == out["next_token"][0, 0], row


@needs_model
def test_smollm2_kv_cache_decode_native(smollm2):
    """The cache is the package's state, updated in place: after the poem's tokens fill its rows, a prefill of the
    capital prompt and decode steps of one token each (each reading the row the step before wrote) give the
    reference logits of their positions; the state is neither an input nor an output."""
    dg, session, ref, _ = smollm2
    assert {i["name"] for i in session.inputs} == {"input_ids", "past_sequence_length"}
    assert {o["name"] for o in session.outputs} == {"logits", "next_token"}
    assert [s["name"] for s in session.manifest["state"]] == [p for p, _ in dg.cache]
    prompt, answer = ref["capital_prompt_ids"], ref["capital_generated_ids"]
    want = ref["capital_logits"].astype(np.float32)
    other = np.concatenate([ref["poem_prompt_ids"], ref["poem_generated_ids"]])[:64]
    assert len(other) > len(prompt) + 3
    session.run(_feeds(other))  # other tokens in every row the steps below use
    out = session.run(_feeds(prompt))
    assert np.abs(out["logits"][0, -1] - want[len(prompt) - 1]).max() < 3e-2
    for step in range(3):
        out = session.run(_feeds(answer[step:step + 1], len(prompt) + step))
        row = want[len(prompt) + step]
        assert np.abs(out["logits"][0, 0] - row).max() < 3e-2
        assert out["logits"][0, 0].argmax() == answer[step + 1]
        assert out["next_token"][0, 0] == answer[step + 1]
    with pytest.raises(ShapeError, match=r"past_sequence \+ sequence = 129 exceed their bound 128"):
        session.run(_feeds(answer[:2], 127))
    with pytest.raises(ShapeError, match=r"'past_sequence_length' \(past_sequence\) is -1, outside its bounds"):
        session.run(_feeds(answer[:1], -1))


# ----------------------------------------------------------------------------- bad input
def _tiny_gguf(path, arch="llama", qtype=gguf.GGMLQuantizationType.F32):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_context_length(64)
    w.add_layer_norm_rms_eps(1e-5)
    data = np.ones((16, 32), np.float32)
    if qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor("token_embd.weight", data)
    else:
        w.add_tensor("token_embd.weight", gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_bad_input(tmp_path):
    """Another architecture, an unsupported quantization type, a truncated file and a file that is not GGUF are
    each one clear error naming the problem."""
    with pytest.raises(ModelFormatError, match="architecture 'gpt2' is not supported"):
        read_gguf(_tiny_gguf(tmp_path / "gpt2.gguf", arch="gpt2"))
    with pytest.raises(ModelFormatError, match="quantization type Q5_1"):
        read_gguf(_tiny_gguf(tmp_path / "q5.gguf", qtype=gguf.GGMLQuantizationType.Q5_1))
    good = tiny_llama(tmp_path / "good.gguf")  # (a whole one-layer model: the reader checks every tensor)
    read_gguf(good)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:-100])
    with pytest.raises(ModelFormatError, match="truncated"):
        read_gguf(cut)
    head = tmp_path / "head.gguf"
    head.write_bytes(good.read_bytes()[:40])
    with pytest.raises(ModelFormatError, match="unreadable GGUF|truncated|damaged GGUF header"):
        read_gguf(head)
    other = tmp_path / "model.gguf"
    other.write_bytes(struct.pack("<4sI", b"ONNX", 3))
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        read_gguf(other)
    with pytest.raises(KilnError, match="max context 100000"):
        import_gguf(good, max_context=100000)
    layerless = _tiny_gguf(tmp_path / "layerless.gguf")
    with pytest.raises(ModelFormatError, match="no tensor (output_norm|blk.0.attn_norm).weight"):
        read_gguf(layerless)


@needs_model
def test_tokenizer_and_chat_template_match_reference(smollm2_gguf):
    """The tokenizer.json built from the GGUF's vocabulary and merges (HF ``tokenizers``) and its chat template
    (``jinja2``) give the reference's prompt text and ids, and decode the reference answers."""
    from tokenizers import Tokenizer

    from kiln.frontend.gguf.tokenizer import tokenizer_json
    from kiln.runtime.chat import render_chat

    meta = smollm2_gguf.metadata
    tok = Tokenizer.from_str(tokenizer_json(meta))
    ref = np.load(REFERENCE)
    for name, question in [("capital", "What is the capital of France? Answer in one sentence."),
                           ("poem", "Write a short poem about the sea.")]:
        text = render_chat(meta["tokenizer.chat_template"], [{"role": "user", "content": question}])
        assert text == str(ref[f"{name}_prompt_text"])
        assert tok.encode(text).ids == ref[f"{name}_prompt_ids"].tolist()
        assert tok.decode(ref[f"{name}_generated_ids"].tolist(), skip_special_tokens=True) == \
            str(ref[f"{name}_generated_text"])
    assert [tok.id_to_token(i) for i in tok.encode("2024").ids] == ["2", "0", "2", "4"]  # digits split one by one
    with pytest.raises(ModelFormatError, match="pre-tokenizer 'falcon'"):
        tokenizer_json({**meta, "tokenizer.ggml.pre": "falcon"})


# ----------------------------------------------------------------------------- generation
@pytest.fixture
def chat_package(smollm2_chat_package):
    """SmolLM2 as ``kiln compile model.gguf --target webgpu,wasm,cpu`` makes it (last-row logits, on-device arg max),
    192-token context (conftest.py's, shared with test_llm_browser.py)."""
    return smollm2_chat_package


@needs_model
def test_kiln_compile_gguf_package(chat_package, tmp_path):
    """``kiln compile model.gguf`` (the fixture's package): weights stay packed (about 5 bits a weight), with the
    generation section (the KV cache as state buffers of the context bound, tokenizer, chat template, stop tokens)
    that the manifest schema validates;
    a GGUF the frontend refuses writes nothing."""
    from click.testing import CliRunner

    from kiln.cli import main
    from kiln.package.format import read_manifest

    m = read_manifest(chat_package)
    gen = m["generation"]
    assert gen["logits_rows"] == "last" and gen["max_context"] == 192 and len(gen["cache"]["state"]) == 60
    state = {s["name"]: s for s in m["state"]}
    assert set(gen["cache"]["state"]) == set(state) and {s["shape"][2] for s in state.values()} == {192}
    assert all(m["buffers"][s["buffer"]]["kind"] == "state" for s in state.values())
    assert m["dim_limits"] == [{"dims": ["past_sequence", "sequence"], "max": 192}]
    assert gen["eos_token_ids"][0] == 2 and "<|im_start|>" in gen["chat_template"]
    assert (chat_package / "tokenizer.json").exists()
    sampler = read_manifest(chat_package / gen["sampler"])  # sampling on the GPU (format 1.8)
    assert [i["name"] for i in sampler["inputs"]] == ["logits", "seen", "options", "seed"]
    assert list(sampler["targets"]) == ["webgpu"] and sampler["outputs"][0]["name"] == "token"
    params = 134_515_008
    assert m["memory"]["weight_bytes"] * 8 / params < 6.0  # packed: f32 weights would be 32 bits a weight
    bad = _tiny_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    done = CliRunner().invoke(main, ["compile", str(bad), "-o", str(tmp_path / "bad")])
    assert done.exit_code != 0 and "architecture 'gpt2' is not supported" in done.output
    assert not (tmp_path / "bad").exists()


@needs_model
@pytest.mark.parametrize("target", ["webgpu", "wasm", "cpu"])
def test_greedy_generation_reproduces_reference_answers(chat_package, target):
    """``session.generate`` over chat messages: greedy decoding (the arg max read back; the cache kept in place in
    the package's state on every target; on wasm (wasmtime) and cpu kernels over run-time dims)
    reproduces both reference answers (wasm: the capital one; Chromium runs both) token for token and stops at
    ``<|im_end|>``; the streamed text is the reference text."""
    session = kiln.load(chat_package, target=target)
    ref = np.load(REFERENCE)
    questions = [("capital", "What is the capital of France? Answer in one sentence."),
                 ("poem", "Write a short poem about the sea.")]
    for name, question in questions[:1] if target == "wasm" else questions:  # (wasm's poem: test_llm_browser.py)
        want = ref[f"{name}_generated_ids"].tolist()
        chunks = list(session.generate([{"role": "user", "content": question}], max_new_tokens=len(want)))
        ended = want[-1] == 2  # the reference stopped at <|im_end|> (not yielded) or ran out of tokens
        assert [c.token for c in chunks] == (want[:-1] if ended else want)
        assert "".join(c.text for c in chunks) == str(ref[f"{name}_generated_text"])
        stats = session.generator.stats
        assert stats.prompt_tokens == len(ref[f"{name}_prompt_ids"])
        assert stats.stop_reason == ("stop" if ended else "length")


def test_run_ahead_decoding_matches_one_step_at_a_time(tmp_path):
    """Greedy decoding on WebGPU queues steps n + 1 .. n + k, each fed the token of the one before on the device,
    before token n is read back (``Generator.run_ahead`` k): a one-layer Llama's answers, from prompts given as token
    ids, are the same token for token at k = 3, 2, 1 as one step at a time, for answers ended by the length limit
    and by the end token (the steps queued past it are dropped); the session's command buffers per run are restored
    after; a token id outside the vocabulary is a one-line error."""
    from kiln.compiler import compile_model

    pkg = tmp_path / "tiny"
    compile_model(tiny_llama(tmp_path / "tiny.gguf"), pkg, max_context=48, target="webgpu", validate=False)
    session = kiln.load(pkg)
    gen = session.generator
    chunks = session.submit_chunks = 2
    answers = {}
    for ahead in (3, 2, 1, 0):
        gen.run_ahead = ahead
        answers[ahead] = [[c.token for c in session.generate(prompt, 20)] for prompt in ([3, 0, 1], [3, 4, 5, 6, 2])]
        assert session.submit_chunks == chunks
    assert answers[3] == answers[2] == answers[1] == answers[0] and gen.stats.stop_reason == "length"
    full = answers[0][1]
    k = next(i for i in range(2, len(full)) if full[i] not in full[:i])  # a token first chosen at step k > 1
    gen.eos = {full[k]}  # (this model has no end token: make that one it)
    for ahead in (3, 2, 1, 0):
        gen.run_ahead = ahead
        assert [c.token for c in session.generate([3, 4, 5, 6, 2], 20)] == full[:k], ahead
        assert gen.stats.stop_reason == "stop" and gen.stats.new_tokens == k and session.submit_chunks == chunks
    with pytest.raises(KilnError, match="token id 99 of the prompt is outside the vocabulary of 8 tokens"):
        session.generate([3, 99], 2)


@needs_model
def test_sampling_is_seeded_and_bad_prompts_are_refused(chat_package):
    """Sampling with a seed repeats itself and differs from another seed, and on WebGPU each token is the package's
    sampler's draw from that step's logits (replayed step by step); a second generation while one runs on the
    session (one cache) is refused; a prompt longer than the context, a non-UTF-8 prompt and bad options are one-line
    errors."""
    session = kiln.load(chat_package)
    opts = {"temperature": 1.0, "top_k": 50, "top_p": 0.9, "repetition_penalty": 1.1}
    runs = [[c.token for c in session.generate("Once upon", 5, seed=s, **opts)] for s in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    # on WebGPU the package's sampler drew them from the logits on the device: replay the steps by hand
    sampler, ids = session.generator.sampler(), session.generator.encode("Once upon")
    out = session.run({"input_ids": np.asarray([ids]), "past_sequence_length": np.array([0])}, output="gpu")
    for n, token in enumerate(runs[0]):
        seen = np.asarray(list(dict.fromkeys(ids + runs[0][:n])), np.int32)
        feeds = {"logits": out["logits"], "seen": seen, "options": np.array([1.0, 0.9, 1.1, 50], np.float32),
                 "seed": np.array([1, n], np.int32)}
        assert int(sampler.run(feeds)["token"].reshape(-1)[0]) == token
        out = session.run({"input_ids": np.array([[token]]), "past_sequence_length": np.array([len(ids) + n])},
                          output="gpu")
    first = session.generate("Once upon", 5, seed=1, **opts)
    assert next(first).token == runs[0][0]
    with pytest.raises(KilnError, match="already running on this session"):  # one KV cache a session
        next(session.generate("Hello", 2))
    first.close()
    assert [c.token for c in session.generate("Once upon", 5, seed=1, **opts)] == runs[0]
    with pytest.raises(KilnError, match="exceeds the package's context of 192 tokens"):
        session.generate("word " * 150, 100)
    with pytest.raises(KilnError, match="not valid UTF-8"):
        session.generate("caf\udce9", 4)
    with pytest.raises(KilnError, match="top_p must be in"):
        session.generate("Hi", 4, top_p=0)
    with pytest.raises(KilnError, match="unknown sampling option"):
        session.generate("Hi", 4, temprature=0.5)
    with pytest.raises(KilnError, match="fills the package's context of 192 tokens"):
        session.generate("word " * 300)


@needs_model
def test_stop_strings_end_the_answer(chat_package):
    """A stop string ends the answer before it (OpenAI's ``stop``): the text streamed is the reference answer up to
    it, and no piece of the stop string was yielded."""
    session = kiln.load(chat_package)
    question = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    chunks = list(session.generate(question, stop=["Paris", "London"]))
    assert "".join(c.text for c in chunks) == "The capital of France is "
    assert session.generator.stats.stop_reason == "stop"


def test_text_stream_is_the_decoded_answer(rng, smollm2_gguf):
    """Incremental detokenization: the pieces :class:`TextStream` yields, token by token, join to the whole
    answer's decoding, with nothing yielded while a character is split across byte-level tokens (emoji, CJK)."""
    from tokenizers import Tokenizer

    from kiln.frontend.gguf.tokenizer import tokenizer_json
    from kiln.runtime.generate import TextStream

    tok = Tokenizer.from_str(tokenizer_json(smollm2_gguf.metadata))
    pool = list("abc xyz,.!?\n") + ["é", "ß", "日本", "😀", "🎉", "Ωμέγα", " Paris", "  "]
    for _ in range(20):
        text = "".join(rng.choice(pool, 30))
        ids = tok.encode(text).ids
        stream = TextStream(lambda t: tok.decode(t, skip_special_tokens=True))
        pieces = [stream.push(i) for i in ids]
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True) == text
        assert not any("\ufffd" in p for p in pieces)


def test_sampler_filters(rng):
    """Host sampling: top-k and top-p keep only the likeliest tokens, the repetition penalty pushes seen tokens
    down, temperature 0 is the arg max."""
    from kiln.runtime.generate import SamplingOptions, sample

    logits = np.array([5.0, 4.0, 1.0, 0.5, -3.0], np.float32)
    draws = {sample(logits, SamplingOptions(temperature=1.0, top_k=2), [], rng) for _ in range(200)}
    assert draws == {0, 1}
    draws = {sample(logits, SamplingOptions(temperature=1.0, top_p=0.5), [], rng) for _ in range(200)}
    assert draws == {0}  # token 0 alone holds 72% of the mass
    assert sample(logits, SamplingOptions(), [], rng) == 0
    assert sample(logits, SamplingOptions(repetition_penalty=2.0), [0], rng) == 1  # 5 / 2 < 4


@needs_model
def test_kiln_generate_and_chat_in_tmux(chat_package, tmp_path):
    """``kiln generate --prompt`` streams the answer; ``kiln chat``, driven in tmux as a person would (typing the
    question, reading the screen), answers Paris."""
    import shutil
    import subprocess
    import time

    from click.testing import CliRunner

    from kiln.cli import main

    want = "".join(c.text for c in kiln.load(chat_package).generate("The sea is", 3))
    done = CliRunner().invoke(main, ["generate", str(chat_package), "--raw", "--prompt", "The sea is",
                                     "--max-new-tokens", "3"])
    assert done.exit_code == 0, done.output
    assert done.output.startswith(want) and want.strip()
    done = CliRunner().invoke(main, ["generate", str(chat_package), "--raw", "--prompt", "The sea is",
                                     "--max-new-tokens", "3", "--target", "cpu"])
    assert done.exit_code == 0 and done.output.startswith(want), done.output
    # a message that outgrows the context is refused and the conversation goes on
    done = CliRunner().invoke(main, ["chat", str(chat_package), "--target", "cpu", "--max-new-tokens", "8"],
                              input="word " * 200 + "\nWhat is the capital of France?\n")
    assert done.exit_code == 0, done.output
    assert "fills the package's context of 192 tokens" in done.output and "Paris" in done.output
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    kiln_bin = ROOT / ".venv" / "bin" / "kiln"
    name = f"kiln-chat-{tmp_path.name}"
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "200", "-y", "50",
                    f"{kiln_bin} chat {chat_package} --max-new-tokens 16"], check=True)
    try:
        def screen() -> str:
            return subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True, text=True, check=False).stdout

        deadline = time.monotonic() + 120
        while not screen().rstrip().endswith(">") and time.monotonic() < deadline:  # the prompt (tmux trims spaces)
            time.sleep(0.5)
        subprocess.run(["tmux", "send-keys", "-t", name, "What is the capital of France?", "Enter"], check=True)
        deadline = time.monotonic() + 180
        while "tokens/s" not in screen() and time.monotonic() < deadline:
            time.sleep(0.5)
        text = screen()
        assert "Paris" in text, text
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], check=False)


@needs_model
def test_onnx_q4_decoder_matches_onnxruntime(tmp_path):
    """SmolLM2 exported to ONNX with a KV cache (optimum's layout) from the GGUF's dequantized weights: onnxruntime
    running the fp32 export gives the reference logits; onnxruntime's 4-bit quantizer makes the q4 export
    (MatMulNBits); Kiln compiled from that file (run-time ``sequence``, ``past_sequence`` from 0 and
    ``total_sequence = past_sequence + sequence``) matches onnxruntime running the same file over a 32-token
    greedy generation, each with its own cache: logits within 1e-3 at every step, the same tokens (on wasm); compiled
    with the default (gpu) schedules and fusions for WebGPU, over the prompt and two decode steps."""
    import collections

    import onnx
    import onnxruntime as ort

    from kiln.compiler import compile_model
    from kiln.zoo.llama_export import export_decoder, quantize_4bit

    fp32, q4 = tmp_path / "decoder.onnx", tmp_path / "decoder_q4.onnx"
    c = export_decoder(SMOLLM2, fp32)
    ref = np.load(REFERENCE)
    prompt = ref["capital_prompt_ids"]
    cache = {f"past_key_values.{i}.{p}": np.zeros((1, c["kv_heads"], 0, c["head_dim"]), np.float32)
             for i in range(c["layers"]) for p in ("key", "value")}

    def feeds(ids, start, past):
        return {"input_ids": np.asarray(ids)[None], "attention_mask": np.ones((1, start + len(ids)), np.int64),
                "position_ids": np.arange(start, start + len(ids))[None], **past}

    exported = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(
        ["logits"], feeds(prompt, 0, cache))[0][0]
    assert np.abs(exported - ref["capital_logits"][:len(prompt)].astype(np.float32)).max() < 3e-2
    quantize_4bit(fp32, q4)
    kinds = collections.Counter(n.op_type for n in onnx.load(str(q4)).graph.node)
    assert kinds["MatMulNBits"] == 7 * c["layers"] + 1  # every projection and the head; QK^T and PV stay MatMul
    # (the 32 steps on wasm: WebGPU on lavapipe takes a second a step; its GPU-schedule kernels are checked below)
    session = kiln.load(compile_model(q4, tmp_path / "pkg", dims={
        "sequence": (1, 64, 1), "past_sequence": (0, 95), "total_sequence": "past_sequence+sequence"},
        device_class="cpu", target="wasm", validate=False), target="wasm")
    runtime = ort.InferenceSession(str(q4), providers=["CPUExecutionProvider"])
    names = [o.name for o in runtime.get_outputs()]
    ours, theirs = dict(cache), dict(cache)
    ids, start = list(prompt), 0
    for _ in range(32):
        want = dict(zip(names, runtime.run(None, feeds(ids, start, theirs))))
        got = session.run(feeds(ids, start, ours))
        assert np.abs(got["logits"] - want["logits"]).max() < 1e-3
        token = int(want["logits"][0, -1].argmax())
        assert int(got["logits"][0, -1].argmax()) == token
        theirs = {n.replace("present", "past_key_values"): want[n] for n in names[1:]}
        ours = {n.replace("present", "past_key_values"): got[n] for n in names[1:]}
        start, ids = start + len(ids), [token]
    # the default device class (gpu schedules and fusions: norms in the projections, attention in one kernel for a
    # decode step, concatenated kernels): the prompt and two decode steps
    session = kiln.load(compile_model(q4, tmp_path / "gpu", dims={
        "sequence": (1, 64, 1), "past_sequence": (0, 95), "total_sequence": "past_sequence+sequence"},
        validate=False), poison=True)
    ours, theirs, ids, start = dict(cache), dict(cache), list(prompt), 0
    for _ in range(3):
        want = dict(zip(names, runtime.run(None, feeds(ids, start, theirs))))
        got = session.run(feeds(ids, start, ours))
        assert np.abs(got["logits"] - want["logits"]).max() < 1e-3, start
        theirs = {n.replace("present", "past_key_values"): want[n] for n in names[1:]}
        ours = {n.replace("present", "past_key_values"): got[n] for n in names[1:]}
        start, ids = start + len(ids), [int(want["logits"][0, -1].argmax())]
