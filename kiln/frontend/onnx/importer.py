"""Import an ONNX model into Kiln's graph IR.

Steps: load and check the file with ``onnx``; run ONNX shape inference; refuse,
listing all of them at once, every operator Kiln has no converter for; bind
symbolic dims (``N``) to concrete values; turn initializers into constants; and
convert nodes in order with the opset-versioned converters of
:mod:`kiln.frontend.onnx.registry`.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections import ChainMap
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from kiln.arith import symbolic
from kiln.errors import KilnError, ModelFormatError, ShapeError, UnsupportedOpError, one_line
from kiln.frontend.onnx import ops as _ops  # noqa: F401  (registers the converters)
from kiln.frontend.onnx.registry import lookup
from kiln.ir import dtypes
from kiln.ir.graph import MAX_CONSTANT_BYTES, Builder, Graph, Value


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Read and check an ONNX file.

    Raises:
        ModelFormatError: if the file is missing, unreadable, or not a valid ONNX model.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelFormatError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelFormatError(f"{path}: is a directory, not an ONNX file")
    try:
        model = onnx.load(path)
    except Exception as e:  # noqa: BLE001  (onnx raises DecodeError, protobuf errors, ...)
        raise ModelFormatError(f"{path}: not an ONNX model ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'parse failed'})") from None
    if not model.graph.node and not model.graph.output:
        raise ModelFormatError(f"{path}: not an ONNX model (no graph)")
    _check_strings(model.graph, path)
    try:
        extras = [(node, node.domain) for node in _runtime_ops(model)]
    except (TypeError, ValueError, UnicodeDecodeError) as e:  # a node whose op or domain is no valid string
        raise ModelFormatError(f"{path}: invalid ONNX model ({type(e).__name__}: {one_line(e, 200)})") from None
    if extras:  # checked as ops of a domain onnx does not know (which it skips), then given back
        model.opset_import.append(onnx.helper.make_opsetid(_RUNTIME_DOMAIN, 1))
        for node, _ in extras:
            node.domain = _RUNTIME_DOMAIN
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise ModelFormatError(f"{path}: invalid ONNX model: {str(e).splitlines()[0]}") from None
    except Exception as e:  # noqa: BLE001  (the checker also fails on bytes that are no valid UTF-8 strings, ...)
        raise ModelFormatError(f"{path}: invalid ONNX model ({type(e).__name__}: {one_line(e, 200)})") from None
    finally:
        if extras:
            del model.opset_import[-1]
            for node, domain in extras:
                node.domain = domain
    return model


def _check_strings(g: onnx.GraphProto, path: str) -> None:
    """Refuse names that are no valid UTF-8 (protobuf then hands them over as bytes), subgraphs included.

    Raises:
        ModelFormatError: naming where the bad name is.
    """
    def check(value, where: str) -> None:
        if not isinstance(value, str):
            raise ModelFormatError(f"{path}: {where} is not valid UTF-8 text ({value!r:.60})")

    check(g.name, "the graph's name")
    for kind in ("input", "output", "value_info", "initializer"):
        for v in getattr(g, kind):
            check(v.name, f"a graph {kind}'s name")
    for node in g.node:
        for field in ("name", "op_type", "domain"):
            check(getattr(node, field), f"a node's {field}")
        for name in (*node.input, *node.output):
            check(name, f"node {node.name!r}'s input or output name")
        for a in node.attribute:
            check(a.name, f"node {node.name!r}'s attribute name")
            for sub in (*([a.g] if a.HasField("g") else []), *a.graphs):
                _check_strings(sub, path)


#: the domain :func:`load_model` lends onnxruntime's default-domain operators while onnx's checker runs
_RUNTIME_DOMAIN = "kiln.onnxruntime"


def _runtime_ops(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The default-domain nodes (subgraphs included) of operators onnx has no schema for but Kiln converts:
    onnxruntime registers a few of its own there (SimplifiedLayerNormalization)."""
    opset = opset_of(model)
    found = []
    stack = [model.graph]
    while stack:
        graph = stack.pop()
        for node in graph.node:
            if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type) and lookup(node.op_type, opset):
                found.append(node)
            stack.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
            stack.extend(g for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs)
    return found


