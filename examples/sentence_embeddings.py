"""Sentence embeddings with all-MiniLM-L6-v2 through Kiln, and their cosine similarities.

Tokenizes with HuggingFace's ``tokenizers`` (the model's own ``tokenizer.json``: BERT's uncased WordPiece,
truncated at its 128 tokens), pads the batch to the longest sentence rounded up to a multiple of 16 (Kiln
compiles a package per batch size and sequence length; packages are cached in ``--cache``), runs the BERT
encoder natively on WebGPU (wgpu-py; lavapipe without a GPU), then mean-pools ``last_hidden_state`` over the
attention mask and L2-normalises, as sentence-transformers does (Reimers & Gurevych, *Sentence-BERT*, EMNLP
2019). Prints the cosine-similarity matrix.

    python examples/sentence_embeddings.py ["a sentence" ...] [--engine kiln|onnxruntime] [--cache DIR] [--models DIR]

With ``--web DIR`` it instead builds the browser version (examples/web/embeddings/, see embeddings_web.py): one
package with run-time dims (batch 1..--max-batch, seq 1..--max-seq) in DIR and the page in DIR/embeddings/, which
tokenizes in the browser with the model's tokenizer.json; serve it with ``kiln serve DIR``.

    python examples/sentence_embeddings.py --web build/embeddings [--force] [--max-batch 8] [--max-seq 128]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from package_cache import cached_package

MODELS = (Path(__file__).resolve().parents[1] / ".." / "shared" / "models").resolve()
MODEL = MODELS / "all_minilm_l6_v2.onnx"
TOKENIZER = MODELS / "all_minilm_l6_v2_tokenizer" / "tokenizer.json"
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "A monkey is playing drums.",
]


def tokenize(sentences: list[str], tokenizer: str | Path = TOKENIZER, multiple: int = 16) -> dict[str, np.ndarray]:
    """``input_ids``, ``attention_mask`` and ``token_type_ids``, int64 [len(sentences), seq]: ``[CLS] ... [SEP]``,
    padded with ``[PAD]`` (mask 0) to the longest sentence rounded up to a multiple of ``multiple``.
    Raises ``ValueError`` for no sentences."""
    from tokenizers import Tokenizer

    if not sentences:
        raise ValueError("no sentences to tokenize")
    tok = Tokenizer.from_file(str(tokenizer))
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]", pad_to_multiple_of=multiple)
    enc = tok.encode_batch(sentences)
    return {"input_ids": np.array([e.ids for e in enc], np.int64),
            "attention_mask": np.array([e.attention_mask for e in enc], np.int64),
            "token_type_ids": np.array([e.type_ids for e in enc], np.int64)}


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``hidden`` float32 [B, S, D] averaged over the positions where ``mask`` [B, S] is 1, then L2-normalised:
    float32 [B, D] unit vectors."""
    m = mask[..., None].astype(np.float32)
    emb = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return (emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def embed_kiln(feeds: dict[str, np.ndarray], cache: str | Path = "build/minilm-packages", device_class: str = "cpu",
               model: str | Path = MODEL, log=None) -> np.ndarray:
    """``last_hidden_state`` float32 [B, S, 384] of ``feeds`` (see :func:`tokenize`) through Kiln, from a package
    for their shape (compiled into ``cache`` on first use)."""
    import kiln

    pkg = cached_package(model, cache, {k: v.shape for k, v in feeds.items()}, device_class, log)
    return kiln.load(pkg).run(feeds)["last_hidden_state"]


def embed_onnxruntime(feeds: dict[str, np.ndarray], model: str | Path = MODEL) -> np.ndarray:
    """``last_hidden_state`` float32 [B, S, 384] of ``feeds`` through onnxruntime (CPU)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(["last_hidden_state"], feeds)[0]


def build_web(args: argparse.Namespace) -> int:
    """``--web DIR``: compile the package with run-time dims and write the page (embeddings_web.build); prints
    how to serve it. Returns the exit status (2 for a refused destination or an npm failure)."""
    import embeddings_web

    import kiln

    models = Path(args.models)
    try:
        out = embeddings_web.build(args.web, models / MODEL.name, models / TOKENIZER.parent.name,
                                   max_batch=args.max_batch, max_seq=args.max_seq, device_class=args.device_class,
                                   force=args.force, log=lambda s: print(s, file=sys.stderr))
    except (kiln.KilnError, RuntimeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote the package {out} and its page {out / 'embeddings'}/; serve them with\n"
          f"  kiln serve {out}\n"
          "and open http://127.0.0.1:8000/embeddings/ in a browser with WebGPU")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line: prints the cosine-similarity matrix of the sentences."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sentences", nargs="*", help="sentences (default: six examples)")
    ap.add_argument("--engine", choices=["kiln", "onnxruntime"], default="kiln")
    ap.add_argument("--models", default=str(MODELS),
                    help="directory of all_minilm_l6_v2.onnx and all_minilm_l6_v2_tokenizer/ (default: %(default)s)")
    ap.add_argument("--cache", default="build/minilm-packages", help="directory of Kiln's compiled packages")
    ap.add_argument("--device-class", choices=["cpu", "gpu"], default="cpu",
                    help="Kiln's schedules: cpu for lavapipe/SwiftShader, gpu for GPUs")
    web = ap.add_argument_group("browser page (--web)")
    web.add_argument("--web", metavar="DIR", help="build the browser page: a package with run-time dims in DIR "
                     "and the page in DIR/embeddings/ (serve with `kiln serve DIR`)")
    web.add_argument("--force", action="store_true", help="replace the package at DIR if there is one")
    web.add_argument("--max-batch", type=int, default=8, help="most sentences per run (default: %(default)s)")
    web.add_argument("--max-seq", type=int, default=128, help="most tokens per sentence (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.web:
        return build_web(args)
    sentences = args.sentences or SENTENCES
    models = Path(args.models)
    feeds = tokenize(sentences, models / TOKENIZER.relative_to(MODELS))
    if args.engine == "kiln":
        hidden = embed_kiln(feeds, args.cache, args.device_class, models / MODEL.name,
                            log=lambda s: print(s, file=sys.stderr))
    else:
        hidden = embed_onnxruntime(feeds, models / MODEL.name)
    emb = mean_pool(hidden, feeds["attention_mask"])
    cos = emb @ emb.T
    for i, s in enumerate(sentences):
        print(f"[{i}] {s}")
    print("      " + "".join(f"[{j}]".rjust(7) for j in range(len(sentences))))
    for i, row in enumerate(cos):
        print(f"[{i}]".ljust(6) + "".join(f"{c:7.3f}" for c in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
