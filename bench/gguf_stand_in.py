"""A stand-in GGUF for timing on machines a model cannot travel to: the real file's header (metadata, tokenizer,
tensor layout) with pseudo-random weights of the same types.

The lent GPU takes at most 64 MiB a call, the working tree included, and SmolLM2's GGUF is 98 MB. Its header is
1.8 MB: ``python -m bench.gguf_stand_in header MODEL .llm/smollm2.header`` saves it here, and there
``python -m bench.gguf_stand_in fill .llm/smollm2.header /tmp/llm/smollm2.gguf`` writes a file of the same size,
layout and metadata. Every kernel then does the same work as on the real weights (no kernel's work depends on weight
values), so timings stand for the real model's; answers do not. Block scales are set to small finite values and
norm weights near 1, so activations stay finite.

Layout: GGUF v3 (ggml's docs/gguf.md); blocks as in ``gguf.constants.GGML_QUANT_SIZES`` (Q4_0: f16 scale and 16
bytes of nibbles; Q4_1: f16 scale, f16 minimum, 16 bytes; Q8_0: f16 scale, 32 int8).
"""

from __future__ import annotations

import argparse
import struct
from pathlib import Path

import numpy as np

#: bytes before the header that record the whole file's size (little-endian uint64), then the header
_SIZE = struct.Struct("<Q")


def save_header(model: Path, out: Path) -> int:
    """Write the file's size and its bytes before the tensor data to ``out``; returns the header's bytes."""
    import gguf

    offset = gguf.GGUFReader(str(model)).data_offset
    with open(model, "rb") as f:
        head = f.read(offset)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(_SIZE.pack(model.stat().st_size) + head)
    return offset


def fill(header: Path, out: Path, seed: int = 0) -> None:
    """Write a GGUF of the saved header's layout and size with pseudo-random weights (see the module docstring).

    Raises:
        ValueError: a tensor type this stand-in does not fill.
    """
    import gguf

    raw = header.read_bytes()
    (size,) = _SIZE.unpack_from(raw)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        f.write(raw[_SIZE.size:])
        f.truncate(size)
    rng = np.random.default_rng(seed)
    r = gguf.GGUFReader(str(out), "r+")
    q = gguf.GGMLQuantizationType
    for t in r.tensors:
        data = t.data
        if t.tensor_type == q.F32:
            data[...] = (1.0 + 0.1 * rng.standard_normal(data.shape)).astype(np.float32)
            continue
        if t.tensor_type not in (q.Q4_0, q.Q4_1, q.Q8_0):
            raise ValueError(f"{t.name}: {t.tensor_type.name} tensors are not filled by this stand-in")
        blocks = data.reshape(-1, gguf.GGML_QUANT_SIZES[t.tensor_type][1])  # one row a block
        blocks[...] = rng.integers(0, 256, blocks.shape, dtype=np.uint8)
        blocks[:, 0:2] = np.frombuffer(np.float16(0.02).tobytes(), np.uint8)  # the block's scale
        if t.tensor_type == q.Q4_1:
            blocks[:, 2:4] = np.frombuffer(np.float16(-0.15).tobytes(), np.uint8)  # its minimum
    r.data.flush()


def main(argv: list[str] | None = None) -> None:
    """``header MODEL OUT`` or ``fill HEADER OUT``."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("what", choices=["header", "fill"])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    a = ap.parse_args(argv)
    if a.what == "header":
        print(f"{a.out}: {save_header(a.src, a.out)} bytes of header")
    else:
        fill(a.src, a.out)
        print(f"{a.out}: {a.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