def opset_of(model: onnx.ModelProto, domain: str = "") -> int:
    """The opset version the model imports for ``domain`` (default domain: ``""``)."""
    for imp in model.opset_import:
        if imp.domain in (domain, "ai.onnx" if domain == "" else domain):
            return imp.version
    return 1


def unsupported_ops(model: onnx.ModelProto) -> list[tuple[str, str, int, str]]:
    """Every node Kiln cannot convert, as ``(op_type, domain, opset, node_name)``."""
    missing = []
    for i, node in enumerate(model.graph.node):
        opset = opset_of(model, node.domain)
        if lookup(node.op_type, opset, node.domain) is None:
            missing.append((node.op_type, node.domain, opset, node.name or f"#{i}"))
    return missing


def tensor_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    """The array of an initializer or tensor attribute, checked before numpy reads it: a known element type,
    non-negative dims within :data:`~kiln.ir.graph.MAX_CONSTANT_BYTES`, and data of exactly that size.

    Raises:
        ModelFormatError: naming the tensor and what is wrong with it.
    """
    name = f"{what} {t.name!r}"
    try:
        dtype = dtypes.from_onnx(t.data_type)
        itemsize = dtypes.itemsize(dtype)
    except (KeyError, KilnError, TypeError):
        raise ModelFormatError(f"{name}: unknown element type {t.data_type}") from None
    dims = [int(d) for d in t.dims]
    if any(d < 0 for d in dims):
        raise ModelFormatError(f"{name}: negative dims {dims}")
    size = int(np.prod(dims, dtype=object))
    if size * itemsize > MAX_CONSTANT_BYTES:
        raise ModelFormatError(f"{name}: {dtype}{dims} is {size * itemsize / 2**30:.3g} GiB, beyond the "
                               f"{MAX_CONSTANT_BYTES >> 30} GiB Kiln allows a tensor")
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise ModelFormatError(f"{name}: its external data was not loaded (missing, or outside the model's folder)")
    if t.HasField("raw_data") and dtype not in dtypes.NARROW_INTS and len(t.raw_data) != size * itemsize:
        raise ModelFormatError(f"{name}: raw_data holds {len(t.raw_data)} bytes, {dtype}{dims} needs "
                               f"{size * itemsize}")
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:  # noqa: BLE001  (numpy and onnx raise ValueError, TypeError, ... on bad data)
        raise ModelFormatError(f"{name}: unreadable data ({one_line(e, 200)})") from None
    if arr.size != size:
        raise ModelFormatError(f"{name}: holds {arr.size} elements, its dims {dims} say {size}")
    return arr


def _attr_value(a: onnx.AttributeProto) -> Any:
    v = onnx.helper.get_attribute_value(a)
    try:
        if isinstance(v, onnx.TensorProto):
            return tensor_array(v, f"attribute {a.name!r}'s tensor")
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, list):
            return [x.decode() if isinstance(x, bytes) else x for x in v]
    except UnicodeDecodeError:
        raise ModelFormatError(f"attribute {a.name!r}: a string that is not UTF-8") from None
    return v


def dim_key(input_name: str, index: int, dim: onnx.TensorShapeProto.Dimension) -> str:
    """The name a symbolic dim is bound by (``--dim KEY=SIZE``): its ``dim_param``, or ``<input>_dim<index>``
    for an anonymous one (no name, ``?``, or a negative ``dim_value`` as some exporters write)."""
    if dim.HasField("dim_param") and dim.dim_param not in ("", "?"):
        return dim.dim_param
    return f"{input_name}_dim{index}"


def _symbolic_input_dims(graph: onnx.GraphProto) -> Iterator[tuple[str, bool]]:
    """``(key, named)`` for every symbolic dim of ``graph``'s inputs (initializers excluded), in input order: its
    :func:`dim_key` and whether the model names it (``dim_param``)."""
    inits = {t.name for t in graph.initializer}
    for inp in graph.input:
        if inp.name in inits or not inp.type.HasField("tensor_type"):
            continue
        for i, d in enumerate(inp.type.tensor_type.shape.dim):
            if not (d.HasField("dim_value") and d.dim_value >= 0):
                yield dim_key(inp.name, i, d), d.HasField("dim_param") and d.dim_param not in ("", "?")


