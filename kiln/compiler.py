"""The compiler driver: model -> graph IR -> passes -> fused groups -> memory plan -> each target's build -> package.

:func:`compile_model` is what ``kiln compile`` and :func:`kiln.compile` call; :func:`compile_graph` is the straight
loop over the targets (:mod:`kiln.codegen.target`). Nothing here knows a target's code.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.codegen.lowering import group_expr, steps_for
from kiln.codegen.target import Program, Target, TargetBuild, bind_steps, get_target, target_names
from kiln.errors import KilnError, UnsupportedOpError, one_line
from kiln.frontend.gguf import import_gguf
from kiln.frontend.onnx.importer import import_model, load_model, unbound_dims, unsupported_ops
from kiln.frontend.sampling import sampler_graph
from kiln.ir.graph import Graph
from kiln.ir.verify import verify
from kiln.package.writer import check_destination, write_package
from kiln.passes.fusion import Group, fuse
from kiln.passes.manager import has_control, optimize, optimize_nested
from kiln.passes.memory_plan import MemoryPlan, mark_in_place, plan_memory
from kiln.passes.split_attention import fuse_split_attention
from kiln.passes.split_k import split_k
from kiln.passes.split_reduction import split_reduction
from kiln.te.compute import Tensor
from kiln.te.schedule import DEVICE_CLASSES, Schedule
from kiln.train import build_train_graph

#: ``kiln compile --precision`` values -> the accumulator of dot products (None: fp32 compute); see kiln.te.half
PRECISIONS = {"fp32": None, "fp16": "float32", "fp16-acc16": "float16"}

__all__ = ["PRECISIONS", "Compiled", "compile_graph", "compile_model", "group_expr", "parse_targets", "steps_for"]


@dataclass
class Compiled:
    """Everything a package is written from: the target-neutral program and each target's build.

    Attributes:
        program: the optimised graph, fused groups and memory plan every target shares.
        builds: target name -> its :class:`~kiln.codegen.target.TargetBuild`, in preference order.
        passes: the graph passes that fired.
    """

    program: Program
    builds: dict[str, TargetBuild]
    passes: list[str] = field(default_factory=list)

    @property
    def graph(self) -> Graph:
        """The optimised graph."""
        return self.program.graph

    @property
    def groups(self) -> list[Group]:
        """Fused groups in execution order."""
        return self.program.groups

    @property
    def plan(self) -> MemoryPlan:
        """The memory plan (buffers shared by every target)."""
        return self.program.plan

    @property
    def training(self) -> Any:
        """The :class:`kiln.train.TrainGraph` of a train-step package, else None."""
        return self.program.training

    @property
    def targets(self) -> tuple[str, ...]:
        """The targets built, in preference order."""
        return tuple(self.builds)

    @property
    def kernels(self) -> list[Any]:
        """The webgpu target's kernels (:class:`kiln.codegen.webgpu.build.Kernel`); empty without it."""
        return self.builds["webgpu"].kernels if "webgpu" in self.builds else []

    @property
    def steps(self) -> list[Any]:
        """The webgpu target's plan steps (:class:`kiln.codegen.webgpu.build.Step`); empty without it."""
        return self.builds["webgpu"].steps if "webgpu" in self.builds else []


