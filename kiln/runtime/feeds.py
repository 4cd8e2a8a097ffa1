"""Checking a model's inputs (and the outputs a run is asked for) against its manifest, shared by the native and the
RPC runtimes."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.package.format import numpy_dtype, to_storage


def shape_text(shape: list) -> str:
    """A manifest shape as error messages show it, as the static checks do: ``[N, 3, 224, 224]`` (a size expression
    as its JSON)."""
    return "[" + ", ".join(str(w) if isinstance(w, (int, str)) else json.dumps(w) for w in shape) + "]"


def check_feeds(specs: list[dict[str, Any]], feeds: dict[str, Any]) -> list[tuple[dict[str, Any], np.ndarray]]:
    """Match ``feeds`` to the manifest's input descriptions.

    Args:
        specs: the manifest's ``inputs`` (each with ``name``, ``dtype``, ``shape``, ``symbolic_shape``).
        feeds: input name -> array-like of exactly that dtype and shape.

    Returns:
        ``(spec, array)`` per input in manifest order, each array C-contiguous.

    Raises:
        ShapeError: an unknown or missing input, or one of another dtype or shape.
    """
    names = {i["name"] for i in specs}
    unknown = sorted(set(feeds) - names)
    if unknown:
        raise ShapeError(f"unknown input{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         f"the model's inputs are {', '.join(map(repr, sorted(names)))}")
    out = []
    for spec in specs:
        if spec["name"] not in feeds:
            raise ShapeError(f"missing input {spec['name']!r} ({spec['dtype']}{spec['shape']})")
        a = np.asarray(feeds[spec["name"]])
        if a.dtype != numpy_dtype(spec["dtype"]):
            raise ShapeError(f"input {spec['name']!r}: expected dtype {spec['dtype']}, got {a.dtype}")
        if "dynamic_shape" in spec:  # run-time dims: the runtime binds and checks them (kiln.runtime.dynamic)
            if a.ndim != len(spec["dynamic_shape"]):
                raise ShapeError(f"input {spec['name']!r}: expected rank {len(spec['dynamic_shape'])} "
                                 f"{shape_text(spec['dynamic_shape'])}, got shape {list(a.shape)}")
        elif list(a.shape) != list(spec["shape"]):
            raise ShapeError(f"input {spec['name']!r}: expected shape {spec['shape']} "
                             f"(symbolic {shape_text(spec.get('symbolic_shape', spec['shape']))}), got {list(a.shape)}")
        out.append((spec, np.ascontiguousarray(a)))
    return out


def storage_feeds(specs: list[dict[str, Any]], feeds: dict[str, Any]) -> list[tuple[dict[str, Any], np.ndarray]]:
    """:func:`check_feeds`, then each array converted to its buffer's element type (the manifest's
    ``storage``: bool, 8/16-bit and int64 tensors become int32), C-contiguous.

    Raises:
        ShapeError: as :func:`check_feeds`, or an int64 value outside int32's range.
    """
    return [(spec, np.ascontiguousarray(to_storage(a, spec["dtype"], f"input {spec['name']!r}")))
            for spec, a in check_feeds(specs, feeds)]


def selected_outputs(specs: list[dict[str, Any]], names, read, output: str) -> tuple[list[bool], list[str]]:
    """Per output of ``specs`` (the manifest's ``outputs``), whether a run returns it (``names``: a run's
    ``outputs``, a name or names, None for all), and ``read`` (a run's outputs to read back as it runs) as a list.

    Raises:
        KilnError: a name that is no output of the model; ``read`` without ``output="gpu"`` or naming an output not
            returned.
    """
    if names is None and not read:  # (every run but a decoder's: nothing to check)
        return [True] * len(specs), []
    known = [o["name"] for o in specs]
    if names is not None:
        names = [names] if isinstance(names, str) else list(names)
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise KilnError(f"run: unknown output{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                            f"the model's outputs are {', '.join(map(repr, known))}")
    wanted = [names is None or n in names for n in known]
    read = [read] if isinstance(read, str) else list(read)
    if read and (output != "gpu" or not set(read) <= {n for n, w in zip(known, wanted) if w}):
        raise KilnError(f"run: read={read} names outputs to read back with output='gpu', among those returned")
    return wanted, read