def unbound_dims(model: onnx.ModelProto, dims: dict[str, Any] | None = None) -> list[str]:
    """The named symbolic dims of ``model``'s inputs (``dim_param``, in input order) that ``dims`` gives no value:
    those :func:`import_model`'s ``unbound`` decides (static 1, or growable run-time dims)."""
    dims = dims or {}
    return list(dict.fromkeys(k for k, named in _symbolic_input_dims(model.graph) if named and k not in dims))


def parse_dim_spec(key: str, value: Any) -> int | tuple[Any, ...]:
    """A ``--dim`` value: an int (a static binding), or ``(lo, hi)``, ``(lo, hi, opt)``, ``(lo, hi, opt, multiple)``,
    ``"lo..hi"``, ``"lo..hi@opt"`` or ``"lo..hi@opt%multiple"`` (a run-time dim with bounds; ``opt``, default ``hi``,
    is the value schedules are chosen for; ``%multiple`` says every value is a multiple of it, as PP-OCR's
    detector needs of its height and width). A multiple of 1 gives the 3-tuple. Without ``hi`` (``"lo.."``,
    ``"lo..@opt"``, ``"auto"`` for ``"1.."``; ``(lo, None)`` in Python) the dim is *growable*: no upper bound, its
    buffers grow at run time (docs/dynamic-shapes.md) and ``hi`` in the result is None.

    Raises:
        KilnError: a malformed value.
    """
    multiple = 1
    if isinstance(value, str):
        text = value.strip()
        if text == "auto":
            text = "1.."
        try:
            if ".." not in text:
                return int(text)
            text, _, mult = text.partition("%")
            multiple = int(mult) if mult else 1
            rng, _, opt = text.partition("@")
            lo, _, hi = rng.partition("..")
            lo_i, hi_i = int(lo), (int(hi) if hi.strip() else None)
            spec = (lo_i, hi_i, int(opt) if opt else hi_i)
        except ValueError:
            raise KilnError(f"--dim {key}={value}: expected SIZE, LO..HI, LO..HI@OPT, LO..HI[@OPT]%MULTIPLE, LO.. "
                            "or auto (integers)") from None
    elif isinstance(value, (tuple, list, range)):
        v = (value.start, value.stop - 1) if isinstance(value, range) else \
            tuple(None if x is None else int(x) for x in value)
        if len(v) not in (2, 3, 4) or v[0] is None or any(x is None for x in v[3:]):
            raise KilnError(f"dim {key}: a run-time dim is (lo, hi), (lo, hi, opt) or (lo, hi, opt, multiple), "
                            f"hi None for no bound, got {value!r}")
        spec = (v[0], v[1], v[2] if len(v) >= 3 else v[1])
        multiple = v[3] if len(v) == 4 else 1
    else:
        return int(value)
    lo, hi, opt = spec
    if opt is None and hi is not None:
        opt = hi
        spec = (lo, hi, opt)
    if hi is None:
        if lo < 0 or (opt is not None and opt < lo):
            raise KilnError(f"dim {key}: a growable dim needs 0 <= lo <= opt, got {lo}..@{opt}")
    elif not 0 <= lo <= opt <= hi:
        raise KilnError(f"dim {key}: a run-time dim needs 0 <= lo <= opt <= hi, got {lo}..{hi}@{opt}")
    if multiple < 1 or any(x % multiple for x in spec if x is not None):
        raise KilnError(f"dim {key}: {lo}..{'' if hi is None else hi}@{opt} must be multiples of {multiple}")
    return spec if multiple == 1 else (*spec, multiple)


def _derived_dim(key: str, text: str, size_vars: dict[str, Any]) -> Any:
    """A dim that is the sum of run-time dims and sizes (``--dim total=past+seq``, a decoder's attention mask
    covering the cache and the new tokens), as a size expression.

    Raises:
        KilnError: a term that is neither an integer nor a run-time dim given with its bounds.
    """
    total: Any = 0
    for term in text.split("+"):
        term = term.strip()
        if term.lstrip("-").isdigit():
            total = total + int(term)
        elif term in size_vars:
            total = total + size_vars[term]
        else:
            raise KilnError(f"--dim {key}={text}: {term!r} is not a run-time dim (give it as --dim {term}=LO..HI) "
                            "or an integer")
    return symbolic.simplify(total)


