"""Importing extagg is cheap: the engines (numba, pyarrow) load only when used."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("numba", "pyarrow", "extagg.columnar", "extagg.generic")


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


@pytest.mark.parametrize(
    "code",
    [
        "import extagg",
        "import extagg.memory",
        "import extagg.errors",
        "from extagg import SpillError",
    ],
)
def test_light_imports_load_no_engine(code: str) -> None:
    loaded = _loaded_after(code)
    assert not loaded & set(HEAVY), f"{code!r} loaded {sorted(loaded & set(HEAVY))}"


def test_public_names_still_import_and_load_their_engine() -> None:
    loaded = _loaded_after(
        "from extagg import aggregate, HashAggregator, Aggregator, ExternalAppendOnlyMap\n"
        "import extagg.columnar.functions as F\n"
        "assert callable(aggregate) and F.FUNCTIONS"
    )
    assert {"numba", "pyarrow", "extagg.columnar", "extagg.generic"} <= loaded


def test_every_public_name_resolves_and_errors_are_extagg_errors() -> None:
    import extagg

    for name in extagg.__all__:
        value = getattr(extagg, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, extagg.ExtaggError), name
    with pytest.raises(AttributeError):
        extagg.no_such_name  # noqa: B018
