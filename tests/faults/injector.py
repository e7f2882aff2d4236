"""Fail the N-th I/O operation extagg performs, in the manner of SQLite's I/O-error tests.

The real call points: run files are created by :func:`extagg.spill.runfile.open_for_writing`
(``open(path, "wb")``) and written with ``write`` and ``close``; state files are written through
:class:`extagg.state.atomic.AtomicFile` (``open(temp, "xb")``, ``write``, ``flush``, ``os.fsync``,
``close``, then ``os.replace`` or ``os.link``). Those are the operations counted here:

* ``create`` (opening a file for writing) and ``write`` and ``close`` fail with ``ENOSPC``;
* ``flush`` fails with ``ENOSPC``; ``fsync`` and ``rename`` (``os.replace``/``os.rename``/
  ``os.link``) fail with ``EIO``.

``open`` is replaced in the two writing modules only; the ``os`` functions are wrapped process-wide
but act only when called from an ``extagg`` module (pytest's own I/O is never failed). Nothing is
mocked: every operation that is not the failing one runs for real on a real disk.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any

import extagg.spill.runfile as runfile_module
import extagg.state.atomic as atomic_module

KINDS = ("create", "write", "flush", "close", "fsync", "rename")
ERRNOS = {
    "create": errno.ENOSPC,
    "write": errno.ENOSPC,
    "flush": errno.ENOSPC,
    "close": errno.ENOSPC,
    "fsync": errno.EIO,
    "rename": errno.EIO,
}
_WRITING_MODULES = (runfile_module, atomic_module)
_OS_FUNCTIONS = {"fsync": "fsync", "replace": "rename", "rename": "rename", "link": "rename"}


class InjectedFault(OSError):
    """The error an injected fault raises (an ``OSError`` with a real errno)."""


class FaultInjector:
    """Counts extagg's write-side I/O operations and fails the ``fail_at``-th (1-based).

    ``fail_at=None`` only counts. After a run, ``count`` is how many operations it performed and
    ``fired`` describes the failed one (``None``: the run had fewer than ``fail_at``).
    """

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.count = 0
        self.fired: str | None = None
        self.kinds: dict[str, int] = dict.fromkeys(KINDS, 0)

    def point(self, kind: str, target: Any) -> None:
        """One I/O operation of ``kind`` on ``target``: counted, and failed if it is the N-th."""
        self.count += 1
        self.kinds[kind] += 1
        if self.count == self.fail_at:
            self.fired = f"{kind} #{self.count} on {target}"
            code = ERRNOS[kind]
            raise InjectedFault(code, f"{os.strerror(code)} (injected: {self.fired})", str(target))

    @contextlib.contextmanager
    def active(self) -> Iterator[FaultInjector]:
        """Install the wrappers for the duration of the block."""
        real_open = builtins.open
        real_os = {name: getattr(os, name) for name in _OS_FUNCTIONS}
        injector = self

        def faulty_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if not any(flag in mode for flag in "wxa+"):
                return real_open(file, mode, *args, **kwargs)
            injector.point("create", file)
            return _FaultyFile(real_open(file, mode, *args, **kwargs), injector, file)

        def wrap(name: str) -> Any:
            real = real_os[name]
            kind = _OS_FUNCTIONS[name]

            def faulty(*args: Any, **kwargs: Any) -> Any:
                caller = sys._getframe(1).f_globals.get("__name__", "")
                if caller.startswith("extagg."):
                    injector.point(kind, args[-1] if kind == "rename" else args[0])
                return real(*args, **kwargs)

            return faulty

        for module in _WRITING_MODULES:
            module.open = faulty_open  # type: ignore[attr-defined]
        for name in _OS_FUNCTIONS:
            setattr(os, name, wrap(name))
        try:
            yield self
        finally:
            for module in _WRITING_MODULES:
                del module.open  # type: ignore[attr-defined]
            for name, real in real_os.items():
                setattr(os, name, real)


class _FaultyFile:
    """A real file whose ``write``, ``flush`` and ``close`` are fault points."""

    def __init__(self, handle: Any, injector: FaultInjector, name: Any) -> None:
        self._handle = handle
        self._injector = injector
        self._name = name

    def write(self, data: Any) -> int:
        self._injector.point("write", self._name)
        return self._handle.write(data)

    def flush(self) -> None:
        self._injector.point("flush", self._name)
        self._handle.flush()

    def close(self) -> None:
        if self._handle.closed:
            return
        try:
            self._injector.point("close", self._name)
        except OSError:
            self._handle.close()  # as a real failing close(2): the descriptor is gone anyway
            raise
        self._handle.close()

    def fileno(self) -> int:
        return self._handle.fileno()

    @property
    def closed(self) -> bool:
        return self._handle.closed

    def __enter__(self) -> _FaultyFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
