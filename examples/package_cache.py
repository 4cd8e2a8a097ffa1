"""A directory of Kiln packages, one per model and concrete input shape, compiled on first use (used by the
examples: Kiln compiles a package per value of each symbolic dim)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path


def symbolic_dims(model: str | Path) -> dict[str, list[str | None]]:
    """Each graph input of ``model`` (an ``.onnx`` file) -> per axis, the key ``kiln.compile(dims=...)`` binds
    it by (:func:`kiln.frontend.onnx.importer.dim_key`), or ``None`` for a fixed axis."""
    import onnx

    from kiln.frontend.onnx.importer import dim_key

    graph = onnx.load(str(model), load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    return {i.name: [None if d.HasField("dim_value") and d.dim_value > 0 else dim_key(i.name, k, d)
                     for k, d in enumerate(i.type.tensor_type.shape.dim)]
            for i in graph.input if i.name not in weights}


def cached_package(model: str | Path, cache: str | Path, shapes: dict[str, tuple[int, ...]],
                   device_class: str = "cpu", log: Callable[[str], None] | None = None) -> Path:
    """The package of ``model`` for inputs of ``shapes`` (input name -> shape), from ``cache`` when a package
    there was made by this Kiln version from a file of the same name for the same dims and device class;
    otherwise compiled now (``kiln.compile(..., force=True)``: ``cache`` must hold Kiln packages only).

    The package directory is ``<cache>/<model stem>-<shape of each input>-<device_class>``.

    Raises:
        kiln.ShapeError: an input missing from ``shapes``, a rank that differs from the model's, or one symbolic
            dim given two sizes; and what :func:`kiln.compile` raises.
    """
    import kiln

    model, cache = Path(model), Path(cache)
    dims: dict[str, int] = {}
    for name, keys in symbolic_dims(model).items():
        shape = shapes.get(name)
        if shape is None or len(shape) != len(keys):
            raise kiln.ShapeError(f"{model.name}: input {name!r} needs a shape of rank {len(keys)}, got {shape}")
        for key, n in zip(keys, shape):
            if key is not None and dims.setdefault(key, int(n)) != int(n):
                raise kiln.ShapeError(f"{model.name}: dim {key!r} given two sizes, {dims[key]} and {n}")
    tag = "_".join(dict.fromkeys("x".join(map(str, shapes[name])) for name in sorted(shapes)))
    out = cache / f"{model.stem}-{tag}-{device_class}"
    return _reuse_or_compile(model, out, dims, device_class, lambda m: m.get("dims") == dims, f"for {dims}", log)


def cached_dynamic_package(model: str | Path, cache: str | Path, dims: dict[str, int | tuple[int, ...]],
                           device_class: str = "cpu", log: Callable[[str], None] | None = None) -> Path:
    """The ONE package of ``model`` with run-time dims ``dims`` (key -> a static size, or ``(lo, hi, opt[,
    multiple])`` for a run-time dim, as :func:`kiln.compile` takes them; docs/dynamic-shapes.md), from ``cache``
    when a package there was made by this Kiln version from a file of the same name with the same dims and device
    class; otherwise compiled now (``force=True``: ``cache`` must hold Kiln packages only).

    The package directory is ``<cache>/<model stem>-dynamic-<lo..hi of each run-time dim>-<device_class>``.

    Raises:
        what :func:`kiln.compile` raises (a dim naming no input dim, bad bounds).
    """

    model, cache = Path(model), Path(cache)
    ranges = {k: tuple(v) for k, v in dims.items() if not isinstance(v, int)}
    want = [[k, v[0], v[1], v[2] if len(v) > 2 else v[1], v[3] if len(v) > 3 else 1] for k, v in ranges.items()]
    tag = "_".join(f"{v[0]}..{v[1]}" for v in ranges.values())
    out = cache / f"{model.stem}-dynamic-{tag}-{device_class}"

    def same_dims(m: dict) -> bool:
        return [[d["name"], d["min"], d["max"], d["opt"], d.get("multiple", 1)] for d in m.get("dynamic_dims", [])] == want

    return _reuse_or_compile(model, out, dims, device_class, same_dims, f"once for {tag}", log)


def _reuse_or_compile(model: Path, out: Path, dims: dict, device_class: str, same_dims: Callable[[dict], bool],
                      what: str, log: Callable[[str], None] | None) -> Path:
    """``out`` if it holds a package this Kiln version made from a file named like ``model`` for ``device_class``
    whose manifest passes ``same_dims``; otherwise ``model`` compiled into ``out`` now (``force=True``)."""
    import kiln

    manifest = out / "manifest.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())
        if (m.get("generator") == f"kiln {kiln.__version__}" and same_dims(m) and m.get("source") == model.name
                and m.get("targets", {}).get("webgpu", {}).get("device_class") == device_class):
            return out
    t0 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    kiln.compile(model, out, dims=dims, device_class=device_class, force=True)
    if log:
        log(f"compiled {model.name} {what} in {time.perf_counter() - t0:.1f} s -> {out}")
    return out
