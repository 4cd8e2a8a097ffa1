"""The tuning database: the best schedule found per kernel signature and adapter, in one JSON file.

Format (``format: "kiln-tuning"``, ``version: 1``; indented, records sorted, so diffs read well)::

    {"format": "kiln-tuning", "version": 1,
     "records": [{"kernel": "<signature>", "adapter": {"vendor", "architecture", "device", "driver"},
                  "adapter_key": "vendor | architecture | device | driver",
                  "ops": "Conv+Add+Clip", "shape": [1, 32, 112, 112],
                  "schedule": {...Schedule.to_json()...}, "best_ms": 0.01, "default_ms": 0.02,
                  "speedup": 2.0, "trials": 64, "clock": "timestamp-query", "device_class": "gpu",
                  "code": "<digest>", "default_code": "<digest>",
                  "date": "2026-11-22T05:00:00+00:00"}, ...]}

A kernel's **signature** (:func:`kernel_signature`) is a SHA-256 of its canonical tensor expression:
axis names canonicalised (:func:`kiln.te.lower.canonical`), input buffers named by first use with
their shapes and dtypes, constants with their dtypes, and the output's shape and dtype. Two kernels
with the same signature compute the same function of their buffers, whatever model they come from.

A record holds for the code it was measured as: ``code`` and ``default_code`` (:func:`code_digest`) are digests of
the WGSL that the recorded schedule and the device class's default schedule lowered to when it was measured. When
Kiln's lowering or its default schedules change, a kernel's record may no longer be the faster one (a record
measured against an older default can be slower than today's default): :meth:`TuningDB.scheduler` then uses the
default schedule and reports the record as *stale*, and ``kiln tune`` searches that kernel again. A compile for
another device class than the tuning's (``--device-class``) finds its records stale too: their speedups were measured
against another default. Records written before these fields existed (before 2026-11-29) count as stale.

Writes are atomic (a temporary file in the same directory renamed over the old one), so a tuning
run that is interrupted leaves the last complete database, and a later run resumes from it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kiln.arith.expr import Bin, Call, Cast, Const, Expr, Load, Reduce, Select, Var
from kiln.codegen.webgpu import wgsl
from kiln.errors import DeviceError, KilnError
from kiln.te.compute import Tensor
from kiln.te.lower import canonical, lower
from kiln.te.schedule import Schedule
from kiln.tune.space import SearchSpace

FORMAT = "kiln-tuning"
VERSION = 1
#: adapter fields a record is keyed by
ADAPTER_FIELDS = ("vendor", "architecture", "device", "driver")


def expression_text(t: Tensor) -> str:
    """A canonical text of computed tensor ``t`` (producers inlined): equal for kernels that
    differ only in variable or tensor names."""
    t = canonical(t)
    names: dict[int, str] = {}
    memo: dict[int, str] = {}

    def text(e: Expr) -> str:
        key = id(e)
        if key in memo:
            return memo[key]
        if isinstance(e, Const):
            s = f"{e.value!r}:{e.dtype}"
        elif isinstance(e, Var):
            s = e.name
        elif isinstance(e, Bin):
            s = f"({text(e.a)} {e.op} {text(e.b)})"
        elif isinstance(e, Call):
            s = f"{e.fn}({', '.join(text(a) for a in e.args)})"
        elif isinstance(e, Select):
            s = f"select({text(e.cond)}, {text(e.t)}, {text(e.f)})"
        elif isinstance(e, Cast):
            s = f"{e.dtype}({text(e.x)})"
        elif isinstance(e, Load):
            tid = id(e.tensor)
            if tid not in names:
                names[tid] = f"in{len(names)}:{e.tensor.dtype}{list(e.tensor.shape)}"
            s = f"{names[tid]}[{', '.join(text(i) for i in e.indices)}]"
        elif isinstance(e, Reduce):
            axes = ", ".join(f"{a.name}<{a.extent}" for a in e.axes)
            s = f"{e.op}[{axes}]({text(e.body)})"
        else:
            raise TypeError(f"unknown expression node {type(e).__name__}")
        memo[key] = s
        return s

    body = text(t.body)
    return f"out:{t.dtype}{list(t.shape)}[{', '.join(a.name for a in t.axes)}] = {body}"


def kernel_signature(t: Tensor) -> str:
    """The signature of a kernel expression: the first 24 hex digits of the SHA-256 of
    :func:`expression_text` (96 bits)."""
    return hashlib.sha256(expression_text(t).encode()).hexdigest()[:24]


def code_digest(t: Tensor, schedule: Schedule) -> str:
    """What kernel expression ``t`` lowers to under ``schedule`` now: the first 16 hex digits of the SHA-256 of its
    WGSL (comment lines left out) and its dispatch. Equal digests mean the code a tuning record measured is the code
    a compile would generate.

    Raises:
        Exception: whatever :func:`kiln.te.lower.lower` raises for a schedule it refuses.
    """
    k = lower(t, schedule, name="tuned")
    code = "\n".join(line for line in wgsl.render(k).splitlines() if not line.startswith("//"))
    return hashlib.sha256(f"{tuple(k.dispatch)}\n{code}".encode()).hexdigest()[:16]


def adapter_identity(info: dict[str, Any]) -> dict[str, str]:
    """The fields a tuning record is keyed by, from a WebGPU adapter's info.

    Args:
        info: wgpu-py's ``adapter.info`` (``vendor``, ``architecture``, ``device``, ``description``:
            the driver, e.g. ``Mesa 22.3.6 (LLVM 15.0.6)``) or an RPC device's adapter (the
            browser's ``GPUAdapterInfo``, where ``description`` may be empty).

    Returns:
        ``{vendor, architecture, device, driver}``, stripped strings (``driver`` from ``driver``
        if given, else ``description``).
    """
    driver = info.get("driver") or info.get("description") or ""
    return {"vendor": str(info.get("vendor", "")).strip(), "architecture": str(info.get("architecture", "")).strip(),
            "device": str(info.get("device", "")).strip(), "driver": str(driver).strip()}


def adapter_key(identity: dict[str, str]) -> str:
    """``"vendor | architecture | device | driver"`` of an :func:`adapter_identity`."""
    return " | ".join(identity.get(k, "") for k in ADAPTER_FIELDS)


def local_adapter() -> dict[str, str]:
    """The :func:`adapter_identity` of this machine's high-performance WebGPU adapter (wgpu-py).

    Raises:
        KilnError: no adapter (pass ``--adapter`` to ``kiln compile`` instead).
    """
    from kiln.runtime import gpu

    try:
        adapter = gpu.adapter()
    except DeviceError:
        raise KilnError("no local WebGPU adapter to match tuning records against; name one with --adapter") from None
    return adapter_identity(dict(adapter.info))


@dataclass(frozen=True)
class TunedSchedule(Schedule):
    """A schedule chosen from a tuning record; ``tuning`` (not part of equality) is what the
    package manifest records about it (``speedup``, ``trials``, ``adapter``)."""

    tuning: dict = field(default_factory=dict, compare=False, hash=False)


class TuningDB:
    """A tuning database file (see the module docstring for the format).

    Args:
        path: the JSON file; it need not exist yet (an empty database until :meth:`save`).

    Raises:
        KilnError: the file exists but is not a readable Kiln tuning database of a known version.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._records: dict[tuple[str, str], dict[str, Any]] = {}
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise KilnError(f"{self.path}: not a readable tuning database ({e})") from None
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise KilnError(f"{self.path}: not a Kiln tuning database (no \"format\": \"{FORMAT}\")")
            if not isinstance(data.get("version"), int) or data["version"] > VERSION:
                raise KilnError(f"{self.path}: tuning database version {data.get('version')!r}; this Kiln reads "
                                f"version {VERSION} (upgrade Kiln)")
            for r in data.get("records", []):
                try:
                    Schedule.from_json(r["schedule"])
                    key = (str(r["kernel"]), adapter_key(r["adapter"]))
                except (KeyError, TypeError, ValueError) as e:
                    raise KilnError(f"{self.path}: malformed tuning record ({e!r})") from None
                self._records[key] = r

    def __len__(self) -> int:
        return len(self._records)

    def records(self) -> list[dict[str, Any]]:
        """Every record, sorted by adapter then kernel."""
        return [self._records[k] for k in sorted(self._records, key=lambda k: (k[1], k[0]))]

    def adapters(self) -> dict[str, dict[str, str]]:
        """Adapter key -> identity, for every adapter with records."""
        return {adapter_key(r["adapter"]): r["adapter"] for r in self._records.values()}

    def get(self, kernel: str, adapter: dict[str, str]) -> dict[str, Any] | None:
        """The record of kernel signature ``kernel`` on ``adapter`` (an :func:`adapter_identity`), if any."""
        return self._records.get((kernel, adapter_key(adapter)))

    def put(self, kernel: str, adapter: dict[str, str], schedule: Schedule, *, best_ms: float, default_ms: float,
            trials: int, clock: str, device_class: str, ops: str = "", shape: list[int] | None = None,
            code: str = "", default_code: str = "") -> dict:
        """Add or replace the record of ``kernel`` on ``adapter`` (call :meth:`save` to write it).

        Args:
            best_ms, default_ms: milliseconds per dispatch of ``schedule`` and of the default schedule.
            trials: candidates measured for this kernel so far (over every run).
            clock: what measured them (``timestamp-query`` or ``wall``).
            device_class: the device class whose default schedule ``default_ms`` measured.
            code, default_code: :func:`code_digest` of ``schedule`` and of the default schedule as measured (a
                record without them is :meth:`stale`).

        Returns:
            The record.
        """
        record = {"kernel": kernel, "adapter": dict(adapter), "adapter_key": adapter_key(adapter), "ops": ops,
                  "shape": list(shape or []), "schedule": schedule.to_json(), "best_ms": float(best_ms),
                  "default_ms": float(default_ms), "speedup": round(float(default_ms) / float(best_ms), 4)
                  if best_ms > 0 else 1.0, "trials": int(trials), "clock": clock, "device_class": device_class,
                  "code": code, "default_code": default_code, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        self._records[(kernel, record["adapter_key"])] = record
        return record

    def save(self) -> None:
        """Write the database atomically (temporary file, then rename over ``path``)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"format": FORMAT, "version": VERSION, "records": self.records()}, indent=1)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text + "\n")
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def match_adapter(self, description: str | None) -> dict[str, str] | None:
        """The adapter whose records ``kiln compile --tuning-db`` uses.

        Args:
            description: words that must all occur (case-insensitively) in an adapter's key, e.g.
                ``"nvidia h100"``; ``None`` means this machine's adapter (:func:`local_adapter`),
                matched exactly.

        Returns:
            The matching adapter identity, or ``None`` when the database has no records for it.

        Raises:
            KilnError: ``description`` matches several adapters (naming them), or ``None`` was
                given and there is no local adapter.
        """
        adapters = self.adapters()
        if description is None:
            key = adapter_key(local_adapter())
            return adapters.get(key)
        words = description.lower().split()
        found = [ident for key, ident in adapters.items() if all(w in key.lower() for w in words)]
        if len(found) > 1:
            names = "; ".join(adapter_key(a) for a in found)
            raise KilnError(f"--adapter {description!r} matches {len(found)} adapters in {self.path}: {names}; "
                            "add words to choose one")
        return found[0] if found else None

    @staticmethod
    def stale(record: dict[str, Any], t: Tensor, default: Schedule) -> bool:
        """Whether ``record`` (of kernel expression ``t``) was measured on other code than its schedule and
        ``default`` lower to now (module docstring): no digests, or either :func:`code_digest` differs."""
        if not record.get("code") or not record.get("default_code"):
            return True
        try:
            return (code_digest(t, Schedule.from_json(record["schedule"])) != record["code"]
                    or code_digest(t, default) != record["default_code"])
        except Exception:  # noqa: BLE001  (a schedule today's lowering refuses: the record is of another Kiln)
            return True

    def scheduler(self, adapter: dict[str, str] | None,
                  fallback: Callable[[Tensor], Schedule]) -> TunedScheduler:
        """A schedule chooser for the compiler: the record of each kernel on ``adapter`` when there is one, it is
        valid for the kernel and not :meth:`stale` (against ``fallback(t)``), otherwise ``fallback(t)``.

        The chosen schedules are :class:`TunedSchedule` objects, which the package writer records
        as ``tuned: true`` with the record's speedup.
        """
        return TunedScheduler(self, adapter, fallback)


class TunedScheduler:
    """The compiler's schedule chooser of :meth:`TuningDB.scheduler`: call it with a kernel expression.

    Attributes:
        stale: the records passed over as :meth:`TuningDB.stale` (each a record dict, once per kernel signature).
    """

    def __init__(self, db: TuningDB, adapter: dict[str, str] | None, fallback: Callable[[Tensor], Schedule]):
        self.db, self.adapter, self.fallback = db, adapter, fallback
        self.stale: list[dict[str, Any]] = []
        self._seen: set[str] = set()

    def __call__(self, t: Tensor) -> Schedule:
        default = self.fallback(t)
        sig = kernel_signature(t) if self.adapter is not None else None
        record = self.db.get(sig, self.adapter) if sig is not None else None
        if record is None:
            return default
        s = Schedule.from_json(record["schedule"])
        if SearchSpace(t).check(s) is not None:
            return default
        if TuningDB.stale(record, t, default):
            if sig not in self._seen:
                self._seen.add(sig)
                self.stale.append(record)
            return default
        knobs = {f.name: getattr(s, f.name) for f in fields(Schedule)}
        return TunedSchedule(**knobs, tuning={"speedup": record["speedup"], "trials": record["trials"],
                                              "adapter": record["adapter_key"]})
