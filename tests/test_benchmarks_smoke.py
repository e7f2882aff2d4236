"""The benchmark scripts stay runnable: each runs ``--quick`` on tiny data in fresh processes.

No timing is asserted (speed lives in ``benchmarks/``); these check that the scripts run end to
end, that every engine they drive agrees on the result, and that the numba ceiling table agrees
with its plain-Python twin.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import _harness as H  # noqa: E402
from numba_ceiling import ceiling_aggregate, reference_aggregate  # noqa: E402


def _run(script: str, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "results"
    env = dict(os.environ, EXTAGG_BENCH_DATA=str(tmp_path / "data"))
    cmd = [sys.executable, str(BENCH / script), "--quick", "--out", str(out), "--no-readme", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    name = script.removeprefix("bench_").removesuffix(".py")
    payload = json.loads((out / f"{name}-quick.json").read_text())
    assert (out / f"{name}-quick.md").read_text().startswith("Measured")
    return payload


def test_generic_quick_runs_and_engines_agree(tmp_path: Path) -> None:
    payload = _run(
        "bench_generic.py", tmp_path, "--workloads", "str-2M", "--engines", "extagg", "dict"
    )
    results = payload["results"]
    assert [(r["case"]["engine"], r["case"]["mode"]) for r in results] == [
        ("extagg", "in memory"),
        ("extagg", "spilling"),
        ("dict", "in memory"),
    ]
    distinct = payload["workloads"]["str-2M"]["distinct"]
    for r in results:
        (run,) = r["runs"]
        assert "error" not in run, run
        assert run["groups"] == distinct
        assert run["peak_rss"] >= run["baseline_rss"] > 0
    assert results[1]["runs"][0]["spills"] >= 0


def test_columnar_quick_runs_and_engines_agree(tmp_path: Path) -> None:
    engines = ["extagg", "ceiling"]
    if importlib.util.find_spec("duckdb"):
        engines.append("duckdb-1t")
    payload = _run("bench_columnar.py", tmp_path, "--workloads", "int-1M", "--engines", *engines)
    assert payload["problems"] == []
    distinct = payload["workloads"]["int-1M"]["distinct"]
    by_case = {(r["case"]["engine"], r["case"]["mode"]): r for r in payload["results"]}
    for key in [("extagg", "no limit"), ("ceiling", "no limit"), ("extagg", "1/8")]:
        (run,) = by_case[key]["runs"]
        assert "error" not in run, run
        assert run["groups"] == distinct
    granted = by_case[("extagg", "no limit")]["runs"][0]["peak_granted_bytes"]
    assert by_case[("extagg", "1/8")]["case"]["budget"] == granted // 8


def test_scaling_quick_runs_and_engines_agree(tmp_path: Path) -> None:
    engines = ["extagg", "generic"]
    if importlib.util.find_spec("duckdb"):
        engines.append("duckdb")
    payload = _run(
        "bench_scaling.py", tmp_path, "--curves", "rows", "budget", "--engines", *engines
    )
    results = payload["results"]
    assert {r["case"]["engine"] for r in results} == set(engines)
    for r in results:
        (run,) = r["runs"]
        if r["case"]["engine"] == "duckdb" and "Out of Memory" in run.get("error", ""):
            continue  # DuckDB 2 cannot finish under the smallest budgets: a result, not a defect
        assert "error" not in run, run
        assert run["groups"] == r["case"]["groups"]
    budgets = [r for r in results if r["case"]["curve"] == "budget" and r["case"]["budget"]]
    finished = [r for r in budgets if "error" not in r["runs"][0]]
    assert finished and all(r["runs"][0]["peak_above_baseline"] >= 0 for r in finished)
    extagg_limited = [r for r in budgets if r["case"]["engine"] == "extagg"]
    assert extagg_limited and all(r["runs"][0]["spills"] > 0 for r in extagg_limited)


@pytest.mark.parametrize(("total", "distinct"), [(1, 1), (10, 3), (1000, 10), (65_536, 4096)])
def test_permuted_keys_are_exact_and_sliceable(total: int, distinct: int) -> None:
    whole = H.permuted_key_index(0, total, total, distinct, seed=5)
    counts = np.bincount(whole, minlength=distinct)
    assert counts.sum() == total and counts.max() - counts.min() <= 1
    cut = total // 3
    parts = np.concatenate(
        [
            H.permuted_key_index(0, cut, total, distinct, seed=5),
            H.permuted_key_index(cut, total, total, distinct, seed=5),
        ]
    )
    assert np.array_equal(whole, parts)
    assert len(np.unique(H.scramble_keys(np.arange(distinct)))) == distinct


@settings(max_examples=60, deadline=None)
@given(
    n_keys=st.integers(1, 3),
    ops=st.lists(st.sampled_from(["sum", "max"]), min_size=1, max_size=2),
    rows=st.integers(0, 3000),
    cardinality=st.integers(1, 2000),
    presize=st.none() | st.integers(0, 5000),
    seed=st.integers(0, 2**32 - 1),
)
def test_ceiling_matches_reference(
    n_keys: int, ops: list[str], rows: int, cardinality: int, presize: int | None, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    keys = [rng.integers(-cardinality, cardinality, rows) for _ in range(n_keys)]
    values = [rng.normal(size=rows) for _ in ops]
    # presized for the right number of groups, too few (it grows) or too many
    group_keys, counts, states = ceiling_aggregate(keys, values, ops, groups=presize)
    expected = reference_aggregate(keys, values, ops)
    got = {
        tuple(int(k) for k in group_keys[:, g]): (int(counts[g]), states[:, g].tolist())
        for g in range(len(counts))
    }
    assert got.keys() == expected.keys()
    for key, (count, row) in expected.items():
        assert got[key][0] == count
        np.testing.assert_allclose(got[key][1], row, rtol=1e-12, atol=1e-12)


def test_ceiling_rejects_what_it_cannot_do() -> None:
    k, v = np.arange(4), np.ones(4)
    with pytest.raises(ValueError, match="1 to 3 int64 key columns"):
        ceiling_aggregate([k] * 4, [v], ["sum"])
    with pytest.raises(ValueError, match="one op each"):
        ceiling_aggregate([k], [v, v], ["sum"])
    with pytest.raises(ValueError, match="unknown ops"):
        ceiling_aggregate([k], [v], ["mean"])
    with pytest.raises(ValueError, match="same length"):
        ceiling_aggregate([k], [v[:3]], ["sum"])


def test_files_quick_runs_and_answers_match_duckdb(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    if not (Path(sys.executable).parent / "tpchgen-cli").exists():
        pytest.skip("tpchgen-cli (the bench extra) is not installed")
    payload = _run(
        "bench_files.py", tmp_path, "--formats", "parquet", "--queries", "q1", "q1full",
        "orderkey", "--engines", "extagg", "duckdb",
    )  # fmt: skip
    summaries = {
        (r["case"]["query"], r["case"]["engine"], r["case"]["memory"] is None): r["summary"]
        for r in payload["results"]
    }
    assert all("error" not in s for s in summaries.values()), summaries
    for query in ("q1", "q1full", "orderkey"):
        mine, duck = summaries[(query, "extagg", True)], summaries[(query, "duckdb", True)]
        assert mine["groups"] == duck["groups"]
        for name, value in duck["sums"].items():
            rel = 1e-5 if name.startswith("avg") else 1e-9  # decimal means round at scale + 4
            assert mine["sums"][name] == pytest.approx(value, rel=rel), (query, name)


def test_json_quick_runs_and_answers_match_duckdb(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    payload = _run("bench_json.py", tmp_path, "--engines", "extagg", "duckdb")
    summaries = {
        (r["case"]["query"], r["case"]["engine"]): r["summary"] for r in payload["results"]
    }
    assert all("error" not in s for s in summaries.values()), summaries
    for query in ("country", "hourly", "tags"):
        mine, duck = summaries[(query, "extagg")], summaries[(query, "duckdb")]
        assert mine["groups"] == duck["groups"] and duck["groups"][0] > 4
        assert set(mine["sums"]) == set(duck["sums"]) and duck["sums"]
        for name, value in duck["sums"].items():
            assert mine["sums"][name] == pytest.approx(value, rel=1e-9), (query, name)


def test_quantiles_quick_runs_and_answers_match_duckdb(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    payload = _run("bench_quantiles.py", tmp_path, "--engines", "extagg", "duckdb",
                   "--limits", "4m")  # fmt: skip
    summaries = {
        (r["case"]["query"], r["case"]["limit"], r["case"]["engine"]): r["summary"]
        for r in payload["results"]
    }
    assert all("error" not in s for s in summaries.values()), summaries
    for query in ("median", "quantiles"):
        duck = summaries[(query, None, "duckdb")]
        assert duck["groups"][0] == 500 and duck["sums"]
        for limit in (None, "4m"):
            mine = summaries[(query, limit, "extagg")]
            assert mine["groups"] == duck["groups"]
            assert set(mine["sums"]) == set(duck["sums"])
            for name, value in duck["sums"].items():
                assert mine["sums"][name] == pytest.approx(value, rel=1e-9), (query, name)


def test_threads_quick_runs_and_every_thread_count_agrees(tmp_path: Path) -> None:
    payload = _run("bench_threads.py", tmp_path, "--threads", "1", "2", "--workloads", "str-quick")
    results = payload["results"]
    assert [(r["case"]["name"], r["case"]["mode"], r["case"]["threads"]) for r in results] == [
        (name, mode, n)
        for name in ("str-quick",)
        for mode in ("no limit", "1/8 of the table")
        for n in (1, 2)
    ]
    digests = {}
    for r in results:
        (run,) = r["runs"]
        assert "error" not in run, run
        assert run["peak_rss"] >= run["baseline_rss"] > 0
        digests.setdefault(r["case"]["name"], set()).add(run["digest"])
    assert all(len(d) == 1 for d in digests.values()), digests


def test_outputs_quick_writes_every_format() -> None:
    """``bench_outputs.py --quick``: every output of both engines written and sized."""
    cmd = [sys.executable, str(BENCH / "bench_outputs.py"), "--quick"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split(" | ") for line in proc.stdout.splitlines() if line.startswith("| extagg")]
    assert [row[1] for row in rows] == [".csv", ".csv.gz", ".csv.zst", ".csv.bz2", ".jsonl",
                                        ".jsonl.gz", ".parquet"]  # fmt: skip
    sizes = {row[1]: int(row[3].rstrip(" |").replace(",", "")) for row in rows}
    assert sizes[".csv.gz"] < sizes[".csv"] / 2 and sizes[".jsonl"] > sizes[".csv"]
    if importlib.util.find_spec("duckdb") is not None:
        assert proc.stdout.count("| duckdb |") == 4