def parse_targets(target: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"webgpu,wasm"`` (or a list) as a tuple of known target names, in registry (preference) order.

    Raises:
        KilnError: an unknown target, or none.
    """
    known = target_names()
    names = [t.strip() for t in (target.split(",") if isinstance(target, str) else target) if t.strip()]
    unknown = [t for t in names if t not in known]
    if unknown or not names:
        raise KilnError(f"unknown target {', '.join(map(repr, unknown)) or '(none)'}; known: {', '.join(known)} "
                        "(several as a comma list: webgpu,wasm)")
    return tuple(t for t in known if t in names)


def check_precision(precision: str, training: Any = None) -> str | None:
    """The dot-product accumulator of ``precision`` (a key of :data:`PRECISIONS`; None for fp32).

    Raises:
        KilnError: an unknown precision, or fp16 with a train step.
    """
    if precision not in PRECISIONS:
        raise KilnError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    if PRECISIONS[precision] is not None and training is not None:
        raise KilnError(f"--precision {precision} does not apply to train-step packages (--train): they train in fp32")
    return PRECISIONS[precision]


def check_targets(targets: list[Target], graph: Graph, precision: str, training: Any = None) -> None:
    """Each target refuses, with a clear error, what it cannot build (:meth:`Target.check`), and state is refused
    where targets that update it in place share a package with targets that copy it back (one memory plan serves
    every target: the update is in the state's buffer or in its own)."""
    control = has_control(graph)
    for t in targets:
        t.check(graph, precision=precision, training=training, control=control)
    if graph.state and len({t.in_place for t in targets}) > 1:
        raise KilnError(f"state kept between runs ({', '.join(graph.state)}: a run counter of random draws, a KV cache) "
                        f"is updated in place by the {', '.join(t.name for t in targets if t.in_place)} target(s) and "
                        f"copied back by {', '.join(t.name for t in targets if not t.in_place)}; compile those in "
                        "separate packages")


def compile_graph(graph: Graph, target: str | list[str] = "webgpu", validate: bool = True, progress: bool = False,
                  device_class: str = "gpu", wasm_threads: bool = True,
                  schedule: Callable[[Tensor], Schedule] | None = None, training: Any = None,
                  precision: str = "fp32", concat_steps: bool = True) -> Compiled:
    """Optimise ``graph`` in place, fuse it, plan its memory and build it for each of ``target`` (a name or a
    comma list: ``webgpu`` with the default schedules for ``device_class``, ``webgl2``, ``wasm``).

    ``schedule`` chooses each WebGPU kernel's schedule (a tuning database's
    :meth:`~kiln.tune.db.TuningDB.scheduler`); by default the default schedules for ``device_class``.
    With ``training`` (a :class:`kiln.train.TrainGraph` whose ``graph`` is ``graph``) the result also
    records the steps inference runs (``infer_steps``); train-step packages have the webgpu target only.
    ``concat_steps`` lets the webgpu target run neighbouring independent kernels as one plan step (False: a step
    per kernel group, as the tuner times them).
    ``precision`` ``fp16`` (or ``fp16-acc16``) stores float weights and activations as f16 and computes
    in f16 by the rules of :mod:`kiln.te.half`; the package then needs WebGPU's ``shader-f16``.

    Raises:
        KilnError: an unknown target or precision, or what a target refuses (:meth:`Target.check`).
    """
    accumulate = check_precision(precision, training)
    targets = [get_target(name, **({"threads": wasm_threads} if name == "wasm" else {}))
               for name in parse_targets(target)]
    check_targets(targets, graph, precision, training)
    program = Program(graph, [], MemoryPlan([], {}, 0), device_class=device_class, precision=precision,
                      accumulate=accumulate, schedule=schedule, training=training, concat_steps=concat_steps)
    if has_control(graph):  # If/Loop decided at run time: the webgpu target plans each graph level
        program.control = True
        fired = optimize_nested(graph)
    else:
        verify(graph)
        fired = optimize(graph)
        if all(t.rfactor(device_class, precision, training) for t in targets):  # for a GPU's many cores
            for name, rewrite in (("split_k", split_k), ("split_reduction", split_reduction)):
                if rewrite(graph):
                    verify(graph)
                    fired.append(name)
        predicates = [t.row_kernels(device_class, precision, training) for t in targets]
        rows = predicates[0] if len(predicates) == 1 else None  # row kernels only where every target has them
        # the groups and buffers serve every target: the tightest buffer-per-kernel limit applies
        max_inputs = min(t.limits.get("maxStorageBuffersPerShaderStage", 8) for t in targets) - 1
        mark_in_place(graph, enabled=all(t.in_place for t in targets))
        prologues = all(t.matmul_prologues(device_class, precision, training) for t in targets)
        program.groups = fuse(graph, max_inputs=max_inputs, rows=rows, prologues=prologues)
        if rows is not None:  # (FlashDecoding's alternative to the attentions fuse gave a fused row kernel)
            program.groups = fuse_split_attention(graph, program.groups, rows, max_inputs)
        program.plan = plan_memory(graph, program.groups, half=accumulate is not None)
        if training is not None:
            names = set(training.forward_outputs)
            program.infer_steps = steps_for(program.groups, [v for v in graph.outputs if v.name in names])
    builds = {t.name: t.build(program, validate=validate, progress=progress) for t in targets}
    for build in builds.values():  # data-dependent dims: the step after which each is read back and bound
        bind_steps(graph, program.groups, build.section["plan"])
    return Compiled(program, builds, fired)


def compile_model(model: str | os.PathLike, out: str | os.PathLike, *, target: str | list[str] = "webgpu",
                  dims: dict[str, int] | None = None, force: bool = False, preset: str = "auto",
                  labels: str | os.PathLike | None = None, validate: bool = True, progress: bool = False,
                  device_class: str = "gpu", wasm_threads: bool = True,
                  schedule: Callable[[Tensor], Schedule] | None = None, train: Any = None,
                  precision: str = "fp32", max_context: int = 2048, beams: int = 5, unbound: str = "auto") -> Path:
    """Compile an ONNX model, a GGUF language model, or a CTranslate2 Whisper model folder into a package directory
    (a speech package for Whisper: :func:`compile_whisper`).

    Args:
        model: path of an ``.onnx`` file, of a ``.gguf`` language model (Llama family,
            :mod:`kiln.frontend.gguf`): its decoder step with a KV cache, tokenizer and chat template
            (the manifest's ``generation`` section), or of a CTranslate2 Whisper model folder (or its
            ``model.bin``): a speech package (:func:`compile_whisper`).
        out: package directory to create.
        target: code generation target(s): ``webgpu``, ``webgl2``, ``wasm`` or a comma list (``webgpu,webgl2``).
        dims: values of symbolic dims (``{"N": 1}``; ranges make run-time dims, ``"1.."`` or ``"auto"`` growable ones:
            :func:`~kiln.frontend.onnx.importer.parse_dim_spec`).
        force: replace ``out`` if it already holds a Kiln package (never anything else).
        preset: ``auto`` (detect an ImageNet classifier), ``imagenet`` or ``none``: the
            pre/post-processing the demo page and ``kiln run --image`` use.
        labels: a text file of class names, one a line (overrides the preset's).
        validate: validate every shader with naga.
        progress: show progress bars on stderr.
        device_class: ``gpu`` (discrete or integrated GPUs) or ``cpu`` (WebGPU on a CPU:
            SwiftShader, lavapipe): the kind of device the default schedules are made for
            (see :func:`~kiln.te.schedule.default_schedule`); the package runs on both.
        schedule: chooses each kernel's schedule instead of the defaults (``kiln compile
            --tuning-db``: :meth:`kiln.tune.db.TuningDB.scheduler`, which falls back to them).
        wasm_threads: with the wasm target, also build its shared-memory module for workers.
        train: a :class:`kiln.train.TrainOptions`: also build the train step (forward, loss, backward,
            optimizer update; docs/training.md) into the package, whose trainable weights and optimizer
            state persist in device buffers (``Session.train_step``, ``session.trainStep`` in kiln.js).
            The package's dims (batch size) serve both training and inference.
        max_context: GGUF models: the most tokens the KV cache holds (prompt and answer).
        beams: Whisper models: the widest beam search the decoder's cache holds (:func:`compile_whisper`).
        unbound: ONNX models: what a named symbolic dim absent from ``dims`` becomes: ``"auto"`` (the default: a
            growable run-time dim, docs/dynamic-shapes.md *Growable buffers*; bound to 1 with a
            :class:`StaticDimsWarning` where run-time dims cannot be built: a train step, a target without them, or
            a model that fails to compile with them), ``"grow"`` (growable, or the error) or ``"static"`` (1).
        precision: ``fp32`` (default), ``fp16`` (float weights and activations stored as f16, arithmetic
            in f16 with f32 accumulation and f32 for fragile ops, see :mod:`kiln.te.half`; the package
            needs WebGPU's ``shader-f16``; webgpu target only) or ``fp16-acc16`` (dot products also
            accumulated in f16). Model inputs and outputs keep their dtypes.

    Returns:
        The package directory.

    Raises:
        ModelFormatError, UnsupportedOpError (all missing ops at once, before other work),
        ShapeError, PackageError (``out`` exists and ``force`` is not set), KilnError.
    """
    if is_whisper_folder(model):
        if train is not None:
            raise KilnError("--train takes ONNX models; a Whisper model compiles for inference")
        return compile_whisper(model, out, target=target, force=force, validate=validate, progress=progress,
                               device_class=device_class, wasm_threads=wasm_threads, precision=precision,
                               beams=beams)
    check_destination(out, force)
    check_precision(precision, train)
    parse_targets(target)
    if Path(model).suffix.lower() == ".gguf":
        if train is not None:
            raise KilnError("--train takes ONNX models; a GGUF language model compiles for inference")
        dg = import_gguf(model, max_context=max_context, max_tokens=min(512, max_context), logits="last")
        tokenizer = dg.tokenizer_json()  # an unsupported tokenizer fails before the long compile
        compiled = compile_graph(dg.graph, target, validate=validate, progress=progress, device_class=device_class,
                                 wasm_threads=wasm_threads, schedule=schedule, precision=precision)
        generation, parts = dg.generation(), {}
        if "webgpu" in parse_targets(target):  # sampling on the GPU; the C targets' host reads logits in place
            sampler = sampler_graph(dg.graph.outputs[0].shape[-1], max_context)  # the logits row's length
            parts["sampler"] = compile_graph(sampler, "webgpu", validate=validate, device_class=device_class)
            generation["sampler"] = "sampler"
        return write_package(compiled, out, force=force, preset="none", source=Path(model).name,
                             generation=generation, extra_files={"tokenizer.json": tokenizer}, parts=parts)
    onnx_model = load_model(model)
    missing = unsupported_ops(onnx_model)
    if missing:
        raise UnsupportedOpError(missing)
    if device_class not in DEVICE_CLASSES:
        raise KilnError(f"device class must be one of {', '.join(DEVICE_CLASSES)}, not {device_class!r}")

    def build(mode: str) -> Compiled:
        training = None
        if train is not None:
            training = build_train_graph(onnx_model, train, dims)
            graph = training.graph
        else:
            graph = import_model(onnx_model, dims, unbound=mode)
        if graph.name in ("", "main_graph", "model", "torch_jit"):
            graph.name = Path(model).stem
        return compile_graph(graph, target, validate=validate, progress=progress, device_class=device_class,
                             wasm_threads=wasm_threads, schedule=schedule, training=training, precision=precision)

    mode, open_dims = unbound_mode(onnx_model, dims, unbound, target, train, tuned=schedule is not None)
    try:
        compiled = build(mode)
    except KilnError as e:
        if unbound != "auto" or mode != "grow":
            raise
        compiled = build("static")  # (if that fails too, its error is the one to show)
        warn_static(open_dims, f"as growable run-time dims the model does not compile: {e}")
    return write_package(compiled, out, force=force, preset=preset, labels=labels, source=Path(model).name)


class StaticDimsWarning(UserWarning):
    """Symbolic dims the user left unbound were bound to 1 (a target, a train step or the model needs static dims):
    the package takes only size 1 for them. ``--dim NAME=SIZE`` or ``--dim NAME=LO..HI`` says what to build."""


def warn_static(names: list[str], why: str) -> None:
    """Warn (:class:`StaticDimsWarning`, one line) that the unbound dims ``names`` are bound to 1, and why."""
    s = "s" if len(names) > 1 else ""
    warnings.warn(one_line(f"dim{s} {', '.join(names)} left unbound {'are' if s else 'is'} bound to 1 ({why}); "
                           f"give {'them' if s else 'it'} with --dim NAME=SIZE or NAME=LO..HI"),
                  StaticDimsWarning, stacklevel=3)


def unbound_mode(onnx_model: Any, dims: dict[str, Any] | None, unbound: str, target: str | list[str],
                 train: Any, tuned: bool = False) -> tuple[str, list[str]]:
    """What the ONNX importer makes of the named symbolic dims ``dims`` leaves unbound (:func:`compile_model`'s
    ``unbound``): ``("grow" or "static", their names)``. ``"auto"`` makes them growable unless there are none, a
    target takes static dims only (none of Kiln's since webgl2 has run-time dims), a train step is built, or the
    schedules come from a tuning database (``tuned``: ``kiln tune`` binds such dims to 1 and its records are for
    static shapes, which kernels over run-time dims never use): then static, with a warning.

    Raises:
        KilnError: ``unbound`` is not ``auto``, ``grow`` or ``static``; ``grow`` with a train step.
    """
    if unbound not in ("auto", "grow", "static"):
        raise KilnError(f"unbound dims are 'auto', 'grow' or 'static', not {unbound!r}")
    names = unbound_dims(onnx_model, dims)
    if unbound == "grow" and names and train is not None:
        raise KilnError(f"--unbound grow: a train step takes static dims; give {', '.join(names)} with --dim NAME=SIZE")
    if unbound != "auto":
        return unbound, names
    if not names:
        return "static", names
    fixed = [t for t in parse_targets(target) if not get_target(t).run_time_dims]
    why = (f"the {', '.join(fixed)} target{'s take' if len(fixed) > 1 else ' takes'} static dims" if fixed
           else "a train step takes static dims" if train is not None
           else "tuned schedules (--tuning-db) are for the static shapes kiln tune measured" if tuned else None)
    if why:
        warn_static(names, why)
        return "static", names
    return "grow", names


def is_whisper_folder(model: str | os.PathLike) -> bool:
    """Whether ``model`` is a CTranslate2 model folder or its ``model.bin`` (a Whisper model is checked when read)."""
    p = Path(model)
    return (p.is_dir() and (p / "model.bin").is_file()) or (p.is_file() and p.name == "model.bin")


def compile_whisper(model: str | os.PathLike, out: str | os.PathLike, *, target: str | list[str] = "webgpu",
                    force: bool = False, validate: bool = True, progress: bool = False, device_class: str = "gpu",
                    wasm_threads: bool = True, precision: str = "fp32", beams: int = 5) -> Path:
    """Compile a CTranslate2 Whisper model folder (``model.bin``, ``config.json``, ``tokenizer.json``) into a speech
    package (docs/speech.md): a resampler (:mod:`kiln.frontend.audio`), its log-mel front end, encoder and decoder
    step (:mod:`kiln.frontend.whisper`), each a package, and ``speech.json``. The arguments are :func:`compile_model`'s;
    ``beams``: the widest beam search the decoder's cache holds (1: greedy decoding only; each hypothesis adds
    ``2 * layers * 448 * width`` floats of cache, 5.5 MB for tiny in fp32).

    Raises:
        ModelFormatError: not a Whisper model (another CTranslate2 model type is named), no tokenizer.json;
        PackageError: ``out`` exists and ``force`` is not set; KilnError: a bad target or precision.
    """
    from kiln.frontend import whisper
    from kiln.frontend.audio import resample_graph
    from kiln.package.speech import check_speech_destination, write_speech_package

    check_speech_destination(out, force)
    check_precision(precision, None)
    parse_targets(target)
    if device_class not in DEVICE_CLASSES:
        raise KilnError(f"device class must be one of {', '.join(DEVICE_CLASSES)}, not {device_class!r}")
    if not isinstance(beams, int) or not 1 <= beams <= 16:
        raise KilnError(f"beams must be an integer from 1 to 16, not {beams!r}")
    m = whisper.read_whisper(model)
    spec = {**whisper.speech_manifest(m), "beams": beams}  # a missing tokenizer fails before the long compile
    graphs = {"resample": resample_graph(), "log_mel": whisper.log_mel_graph(m.config.n_mels),
              "encoder": whisper.encoder_graph(m), "decoder": whisper.decoder_graph(m, beams=beams)}
    parts = {}
    for name, graph in graphs.items():
        # the front end stays fp32: log10 of powers spanning 1e-10..1e4 and the STFT's sums need its range
        front = name in ("resample", "log_mel")
        parts[name] = compile_graph(graph, target, validate=validate, progress=progress, device_class=device_class,
                                    wasm_threads=wasm_threads, precision="fp32" if front else precision)
    return write_speech_package(parts, out, spec=spec, files={"tokenizer.json": m.folder / "tokenizer.json"},
                                force=force, source=m.folder.name)
