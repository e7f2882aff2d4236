"""Hold Ctrl-C (SIGINT) back while a structure is between two consistent states.

A ``KeyboardInterrupt`` can be raised between any two bytecodes of the main thread. Where an
engine changes several things that must change together (a chunk of records folded into a map
and the count of records folded; a map destroyed by its sort and the arrays that replace it;
numba's type registries filled the first time the kernels load), :class:`deferred_interrupts`
installs a SIGINT handler that only notes the signal, and at the end of the block restores the
previous handler and calls it with the noted signal, so the ``KeyboardInterrupt`` is raised
right after the block, with everything consistent. Blocks are short (one chunk of records, one
sort); a Ctrl-C during one waits for it to end.

Only the main thread receives signals, and only it may install handlers: in other threads the
block runs unprotected (no interrupt can arrive there). Nested blocks defer to the outermost.

Python drops a ``KeyboardInterrupt`` raised where no caller can see it: in a ``__del__``, a
weakref callback, a garbage-collector pass ("Exception ignored in ..."). numba compiling a
kernel on a cold cache runs many ``__del__`` in LLVM's bindings, so a Ctrl-C then was lost and
the command ran to the end and exited 0. :class:`latched_interrupts` (the command line's whole
run) installs a handler that also *remembers* the signal, and the engines' batch loops call
:func:`raise_if_interrupted`, so a lost interrupt still stops the run at the next batch; the
"Exception ignored" traceback Python would print for it is left out (the run reports the
interrupt itself).

A held block can last long: numba compiling a query's kernels on a cold cache (the first run
after an install) takes 6-30 s, mostly in LLVM's C code, where Python runs no signal handler,
and an interrupt must not land inside it (llvmlite can free an object twice and abort the
process). A process that is the command line's own calls :func:`stop_process_on_interrupt`:
a thread of its own wakes at once on SIGINT/SIGTERM/SIGHUP (``signal.set_wakeup_fd``), and if
a thread is compiling then (:func:`compiling`) it calls ``stop``, which removes the run's files
and leaves with ``os._exit`` — the compiler is not interrupted, nothing is freed twice. A
library caller's process is never left so: its Ctrl-C waits for the compile. The same thread
is the command's backstop: a run still alive ``deadline`` seconds after the first stopping
signal (its own stop waits on something that does not come: a thread that does not end, a
lock) is stopped by ``stop`` all the same, so that a Ctrl-C always ends the command.
"""

from __future__ import annotations

# the C functions under ``signal``: ``signal.signal``/``getsignal`` wrap every handler in an
# enum conversion that costs ~20x the call itself, and a block is entered per chunk of records
import _signal  # type: ignore[import-not-found,unused-ignore]
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

__all__ = [
    "compiling",
    "deferred_interrupts",
    "interrupt_once",
    "latched_interrupts",
    "raise_if_interrupted",
    "stop_process_on_interrupt",
]

_main_thread = threading.main_thread()
_SIGINT = _signal.SIGINT
#: set by :class:`latched_interrupts`' handler; cleared when the latch is left
_interrupted = False
#: the threads compiling (or loading) kernels now, by ident: how deep (a kernel's compile
#: compiles the kernels it calls)
_compiling: dict[int, int] = {}
#: the signals that stop the command line (SIGTERM and SIGHUP as Ctrl-C does)
_STOPPING = frozenset(
    number for number in (getattr(_signal, name, None) for name in ("SIGINT", "SIGTERM", "SIGHUP"))
    if number is not None
)  # fmt: skip


def interrupt_once(grace: float = 10.0) -> None:
    """For a process that is the command line's own: the first Ctrl-C raises
    ``KeyboardInterrupt`` and the run stops and removes its files; a repeated one within
    ``grace`` seconds is let go, so that it cannot land in that cleanup (a user pressing
    Ctrl-C three times left a traceback and the spill files, 5 runs in 7). One after the grace
    raises again (a run that did not stop). Call it from the main thread before the run."""
    first: list[float] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if first and now - first[0] < grace:
            return  # the run is stopping: let it finish removing its files
        first[:] = [now]
        raise KeyboardInterrupt

    _signal.signal(_SIGINT, handler)


