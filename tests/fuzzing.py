"""Shared hypothesis strategies of the model-file fuzz harnesses (tests/test_fuzz_ctranslate2.py,
tests/test_fuzz_gguf.py)."""

from __future__ import annotations

import struct

from hypothesis import strategies as st


@st.composite
def mutated(draw, valid: bytes, field: str, extremes: list[int]) -> bytes:
    """``valid`` with 1 to 4 edits: a bit flipped, the tail cut, bytes spliced in or deleted, or a count, dim or size
    field (``struct`` format ``field``, little-endian) overwritten with one of ``extremes``."""
    data = bytearray(valid)
    width = struct.calcsize(field)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "splice", "field", "delete"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[at:]
        elif kind == "splice":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 64))]
        elif kind == "field" and len(data) >= at + width:
            data[at:at + width] = struct.pack(field, draw(st.sampled_from(extremes)))
    return bytes(data)
