"""FlashDecoding's split of a decode step's attention over blocks of keys (kiln.passes.split_attention): a one-layer
Llama GGUF (tests/test_fuzz_gguf.py's) with a 1024-token cache, compiled with the GPU fusions. A decode step past
``MAX_FUSED_KEYS`` keys runs the split and combine kernels; its logits equal those of a prefill of the same tokens
(the three attention kernels), natively with poisoned buffers and in Chromium. A decode step's KV-cache writes ride
on its attention kernel, the fused one's or the split's (kiln.te.horizontal.ride)."""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest
from test_fuzz_gguf import tiny_llama

import kiln
from kiln.codegen.webgpu.build import MAX_FUSED_KEYS
from kiln.compiler import compile_model
from kiln.passes.split_attention import BLOCK
from kiln.runtime.dynamic import StepSizes

CONTEXT = 1024
#: one quantization type for the query, key and value projections (one merged matmul, as in SmolLM2): the split
#: kernel's buffers then leave room for the KV-cache writes to ride on its dispatch
QKV = gguf.GGMLQuantizationType.Q4_1


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The package (webgpu, GPU schedules) and token ids for every position of its cache."""
    tmp = tmp_path_factory.mktemp("split")
    model = tiny_llama(tmp / "tiny.gguf", {"llama.context_length": (CONTEXT, gguf.GGUFValueType.UINT32)}, qkv=QKV)
    pkg = tmp / "pkg"
    compile_model(model, pkg, max_context=CONTEXT, device_class="gpu", target="webgpu")
    return pkg, np.random.default_rng(3).integers(0, 8, CONTEXT)


def _feeds(tokens, past: int) -> dict:
    return {"input_ids": np.asarray(tokens, np.int64)[None], "past_sequence_length": np.array([past], np.int64)}


def _prefill(run, tokens, upto: int) -> None:
    """Fill the cache with ``tokens[:upto]`` in chunks of at most 512 (the package's ``max_tokens``)."""
    for start in range(0, upto, 512):
        run(_feeds(tokens[start:min(upto, start + 512)], start))


def test_decode_past_the_fused_kernels_keys_runs_split_and_combine(llama):
    """Which attention kernels a step runs: the fused row kernel up to MAX_FUSED_KEYS keys, the split kernel (a
    workgroup a block of BLOCK keys and query row) and the combine kernel past them, the three kernels for a
    prefill."""
    pkg, _ = llama
    manifest = kiln.load(pkg).manifest
    plan, kernels = manifest["targets"]["webgpu"]["plan"], manifest["targets"]["webgpu"]["kernels"]
    sizes = StepSizes(plan, "groups")

    def attention(s: int, past: int) -> list[list[str]]:
        counts = sizes.dispatches({"sequence": s, "past_sequence": past})[1]
        ran = [kernels[st["kernel"]]["ops"] for st, c in zip(plan, counts) if c[0]]
        return [ops for ops in ran if "Where" in ops or "Exp" in ops or ops == ["Slice", "MatMul"]]  # (its masks)

    fused = attention(1, MAX_FUSED_KEYS - 1)
    assert len(fused) == 1 and fused[0].count("MatMul") == 2, fused
    split = attention(1, MAX_FUSED_KEYS)  # (one key more)
    assert len(split) == 2 and split[0].count("MatMul") == 2 and "Concat" in split[0], split
    assert split[1].count("MatMul") == 0 and split[1].count("ReduceSum") == 2, split  # the combine
    assert attention(1, CONTEXT - 1) == split
    assert len(attention(3, MAX_FUSED_KEYS)) == 3  # a prefill: the three kernels
    assert BLOCK * (CONTEXT // BLOCK) == CONTEXT


def _split_kernels(target: dict) -> list[dict]:
    """The split kernels of a manifest's webgpu section: scores and ``P V`` (two MatMuls) and the Concat of the
    log-sum-exp (then the cache writes riding on it, where they do)."""
    return [k for k in target["kernels"] if "Concat" in k["ops"] and k["ops"].count("MatMul") == 2]


def test_split_kernel_stores_its_log_sum_exp_apart(llama):
    """The split kernel's output packs the block's log-sum-exp after ``P V``'s columns (a head's width + 1): the lanes
    tile the head's width alone (``kiln.te.rows._row_only_tail``; 65 columns made parts 65 lanes apart, whose warps
    read two keys' rows), one lane stores the last column. The numbers: test_split_decode_equals_the_prefill."""
    pkg, _ = llama
    target = kiln.load(pkg).manifest["targets"]["webgpu"]
    split = _split_kernels(target)
    assert len(split) == 1, [k["name"] for k in split]
    source = (pkg / split[0]["source"]).read_text()
    out = re.search(r"var<storage, read_write> (\w+)", source)[1]  # (the partials; the caches' writes ride after)
    stores = [line for line in source.splitlines() if line.strip().startswith(f"{out}[")]
    assert len(stores) >= 2 and "(lane == 0i)" in source, stores
    strides = [int(n) for n in re.findall(r"let g\d+ = \(lane % (\d+)i\);", source)]  # (the column parts')
    assert len(strides) == 1 and strides[0] & (strides[0] - 1) == 0, strides


def test_alternatives_take_the_token_count_as_a_constant(llama):
    """A decode step's alternatives (the split and combine kernels, the fused row kernel, RMSNorm inside the
    projections) run for one token only: ``sequence`` is the constant 1 in their WGSL (``kiln.te.loops.pin_dims``),
    not a word of the dims uniform, which the kernels of a prefill read."""
    pkg, _ = llama
    manifest = kiln.load(pkg).manifest
    plan, kernels = manifest["targets"]["webgpu"]["plan"], manifest["targets"]["webgpu"]["kernels"]
    index = next(d["index"] for d in manifest["dynamic_dims"] if d["name"] == "sequence")
    word = f"kiln_dims[{index // 4}][{index % 4}]"
    sizes = StepSizes(plan, "groups")

    def source(k: int) -> str:
        return (pkg / kernels[k]["source"]).read_text()

    alternatives = set()
    for past in (10, MAX_FUSED_KEYS):  # (the fused row kernel, then the split's two)
        one, three = sizes.dispatches({"sequence": 1, "past_sequence": past}), \
            sizes.dispatches({"sequence": 3, "past_sequence": past})
        alternatives |= {st["kernel"] for st, c1, n1, c3, n3 in zip(plan, *one, *three)
                         if not c1 and n1[0] and not c3 and not n3[0]}  # (its own kernel, for one token only)
    names = [kernels[k]["name"] for k in alternatives]
    assert len(alternatives) >= 4 and any("Concat" in kernels[k]["ops"] for k in alternatives), names
    assert all(word not in source(k) for k in alternatives), names
    prefill = sizes.dispatches({"sequence": 3, "past_sequence": 10})
    assert any(word in source(st["kernel"] if not c else st["variants"][c - 1]["kernel"])
               for st, c, n in zip(plan, *prefill) if n[0])


@pytest.mark.parametrize("past", [MAX_FUSED_KEYS, MAX_FUSED_KEYS + BLOCK + 3, CONTEXT - 1])
def test_split_decode_equals_the_prefill(llama, past):
    """A decode step at ``past`` cached keys (split and combine kernels; the last block partly past the keys, a whole
    number of blocks, the cache's last row) against a prefill ending with the same token (three kernels), each from
    an empty cache."""
    pkg, tokens = llama
    decode, prefill = kiln.load(pkg, poison=True), kiln.load(pkg, poison=True)
    _prefill(decode.run, tokens, past)
    got = decode.run(_feeds(tokens[past:past + 1], past))["logits"]
    _prefill(prefill.run, tokens, 512)
    want = prefill.run(_feeds(tokens[512:past + 1], 512))["logits"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("first", [12, MAX_FUSED_KEYS])
def test_kv_cache_writes_ride_on_the_decode_attention(llama, first):
    """A decode step's KV-cache writes run inside its attention kernel's dispatch, the fused row kernel's up to
    MAX_FUSED_KEYS keys and the split kernel's past them (each reads the new rows from the keys and values being
    written): the write kernel has workgroups in a prefill only. Four decode steps in a row from ``first`` cached
    keys, each reading the rows the steps before wrote, give the logits of prefills of the same tokens."""
    pkg, _ = llama
    manifest = kiln.load(pkg).manifest
    plan, kernels = manifest["targets"]["webgpu"]["plan"], manifest["targets"]["webgpu"]["kernels"]
    sizes = StepSizes(plan, "groups")

    def ran(past: int, sequence: int = 1) -> list[dict]:
        choice, counts = sizes.dispatches({"sequence": sequence, "past_sequence": past})
        return [kernels[st["kernel"] if not c else st["variants"][c - 1]["kernel"]]
                for st, c, n in zip(plan, choice, counts) if n[0]]

    def writes(past: int, sequence: int = 1) -> list[str]:  # the kernels that write the caches and nothing else
        return [k["name"] for k in ran(past, sequence) if k["ops"][-1] == "TensorScatter" and "MatMul" not in k["ops"]]

    assert writes(first, 3) and not writes(first), writes(first)
    hosts = [k for k in ran(first) if k["ops"][-1] == "TensorScatter"]  # the attention kernel, the writes after it
    assert len(hosts) == 1 and hosts[0]["ops"].count("MatMul") == 2, [k["name"] for k in ran(first)]
    assert [b["access"] for b in hosts[0]["bindings"]].count("read_write") == 3  # its output and both caches
    if first >= MAX_FUSED_KEYS:
        assert hosts == _split_kernels(manifest["targets"]["webgpu"])
    # the tokens before one token each (the model's values depend on the token alone: each new row's value is one
    # no other row holds, and the first head's query scores its own key highest; tests/test_fuzz_gguf.tiny_llama)
    tokens = np.concatenate([np.zeros(first, np.int64), [1, 2, 4, 5]])
    decode, prefill = kiln.load(pkg, poison=True), kiln.load(pkg, poison=True)
    _prefill(decode.run, tokens, first)
    got = [decode.run(_feeds(tokens[past:past + 1], past))["logits"] for past in range(first, first + 4)]
    start = first - 1  # (each prefill from there rewrites the rows after it: two tokens or more)
    _prefill(prefill.run, tokens, start)
    want = [prefill.run(_feeds(tokens[start:past + 1], start))["logits"] for past in range(first, first + 4)]
    np.testing.assert_allclose(np.concatenate(got), np.concatenate(want), rtol=1e-4, atol=1e-4)


def test_split_decode_over_a_cache_of_no_whole_blocks(tmp_path):
    """A cache of 1000 rows (no whole number of blocks): the split reads zero rows past its end for the last block,
    masked like the tail keys; a decode step at the cache's last row equals a prefill of the same tokens. (Its
    projections are three matmuls: too many buffers for the cache writes to ride on the split kernel, which then
    reads the cache after them.)"""
    rows = 1000
    model = tiny_llama(tmp_path / "tiny.gguf", {"llama.context_length": (rows, gguf.GGUFValueType.UINT32)})
    pkg = compile_model(model, tmp_path / "pkg", max_context=rows, device_class="gpu", target="webgpu")
    manifest = kiln.load(pkg).manifest
    plan, kernels = manifest["targets"]["webgpu"]["plan"], manifest["targets"]["webgpu"]["kernels"]
    counts = StepSizes(plan, "groups").dispatches({"sequence": 1, "past_sequence": rows - 1})[1]
    assert any("Concat" in kernels[st["kernel"]]["ops"] and "Pad" in kernels[st["kernel"]]["ops"]
               for st, c in zip(plan, counts) if c[0])  # (the split kernel runs)
    tokens = np.random.default_rng(5).integers(0, 8, rows)
    decode, prefill = kiln.load(pkg, poison=True), kiln.load(pkg, poison=True)
    _prefill(decode.run, tokens, rows - 1)
    got = decode.run(_feeds(tokens[rows - 1:], rows - 1))["logits"]
    _prefill(prefill.run, tokens, 512)
    want = prefill.run(_feeds(tokens[512:], 512))["logits"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_split_decode_in_fp16(tmp_path):
    """``--precision fp16`` (f16 cache and activations): the split kernel (its log-sum-exp stored apart, as in fp32)
    gives a decode step the logits of a prefill of the same tokens, to fp16's accuracy (measured: 0.014 at most, the
    logits up to 5.9). The split's tail column once failed to compile in fp16 (a marker of the wrong dtype)."""
    model = tiny_llama(tmp_path / "tiny.gguf", {"llama.context_length": (CONTEXT, gguf.GGUFValueType.UINT32)},
                       qkv=QKV)
    pkg = compile_model(model, tmp_path / "pkg", max_context=CONTEXT, device_class="gpu", target="webgpu",
                        precision="fp16")
    target = kiln.load(pkg).manifest["targets"]["webgpu"]
    split = _split_kernels(target)
    assert len(split) == 1 and "(lane == 0i)" in (pkg / split[0]["source"]).read_text()
    tokens = np.random.default_rng(7).integers(0, 8, CONTEXT)
    past = MAX_FUSED_KEYS + BLOCK + 3
    decode, prefill = kiln.load(pkg, poison=True), kiln.load(pkg, poison=True)
    _prefill(decode.run, tokens, past)
    got = decode.run(_feeds(tokens[past:past + 1], past))["logits"].astype(np.float32)
    _prefill(prefill.run, tokens, 512)
    want = prefill.run(_feeds(tokens[512:past + 1], 512))["logits"][:, -1:].astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-2 * np.abs(want).max())


#: runs the package's steps ``chunks`` ([token ids, past]) in one session in the page; answers the last logits
STEPS = """async ({chunks}) => {
  const kiln = await import('./kiln.js');
  const session = await kiln.load('./', {target: 'webgpu', poison: true});
  let out = null;
  for (const [ids, past] of chunks) {
    out = await session.run({
      input_ids: new kiln.Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, ids.length]),
      past_sequence_length: new kiln.Tensor('int64', BigInt64Array.of(BigInt(past)), [1])});
  }
  const logits = Array.from(out.logits.data);
  session.destroy();
  return logits;
}"""


@pytest.mark.browser
def test_split_decode_in_the_browser(browser, llama):
    """In Chromium (Tint compiles the split kernel's barriers; kiln.js runs the steps the dims select) a decode step
    past MAX_FUSED_KEYS keys gives the native runtime's logits."""
    from browser import evaluate_in_package

    pkg, tokens = llama
    past = MAX_FUSED_KEYS + 40
    native = kiln.load(pkg, poison=True)
    _prefill(native.run, tokens, past)
    want = native.run(_feeds(tokens[past:past + 1], past))["logits"]
    chunks = [[tokens[a:min(past, a + 512)].tolist(), a] for a in range(0, past, 512)]
    got = evaluate_in_package(browser, pkg, STEPS, {"chunks": chunks + [[tokens[past:past + 1].tolist(), past]]})
    np.testing.assert_allclose(np.array(got, np.float32).reshape(want.shape), want, rtol=1e-4, atol=1e-4)
