"""The package contract: ``manifest.json`` checked against its JSON Schema (``manifest.schema.json``).

The schema (JSON Schema draft 2020-12, shipped beside this module) is the normative description of the manifest;
docs/package-format.md is its prose and ``kiln/js/manifest.d.ts`` its TypeScript form (generated from it by
``python -m tools.manifest_types``). The writer validates what it is about to write (:func:`validate_manifest`; :func:`validate_section` checks one
target's section alone), and
:func:`kiln.package.format.parse_manifest` validates what the Python runtimes read, so a malformed package fails
with one line naming the JSON path and the problem instead of a ``KeyError`` deep inside a runtime.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from kiln.errors import PackageError, one_line

#: the schema's file name inside the ``kiln.package`` package
SCHEMA_FILE = "manifest.schema.json"


@functools.cache
def schema() -> dict[str, Any]:
    """The manifest's JSON Schema (loaded once from the package data)."""
    return json.loads((resources.files("kiln.package") / SCHEMA_FILE).read_text(encoding="utf-8"))


def _name(ref: str) -> str:
    return ref.rsplit("/", 1)[1]


def _inlined(root: dict[str, Any]) -> dict[str, Any]:
    """``root`` with every ``$ref`` to a definition that does not refer back to itself replaced by a copy of it.

    The same constraints, validated about twice as fast: jsonschema resolves each ``$ref`` anew for every instance
    it meets (a plan of a thousand steps meets thousands). The recursive definitions (plan steps, size expressions)
    stay references into ``$defs``.
    """
    defs = root["$defs"]

    def refs(node: Any) -> set[str]:
        if isinstance(node, dict):
            found = {_name(node["$ref"])} if "$ref" in node else set()
            return found.union(*(refs(v) for v in node.values()))
        if isinstance(node, list):
            return set().union(*(refs(v) for v in node))
        return set()

    direct = {name: refs(d) for name, d in defs.items()}

    def reaches(start: str) -> set[str]:
        seen, todo = set(), list(direct[start])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += direct[name]
        return seen

    recursive = {name for name in defs if name in reaches(name)}

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node and _name(node["$ref"]) not in recursive:
                rest = {k: inline(v) for k, v in node.items() if k != "$ref"}
                return {**inline(defs[_name(node["$ref"])]), **rest}
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return {**inline({k: v for k, v in root.items() if k != "$defs"}),
            "$defs": {name: inline(defs[name]) for name in sorted(recursive)}}


@functools.cache
def _validator(definition: str | None = None) -> Draft202012Validator:
    """A validator for the whole manifest, or for ``$defs/<definition>`` of the schema."""
    root = schema()
    if definition is not None:
        root = {"$schema": root["$schema"], "$defs": root["$defs"], "$ref": f"#/$defs/{definition}"}
    return Draft202012Validator(_inlined(root))


def json_path(parts: Iterable[str | int]) -> str:
    """``targets.webgpu.plan[3].kernel`` from the parts of a path into a JSON document (keys and indices)."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _message(error: ValidationError, prefix: Iterable[str | int] = ()) -> str:
    """``path: problem`` on one line (long values in jsonschema's message shortened)."""
    message = error.message
    if len(message) > 200:
        message = message.replace(repr(error.instance), _short(error.instance))
    if len(message) > 200:
        message = message[:197] + "..."
    path = json_path([*prefix, *error.absolute_path])
    return f"{path}: {message}" if path else message


def _check(validator: Draft202012Validator, instance: Any, where: str, prefix: Iterable[str | int] = ()) -> None:
    error = best_match(validator.iter_errors(instance))
    if error is not None:  # (keys of a hostile manifest may hold newlines: the message stays one line)
        raise PackageError(f"{where}: {one_line(_message(error, prefix), 400)}")


def validate_manifest(manifest: Any, where: str) -> None:
    """Check a whole manifest against the schema.

    Args:
        manifest: the parsed ``manifest.json``.
        where: what to name in the error (the manifest's path).

    Raises:
        PackageError: one line, ``<where>: <JSON path>: <problem>``, e.g.
            ``manifest.json: targets.webgpu.plan[3].kernel: 'x' is not of type 'integer'``.
    """
    _check(_validator(), manifest, where)


def validate_section(target: str, section: Any, where: str) -> None:
    """Check one target's section (``manifest["targets"][target]``) against the schema: the target's own
    definition for the targets the schema describes, any JSON object for others.

    Raises:
        PackageError: one line naming ``where``, the JSON path from the manifest's root and the problem.
    """
    ref = schema()["$defs"]["Targets"]["properties"].get(target, {}).get("$ref")
    if ref is None:
        if not isinstance(section, dict):
            raise PackageError(f"{where}: targets.{target}: {_short(section)} is not of type 'object'")
        return
    _check(_validator(_name(ref)), section, where, ("targets", target))


#: the speech package's schema (``speech.json``, docs/speech.md) beside this module
SPEECH_SCHEMA_FILE = "speech.schema.json"


@functools.cache
def _speech_validator() -> Draft202012Validator:
    return Draft202012Validator(json.loads((resources.files("kiln.package") / SPEECH_SCHEMA_FILE)
                                           .read_text(encoding="utf-8")))


def validate_speech_manifest(spec: Any, where: str) -> None:
    """Check a speech package's ``speech.json`` against ``kiln/package/speech.schema.json``.

    Raises:
        PackageError: one line, ``<where>: <JSON path>: <problem>``, e.g. ``speech.json: tokens.eot: -1 is less
            than the minimum of 0``.
    """
    _check(_speech_validator(), spec, where)
