"""`python -m flashkv ...` runs the flashkv command-line tool (docs/cli.md) with the same arguments.

The executable is looked up in this order: FLASHKV_CLI (a path), the package's own flashkv/_native/flashkv (where
`pip install .` puts it), bin/flashkv next to the library the package loads (a build tree: build/<preset>/bin), then
`flashkv` on PATH. `python -m flashkv --version` prints the package, library and CLI versions and exits 1 (with the
three versions) if they disagree. A missing executable exits 2 with one line naming what was tried.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def _candidates() -> list[Path]:
    out = []
    env = os.environ.get("FLASHKV_CLI")
    if env:
        return [Path(env)]
    here = Path(__file__).resolve().parent
    out.append(here / "_native" / "flashkv")
    try:
        from . import library_path

        lib = Path(library_path()).resolve()
        out.append(lib.parent.parent / "bin" / "flashkv")
    except OSError:
        pass
    found = shutil.which("flashkv")
    if found:
        out.append(Path(found))
    return out


def find_cli() -> Path | None:
    for p in _candidates():
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def main(argv: list[str]) -> int:
    cli = find_cli()
    if argv[:1] == ["--version"]:
        from . import __version__, library_version

        lib = library_version()
        exe = subprocess.run([str(cli), "--version"], capture_output=True, text=True).stdout.split()[-1] if cli else None
        print(f"flashkv package {__version__}, library {lib}, cli {exe or 'not found'}")
        return 0 if lib == __version__ and exe in (None, __version__) else 1
    if cli is None:
        tried = ", ".join(str(p) for p in _candidates()) or "nothing"
        print(f"flashkv: cannot find the flashkv executable (set FLASHKV_CLI or `pip install .`); tried: {tried}",
              file=sys.stderr)
        return 2
    os.execv(str(cli), [str(cli), *argv])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
