import pytest

from extagg._config import env_size, format_size, parse_size


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
    with pytest.raises(ValueError, match="memory"):
        parse_size(bad, name="memory")


def test_parse_size_zero_allowed_when_asked():
    assert parse_size("0", allow_zero=True) == 0


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
