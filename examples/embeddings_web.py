"""The browser sentence-embeddings page (examples/web/embeddings/): one Kiln package of all-MiniLM-L6-v2 with
run-time dims (``batch``, ``seq``) and, in its ``embeddings/`` folder, the page, its ES module, the model's
``tokenizer.json`` and the tokenizer library (npm ``@huggingface/tokenizers``, the copy Kiln vendors for its
language-model packages: kiln/js/vendor, pinned by its package-lock.json).

Used by ``python examples/sentence_embeddings.py --web DIR``; serve the result with ``kiln serve DIR`` and open
``http://127.0.0.1:8000/embeddings/``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from importlib import resources
from pathlib import Path

#: the page's sources: index.html and embeddings.js
PAGE = Path(__file__).resolve().parent / "web" / "embeddings"


def copy_page(dest: Path, tokenizer_dir: Path, page: Path = PAGE) -> Path:
    """Write the page into ``dest`` (created): index.html, embeddings.js, tokenizer.json and tokenizer_config.json
    from ``tokenizer_dir``, and vendor/tokenizers.mjs with the library's LICENSE (Kiln's vendored copy).

    Returns:
        ``dest``.

    Raises:
        FileNotFoundError: ``tokenizer_dir`` lacks tokenizer.json or tokenizer_config.json.
    """
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (tokenizer_dir / name).is_file():
            raise FileNotFoundError(f"{tokenizer_dir / name} is missing (the model's tokenizer files)")
    (dest / "vendor").mkdir(parents=True, exist_ok=True)
    for name in ("index.html", "embeddings.js"):
        shutil.copyfile(page / name, dest / name)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, dest / name)
    vendor = resources.files("kiln") / "js" / "vendor"
    for src, name in (("tokenizers.mjs", "tokenizers.mjs"), ("LICENSE.tokenizers", "LICENSE")):
        with resources.as_file(vendor / src) as f:
            shutil.copyfile(f, dest / "vendor" / name)
    return dest


def build(out: str | Path, model: str | Path, tokenizer_dir: str | Path, max_batch: int = 8, max_seq: int = 128,
          opt_seq: int = 32, device_class: str = "cpu", force: bool = False,
          log: Callable[[str], None] | None = None) -> Path:
    """Compile ``model`` into the package ``out`` with run-time dims ``batch`` in 1..``max_batch`` and ``seq`` in
    1..``max_seq`` (schedules chosen for ``seq`` = ``opt_seq``), then write the page into ``out/embeddings``.

    Args:
        out: the package directory to create (replaced only with ``force``, and only if it is a Kiln package).
        model: all_minilm_l6_v2.onnx (inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` int64
            [batch, seq]; output ``last_hidden_state`` float32 [batch, seq, 384]).
        tokenizer_dir: the folder of the model's tokenizer.json and tokenizer_config.json.
        max_batch: most sentences per run (the page runs more in several runs).
        max_seq: most tokens per sentence (the page truncates to the smaller of this and tokenizer.json's
            ``truncation.max_length``).
        opt_seq: the sequence length the default schedules are chosen for.
        device_class: ``cpu`` (SwiftShader, lavapipe) or ``gpu`` schedules.
        force: replace an existing package at ``out``.
        log: called with progress lines.

    Returns:
        ``out``.

    Raises:
        kiln.PackageError: ``out`` exists (without ``force``, or it is not a Kiln package); what
            :func:`kiln.compile` raises; see :func:`copy_page`.
    """
    import kiln

    out = Path(out)
    if log:
        log(f"compiling {Path(model).name} with batch=1..{max_batch}, seq=1..{max_seq}@{opt_seq} into {out} ...")
    kiln.compile(model, out, dims={"batch": (1, max_batch), "seq": (1, max_seq, min(opt_seq, max_seq))},
                 device_class=device_class, force=force)
    copy_page(out / "embeddings", Path(tokenizer_dir), PAGE)
    return out