def _bind_shape(name: str, t: onnx.TypeProto, dims: dict[str, Any],
                grow: Callable[[str], Any] | None = None) -> tuple[tuple[int, ...], tuple[int | str, ...]]:
    if not t.HasField("tensor_type"):
        raise KilnError(f"input {name!r}: only tensor inputs are supported")
    if not t.tensor_type.HasField("shape"):
        raise ShapeError(f"input {name!r} has no shape; give it with --shape")
    sym: list[int | str] = []
    concrete: list[int] = []
    for i, d in enumerate(t.tensor_type.shape.dim):
        if d.HasField("dim_value") and d.dim_value >= 0:
            sym.append(d.dim_value)
            concrete.append(d.dim_value)
        else:
            key = dim_key(name, i, d)
            sym.append(key)
            if key not in dims:
                if d.dim_param and d.dim_param != "?":
                    dims[key] = 1 if grow is None else grow(key)
                else:
                    raise ShapeError(f"input {name!r} dim {i} is unknown; bind it with --dim {key}=SIZE")
            concrete.append(dims[key] if not isinstance(dims[key], (int, np.integer)) else int(dims[key]))
    return tuple(concrete), tuple(sym)


def _call(fn, b: Builder, inputs: list[Value | None], attrs: dict[str, Any], node: onnx.NodeProto, opset: int):
    params = inspect.signature(fn).parameters
    known = {k for k, p in params.items() if p.kind == p.KEYWORD_ONLY}
    extra = set(attrs) - known
    if extra and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        raise UnsupportedOpError([(f"{node.op_type}[{','.join(sorted(extra))}]", node.domain, opset, node.name)])
    if "_opset" in params:
        attrs = {**attrs, "_opset": opset}
    if "_nout" in params:
        attrs = {**attrs, "_nout": len(node.output)}
    return fn(b, *inputs, **attrs)


def import_model(model: onnx.ModelProto | str | os.PathLike, dims: dict[str, int] | None = None,
                 variables: Collection[str] = (), unbound: str = "static") -> Graph:
    """Convert an ONNX model to a :class:`~kiln.ir.graph.Graph`.

    Args:
        model: a loaded ``ModelProto`` or a path to an ``.onnx`` file.
        dims: values for symbolic dims (``{"N": 1}``, ``{"seq": (1, 512)}``, ``{"batch": (1, None)}``: see
            :func:`parse_dim_spec`).
        variables: initializer names to import as graph inputs (appended after the model's
            inputs, in this order) instead of constants, so nothing folds them: the trainable
            weights of a train-step graph (:mod:`kiln.train`).
        unbound: what a named symbolic dim without an entry in ``dims`` becomes: ``"static"`` (bound to 1) or
            ``"grow"`` (a growable run-time dim, ``1..``; docs/dynamic-shapes.md). A growable dim the model bounds
            (a Slice of a constant table by it) gets that bound: the model is converted again with it, and
            ``graph.inferred_bounds`` says why.

    Raises:
        ModelFormatError: the file is not a valid ONNX model.
        UnsupportedOpError: listing every operator Kiln lacks, before any conversion.
        ShapeError: a graph input has unknown dims, or shapes do not fit.
    """
    if unbound not in ("static", "grow"):
        raise KilnError(f"unbound dims are 'static' or 'grow', not {unbound!r}")
    if not isinstance(model, onnx.ModelProto):
        model = load_model(model)
    missing = unsupported_ops(model)
    if missing:
        raise UnsupportedOpError(missing)
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001, S110  (ONNX's inference is advisory; Kiln's own shape rules decide)
        pass
    inferred: dict[str, tuple[int, str]] = {}
    while True:
        try:
            graph = _import(model, dims, variables, unbound, inferred)
        except symbolic.BoundInferred as e:
            if e.dim in inferred:  # (a second bound for the same dim: the first did not settle it)
                raise KilnError(f"{e}; give the dim's bounds with --dim {e.dim}=LO..HI") from None
            inferred[e.dim] = (e.hi, str(e))
            continue
        graph.inferred_bounds = {k: why for k, (_, why) in inferred.items() if k in graph.size_vars}
        return graph


