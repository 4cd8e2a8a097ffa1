"""A GGUF model's tokenizer and chat template, through HuggingFace ``tokenizers`` and ``jinja2`` (never by hand).

GGUF keeps a byte-level BPE tokenizer as ``tokenizer.ggml.tokens`` (the vocabulary in id order), ``.merges``
(``"a b"`` strings, by rank), ``.token_type`` (3: control tokens such as ``<|im_end|>``) and ``.pre`` (the
pre-tokenizer's name in llama.cpp, which decides how text is split before BPE). :func:`tokenizer_json` turns
them into a ``tokenizer.json`` that HuggingFace ``tokenizers`` (Python) and ``@huggingface/tokenizers`` (the
browser) both load.
"""

from __future__ import annotations

import json
from typing import Any

from kiln.errors import ModelFormatError

#: llama.cpp pre-tokenizer names (``tokenizer.ggml.pre``) Kiln builds, and the ``tokenizers`` pre-tokenizers
#: they stand for (llama.cpp's llama-vocab.cpp): SmolLM splits digits one by one before GPT-2's byte-level split
PRE_TOKENIZERS: dict[str, list[dict[str, Any]]] = {
    "smollm": [{"type": "Digits", "individual_digits": True},
               {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}],
    "gpt2": [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}],
}
CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL


def tokenizer_json(metadata: dict[str, Any]) -> str:
    """The ``tokenizer.json`` text of a GGUF's byte-level BPE tokenizer (``tokenizer.ggml.model`` ``gpt2``).

    Raises:
        ModelFormatError: another tokenizer model (SentencePiece ``llama``, ...) or a pre-tokenizer Kiln does not
            know (naming it), or missing tokenizer fields.
    """
    model = metadata.get("tokenizer.ggml.model")
    if not isinstance(model, str) or model != "gpt2":
        raise ModelFormatError(f"GGUF tokenizer model {model!r} is not supported (Kiln builds byte-level BPE, 'gpt2')")
    pre = metadata.get("tokenizer.ggml.pre", "gpt2")
    if not isinstance(pre, str) or pre not in PRE_TOKENIZERS:
        raise ModelFormatError(f"GGUF pre-tokenizer {pre!r} is not supported (Kiln knows {', '.join(PRE_TOKENIZERS)})")
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        if key not in metadata:
            raise ModelFormatError(f"GGUF metadata has no {key}")
    tokens, merges = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.merges"]
    types = metadata.get("tokenizer.ggml.token_type", [1] * len(tokens) if isinstance(tokens, list) else [])
    if not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)
            and isinstance(merges, list) and all(isinstance(m, str) and " " in m for m in merges)
            and isinstance(types, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in types)):
        raise ModelFormatError("GGUF tokenizer metadata must be lists of token strings, of merges 'a b' and of "
                               "integer token types")
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, (t, kind) in enumerate(zip(tokens, types)) if kind == CONTROL]
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": PRE_TOKENIZERS[pre]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": [m.split(" ", 1) for m in merges]},
    }
    return json.dumps(doc, ensure_ascii=False)
