"""Option parsers shared by the ``kiln`` commands (``kiln compile``, ``kiln tune``); kept apart from
:mod:`kiln.cli` so that :mod:`kiln.tune.cli`, which ``kiln.cli`` imports, can use them too."""

from __future__ import annotations

import click

from kiln.errors import KilnError


def parse_dims(values: tuple[str, ...], ranges: bool = True) -> dict[str, int | tuple[int, ...]]:
    """``--dim`` values: ``NAME=SIZE`` binds a symbolic dim statically; with ``ranges``,
    ``NAME=LO..HI[@OPT][%MULTIPLE]`` makes it a run-time dim (docs/dynamic-shapes.md), ``(lo, hi, opt)`` or
    ``(lo, hi, opt, multiple)``; ``LO`` may be 0 (a decoder's empty KV cache). ``NAME=A+B`` makes a dim the sum of
    run-time dims (a decoder's attention mask: ``total=past+seq``), kept as the text.

    Raises:
        click.BadParameter: a malformed value, a size below 1, bounds out of order, or a range where
            ``ranges`` is false.
    """
    from kiln.frontend.onnx.importer import parse_dim_spec

    dims: dict[str, int | tuple[int, ...] | str] = {}
    expected = "NAME=SIZE with SIZE >= 1"
    if ranges:
        expected += (", NAME=LO..HI[@OPT][%MULTIPLE] with 0 <= LO <= OPT <= HI (and MULTIPLE dividing them), "
                     "NAME=LO..[@OPT] or NAME=auto (growable: no upper bound), or NAME=A+B (a sum of run-time dims)")
    for item in values:
        name, sep, val = item.partition("=")
        if ranges and sep and "+" in val and ".." not in val:  # a sum of run-time dims, resolved by the importer
            dims[name.strip()] = val.strip()
            continue
        try:
            spec = parse_dim_spec(name.strip(), val) if sep else None
        except KilnError:
            spec = None
        if spec is None or (isinstance(spec, int) and spec < 1) or (isinstance(spec, tuple) and spec[0] < 0):
            raise click.BadParameter(f"{item!r}: expected {expected}", param_hint="--dim")
        if isinstance(spec, tuple) and not ranges:
            raise click.BadParameter(f"{item!r}: this command binds dims statically; expected {expected}",
                                     param_hint="--dim")
        dims[name.strip()] = spec
    return dims
