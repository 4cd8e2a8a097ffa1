"""Text form of the graph IR, for ``kiln compile --print-ir`` and debugging.

Example::

    graph mobilenet_v2(%input: float32[1, 3, 224, 224]) {
      %conv0 = Conv(%input, $w0: float32[32, 3, 3, 3]) {group=1, strides=[2, 2], ...}
      return %logits
    }
"""

from __future__ import annotations

from kiln.arith.symbolic import format_shape
from kiln.ir.graph import Graph, Value


def _ref(v: Value) -> str:
    if v.is_const:
        if v.size == 1:
            return repr(v.const.reshape(()).item())
        return f"${v.name}: {v.dtype}{format_shape(v.shape)}"
    return f"%{v.name}"


def format_graph(graph: Graph, indent: str = "") -> str:
    """Render ``graph`` as text, one node a line (shapes after each result); the sub-graphs of control-flow
    nodes (If branches, Loop bodies) follow their node, indented."""
    ins = ", ".join(f"%{v.name}: {v.dtype}{list(v.sym_shape) if v.sym_shape else format_shape(v.shape)}"
                    for v in graph.inputs)
    lines = [f"{indent}graph {graph.name}({ins}) {{"]
    for n in graph.nodes:
        attrs = ", ".join(f"{k}={v if not isinstance(v, Graph) else '<' + v.name + '>'}"
                          for k, v in sorted(n.attrs.items()))
        outs = ", ".join(f"%{o.name}" for o in n.outputs)
        types = ", ".join(f"{o.dtype}{format_shape(o.shape)}" for o in n.outputs)
        args = ", ".join(_ref(v) for v in n.inputs)
        lines.append(f"{indent}  {outs} = {n.op}({args}){' {' + attrs + '}' if attrs else ''}  # {types}")
        for k, v in sorted(n.attrs.items()):
            if isinstance(v, Graph):
                lines.append(f"{indent}    {k}:")
                lines.append(format_graph(v, indent + "    "))
    lines.append(f"{indent}  return " + ", ".join(_ref(v) for v in graph.outputs))
    lines.append(f"{indent}}}")
    return "\n".join(lines)
