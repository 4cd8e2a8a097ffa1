"""Where the browser page's tokenizer (examples/web/embeddings/embeddings.js over npm @huggingface/tokenizers)
differs from the Python ``tokenizers`` library on the model's tokenizer.json: every code point, tried inside a word.

Usage (from the repository root; needs node and ``npm ci`` in examples/web/embeddings, which setup.sh runs)::

    python -m tools.tokenizer_parity                   # code points U+0001..U+31FFF; prints the differing ones
    python -m tools.tokenizer_parity --last 0x10FFFF --json build/parity.json

Each code point ``c`` is encoded as ``"ab" + c + "cd"`` by both (the page's ``encode`` runs in Node, whose
JavaScript engine and Unicode data stand in for a browser's), and the ids, attention masks and type ids are
compared. Prints the number of differing code points by Unicode general category (Python's ``unicodedata``) and
the first ones with their names. Exit status 0 (the count is a measurement, not a criterion).
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = ROOT.parent / "shared" / "models" / "all_minilm_l6_v2_tokenizer"

#: reads a JSON list of strings from argv[2], writes [[ids, mask, types], ...] to argv[3]
ENCODE_JS = """
import fs from 'fs';
import {fromJSON, encode} from './embeddings.js';
const tok = fromJSON(JSON.parse(fs.readFileSync('tokenizer.json')), JSON.parse(fs.readFileSync('tokenizer_config.json')));
const texts = JSON.parse(fs.readFileSync(process.argv[2]));
fs.writeFileSync(process.argv[3], JSON.stringify(texts.map((t) => {
  const e = encode(tok, t);
  return [e.ids, e.attentionMask, e.tokenTypeIds];
})));
"""


def js_encode(texts: list[str], tokenizer_dir: Path = TOKENIZER_DIR) -> list[list[list[int]]]:
    """The page's encodings (ids, attention mask, type ids) of ``texts``, computed by Node.

    Raises:
        RuntimeError: node or the npm package is missing, or the script failed.
    """
    sys.path.insert(0, str(ROOT / "examples"))
    import embeddings_web

    with tempfile.TemporaryDirectory(prefix="kiln-parity-") as tmp:
        page = embeddings_web.copy_page(Path(tmp), tokenizer_dir)
        (page / "package.json").write_text('{"type": "module"}\n')
        (page / "encode.mjs").write_text(ENCODE_JS)
        (page / "texts.json").write_text(json.dumps(texts))
        try:
            subprocess.run(["node", "encode.mjs", "texts.json", "out.json"], cwd=page, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise RuntimeError(f"node could not run the page's tokenizer: {e}") from e
        return json.loads((page / "out.json").read_text())


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    from tokenizers import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--last", type=lambda s: int(s, 0), default=0x31FFF, help="last code point (default: 0x31FFF)")
    ap.add_argument("--json", type=Path, help="write the differing code points and counts here")
    args = ap.parse_args(argv)
    points = [c for c in range(1, args.last + 1) if not 0xD800 <= c < 0xE000]
    texts = [f"ab{chr(c)}cd" for c in points]
    got = js_encode(texts)
    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    tok.no_padding()
    want = tok.encode_batch(texts)
    bad = [c for c, g, w in zip(points, got, want) if g != [w.ids, w.attention_mask, w.type_ids]]
    cats = collections.Counter(unicodedata.category(chr(c)) for c in bad)
    print(f"{len(bad)} of {len(points)} code points differ (by category, Unicode {unicodedata.unidata_version} data: "
          + ", ".join(f"{k} {v}" for k, v in cats.most_common()) + ")")
    for c in bad[:20]:
        print(f"  U+{c:04X} {unicodedata.category(chr(c))} {unicodedata.name(chr(c), '(unassigned here)')}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"checked": len(points), "differ": [f"U+{c:04X}" for c in bad],
                                         "categories": dict(cats)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
