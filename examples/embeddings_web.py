"""The browser sentence-embeddings page (examples/web/embeddings/): one Kiln package of all-MiniLM-L6-v2 with
run-time dims (``batch``, ``seq``) and, in its ``embeddings/`` folder, the page, its ES module, the model's
``tokenizer.json`` and the vendored tokenizer library (npm ``@huggingface/tokenizers``, pinned with its
integrity in examples/web/embeddings/package-lock.json and installed there by ``npm ci``).

Used by ``python examples/sentence_embeddings.py --web DIR``; serve the result with ``kiln serve DIR`` and open
``http://127.0.0.1:8000/embeddings/``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

#: the page's sources: index.html, embeddings.js, package.json, package-lock.json (and node_modules/ after npm ci)
PAGE = Path(__file__).resolve().parent / "web" / "embeddings"
#: the library's ES module build, as npm ci installs it
TOKENIZERS_JS = Path("node_modules") / "@huggingface" / "tokenizers"


def tokenizers_js(page: Path = PAGE, log: Callable[[str], None] | None = None) -> Path:
    """The installed ``@huggingface/tokenizers`` package folder under ``page``, installed with ``npm ci`` (from
    ``page``'s package-lock.json: exact version and integrity) when it is missing.

    Raises:
        RuntimeError: npm is missing or ``npm ci`` failed (run ``bash setup.sh``, which installs nodejs and npm).
    """
    lib = page / TOKENIZERS_JS
    if not (lib / "dist" / "tokenizers.mjs").is_file():
        if log:
            log(f"installing @huggingface/tokenizers with npm ci in {page} ...")
        try:
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=page, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise RuntimeError(f"could not install @huggingface/tokenizers with npm ci in {page} ({e}); "
                               "install nodejs and npm (bash setup.sh does)") from e
    return lib


def copy_page(dest: Path, tokenizer_dir: Path, page: Path = PAGE, log: Callable[[str], None] | None = None) -> Path:
    """Write the page into ``dest`` (created): index.html, embeddings.js, tokenizer.json and tokenizer_config.json
    from ``tokenizer_dir``, and vendor/tokenizers.mjs with the library's LICENSE and package.json.

    Returns:
        ``dest``.

    Raises:
        FileNotFoundError: ``tokenizer_dir`` lacks tokenizer.json or tokenizer_config.json.
        RuntimeError: see :func:`tokenizers_js`.
    """
    lib = tokenizers_js(page, log)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (tokenizer_dir / name).is_file():
            raise FileNotFoundError(f"{tokenizer_dir / name} is missing (the model's tokenizer files)")
    (dest / "vendor").mkdir(parents=True, exist_ok=True)
    for name in ("index.html", "embeddings.js"):
        shutil.copyfile(page / name, dest / name)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, dest / name)
    shutil.copyfile(lib / "dist" / "tokenizers.mjs", dest / "vendor" / "tokenizers.mjs")
    shutil.copyfile(lib / "LICENSE", dest / "vendor" / "LICENSE")
    shutil.copyfile(lib / "package.json", dest / "vendor" / "package.json")
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
    tokenizers_js(PAGE, log)  # fail before the compile if npm cannot install it
    if log:
        log(f"compiling {Path(model).name} with batch=1..{max_batch}, seq=1..{max_seq}@{opt_seq} into {out} ...")
    kiln.compile(model, out, dims={"batch": (1, max_batch), "seq": (1, max_seq, min(opt_seq, max_seq))},
                 device_class=device_class, force=force)
    copy_page(out / "embeddings", Path(tokenizer_dir), PAGE, log)
    return out
