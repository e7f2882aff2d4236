"""Progress bars for long work: on in the CLI, off in library calls, ``EXTAGG_PROGRESS=0`` wins."""

from __future__ import annotations

import sys
from typing import Any

from extagg._config import env_flag

__all__ = ["progress_enabled", "progress_bar"]


def progress_enabled(default: bool) -> bool:
    """Whether to show a bar: ``EXTAGG_PROGRESS`` if set, else ``default`` on a terminal."""
    return env_flag("EXTAGG_PROGRESS", default and sys.stderr.isatty())


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *_: Any) -> None:
        pass


def progress_bar(*, enabled: bool, **kwargs: Any) -> Any:
    """A tqdm bar writing to stderr, or a silent stand-in with the same methods."""
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(file=sys.stderr, dynamic_ncols=True, **kwargs)
