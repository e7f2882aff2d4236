import os

import pytest

from extagg._config import env_size, format_size, parse_size
from extagg.errors import QueryError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("256m", 256 * 2**20),
        ("256mb", 256 * 2**20),
        ("256MiB", 256 * 2**20),
        ("1g", 2**30),
        ("1.5g", int(1.5 * 2**30)),
        ("64k", 64 * 1024),
        ("100", 100),
        ("100b", 100),
        (" 2 GiB ", 2 * 2**30),
        ("1t", 2**40),
        (4096, 4096),
    ],
)
def test_parse_size_spark_units_are_binary(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "   ", "-1m", "12q", "m", "1..2g", "abc", "0", "0m"])
def test_parse_size_rejects_bad_strings_naming_them(bad):
    with pytest.raises(QueryError, match="memory"):  # extagg's own, a ValueError
        parse_size(bad, name="memory")


def test_parse_size_zero_allowed_when_asked():
    assert parse_size("0", allow_zero=True) == 0


def test_parse_size_takes_whole_floats_only():
    assert parse_size(1048576.0) == 1 << 20
    for bad in (1.5, 1048576.5):  # were 1 byte and 1 MiB
        with pytest.raises(ValueError, match=r"invalid memory .*whole.*'1.5m'"):
            parse_size(bad, name="memory")


def test_parse_size_fractional_bytes_in_a_string_are_refused(monkeypatch):
    """``"1.5"`` (no unit: bytes) was 1 byte, silently; ``EXTAGG_MEMORY=1.5`` too."""
    assert parse_size("1.0") == 1 and parse_size("1.5k") == 1536
    for bad in ("1.5", "2.25b"):
        with pytest.raises(ValueError, match=r"invalid memory .*whole.*m'"):
            parse_size(bad, name="memory")
    monkeypatch.setenv("EXTAGG_MAX_SPILL_BYTES", "1.5")
    with pytest.raises(ValueError, match=r"EXTAGG_MAX_SPILL_BYTES.*whole"):
        env_size("EXTAGG_MAX_SPILL_BYTES")


def test_parse_size_rejects_wrong_types():
    with pytest.raises(TypeError):
        parse_size(True)
    with pytest.raises(TypeError):
        parse_size([1])


def test_env_size_names_the_variable(monkeypatch):
    monkeypatch.setenv("EXTAGG_MEMORY", "12 parsecs")
    with pytest.raises(ValueError, match="EXTAGG_MEMORY"):
        env_size("EXTAGG_MEMORY")
    monkeypatch.setenv("EXTAGG_MEMORY", "3m")
    assert env_size("EXTAGG_MEMORY") == 3 * 2**20
    monkeypatch.delenv("EXTAGG_MEMORY")
    assert env_size("EXTAGG_MEMORY", 7) == 7


def test_format_size_like_spark():
    assert format_size(100) == "100.0 B"
    assert format_size(2048) == "2.0 KiB"
    assert format_size(63.2 * 2**20) == "63.2 MiB"
    assert format_size(3 * 2**30) == "3.0 GiB"


def test_file_queries_leave_a_core_to_the_reader(monkeypatch) -> None:
    """A file query's folds default to one fewer thread than the CPUs (the reader thread
    decodes the file on its own core), at least one; an explicit count or EXTAGG_THREADS is
    obeyed as it is."""
    from extagg import _config

    monkeypatch.delenv("EXTAGG_THREADS", raising=False)
    for cpus, folds in ((1, 1), (2, 1), (4, 3), (16, 15)):
        monkeypatch.setattr(_config.os, "sched_getaffinity", lambda _pid, n=cpus: set(range(n)))
        assert _config.resolve_threads(None) == cpus
        assert _config.resolve_file_threads(None) == folds
        assert _config.resolve_file_threads(2) == 2
    monkeypatch.setenv("EXTAGG_THREADS", "4")
    assert _config.resolve_file_threads(None) == 4
    monkeypatch.setenv("EXTAGG_THREADS", "zero")
    with pytest.raises(ValueError, match="EXTAGG_THREADS"):
        _config.resolve_file_threads(None)


def test_a_file_query_folds_with_the_threads_it_resolved(tmp_path, monkeypatch) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from extagg.io.run import plan_query

    monkeypatch.delenv("EXTAGG_THREADS", raising=False)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": [1, 2, 1], "v": [1.0, 2.0, 3.0]}), path)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    for threads, expected in ((None, max(1, cpus - 1)), (3, 3)):
        query = plan_query(str(path), by=["k"], aggs={"s": ("v", "sum")}, threads=threads)
        try:
            assert query.threads == expected
        finally:
            query.close()
