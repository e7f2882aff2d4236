"""Input paths expanded to files (globs, directories), before anything heavy is imported:
the command line checks them first, so a mistyped path fails at once."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from extagg.errors import InputError

__all__ = ["expand_input_paths"]


def expand_input_paths(paths: Sequence[str]) -> list[tuple[str, str | None]]:
    """``(file, hive base directory or None)`` for every path, glob and directory given.

    Parameters
    ----------
    paths
        Files, globs (``*``, ``?``, ``[...]``, ``**``) and directories (every data file under
        them: names starting with ``.`` or ``_`` and ``.crc`` files skipped).

    Returns
    -------
    list[tuple[str, str | None]]
        Each file, with the directory it was found under (the base of its hive folders).

    Raises
    ------
    InputError
        A path that does not exist, a glob that matches nothing, an empty directory.
    """
    out: list[tuple[str, str | None]] = []
    for raw in paths:
        path = os.fspath(raw)
        if any(ch in path for ch in "*?["):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                raise InputError(f"no file matches {path!r}", path=path)
            for m in matches:
                out.extend(expand_input_paths([m]) if os.path.isdir(m) else [(m, None)])
        elif os.path.isdir(path):
            found = []
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
                found += [
                    os.path.join(root, f)
                    for f in sorted(files)
                    if not f.startswith((".", "_")) and not f.endswith(".crc")
                ]
            if not found:
                raise InputError(f"directory {path} holds no data files", path=path)
            out.extend((f, path) for f in found)
        elif os.path.exists(path):
            out.append((path, None))
        else:
            raise InputError(f"no such file: {path}", path=path)
    return out
