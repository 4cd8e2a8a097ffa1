"""A fuzzing campaign of a given length: ``python -m tools.fuzz_campaign HARNESS [--minutes 30]``.

A harness is one of the ``tests/test_fuzz_*.py`` files (``onnx``, ``package``, ``gguf``, ``ctranslate2``, ``rpc``).
The campaign runs it in rounds, each a pytest process with fresh random inputs (``KILN_FUZZ_RANDOM=1``) and
``--examples`` inputs per test, until the minutes are spent; it stops at the first round that fails and prints that
round's output (hypothesis's shrunk counterexample). Rounds that run past the end are not cut: a campaign always
ends on a finished round. Prints a table (rich) and writes a JSON record under ``bench/results/``.

Exit status: 0 when every round passed, 1 when one failed, 2 for a bad argument.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
HARNESSES = sorted(p.stem.removeprefix("test_fuzz_") for p in (ROOT / "tests").glob("test_fuzz_*.py"))


def _commit() -> str:
    """The commit the campaign ran at (``+dirty`` when the work tree has changes)."""
    def git(*args):
        return subprocess.run(["git", *args], check=False, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain", "--", "kiln", "tests") else "")


def _round(harness: str, examples: int, log: Path) -> tuple[int, int, float]:
    """One pytest process of the harness: (exit status, inputs that passed, seconds); its output goes to ``log``.

    The inputs are hypothesis's own count (``--hypothesis-show-statistics``: "N passing" of each test's
    generate phase); inputs that a harness rejects as invalid (``assume``) are not counted."""
    env = dict(os.environ, KILN_FUZZ_RANDOM="1", KILN_FUZZ_EXAMPLES=str(examples))
    start = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", "-x",
                             f"tests/test_fuzz_{harness}.py", "--hypothesis-show-statistics"],
                            check=False, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    text = log.read_text(errors="replace")
    passed = sum(int(m) for m in re.findall(r"(\d+) passing,", text))
    return rc, passed, time.perf_counter() - start


@click.command()
@click.argument("harness", type=click.Choice(HARNESSES))
@click.option("--minutes", default=30.0, show_default=True, help="Campaign length (rounds are never cut).")
@click.option("--examples", default=2000, show_default=True, help="Fresh inputs per test per round.")
def main(harness: str, minutes: float, examples: int) -> None:
    """Fuzz HARNESS with fresh inputs for MINUTES and report the inputs run and any failure."""
    console = Console()
    commit = _commit()
    log = ROOT / "build" / f"fuzz-{harness}.log"
    log.parent.mkdir(exist_ok=True)
    start, rounds, inputs, failed = time.perf_counter(), [], 0, None
    while time.perf_counter() - start < minutes * 60:
        rc, passed, seconds = _round(harness, examples, log)
        rounds.append({"status": rc, "inputs": passed, "seconds": round(seconds, 1)})
        if rc != 0:
            failed = log.read_text(errors="replace")
            break
        inputs += passed
        console.print(f"[{(time.perf_counter() - start) / 60:5.1f} min] round {len(rounds)}: {passed} fresh inputs "
                      f"passed in {seconds:.0f} s ({inputs} in all)")
    elapsed = time.perf_counter() - start
    record = {"harness": harness, "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "minutes": round(elapsed / 60, 1), "rounds": rounds, "fresh_inputs": inputs,
              "examples_per_test": examples, "failed": failed is not None}
    table = Table(title=f"fuzz campaign: tests/test_fuzz_{harness}.py at {commit}")
    for column in ("minutes", "rounds", "fresh inputs", "result"):
        table.add_column(column, justify="right")
    table.add_row(f"{elapsed / 60:.1f}", str(len(rounds)), str(inputs),
                  "FAILED (output below)" if failed else "clean")
    console.print(table)
    out = ROOT / "bench" / "results" / f"fuzz-{harness}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    console.print(f"wrote {out.relative_to(ROOT)}")
    if failed:
        console.print(failed[-12000:], markup=False, highlight=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
