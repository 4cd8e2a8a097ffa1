"""Shared settings and hypothesis strategies of the fuzz harnesses (tests/test_fuzz_*.py).

In the suite every harness is derandomized (the same inputs each run) and bounded; a campaign sets
``KILN_FUZZ_RANDOM=1`` (fresh inputs) and ``KILN_FUZZ_EXAMPLES`` (inputs per test), as ``tools/fuzz_campaign.py``
does for a given number of minutes.
"""

from __future__ import annotations

import os
import struct

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


def fuzz_settings(examples: int) -> settings:
    """Hypothesis settings of a harness: ``examples`` inputs per test (``KILN_FUZZ_EXAMPLES`` overrides), no deadline,
    no example database, derandomized unless ``KILN_FUZZ_RANDOM`` is set."""
    return settings(max_examples=int(os.environ.get("KILN_FUZZ_EXAMPLES", examples)), deadline=None,
                    derandomize=not os.environ.get("KILN_FUZZ_RANDOM"), database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


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
