"""The browser sentence-embeddings page (examples/web/embeddings/, built by ``sentence_embeddings.py --web``) in
headless Chromium (kiln.js on WebGPU/SwiftShader): its tokenizer (npm @huggingface/tokenizers on the model's own
tokenizer.json) gives the Python ``tokenizers`` library's ids, masks and type ids, and its embeddings and cosine
matrix equal onnxruntime's pipeline (examples/sentence_embeddings.py: tokenize, last_hidden_state, mean-pool over
the mask, L2-normalise)."""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import pytest
from browser import CHROMIUM, ConsoleLog, serving
from conftest import ROOT, SHARED_MODELS

sys.path.insert(0, str(ROOT / "examples"))
import embeddings_web
import sentence_embeddings as st

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)"),
    pytest.mark.skipif(not SHARED_MODELS.is_dir(), reason="needs ../shared/models"),
]

TOKENIZER_DIR = SHARED_MODELS / "all_minilm_l6_v2_tokenizer"
MAX_BATCH = 4

#: sentences whose tokens must match: punctuation, accents (stripped by the uncased normalizer), unknown and
#: split words, Greek capitals with a final sigma, CJK inside and outside the BMP, emoji, control and zero-width
#: characters, whitespace runs, an empty string, and one longer than the 128 tokens tokenizer.json truncates to
SENTENCES = [
    "A man is eating food.",
    "Hello,world...(really?) [yes] -- \"quoted\" & 'single'; $100.50 at 20% off #1 @user",
    "Crème brûlée, naïve café — résumé! Ångström, Øresund, Ñandú, Ǆ, ﬁ, İstanbul",
    "xqzvwk flibbertigibbet antidisestablishmentarianism " + "a" * 120,
    "ΟΔΥΣΣΕΥΣ ΚΑΙ ΣΑΣ, Σ. Москва — Київ",
    "日本語のテキスト 中文 한국어 𠀀𠀁x𠀂 y 𪚥",
    "emoji 😀🎉 zero\u200bwidth\ufeff tab\there\nnewline\r\x00 \u00a0nbsp",
    "",
    "[CLS] not special? [SEP] [MASK] [UNK]",
    " ".join(f"word{i}, and more punctuation!" for i in range(60)),
]

#: code points for random strings: blocks whose Unicode data is the same in the Rust tokenizers crate and in
#: Chromium (characters assigned in Unicode 11 and later are categorised differently: see the README)
POOL = [chr(c) for c in [*range(0x20, 0x7F), *range(0xA0, 0x180), *range(0x300, 0x370), *range(0x391, 0x3CA),
                         *range(0x410, 0x450), *range(0x2010, 0x2028), *range(0x3040, 0x3097), *range(0x4E00, 0x4E80),
                         *range(0xAC00, 0xAC40), *range(0x20000, 0x20040), *range(0x1F600, 0x1F650), 0x9, 0xA, 0xD,
                         0x0, 0x200B, 0xFEFF, 0x3000]]

#: the page's module: each sentence's encoding alone, and the padded batch of all of them
ENCODE = """async (sentences) => {
  const m = await import(new URL('embeddings.js', location.href).href);
  const tok = await m.loadTokenizer('./');
  const one = sentences.map((s) => m.encode(tok, s));
  const b = m.encodeBatch(tok, sentences);
  const list = (a) => Array.from(a, Number);
  return {one, batch: {dims: [b.batch, b.seq], ids: list(b.inputIds), mask: list(b.attentionMask),
                       types: list(b.tokenTypeIds)}};
}"""


@pytest.fixture(scope="module")
def page(browser, tmp_path_factory):
    """The page built once per module (batch 1..4, seq 1..128) and open in Chromium, ready to run."""
    out = embeddings_web.build(tmp_path_factory.mktemp("embeddings") / "minilm", SHARED_MODELS / "all_minilm_l6_v2.onnx",
                               TOKENIZER_DIR, max_batch=MAX_BATCH, max_seq=128, opt_seq=32, device_class="cpu")
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        with serving(out) as url:
            page.goto(url + "embeddings/")
            log.wait_for("#run:not([disabled])")
            yield page, log
    finally:
        page.close()


