"""The numba settings of every compiled kernel, in one place.

Every ``_kernels``-style module compiles its functions with :func:`jit`:

* ``cache=True`` - compiled code is cached next to the module (``__pycache__``), so a new
  process loads the kernels instead of compiling them again (seconds per module);
* ``nogil=True`` - kernels release the GIL, so threads can run them side by side;
* ``fastmath=False`` - float sums, means and variances must match the pure-Python references
  bit for bit and keep IEEE NaN/inf semantics, which fast-math reassociation would break;
* ``boundscheck`` left to numba's ``NUMBA_BOUNDSCHECK`` environment variable (off by default,
  for speed): set ``NUMBA_BOUNDSCHECK=1`` to debug a kernel with checked indexing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numba

__all__ = ["CACHE", "FASTMATH", "NOGIL", "jit"]

CACHE = True
NOGIL = True
FASTMATH = False

F = TypeVar("F", bound=Callable[..., Any])


def jit(**overrides: Any) -> Callable[[F], F]:
    """``numba.njit`` with the project's settings (``overrides``, e.g. ``inline="always"``,
    are added; they may not change the settings above)."""
    clash = {"cache", "nogil", "fastmath"} & overrides.keys()
    if clash:
        raise TypeError(f"jit() settings are fixed in extagg._numba: {sorted(clash)}")
    decorator: Callable[[F], F] = numba.njit(
        cache=CACHE, nogil=NOGIL, fastmath=FASTMATH, **overrides
    )
    return decorator
