"""Nothing lost, nothing half-written (issue 19): ``kiln compile`` killed (SIGKILL), interrupted (SIGINT) or out of
disk space part way leaves the previous package intact; files Kiln writes for the user (``kiln run --outputs``,
exported weights, ``--keep-onnx``, tuning records) go through a temporary file renamed into place."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MOBILENET, sigint_for_children

from kiln.errors import KilnError
from kiln.package.format import atomic_path, read_manifest, verify_files

pytestmark = pytest.mark.skipif(not MOBILENET.exists(), reason="run setup.sh (kiln zoo get mobilenet_v2_imagenet)")

KILN = [sys.executable, "-m", "kiln.cli"]


@pytest.fixture
def previous(mobilenet_package, tmp_path) -> Path:
    """An existing package at the destination (a copy of the session's MobileNetV2)."""
    out = tmp_path / "pkg"
    shutil.copytree(mobilenet_package, out)
    return out


def _compile(out: Path, **kw) -> subprocess.Popen:
    with sigint_for_children():
        return subprocess.Popen([*KILN, "compile", str(MOBILENET), "-o", str(out), "--force", "--no-validate",
                                 "--device-class", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                **kw)


def _temporaries(out: Path) -> list[Path]:
    return list(out.parent.glob(f".{out.name}.*"))


def _caught_writing(proc: subprocess.Popen, out: Path, timeout: float = 120.0) -> bool:
    """Wait until ``proc`` writes its temporary package, then stop it there (SIGSTOP); whether it was caught
    before renaming it into place."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any((t / "weights.safetensors").exists() for t in _temporaries(out)):
            proc.send_signal(signal.SIGSTOP)
            _wait_stopped(proc)  # (the signal is asynchronous: until it lands the compile may finish its writes)
            return bool(_temporaries(out)) and proc.poll() is None
        time.sleep(0.001)
    return False


def _wait_stopped(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Wait until ``proc`` is stopped (state ``T`` in /proc) or has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("T", "t"):
            return
        time.sleep(0.0005)


def _assert_intact(out: Path, manifest: bytes) -> None:
    assert (out / "manifest.json").read_bytes() == manifest
    verify_files(out, read_manifest(out))


def test_killed_compile_leaves_the_previous_package(previous):
    """SIGKILL while the new package is being written: the previous one is untouched (checked while the compile is
    stopped mid-write and after it is killed), and the next compile replaces it despite the leftover temporary."""
    before = (previous / "manifest.json").read_bytes()
    for _ in range(3):  # the write takes a fraction of a second: catch it in the act
        proc = _compile(previous)
        caught = _caught_writing(proc, previous)
        if caught:
            _assert_intact(previous, before)
        proc.kill()
        proc.communicate()
        if caught:
            break
    assert caught, "the compile never stopped mid-write"
    assert proc.returncode == -signal.SIGKILL
    _assert_intact(previous, before)
    assert _temporaries(previous)  # a SIGKILL leaves its temporary directory; nothing else
    done = _compile(previous)
    done.communicate()
    assert done.returncode == 0
    verify_files(previous, read_manifest(previous))


def test_interrupted_compile_cleans_up(previous):
    """SIGINT (Ctrl-C) while writing: exit code 130 and 'interrupted', the temporary directory removed, the previous
    package untouched."""
    before = (previous / "manifest.json").read_bytes()
    for _ in range(3):
        proc = _compile(previous)
        caught = _caught_writing(proc, previous)
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGCONT)
        _, err = proc.communicate()
        if caught:
            break
    assert caught, "the compile never stopped mid-write"
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted", err
    assert not _temporaries(previous)
    _assert_intact(previous, before)


def test_full_disk_is_a_one_line_error(previous):
    """A write that fails (here the file-size limit a full disk stands for: EFBIG) is one line naming the package and
    the reason; the previous package is untouched and no temporary is left."""
    before = (previous / "manifest.json").read_bytes()

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # Python ignores SIGXFSZ: writes get EFBIG

    proc = _compile(previous, preexec_fn=limit)
    _, err = proc.communicate()
    assert proc.returncode == 1, err
    line = err.strip().splitlines()
    assert len(line) == 1 and line[0].startswith(f"error: cannot write the package {previous}: File too large"), err
    assert line[0].endswith("nothing was replaced"), err
    assert not _temporaries(previous)
    _assert_intact(previous, before)


def test_atomic_path(tmp_path):
    """A file written through ``atomic_path`` replaces the old one only when complete: an exception (or interrupt)
    leaves the old file and no temporary; a failed write is a one-line KilnError."""
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("stopped")
    assert target.read_bytes() == b"old" and list(tmp_path.iterdir()) == [target]
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and list(tmp_path.iterdir()) == [target]
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir()
        os.chmod(locked, 0o500)
        with pytest.raises(KilnError, match="cannot write"), atomic_path(locked / "x.bin") as tmp:
            tmp.write_bytes(b"x")