def _import(model: onnx.ModelProto, dims: dict[str, Any] | None, variables: Collection[str], unbound: str,
            inferred: dict[str, tuple[int, str]]) -> Graph:
    """One conversion of :func:`import_model` with the bounds ``inferred`` so far (dim -> (hi, why))."""

    def make_var(key: str, spec: tuple[Any, ...]) -> Any:
        v = symbolic.size_var(key, len(size_vars), *spec)
        if v.grow and key in inferred:
            hi = inferred[key][0]
            v = dataclasses.replace(v, hi=hi, opt=min(v.opt, hi))
        return v

    def grow(key: str) -> Any:  # a named dim left unbound: growable
        size_vars[key] = make_var(key, (1, None, None))
        return size_vars[key]

    g = model.graph
    dims = dict(dims or {})
    graph = Graph(name=g.name or "model")
    size_vars = {}
    derived = {k: v for k, v in dims.items() if isinstance(v, str) and "+" in v}  # total=past+seq
    keys = {k for k, _ in _symbolic_input_dims(g)}
    stated: dict[str, tuple[int, int]] = {}  # bounds of data-dependent dims (NonZero_3.count=0..100), or a mistake
    for key, value in list(dims.items()):
        if key in derived:
            continue
        spec = parse_dim_spec(key, value)
        if key not in keys and isinstance(spec, tuple):
            if spec[1] is None:
                raise KilnError(f"--dim {key}={value}: {key} names no input dim; bounds of a data-dependent dim are "
                                "given as LO..HI")
            stated[key] = spec[:2]
            del dims[key]
            continue
        if isinstance(spec, tuple):
            size_vars[key] = dims[key] = make_var(key, spec)
        else:
            dims[key] = spec
    for key, text in derived.items():
        dims[key] = _derived_dim(key, text, size_vars)
    env: dict[str, Value] = {}
    init_names = {t.name for t in g.initializer}
    for inp in g.input:
        if inp.name in init_names:
            continue
        shape, sym = _bind_shape(inp.name, inp.type, dims, grow if unbound == "grow" else None)
        v = Value(inp.name, dtypes.from_onnx(inp.type.tensor_type.elem_type), shape, sym_shape=sym)
        graph.inputs.append(v)
        env[inp.name] = v
    used = {k for x in graph.inputs for k in (x.sym_shape or ()) if isinstance(k, str)}
    graph.dims = {k: v for k, v in dims.items() if k in used and k not in size_vars and k not in derived}
    graph.size_vars = {k: v for k, v in size_vars.items() if k in used}
    b = Builder(graph, fold=True)
    b.data_bounds = stated
    inits = {t.name: t for t in g.initializer}
    for name in variables:
        t = inits[name]
        v = Value(name, dtypes.from_onnx(t.data_type), tuple(int(d) for d in t.dims))
        graph.inputs.append(v)
        b._names.add(name)
        env[name] = v
    for t in g.initializer:
        if t.name in env:
            continue
        arr = tensor_array(t, "initializer")
        env[t.name] = b.const(arr, name=t.name, dtype=dtypes.from_onnx(t.data_type))

    b.subgraph = _inline(model, b, env)
    b.region = _region(model, b, env)
    _convert_nodes(model, b, g.node, env)
    unused = sorted(set(b.data_bounds) - set(graph.data_dims))
    if unused:
        data = [k for k in graph.size_vars if k in graph.data_dims]
        raise KilnError(f"run-time dim{'s' if len(unused) > 1 else ''} {', '.join(unused)} "
                        f"name{'' if len(unused) > 1 else 's'} no input dim"
                        f"{' or data-dependent dim' if data else ''}; the inputs' dims are "
                        f"{', '.join(sorted(used)) or '(none symbolic)'}"
                        + (f", the data-dependent dims {', '.join(data)}" if data else ""))
    _name_outputs(graph, b, [(o.name, env[o.name]) for o in g.output], g.output, dims)
    return graph


