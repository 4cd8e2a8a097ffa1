"""Where the buffers of the C targets (wasm, cpu) live in their one byte arena, at compile time and at run time.

Buffers of fixed size come first, in buffer-id order; the buffers that grow with a growable dim
(docs/dynamic-shapes.md, *Growable buffers*; manifest ``buffers[i].grow``) follow, in buffer-id order. Each starts at
a multiple of ``align`` and takes its size rounded up to ``align`` (at least one unit); ``slack`` free bytes follow the
last (whole-vector loads may read past a buffer's end). The manifest's ``targets.<t>.memory`` holds the offsets and
total for the buffers' first sizes (``offsets``, ``bytes``) with ``align`` and ``slack``; a runtime lays the growable
buffers out again for each run's dims with :func:`regrow`, so the fixed buffers (the weights) never move. The compiler
and the runtimes share this module (it imports nothing of the compiler).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _up(n: int, align: int) -> int:
    return -(-max(int(n), 1) // align) * align


def layout(sizes: Sequence[int], grows: Sequence[bool], base: int, align: int, slack: int) -> tuple[list[int], int]:
    """Byte offsets of buffers of ``sizes`` bytes (in buffer-id order) from ``base`` (a multiple of ``align``), the fixed
    ones (``grows[i]`` false) first, and the arena's total bytes (``slack`` after the last)."""
    offsets = [0] * len(sizes)
    at = base
    for growing in (False, True):
        for i, n in enumerate(sizes):
            if bool(grows[i]) == growing:
                offsets[i] = at
                at += _up(n, align)
    return offsets, at + slack


def regrow(memory: dict[str, Any], sizes: dict[int, int]) -> tuple[list[int], int]:
    """The offsets and total bytes of a target's arena (its manifest ``memory`` entry: ``offsets``, ``align``,
    ``slack``) with its growable buffers at run-time ``sizes`` (buffer id -> bytes): they start where the first of them
    starts in ``offsets`` and follow one another in id order, the other buffers stay where they are."""
    offsets = list(memory["offsets"])
    if not sizes:
        return offsets, int(memory["bytes"])
    align = int(memory["align"])
    ids = sorted(sizes)
    at = min(offsets[i] for i in ids)
    for i in ids:
        offsets[i] = at
        at += _up(sizes[i], align)
    return offsets, at + int(memory["slack"])
