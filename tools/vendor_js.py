"""Vendor the npm libraries that packages carry into kiln/js/vendor/.

    python -m tools.vendor_js           # npm ci in kiln/js/vendor, then copy the ES module builds next to it
    python -m tools.vendor_js --check   # exit 1 when a committed file differs from what npm ci installed

kiln/js/vendor/package.json names each library with an exact version and package-lock.json pins its integrity
(sha512 of the registry tarball). ``npm ci`` installs them into kiln/js/vendor/node_modules (git-ignored; setup.sh
runs it); this tool copies each library's ES module build and licence into kiln/js/vendor/, where they are
committed and shipped with Kiln, and ``kiln compile`` copies them into packages (the page loads them from
``./vendor/``: no CDN, no network at run time): the JSON Schema validator package.js checks manifests with into every
package, the tokenizer and chat-template engine into language-model packages. tests/test_llm_browser.py runs the
check.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

VENDOR = Path(__file__).resolve().parents[1] / "kiln" / "js" / "vendor"

#: committed file -> its source under node_modules (the library's ES module build, or its licence)
FILES = {
    "tokenizers.mjs": "@huggingface/tokenizers/dist/tokenizers.mjs",
    "LICENSE.tokenizers": "@huggingface/tokenizers/LICENSE",
    "jinja.mjs": "@huggingface/jinja/dist/index.js",
    "LICENSE.jinja": "@huggingface/jinja/LICENSE",
    # (MIT, declared in its package.json, which goes along as the notice: the npm package has no LICENSE file)
    **{f"json-schema/{name}.js": f"@cfworker/json-schema/dist/esm/{name}.js"
       for name in ("index", "deep-compare-strict", "dereference", "format", "pointer", "types", "ucs2-length", "validate",
                    "validator")},
    "json-schema/package.json": "@cfworker/json-schema/package.json",
}


def install(vendor: Path = VENDOR) -> Path:
    """``npm ci`` in ``vendor`` (exact versions and integrity from its package-lock.json), unless installed.

    Returns:
        ``vendor / "node_modules"``.

    Raises:
        RuntimeError: npm is missing or failed (setup.sh installs nodejs and npm).
    """
    modules = vendor / "node_modules"
    if all((modules / src).is_file() for src in FILES.values()):
        return modules
    try:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=vendor, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"npm ci failed in {vendor} ({e}); install nodejs and npm (bash setup.sh does)") from e
    return modules


def differing(vendor: Path = VENDOR) -> list[str]:
    """The committed files that differ from (or lack) npm's installed copy; [] when all match.

    Raises:
        FileNotFoundError: npm ci has not run in ``vendor`` (no node_modules).
    """
    modules = vendor / "node_modules"
    if not modules.is_dir():
        raise FileNotFoundError(f"{modules} is missing: run `npm ci` in {vendor} (setup.sh does)")
    return [name for name, src in FILES.items()
            if not (vendor / name).is_file() or (vendor / name).read_bytes() != (modules / src).read_bytes()]


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tools.vendor_js", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare the committed files with npm's")
    args = parser.parse_args(argv)
    modules = install()
    if args.check:
        bad = differing()
        print("kiln/js/vendor: " + (f"differs from npm ci: {', '.join(bad)}" if bad else "matches npm ci"))
        return 1 if bad else 0
    for name, src in FILES.items():
        (VENDOR / name).parent.mkdir(parents=True, exist_ok=True)
        (VENDOR / name).write_bytes((modules / src).read_bytes())
        print(f"kiln/js/vendor/{name} <- node_modules/{src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
