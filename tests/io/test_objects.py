"""Columns the columnar engine cannot type (nested JSON fields, list/struct Parquet columns,
all-null fields) go through the generic engine from real files: same budget and manager,
spills under a tiny budget, results compared to a plain-dict reference; what cannot be
aggregated is an error naming the column, its type and the file."""

from __future__ import annotations

import gzip
import json
import random
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import extagg
from extagg.cli import main
from extagg.errors import InputError, QueryError
from extagg.memory import UnifiedMemoryManager, task_memory_manager


def events(n: int, seed: int = 5) -> list[dict]:
    r = random.Random(seed)
    rows = []
    for _ in range(n):
        user = None if r.random() < 0.01 else {"id": r.randrange(2_000), "tier": r.choice("ab")}
        tags = None if r.random() < 0.05 else sorted(r.sample("wxyz", r.randrange(3)))
        rows.append({"user": user, "tags": tags, "n": r.randrange(100), "gone": None})
    return rows


def frozen(v):
    if isinstance(v, dict):
        return tuple(frozen(x) for x in v.values())
    if isinstance(v, list):
        return tuple(frozen(x) for x in v)
    return v


def reference(rows: list[dict]) -> dict:
    """{user: (count, sum n, distinct non-null tags, first tags)} with plain dicts."""
    out: dict = {}
    seen: dict = defaultdict(set)
    for row in rows:
        key = frozen(row["user"])
        n, s, _, first = out.get(key, (0, 0, 0, ("unset",)))
        out[key] = (n + 1, s + row["n"], 0, row["tags"] if first == ("unset",) else first)
        if row["tags"] is not None:
            seen[key].add(frozen(row["tags"]))
    return {k: (n, s, len(seen[k]), first) for k, (n, s, _, first) in out.items()}


AGGS = ["n=count(*)", "s=sum(n)", "d=count_distinct(tags)", "f=first(tags)", "z=max(gone)"]


def got(table: pa.Table) -> dict:
    out = {}
    for r in table.to_pylist():
        assert r["z"] is None
        out[frozen(r["user"])] = (r["n"], r["s"], r["d"], r["f"])
    return out


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    rows = events(30_000)
    path = tmp_path_factory.mktemp("objects") / "events.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return path, rows


def test_nested_json_fields_under_a_tiny_budget_spill_and_match(jsonl, tmp_path, capsys):
    path, rows = jsonl
    out = tmp_path / "out.parquet"
    summary = tmp_path / "s.json"
    argv = ["aggregate", str(path), "--by", "user", *(f"--agg={a}" for a in AGGS)]
    rc = main([*argv, "--memory", "2m", "-o", str(out), "-q", "--json-summary", str(summary)])
    assert rc == 0, capsys.readouterr().err
    result = pq.read_table(out)
    assert result.schema.field("user").type == pa.struct(
        [("id", pa.int64()), ("tier", pa.string())]
    )
    assert result.schema.field("f").type == pa.list_(pa.string())
    assert got(result) == reference(rows)
    info = json.loads(summary.read_text())
    assert info["spill_count"] > 0 and info["disk_bytes_spilled"] > 0
    assert info["peak_granted_bytes"] <= info["budget_bytes"]
    assert not list(tmp_path.glob(".*"))


def test_shared_manager_accounts_the_generic_maps(jsonl):
    path, rows = jsonl
    mm = UnifiedMemoryManager("3m")
    seen = []

    def progress(m):
        seen.append(task_memory_manager(mm).memory_used)

    reader = extagg.aggregate_files(
        str(path), by="user", aggs={"n": ("*", "count"), "s": ("n", "sum")},
        memory_manager=mm, progress=progress,
    )  # fmt: skip
    table = reader.read_all()
    assert max(seen) > 0  # the maps held memory from this manager while reading
    want = {k: (n, s) for k, (n, s, _d, _f) in reference(rows).items()}
    assert {frozen(r["user"]): (r["n"], r["s"]) for r in table.to_pylist()} == want
    m = extagg.run_metrics(reader)
    assert 0 < m.peak_granted_bytes <= 3 << 20
    assert task_memory_manager(mm).memory_used == 0