def _inline(model: onnx.ModelProto, b: Builder, env: Mapping[str, Value]):
    """The builder's ``subgraph``: converts a branch or body graph inline, its inputs bound to ``inputs``;
    it sees the enclosing values (returns its outputs)."""

    def subgraph(sub: onnx.GraphProto, inputs: list[Value] | tuple[Value, ...] = ()) -> list[Value]:
        inner = ChainMap({}, env)
        if len(inputs) != len(sub.input):
            raise ModelFormatError(f"subgraph {sub.name!r} takes {len(sub.input)} inputs, given {len(inputs)}")
        inner.update({i.name: v for i, v in zip(sub.input, inputs)})
        for t in sub.initializer:
            inner[t.name] = b.const(tensor_array(t, "initializer"), name=t.name, dtype=dtypes.from_onnx(t.data_type))
        scope, outer = b.scope, (b.subgraph, b.region)
        b.subgraph, b.region = _inline(model, b, inner), _region(model, b, inner)  # nested ones see this scope
        try:
            _convert_nodes(model, b, sub.node, inner)
        finally:
            b.scope, (b.subgraph, b.region) = scope, outer
        return [inner[o.name] for o in sub.output]

    return subgraph


class _Captures(Mapping):
    """The enclosing scope as a sub-graph sees it: reading an outer value that is computed at run time makes
    it an input of the sub-graph (captured once); constants are shared as they are."""

    def __init__(self, outer: Mapping[str, Value], graph: Graph, b: Builder):
        self.outer, self.graph, self.b = outer, graph, b
        self.captured: dict[int, tuple[Value, Value]] = {}

    def __getitem__(self, name: str) -> Value:
        v = self.outer[name]
        if v.is_const:
            return v
        if id(v) not in self.captured:
            inner = Value(self.b.fresh(v.name), v.dtype, v.shape)
            self.captured[id(v)] = (v, inner)
            self.graph.inputs.append(inner)
        return self.captured[id(v)][1]

    def __contains__(self, name: object) -> bool:
        return name in self.outer

    def __iter__(self):
        return iter(self.outer)

    def __len__(self) -> int:
        return len(self.outer)


def _region(model: onnx.ModelProto, b: Builder, env: Mapping[str, Value]):
    """The builder's ``region``: converts a branch or loop body into a closed sub-graph of its own (for If and
    Loop nodes whose condition is known only at run time)."""

    def region(sub: onnx.GraphProto, params: list[Value]) -> tuple[Graph, list[tuple[Value, Value]]]:
        """Convert ``sub`` into a new :class:`Graph` whose first inputs are ``params`` (fresh values standing for
        the sub-graph's declared inputs, in order). Every run-time value it reads from the enclosing scopes
        becomes a further input; returns the graph and those captures as ``(outer value, inner input)`` pairs
        in input order. Outputs are distinct values computed in the sub-graph (an Identity is added where one
        would be an input, a constant or a repeat)."""
        if len(params) != len(sub.input):
            raise ModelFormatError(f"subgraph {sub.name!r} takes {len(sub.input)} inputs, given {len(params)}")
        graph = Graph(name=sub.name or "region")
        sb = Builder(graph, fold=True)
        sb._names, sb._counter = b._names, b._counter  # one namespace: weights keep unique names in the package
        graph.inputs.extend(params)
        captures = _Captures(env, graph, sb)
        inner = ChainMap({i.name: p for i, p in zip(sub.input, params)}, captures)
        for t in sub.initializer:
            inner[t.name] = sb.const(tensor_array(t, "initializer"), name=t.name,
                                     dtype=dtypes.from_onnx(t.data_type))
        sb.subgraph = _inline(model, sb, inner)
        sb.region = _region(model, sb, inner)
        _convert_nodes(model, sb, sub.node, inner)
        sb.fold = False
        for o in sub.output:
            if o.name not in inner:
                raise ModelFormatError(f"subgraph {sub.name!r} returns {o.name!r}, which nothing defines")
            v = inner[o.name]
            if v.is_const or v.producer is None or any(v is x for x in graph.outputs):
                v = sb.op("Identity", [v], name=sb.fresh(o.name))
            graph.outputs.append(v)
        return graph, list(captures.captured.values())

    return region


