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
"""

from __future__ import annotations

# the C functions under ``signal``: ``signal.signal``/``getsignal`` wrap every handler in an
# enum conversion that costs ~20x the call itself, and a block is entered per chunk of records
import _signal  # type: ignore[import-not-found,unused-ignore]
import threading
from types import FrameType, TracebackType
from typing import Any

__all__ = ["deferred_interrupts"]

_main_thread = threading.main_thread()
_SIGINT = _signal.SIGINT


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
