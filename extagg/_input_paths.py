"""Input paths expanded to files (globs, directories), and an output path checked, before
anything heavy is imported: the command lines check them first, so a mistyped path or an
existing output fails at once."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from extagg.errors import InputError

__all__ = ["COMPRESSION_CODECS", "expand_input_paths", "output_is_an_input", "output_problem"]

#: the Arrow codec of each compression suffix of a text file, read or written, matched in any
#: case (``.CSV.GZ``: Arrow's own detection knows lower case only)
COMPRESSION_CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd"}


def expand_input_paths(paths: Sequence[str]) -> list[tuple[str, str | None]]:
    """``(file, hive base directory or None)`` for every path, glob and directory given.

    Parameters
    ----------
    paths
        Files, globs (``*``, ``?``, ``[...]``, ``**``) and directories (every data file under
        them); in both, names starting with ``.`` or ``_`` and ``.crc`` files are skipped (the
        markers and side files Spark and Hadoop write beside the data).

    Returns
    -------
    list[tuple[str, str | None]]
        Each file, with the directory it was found under (the base of its hive folders).

    Raises
    ------
    InputError
        A path that does not exist, a glob that matches nothing, an empty directory, a path
        that is not a regular file (a pipe), no path at all.
    """
    out: list[tuple[str, str | None]] = []
    for raw in paths:
        path = os.fspath(raw)
        if any(ch in path for ch in "*?["):
            # as in a directory: Spark's _SUCCESS and _committed_* markers, .crc side files
            every = sorted(glob.glob(path, recursive=True))
            root = _glob_root(path)
            asked = any(_is_marker(p) for p in os.path.relpath(path, root).split(os.sep)[:-1])
            matches = [m for m in every if not _marked_below(m, root, asked)]
            if not matches:
                what = "only marker files match" if every else "no file matches"
                raise InputError(f"{what} {path!r}", path=path)
            # a file once, however many matches reach it: ``d/**`` matches ``d/`` and its
            # folders as well as their files, and each folder's files were read again
            # (rows counted two and three times)
            reached: dict[str, str | None] = {}
            for m in matches:
                for file, base in expand_input_paths([m]) if os.path.isdir(m) else [(m, None)]:
                    if base is None and _under_hive_folders(file, root):
                        base = root  # 'events/*/*.parquet' over dt=... folders: columns
                    reached.setdefault(os.path.normpath(file), base)
            out.extend(reached.items())
        elif os.path.isdir(path):
            found = []
            # a folder that cannot be listed is an error, not a part of the data skipped (its
            # rows were silently missing); linked folders are followed, as pyarrow's dataset
            # does, each real folder once (a link back up would loop)
            seen = {os.path.realpath(path)}
            for root, dirs, files in os.walk(path, onerror=_unreadable_folder, followlinks=True):
                kept = []
                for d in sorted(dirs):
                    real = os.path.realpath(os.path.join(root, d))
                    if not d.startswith((".", "_")) and real not in seen:
                        seen.add(real)
                        kept.append(d)
                dirs[:] = kept
                found += [os.path.join(root, f) for f in sorted(files) if not _is_marker(f)]
            if not found:
                raise InputError(f"directory {path} holds no data files", path=path)
            out.extend((f, path) for f in found)
        elif os.path.exists(path):
            if not os.path.isfile(path):  # a pipe, /dev/stdin, a device: read as empty before
                raise InputError(
                    f"{path} is not a regular file (a pipe or a device): the scan reads files "
                    "(their size, their Parquet footer, their blocks again); write the stream "
                    "to a file first (`extagg aggregate` does so itself with a pipe or -)",
                    path=path,
                )
            out.append((path, None))
        else:
            raise InputError(f"no such file: {path}", path=path)
    if not out:
        raise InputError("no input: give at least one file, glob or directory")
    return out


def _unreadable_folder(error: OSError) -> None:
    """``os.walk``'s ``onerror``: a folder of the input that cannot be listed stops the run."""
    raise InputError(
        f"cannot read directory {error.filename}: {error.strerror or error}",
        path=str(error.filename),
    ) from error


def _under_hive_folders(file: str, root: str) -> bool:
    """Whether ``file`` lies in ``key=value`` folders below ``root`` (a glob's literal part)."""
    folders = os.path.relpath(os.path.dirname(file), root).split(os.sep)
    return any("=" in folder and not folder.startswith("=") for folder in folders)


def _glob_root(pattern: str) -> str:
    """The directory a glob's wildcards start below (its literal leading components)."""
    parts = pattern.split(os.sep)
    literal = []
    for part in parts[:-1]:
        if any(ch in part for ch in "*?["):
            break
        literal.append(part)
    return os.sep.join(literal) or ("/" if pattern.startswith(os.sep) else ".")


def _marked_below(match: str, root: str, folders_asked: bool) -> bool:
    """Whether a glob's match is, or lies in, a hidden or ``_`` folder or file below the glob's
    literal part: ``data/**/*.csv`` skips ``data/_temporary/0/part.csv``, as a directory walk
    does. Folders are not skipped where the pattern's own folders start so
    (``folders_asked``: ``data/_tmp*/*.csv``), nor one its literal part names."""
    parts = [p for p in os.path.relpath(match, root).split(os.sep) if p not in (".", "..")]
    if folders_asked:
        parts = parts[-1:]
    return any(_is_marker(part) for part in parts)


def _is_marker(name: str) -> bool:
    """A file name that is no data: hidden, ``_SUCCESS``/``_committed_*``, a ``.crc``."""
    return name.startswith((".", "_")) or name.endswith(".crc")


def output_directory_problem(path: str) -> str | None:
    """Why ``path``'s folder cannot take the output (it does not exist), or ``None``: asked
    before a run reads its input, not after."""
    if path == "-":
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(folder):
        return None
    return f"cannot write output {path}: its directory {folder} does not exist"


def output_is_an_input(output: str | None, inputs: Sequence[str]) -> str | None:
    """Why ``output`` may not be written: it is one of the ``inputs`` (``--overwrite``
    replaced the file the run was reading), or ``None``."""
    if output in (None, "-") or not os.path.exists(output):
        return None
    for path in inputs:
        try:
            if os.path.samefile(output, path):
                return f"output {output} is an input: give another file"
        except OSError:  # an input gone since it was listed: the scan says so
            continue
    return None


def output_problem(path: str, overwrite: bool) -> str | None:
    """Why ``path`` cannot be the output (a missing directory; a directory, device or pipe; a
    file there without ``overwrite``), or ``None``. Asked before anything is written, so the
    message names the output, not the hidden temp file the write would have failed on."""
    if path == "-":
        return None
    if os.path.isdir(path):
        return (
            f"output {path} is a directory: give a file name (in it, say), or -o - for "
            "standard output"
        )
    if not os.path.exists(path):
        return output_directory_problem(path)
    if not os.path.isfile(os.path.realpath(path)):
        return (
            f"output {path} is not a regular file (a pipe, a device): the result is written to "
            "a temporary file renamed over it; write to a file, or -o - for standard output"
        )
    if not overwrite:
        return f"output {path} exists; pass --overwrite (overwrite=True) to replace it"
    return None
