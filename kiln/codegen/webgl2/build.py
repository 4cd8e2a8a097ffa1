"""The WebGL2 target's build: fragment-shader kernels and a texture plan for a compiled graph.

The graph, its fused groups and the memory plan are shared with the other targets (the
package's ``buffers``); this module lowers every group under a one-element-per-fragment
schedule, renders it with :mod:`kiln.codegen.webgl2.glsl` and maps the memory plan onto textures:
one texture per buffer and storage type (a shared activation buffer whose values are float32
at one time and int32 at another gets an ``R32F`` and an ``R32I`` texture). Its
:meth:`WebGL2Code.manifest` is the package's ``targets.webgl2`` (docs/package-format.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kiln.arith import symbolic
from kiln.codegen.lowering import build_group, kernel_groups
from kiln.codegen.target import KernelTable, describe, progress_over
from kiln.codegen.webgl2 import glsl
from kiln.errors import KilnError
from kiln.kernels.storage import buffer_dtype
from kiln.te.compute import Tensor
from kiln.te.schedule import Schedule, default_schedule

#: target name in the manifest and on the command line
NAME = "webgl2"


def webgl2_schedule(t: Tensor) -> Schedule:
    """One output element per fragment, with the default schedule's unrolling of small reduction windows."""
    return dataclasses.replace(default_schedule(t, device_class="cpu"), splits=(), reduce_lanes=1)


@dataclass
class WebGL2Code:
    """The WebGL2 target of a package: kernel sources, textures and the draw plan.

    Attributes:
        kernels: ``{name, source (path), text, inputs: [{name, format}], output: {format}, ops, node}``.
        textures: ``{buffer, format, width, height}`` per texture (index = texture id).
        steps: ``{kernel, inputs: [texture ids], output: texture id, viewport: [w, h], node}`` in order.
        width: texture row width in texels.
    """

    kernels: list[dict[str, Any]] = field(default_factory=list)
    textures: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    width: int = glsl.TEXTURE_WIDTH

    def files(self) -> dict[str, str]:
        """Package path -> text of every shader file."""
        return {k["source"]: k["text"] for k in self.kernels}

    def manifest(self) -> dict[str, Any]:
        """The manifest's ``targets.webgl2`` entry."""
        side = max((max(t["width"], t["height"]) for t in self.textures), default=1)
        units = max((len(k["inputs"]) for k in self.kernels), default=0)
        return {
            "extensions": ["EXT_color_buffer_float"],
            "limits": {"MAX_TEXTURE_SIZE": side, "MAX_TEXTURE_IMAGE_UNITS": units},
            "texture_width": self.width,
            "textures": self.textures,
            "kernels": [{k: v for k, v in kern.items() if k != "text"} for kern in self.kernels],
            "plan": self.steps,
        }


def build(graph, groups, plan, progress: bool = False, width: int = glsl.TEXTURE_WIDTH,
          schedule: Callable[[Tensor], Schedule] = webgl2_schedule) -> WebGL2Code:
    """Generate the WebGL2 kernels and texture plan of ``groups`` over memory plan ``plan``.

    Raises:
        KilnError: a kernel that cannot be a fragment shader (too many inputs, ...), naming its node.
    """
    code = WebGL2Code(width=width)
    by_key: dict[tuple[int, str], int] = {}
    buffers = {b.id: b for b in plan.buffers}

    def texture(value, fmt_dtype: str) -> int:
        bid = plan.of[id(value)]
        key = (bid, fmt_dtype)
        if key not in by_key:
            b = buffers[bid]
            if b.grow is not None:  # a growable buffer (format 1.10): rows of `width`, as many as its size needs
                w, h = width, glsl.layout(b.nbytes // 4, width)[1]
            else:
                w, h = glsl.layout(b.nbytes // 4, width)
            by_key[key] = len(code.textures)
            code.textures.append({"buffer": bid, "format": glsl.TEXTURES[fmt_dtype][1], "width": w, "height": h,
                                  **({"grow": True} if b.grow is not None else {})})
        return by_key[key]

    for v in (*graph.inputs, *graph.outputs):  # inputs and outputs have textures even where no kernel touches them
        if id(v) in plan.of:
            texture(v, buffer_dtype(v.dtype))
    table = KernelTable()
    work = kernel_groups(groups)
    for g in progress_over(work, progress, "generating webgl2 kernels"):
        node = g.nodes[0].name
        k, ins = build_group(g, schedule)
        desc = describe(g)
        try:
            src = glsl.render(k, desc, width, node=node)
        except KilnError as e:
            raise KilnError(f"{e} ({desc})") from None
        index = table.add(src, g.name, lambda name: {
            "name": name, "source": f"kernels/{name}.glsl", "text": src,
            "inputs": [{"name": p.name, "format": glsl.TEXTURES[p.dtype][1]} for p in k.params[:-1]],
            "output": {"format": glsl.TEXTURES[k.params[-1].dtype][1]},
            "ops": [n.op for n in g.nodes],
        })
        out = k.params[-1]
        dynamic = symbolic.is_symbolic(out.size)
        code.steps.append({
            "kernel": index,
            "inputs": [texture(v, p.dtype) for v, p in zip(ins, k.params[:-1])],
            "output": texture(g.output, out.dtype),
            # over run-time dims: the viewport at the dims' opt values, and the output's elements to lay out per run
            "viewport": list(glsl.layout(symbolic.at_opt(out.size) if dynamic else out.size, width)),
            **({"elements": symbolic.to_json(out.size)} if dynamic else {}),
            "node": node,
        })
    code.kernels = table.kernels
    for step in code.steps:
        if step["output"] in step["inputs"]:
            raise KilnError(f"node {step['node']!r}: the memory plan reads and writes one buffer in one kernel, "
                            "which WebGL2 cannot (a texture feedback loop)")
    return code
