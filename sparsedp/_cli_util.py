"""Small pieces shared by the subsystems' command-line tools (no module imports ``sparsedp.cli``)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .errors import SparseDPError

__all__ = ["OutputFile", "check_output_paths", "warn_not_private"]


def warn_not_private(seed: int | None, evaluate: bool, truth: str = "the true data") -> bool:
    """Whether the output is a private release; say on stderr why not (a seeded noise generator
    is reproducible; an evaluation compares the release with ``truth``)."""
    if seed is not None:
        print(f"warning: --seed {seed} makes the noise reproducible: this release is NOT private "
              "(for tests and demonstrations only)", file=sys.stderr)
    if evaluate:
        print(f"warning: --evaluate compares the release with {truth}: the output is NOT private",
              file=sys.stderr)
    return seed is None and not evaluate


@dataclass(frozen=True)
class OutputFile:
    """A file a command is about to write: ``name`` is how the user named it (``"--out"``,
    ``"output.release"``), ``release`` says whether it is a release file (an existing one is
    replaced only when forced)."""

    name: str
    path: str | Path
    release: bool = False


def _resolved(path: str | Path) -> Path:
    """``path`` made absolute with every symlink and ``..`` resolved (the file it would reach)."""
    return Path(os.path.abspath(path)).resolve()


def _same_file(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)  # hard links too
    except OSError:
        return False


def check_output_paths(
    outputs: Sequence[OutputFile],
    inputs: Iterable[str | Path | None] = (),
    *,
    force: bool = False,
    within: str | Path | None = None,
    force_hint: str = "--force",
) -> list[Path]:
    """Check the files a command will write before it reads any data, charges any budget or draws
    any noise; return them resolved.  Raises :class:`~sparsedp.errors.SparseDPError` when an output

    * is (after resolving symlinks and ``..``; hard links included) one of the ``inputs``, or lies
      inside an input directory: a release never overwrites its own data (not even when forced);
    * lies outside the directory ``within`` (a spec's outputs stay in the spec's directory);
    * is the same file as another output (the second write would replace the first);
    * is empty or an existing directory (other than a ``.zarr`` array), or has no existing, writable
      parent directory;
    * is a release file that exists already and ``force`` is not set (``force_hint`` says how to
      ask: ``--force``, or a spec's ``overwrite = true``).
    """
    ins = [_resolved(p) for p in inputs if p is not None and str(p) != ""]
    base = _resolved(within) if within is not None else None
    seen: dict[Path, str] = {}
    out: list[Path] = []
    for o in outputs:
        if str(o.path) == "":
            raise SparseDPError(f"{o.name}: an empty file name")
        target = _resolved(o.path)
        if target.is_dir() and target.suffix != ".zarr":  # a Zarr array is a directory; nothing else is
            raise SparseDPError(f"{o.name} {o.path} is a directory: name a file")
        if base is not None and not target.is_relative_to(base):
            raise SparseDPError(f"{o.name} = {o.path} lies outside the spec's directory {base}: outputs are written "
                                "next to the spec only (no '..', absolute paths or symlinks leading out)")
        for src in ins:
            if _same_file(target, src) or (src.is_dir() and target.is_relative_to(src)):
                raise SparseDPError(f"{o.name} {o.path} is an input of this release ({src}): refusing to overwrite "
                                    "it; write the output to another file")
        if target in seen:
            raise SparseDPError(f"{o.name} and {seen[target]} name the same file {o.path}: give each output its own "
                                "file")
        seen[target] = o.name
        parent = target.parent
        if not parent.is_dir():
            raise SparseDPError(f"{o.name}: the directory of {o.path} ({parent}) does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise SparseDPError(f"{o.name}: the directory of {o.path} ({parent}) is not writable")
        if os.path.lexists(target) and o.release and not force:
            raise SparseDPError(f"{o.name} {o.path} exists: refusing to replace an earlier release; pass "
                                f"{force_hint} to overwrite it, or choose another file")
        out.append(target)
    return out