def _convert_nodes(model: onnx.ModelProto, b: Builder, nodes, env: dict[str, Value]) -> None:
    """Convert ``nodes`` in order, reading and defining values in ``env``."""
    for i, node in enumerate(nodes):
        opset = opset_of(model, node.domain)
        fn = lookup(node.op_type, opset, node.domain)
        if fn is None:  # only inside subgraphs: the top level is checked up front
            raise UnsupportedOpError([(node.op_type, node.domain, opset, node.name or f"#{i}")])
        ins = []
        for name in node.input:
            if name == "":
                ins.append(None)
            elif name not in env:
                raise ModelFormatError(f"node {node.name!r} reads {name!r}, which nothing defines")
            else:
                ins.append(env[name])
        attrs = {a.name: _attr_value(a) for a in node.attribute}
        b.scope = node.name or f"{node.op_type}_{i}"
        try:
            outs = _call(fn, b, ins, attrs, node, opset)
        except UnsupportedOpError:
            raise
        except KilnError as e:
            e.args = (f"node {node.name!r} ({node.op_type}, opset {opset}): {e}",)
            raise e from None
        except TypeError as e:
            if b.graph.size_vars:
                _symbolic_error(node, opset, ins, e)
            raise _invalid_node(node, opset, e) from None
        except (IndexError, KeyError, ValueError, ArithmeticError, AttributeError, np.exceptions.AxisError,
                RecursionError, MemoryError) as e:
            # ONNX's checker does not check attribute values (an axis, a perm, pads): a converter meeting one it
            # cannot use fails in Python; that is the model's fault, said in one line
            raise _invalid_node(node, opset, e) from None
        if isinstance(outs, Value):
            outs = [outs]
        extra = [name for name in node.output[len(outs):] if name]
        if extra:
            raise UnsupportedOpError([(f"{node.op_type}[output {extra[0]!r}]", node.domain, opset, node.name)])
        for name, v in zip(node.output, outs):
            if name:
                env[name] = v


def _invalid_node(node: onnx.NodeProto, opset: int, e: BaseException) -> ModelFormatError:
    """The error of a node whose attributes or inputs its converter cannot use (an axis out of range, a perm of the
    wrong length, a malformed tensor): one line naming the node, the op and Python's complaint."""
    return ModelFormatError(f"node {node.name!r} ({node.op_type}, opset {opset}): its attributes or inputs are "
                            f"invalid ({type(e).__name__}: {one_line(e, 200) or 'no detail'})")


def _symbolic_error(node: onnx.NodeProto, opset: int, ins: list[Value | None], e: TypeError) -> None:
    """Raise the KilnError of a converter that met a run-time dim it cannot handle (a Python ``int()`` or
    comparison of a size expression raised TypeError): names the node, the op and the dims."""
    names = sorted({s.name for v in ins if v is not None for s in symbolic.symbols(
        (v.shape, v.const) if v.is_shape_const else v.shape)})
    shapes = ", ".join(f"%{v.name} {symbolic.format_shape(v.shape)}" for v in ins if v is not None)
    raise KilnError(f"node {node.name!r} ({node.op_type}, opset {opset}): Kiln cannot convert this op with run-time "
                    f"dim{'s' if len(names) != 1 else ''} {', '.join(names) or '(in its shape inputs)'} yet (inputs "
                    f"{shapes}; {e}); bind {'them' if len(names) != 1 else 'it'} statically with --dim NAME=SIZE") from None


def _name_outputs(graph: Graph, b: Builder, outs: list[tuple[str, Value]], protos, dims: dict[str, int]) -> None:
    taken = {v.name: v for v in graph.inputs}
    for (name, v), proto in zip(outs, protos):
        if v.is_const or v in graph.inputs or v in graph.outputs:
            b.fold = False
            v = b.op("Identity", [v], name=name)
        if name in b._names and v.name != name:
            clash = next((x for n in graph.nodes for x in n.outputs if x.name == name), None)
            if clash is not None:
                clash.name = b.fresh(name + "_")
        v.name = name
        b._names.add(name)
        taken[name] = v
        try:
            _, v.sym_shape = _bind_shape(name, proto.type, dict(dims))
            v.sym_shape = tuple(v.sym_shape) if len(v.sym_shape) == len(v.shape) else None
        except KilnError:
            v.sym_shape = None
        graph.outputs.append(v)
