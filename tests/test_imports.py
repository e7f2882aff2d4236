"""Importing extagg is cheap: the engines (numba, pyarrow) load only when used."""

from __future__ import annotations

import subprocess
import sys

import pytest

import extagg

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


def test_aggregate_command_loads_only_what_it_uses(tmp_path) -> None:
    """``extagg aggregate`` builds only its own parser: the state store (checkpoints, codecs)
    is not imported, and pyarrow's pandas probe is skipped (pandas is never loaded)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": ["a", "b", "a"], "v": [1, 2, 3]}), path)
    argv = [str(path), "--by", "k", "--agg", "s=sum(v)", "-q", "-o", str(tmp_path / "o.csv")]
    loaded = _loaded_after(
        f"from extagg.cli import main\nassert main(['aggregate', *{argv!r}]) == 0"
    )
    assert "extagg.columnar" in loaded and "pyarrow.dataset" in loaded
    assert not {m for m in loaded if m.startswith(("extagg.state", "pandas"))}
    assert sorted((tmp_path / "o.csv").read_text().splitlines()[1:]) == ["a,4", "b,2"]


def test_arrow_without_pandas_still_converts_to_pandas() -> None:
    """After the probe was skipped, an explicit ``to_pandas()`` still imports pandas."""
    loaded = _loaded_after(
        "from extagg.cli_aggregate import import_arrow_without_pandas\n"
        "import_arrow_without_pandas()\n"
        "import sys\nassert 'pandas' not in sys.modules\n"
        "import pyarrow as pa\n"
        "df = pa.table({'a': [1, 2]}).to_pandas()\n"
        "assert list(df['a']) == [1, 2]"
    )
    assert "pandas" in loaded


def test_state_command_does_not_load_the_engines() -> None:
    loaded = _loaded_after(
        "from extagg.cli import build_parser, command_of\n"
        "argv = ['state', 'metadata', '/nonexistent']\n"
        "args = build_parser(command_of(argv)).parse_args(argv)\n"
        "assert args.state_command == 'metadata'"
    )
    assert not loaded & {"extagg.columnar", "extagg.io", "extagg.cli_aggregate"}


def test_version_loads_no_command() -> None:
    """``extagg --version`` prints the version without building any command's options (their
    modules took ~0.9 s to import for one line)."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from extagg.cli import main; main(['--version'])"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == f"extagg {extagg.__version__}"
    loaded = _loaded_after(
        "from extagg.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n    pass"
    )
    assert not loaded & {"extagg.cli_aggregate", "extagg.state", "numba", "pyarrow"}


@pytest.mark.parametrize("argv", [["--help"], [], ["agregate", "x.csv"]])
def test_top_level_help_and_usage_errors_load_no_command(argv: list[str]) -> None:
    """``extagg --help``, ``extagg`` alone and a mistyped command list the commands without
    importing them (``extagg --help`` took 1.3 s and 100 MB)."""
    loaded = _loaded_after(
        f"from extagg.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"
    )
    assert not loaded & {"extagg.cli_aggregate", "extagg.state", "numba", "pyarrow"}


def test_the_aggregate_command_chooses_arrows_pool_before_pyarrow_loads(tmp_path) -> None:
    """The command reads ``--by`` before it picks Arrow's memory pool (which Arrow reads once,
    at import): a ``--by`` reader that imported pyarrow left mimalloc in place, and runs
    peaked ~40 MiB higher above their fixed RSS (tests/io/test_memory.py caught it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": ["a", "b"], "v": [1, 2]}), path)
    argv = ["aggregate", str(path), "--by", '"k", lower(k)', "--agg", "s=sum(v * 2)", "-q",
            "-o", str(tmp_path / "o.parquet")]  # fmt: skip
    code = (
        "import os, sys\nfrom extagg.cli import main\n"
        f"assert main({argv!r}) == 0\n"
        "import pyarrow as pa\n"
        "print(os.environ.get('ARROW_DEFAULT_MEMORY_POOL'), pa.default_memory_pool().backend_name)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == out[1], out  # the pool the command asked for is the one Arrow uses