def test_parquet_list_keys_and_global_aggregate(tmp_path):
    table = pa.table(
        {
            "path": [[1, 2], [1, 2], [3], None, [], [3]],
            "s": [{"a": 1}, {"a": 2}, {"a": 1}, None, {"a": None}, {"a": 1}],
            "v": [1.5, 2.5, None, 4.0, 5.0, 6.0],
        }
    )
    src = tmp_path / "nested.parquet"
    pq.write_table(table, src, row_group_size=2)
    result = extagg.aggregate_files(
        str(src), by="path", aggs={"n": ("*", "count"), "m": ("v", "mean"), "lo": ("s", "min")}
    ).read_all()
    rows = {None if r["path"] is None else tuple(r["path"]): r for r in result.to_pylist()}
    assert rows.keys() == {(1, 2), (3,), None, ()}
    assert (rows[(1, 2)]["n"], rows[(1, 2)]["m"], rows[(1, 2)]["lo"]) == (2, 2.0, {"a": 1})
    assert (rows[(3,)]["n"], rows[(3,)]["m"]) == (2, 6.0)
    assert rows[()]["lo"] == {"a": None} and rows[None]["lo"] is None
    glob = extagg.aggregate_files(
        str(src), aggs={"n": ("*", "count"), "d": ("s", "count_distinct"), "c": ("path", "count")}
    ).read_all()
    assert glob.to_pylist() == [{"n": 6, "d": 3, "c": 5}]


def test_what_cannot_be_aggregated_names_column_type_and_file(jsonl, tmp_path, capsys):
    path, _ = jsonl
    with pytest.raises(QueryError, match=r"sum\('tags'\).*column 'tags' of type list<item: str"):
        extagg.aggregate_files(str(path), by="user", aggs={"s": ("tags", "sum")})
    rc = main(["aggregate", str(path), "--by", "n", "--agg", "m=mean(user)"])
    err = capsys.readouterr().err
    assert rc == 2 and "column 'user' of type struct<" in err and str(path) in err
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"k": 1, "v": 1}\n{"k": 2, "v": "one"}\n')
    with pytest.raises(InputError, match=r"mixed.jsonl.*field 'v' holds both number and string"):
        extagg.aggregate_files(str(mixed), by="k", aggs={"n": ("v", "count")}).read_all()
    array = tmp_path / "array.json"  # a JSON document, not JSON Lines
    array.write_text('[{"k": 1}, {"k": 2}]\n')
    with pytest.raises(InputError, match=r"array.json.*holds a JSON array, not JSON Lines"):
        extagg.aggregate_files(str(array), aggs={"n": ("*", "count")}).read_all()


def test_an_object_field_first_seen_after_the_inferred_block_is_an_error(tmp_path, capsys):
    """Arrow types a JSON object column from the file's first block; a field that first appears
    later would be dropped from the objects (a wrong max / count_distinct): it stops instead.
    Fields beside the objects, even late ones, are still simply not read."""
    path = tmp_path / "late.jsonl"
    with open(path, "w") as f:
        for i in range(60_000):  # 6 MB: past the first block, which types the columns (4 MiB)
            f.write(json.dumps({"k": "a", "o": {"x": i % 5}, "pad": "p" * 60}) + "\n")
        f.write(json.dumps({"k": "a", "o": {"x": 1}, "late": 5}) + "\n")
        f.write(json.dumps({"k": "a", "o": {"x": 100, "z": 98}}) + "\n")
    args = ["aggregate", str(path), "--by", "k", "--agg", "m=max(o)", "-o", "-", "-q"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert str(path) in err and "column 'o'" in err and "first block" in err
    counted = extagg.aggregate_files(str(path), by="k", aggs={"n": ("*", "count")}).read_all()
    assert counted.to_pylist() == [{"k": "a", "n": 60_002}]


@pytest.mark.parametrize("order", [[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [1, 0, 3, 2, 4]])
def test_min_max_of_lists_and_structs_order_nan_after_numbers(tmp_path, order):
    """A NaN inside a list or a struct compared neither less nor greater than a number, so
    ``min``/``max`` of ``[nan]`` and ``[1.0]`` was whichever row came first. A NaN orders after
    every number (as a plain float column's does, and DuckDB's), a null after every value."""
    nan = float("nan")
    lists = [[nan], [1.0], [2.0, nan], [2.0, 1.0], [1.0, None]]
    rows = [lists[i] for i in order]
    t = pa.table({
        "k": [1] * 5, "li": pa.array(rows, pa.list_(pa.float64())),
        "st": pa.array([{"a": r[0], "b": r[-1]} for r in rows],
                       pa.struct([("a", pa.float64()), ("b", pa.float64())])),
    })  # fmt: skip
    pq.write_table(t, tmp_path / "n.parquet")
    got = extagg.aggregate_files(
        str(tmp_path / "n.parquet"), by="k",
        aggs=["mn=min(li)", "mx=max(li)", "smn=min(st)", "smx=max(st)"],
    ).read_all().to_pylist()[0]  # fmt: skip
    assert got["mn"] == [1.0] and got["smn"] == {"a": 1.0, "b": 1.0}
    assert len(got["mx"]) == 1 and got["mx"][0] != got["mx"][0]  # [nan]
    assert got["smx"]["a"] != got["smx"]["a"]  # {a: nan, b: nan}