def stop_process_on_interrupt(stop: Callable[[int], None], deadline: float | None = None) -> None:
    """Call ``stop(signal number)`` from a thread of its own, at once, when SIGINT, SIGTERM or
    SIGHUP arrives while a thread compiles kernels (see the module's docstring); otherwise
    the signal takes its usual way, and if the process is still running ``deadline`` seconds
    after the first such signal, ``stop`` is called then. ``stop`` must not return: it
    removes the run's files and leaves with ``os._exit``. For a process that is the command
    line's own (it takes the process's one wakeup file descriptor); call it from the main
    thread."""
    backstop: list[threading.Timer] = []
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    _signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            try:
                signals = os.read(read_fd, 64)
            except OSError:  # pragma: no cover - the pipe closed
                return
            if not signals:  # pragma: no cover
                return
            stopping = [signum for signum in signals if signum in _STOPPING]
            if stopping and _compiling:
                stop(stopping[0])
            if stopping and deadline is not None and not backstop:
                backstop.append(threading.Timer(deadline, stop, (stopping[0],)))
                backstop[0].daemon = True
                backstop[0].start()

    threading.Thread(target=watch, name="extagg-interrupts", daemon=True).start()


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """Mark the calling thread as compiling (or loading) kernels for the block."""
    ident = threading.get_ident()
    _compiling[ident] = _compiling.get(ident, 0) + 1
    try:
        yield
    finally:
        depth = _compiling.pop(ident) - 1
        if depth:
            _compiling[ident] = depth


def raise_if_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` if a latched Ctrl-C was noted (and perhaps lost on its way:
    see the module's docstring). Cheap: one global read; called once per batch."""
    if _interrupted:
        raise KeyboardInterrupt


class latched_interrupts:
    """Context manager for a whole run in the main thread: SIGINT goes to the handler that
    was there (Python's raises ``KeyboardInterrupt``; PySpark's driver cancels its jobs and
    raises it), and if that raised ``KeyboardInterrupt`` the interrupt is also remembered
    until the block ends, so that :func:`raise_if_interrupted` raises it again if the first
    one was swallowed. A handler that does not raise is left to decide; where SIGINT is
    ignored, or outside the main thread, the block changes nothing."""

    __slots__ = ("_previous", "_previous_hook")

    def __init__(self) -> None:
        self._previous: Any = None
        self._previous_hook: Any = None

    def _latch(self, signum: int, frame: FrameType | None) -> None:
        global _interrupted
        try:
            self._previous(signum, frame)
        except KeyboardInterrupt:
            _interrupted = True
            raise

    def _unraisable(self, unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _interrupted:
            return  # raised again at the next batch: no "Exception ignored" traceback
        self._previous_hook(unraisable)

    def __enter__(self) -> latched_interrupts:
        global _interrupted
        if threading.current_thread() is not _main_thread:
            return self
        previous = _signal.getsignal(_SIGINT)
        if not callable(previous) or isinstance(
            getattr(previous, "__self__", None), (latched_interrupts, deferred_interrupts)
        ):
            return self  # ignored / default action / latched or deferred by an outer block
        _interrupted = False
        self._previous = previous
        _signal.signal(_SIGINT, self._latch)
        self._previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _interrupted
        previous = self._previous
        if previous is None:
            return
        # ``signal.signal`` first runs a pending SIGINT by the handler it replaces, this
        # block's ``_latch``, which needs ``_previous`` (cleared first, a Ctrl-C pressed again
        # and again once raised "'NoneType' object is not callable" there and left ``_latch``
        # installed); one that raises is raised after the handler is put back
        raised: KeyboardInterrupt | None = None
        while True:
            try:
                _signal.signal(_SIGINT, previous)
                break
            except KeyboardInterrupt as interrupt:
                raised = interrupt
        self._previous = None
        _interrupted = False
        sys.unraisablehook, self._previous_hook = self._previous_hook, None
        if raised is not None:
            raise raised


class deferred_interrupts:
    """Context manager: SIGINT during the block is delivered when the block ends."""

    __slots__ = ("_previous", "_pending")

    def __init__(self) -> None:
        self._previous: Any = None
        self._pending: tuple[int, FrameType | None] | None = None

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self._pending = (signum, frame)

    def __enter__(self) -> deferred_interrupts:
        if threading.current_thread() is not _main_thread:
            return self
        previous = _signal.getsignal(_SIGINT)
        if not callable(previous) or isinstance(
            getattr(previous, "__self__", None), deferred_interrupts
        ):
            return self  # ignored / default action / already deferred by an outer block
        _signal.signal(_SIGINT, self._note)
        self._previous = previous
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        previous = self._previous
        if previous is None:
            return
        self._previous = None
        _signal.signal(_SIGINT, previous)
        pending, self._pending = self._pending, None
        if pending is not None:
            previous(*pending)  # default_int_handler raises KeyboardInterrupt here