def python_tokens(sentences: list[str]):
    """Python ``tokenizers``' encodings of ``sentences`` one by one (tokenizer.json's truncation at 128, no
    padding), and of the batch padded to its longest."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    tok.no_padding()
    one = tok.encode_batch(sentences)
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    return one, tok.encode_batch(sentences)


def test_tokenizer_matches_python(page, rng):
    page, log = page
    randoms = ["".join(rng.choice(POOL, rng.integers(1, 80))) for _ in range(200)]
    sentences = SENTENCES + randoms
    got = log.evaluate(ENCODE, sentences)
    one, batch = python_tokens(sentences)
    assert max(len(e.ids) for e in one) == 128  # the long sentences were truncated
    for s, g, want in zip(sentences, got["one"], one):
        assert (g["ids"], g["attentionMask"], g["tokenTypeIds"]) == (want.ids, want.attention_mask, want.type_ids), \
            (s, want.tokens)
    seq = len(batch[0].ids)
    assert got["batch"]["dims"] == [len(sentences), seq]
    np.testing.assert_array_equal(np.reshape(got["batch"]["ids"], (-1, seq)), [e.ids for e in batch])
    np.testing.assert_array_equal(np.reshape(got["batch"]["mask"], (-1, seq)), [e.attention_mask for e in batch])
    np.testing.assert_array_equal(np.reshape(got["batch"]["types"], (-1, seq)), [e.type_ids for e in batch])


def test_page_embeddings_match_onnxruntime(page):
    page, log = page
    # five sentences of different lengths: two runs (4 + 1 rows; truncation is covered by the tokenizer test, a
    # 4 x 128 run would triple this test's time on SwiftShader)
    sentences = ["A man is eating food.", "A man is eating a piece of bread.",
                 "The quick brown fox, tired of jumping over lazy dogs, took up knitting — and Crème brûlée.",
                 "Ünïcödé words like antidisestablishmentarianism, flibbertigibbet and xqzvwk are split or unknown.",
                 "Dogs."]
    page.fill("#sentences", "\n".join(sentences))
    page.click("#run")
    log.wait_for("#matrix[data-done]")
    result = log.evaluate("""() => {
      const r = globalThis.embeddingsResult;
      return {sentences: r.sentences, dim: r.dim, embeddings: Array.from(r.embeddings), cosine: Array.from(r.cosine),
              ids: r.ids, batches: r.batches,
              cells: Array.from(document.querySelectorAll('#matrix td'), (td) => td.textContent)};
    }""")
    assert result["sentences"] == sentences
    one, _ = python_tokens(sentences)
    assert result["ids"] == [e.ids for e in one]
    assert result["batches"] == [{"batch": 4, "seq": max(len(e.ids) for e in one[:4])},
                                 {"batch": 1, "seq": len(one[4].ids)}]

    feeds = st.tokenize(sentences, TOKENIZER_DIR / "tokenizer.json")
    session = ort.InferenceSession(str(SHARED_MODELS / "all_minilm_l6_v2.onnx"), providers=["CPUExecutionProvider"])
    want = st.mean_pool(session.run(["last_hidden_state"], feeds)[0], feeds["attention_mask"])
    got = np.reshape(result["embeddings"], (len(sentences), result["dim"]))
    assert np.abs(got - want).max() <= 1e-4
    cos = np.reshape(result["cosine"], (len(sentences), len(sentences)))
    assert np.abs(cos - want @ want.T).max() <= 1e-4
    assert abs(cos[0, 1] - 0.755) < 0.01  # the model card's pair (../shared/models/README.md)
    assert result["cells"] == [f"{c:.3f}" for c in cos.ravel()]


def test_web_refuses_to_replace_user_files(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert st.main(["--web", str(out), "--force"]) == 2
    assert "is not a Kiln package" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "keep me"
