"""Shared machinery of the benchmark scripts: fresh-process runs, peak RSS, medians, JSON, tables.

Every measured run happens in a fresh child process (the script re-runs itself with
``--child CASE_JSON``). The child builds its input, primes the engine on a small input (imports,
numba cache loads, lazy initialisation), then resets the kernel's peak-RSS counter
(``/proc/self/clear_refs`` ← ``5`` resets ``VmHWM`` and ``ru_maxrss``), notes its RSS as the
*baseline*, runs the timed block once and reports: seconds, the peak RSS above the baseline
(what the aggregation itself added), the process's whole-life peak, and the engine's figures.
The parent runs one untimed warm-up child per case (first touch of memory after the host took
it back costs ~1 s/GB here) and then ``runs`` timed children, and summarises each number by its
median with min–max.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "MIB",
    "add_common_arguments",
    "checkpoint_file",
    "Timed",
    "child_result",
    "current_rss",
    "format_bytes",
    "format_range",
    "machine_info",
    "markdown_table",
    "peak_rss",
    "permute_bits",
    "permuted_key_index",
    "reset_peak_rss",
    "run_case",
    "run_guarded",
    "scramble_keys",
    "summarise",
    "timed",
    "update_readme",
    "write_results",
]

MIB = 1024 * 1024
RESULT_PREFIX = "BENCH-RESULT "
RESULTS_DIR = Path(__file__).resolve().parent / "results"  # default of write_json's out_dir
#: cached inputs (git-ignored); ``EXTAGG_BENCH_DATA`` moves them (the smoke test uses a temp dir)
DATA_DIR = Path(os.environ.get("EXTAGG_BENCH_DATA") or Path(__file__).resolve().parent / "data")


# ---------------------------------------------------------------------------- memory figures


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss() -> int:
    """Resident set size of this process now, in bytes."""
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    import psutil

    return int(psutil.Process().memory_info().rss)


def peak_rss() -> int:
    """Peak resident set size of this process since start or the last :func:`reset_peak_rss`."""
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


#: the peak RSS of this process before the last :func:`reset_peak_rss`
_PEAK_BEFORE_RESET = 0


def process_peak_rss() -> int:
    """The peak RSS of this process over its whole life: ``VmHWM`` (this process image's own)
    and the peak before any reset. Not ``ru_maxrss``, which carries the parent's RSS over a
    fork and exec (the children of a parent holding 200 MiB all reported >= 200 MiB), unless
    there is no ``/proc``."""
    kib = _status_kib("VmHWM")
    if kib is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return max(_PEAK_BEFORE_RESET, kib * 1024)


# A twin of extagg._sysinfo.reset_peak_rss on purpose: the peers' child processes (DuckDB, Polars,
# pandas, ExternalMerger) must not import extagg, whose package import loads numpy, numba and more.
def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter to the current RSS (Linux ≥ 4.0); False if not possible.
    The peak before it is kept for :func:`process_peak_rss`."""
    global _PEAK_BEFORE_RESET
    _PEAK_BEFORE_RESET = max(_PEAK_BEFORE_RESET, peak_rss())
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return False
    return True


class Timed:
    """What :func:`timed` measured: seconds, RSS figures, and the block's return value."""

    __slots__ = (
        "baseline_rss",
        "peak_above_baseline",
        "peak_rss",
        "peak_reset",
        "seconds",
        "value",
    )

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "baseline_rss": self.baseline_rss,
            "peak_rss": self.peak_rss,
            "peak_above_baseline": self.peak_above_baseline,
            "peak_reset": self.peak_reset,
        }


def timed(block: Callable[[], Any]) -> Timed:
    """Run ``block`` once: wall time, baseline RSS before it and the peak RSS it reached."""
    out = Timed()
    out.peak_reset = reset_peak_rss()
    out.baseline_rss = current_rss()
    started = time.perf_counter()
    out.value = block()
    out.seconds = time.perf_counter() - started
    out.peak_rss = peak_rss()
    out.peak_above_baseline = max(0, out.peak_rss - out.baseline_rss)
    return out


def run_guarded(block: Callable[[], dict[str, Any]]) -> None:
    """Run a child's work and print its result line; an exception becomes ``{"error": ...}``."""
    try:
        payload = block()
    except Exception as err:  # reported to the parent, which puts it in the table
        first = (str(err).strip().splitlines() or [""])[0]
        payload = {"error": f"{type(err).__name__}: {first}"[:300]}
    child_result(payload)


def child_result(payload: dict[str, Any]) -> None:
    """Print the child's result line for the parent (the last line of its stdout)."""
    payload = dict(payload)
    payload["process_peak_rss"] = process_peak_rss()
    sys.stdout.write(RESULT_PREFIX + json.dumps(payload) + "\n")
    sys.stdout.flush()


def setup_engine_process(engine: str, threads: int) -> None:
    """A child's process before its engine is imported: extagg's as ``extagg aggregate`` sets
    its own up (Arrow on jemalloc, no pandas, the C heap keeping freed memory for reuse), and
    for every engine Arrow's CPU and I/O pools and Polars' at ``threads`` (Arrow decodes and
    parses for extagg, and converts DuckDB's result)."""
    if engine == "extagg":
        from extagg._malloc import keep_freed_heap_for_reuse
        from extagg.cli_aggregate import (
            import_arrow_without_pandas,
            return_freed_pages_sooner,
            use_returning_memory_pool,
        )

        use_returning_memory_pool()
        import_arrow_without_pandas()
        return_freed_pages_sooner()
        keep_freed_heap_for_reuse()
    os.environ["POLARS_MAX_THREADS"] = str(threads)
    import pyarrow as pa

    pa.set_cpu_count(threads)
    pa.set_io_thread_count(max(1, threads))


def measured_run(run: Callable[[], dict[str, Any]], imported: float) -> dict[str, Any]:
    """A child's figures for one query: ``run``'s seconds and what it returns, the engine's
    import (the seconds since ``imported``, before the query) and the peak RSS above the
    baseline taken just before the query."""
    import_seconds = time.perf_counter() - imported
    reset_peak_rss()
    baseline = current_rss()
    started = time.perf_counter()
    answer = run()
    return {
        "seconds": time.perf_counter() - started,
        "import_seconds": import_seconds,
        "peak_above_baseline": max(0, peak_rss() - baseline),
        **answer,
    }


def answer_checksum(batches: Iterable[Any]) -> dict[str, Any]:
    """Group count and the float sum of every numeric column (answers compared across engines),
    a batch at a time: extagg's result is streamed, never held whole (as a user writing it to a
    file would), so its peak RSS is the engine's, not the result table's."""
    import pyarrow as pa
    import pyarrow.compute as pc

    groups = 0
    sums: dict[str, float] = {}
    for batch in batches:
        groups += batch.num_rows
        for name, col in zip(batch.schema.names, batch.columns, strict=True):
            t = col.type
            if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
                total = pc.sum(col.cast(pa.float64())).as_py() or 0.0
                sums[name] = sums.get(name, 0.0) + float(total)
    return {"groups": groups, "sums": sums}


def same_answer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two :func:`answer_checksum` summaries agree: the same group count; sums and
    counts to 1e-9 relative, means (columns named ``avg...``) to 1e-5 (extagg's mean of a
    decimal is a decimal rounded to scale + 4, as Spark's; DuckDB's is a double)."""
    if a.get("groups") != b.get("groups"):
        return False
    for name, value in (b.get("sums") or {}).items():
        other = (a.get("sums") or {}).get(name)
        tol = 1e-5 if name.startswith("avg") else 1e-9
        if other is None or abs(other - value) > tol * max(1.0, abs(value)):
            return False
    return True


# ---------------------------------------------------------------------------- running cases


def _spawn(script: str, case: dict[str, Any], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, script, "--child", json.dumps(case)]
    # children start as a user's process does: with bytecode caches (a sandbox's
    # PYTHONDONTWRITEBYTECODE would make every child recompile extagg's sources, ~0.2 s of
    # CPU the installed engines never pay)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)[-400:]}


def run_case(
    script: str,
    case: dict[str, Any],
    *,
    runs: int,
    warmup: int,
    timeout: float,
    log: Callable[[str], None] | None = None,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """``warmup`` untimed and ``runs`` timed fresh children of ``script`` for ``case``.

    Returns ``{"case": case, "runs": [...], "summary": {...}}``; a run that failed carries
    ``error`` and stops the case (a failure repeats; timing it again wastes the machine).
    With ``checkpoint`` (a JSON-lines file) a case already recorded there with the same
    parameters is returned as recorded, and a new one is appended: an interrupted suite resumes.
    """
    key = json.loads(json.dumps({"case": case, "runs": runs, "warmup": warmup}))  # as stored
    if checkpoint is not None and checkpoint.exists():
        for line in checkpoint.read_text(encoding="utf-8").splitlines():
            done = json.loads(line)
            if done["key"] == key:
                if log:
                    log("  (from the checkpoint)")
                return done["result"]
    result = run_cases_interleaved(
        script, [case], runs=runs, warmup=warmup, timeout=timeout, log=log
    )[0]
    if checkpoint is not None:
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        with checkpoint.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"key": key, "result": result}) + "\n")
    return result


def run_cases_interleaved(
    script: str,
    cases: Sequence[dict[str, Any]],
    *,
    runs: int,
    warmup: int,
    timeout: float,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """:func:`run_case` for several cases (engines on one query), their runs interleaved: run
    ``i`` of every case, then run ``i + 1`` of every case. On a machine whose speed drifts over
    minutes (a VM's fresh memory, other tenants) the cases' medians then see the same drift;
    run one after the other, the first case's five runs and the last's differed by up to 30 %
    on the same engine. A case that fails stops (its error is its summary); the others go on."""
    done: list[list[dict[str, Any]]] = [[] for _ in cases]
    failed: list[str | None] = [None for _ in cases]
    for _ in range(warmup):
        for k, case in enumerate(cases):
            if failed[k] is None:
                first = _spawn(script, case, timeout)
                if "error" in first:
                    failed[k] = first["error"]
                    done[k].append(first)
                    if log:
                        log(f"  {case.get('engine', k)}: warm-up failed: {first['error']}")
    for _ in range(runs):
        for k, case in enumerate(cases):
            if failed[k] is None:
                r = _spawn(script, case, timeout)
                done[k].append(r)
                if "error" in r:
                    failed[k] = r["error"]
                    if log:
                        log(f"  {case.get('engine', k)}: run failed: {r['error']}")
    return [
        {"case": case, "runs": results,
         "summary": {"error": err} if err is not None else summarise(results)}
        for case, results, err in zip(cases, done, failed, strict=True)
    ]  # fmt: skip


def summarise(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max of every numeric field of the runs (``field`` → ``[med, lo, hi]``)."""
    out: dict[str, Any] = {}
    keys = dict.fromkeys(k for r in results for k in r)
    for key in keys:
        values = [r[key] for r in results if key in r]
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = [statistics.median(values), min(values), max(values)]
        elif values:
            out[key] = values[-1]
    return out


# ---------------------------------------------------------------------------- deterministic keys

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_SCRAMBLE = np.uint64(0x9E3779B97F4A7C15)
KEY_BITS = 48


def _permute_bits(x: np.ndarray, bits: int, seed: int) -> np.ndarray:
    """A bijection of ``[0, 2**bits)`` (odd multiplies, xor-shifts and a xor, all mod ``2**bits``)."""
    mask = np.uint64((1 << bits) - 1)
    x = (x ^ np.uint64(seed & ((1 << bits) - 1))) & mask
    x = (x * _MIX1) & mask
    x ^= x >> np.uint64(max(1, bits // 2))
    x = (x * _MIX2) & mask
    x ^= x >> np.uint64(max(1, bits // 3))
    return x


def permute_bits(x: np.ndarray, bits: int, seed: int) -> np.ndarray:
    """A bijection of ``[0, 2**bits)`` (see ``permuted_key_index``), for key generators."""
    return _permute_bits(x, bits, seed)


def permuted_key_index(start: int, stop: int, total: int, distinct: int, seed: int) -> np.ndarray:
    """Key numbers (``0 .. distinct-1``) of records ``start .. stop-1`` of a ``total``-record stream.

    Record ``i`` gets ``perm(i) % distinct`` where ``perm`` is a pseudo-random permutation of
    ``[0, total)`` (cycle-walking a bit-mixing bijection): when ``distinct`` divides ``total``
    every key occurs exactly ``total // distinct`` times, in scattered order, and any slice can
    be computed on its own (streams hold no input list).
    """
    bits = max(2, int(total - 1).bit_length())
    x = _permute_bits(np.arange(start, stop, dtype=np.uint64), bits, seed)
    out_of_range = x >= np.uint64(total)
    while out_of_range.any():
        x[out_of_range] = _permute_bits(x[out_of_range], bits, seed)
        out_of_range = x >= np.uint64(total)
    return (x % np.uint64(distinct)).astype(np.int64)


def scramble_keys(index: np.ndarray) -> np.ndarray:
    """Distinct key numbers → distinct int64 keys spread over ``[0, 2**48)`` (odd multiply mod 2**48)."""
    mask = np.uint64((1 << KEY_BITS) - 1)
    return ((index.astype(np.uint64) * _SCRAMBLE) & mask).astype(np.int64)


# ---------------------------------------------------------------------------- reporting


def format_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    if abs(n) >= 1024 * MIB:
        return f"{n / 1024 / MIB:.2f} GiB"
    return f"{n / MIB:.0f} MiB"


def format_range(triple: Sequence[float] | None, fmt: str = "{:.2f}", unit: str = "") -> str:
    """``median (min–max)``."""
    if not triple:
        return "–"
    med, lo, hi = triple
    return f"{fmt.format(med)}{unit} ({fmt.format(lo)}–{fmt.format(hi)})"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        import psutil

        info["memory_total"] = psutil.virtual_memory().total
    except ImportError:
        pass
    for name in ("numpy", "numba", "pyarrow", "duckdb", "polars", "pandas", "pyspark"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            continue
    return info


def write_results(
    name: str, payload: dict[str, Any], text: str, out_dir: Path | None = None
) -> Path:
    """Write ``<name>.json`` (every run) and ``<name>.md`` (the tables) to ``out_dir``
    (default ``benchmarks/results``); returns the JSON path."""
    out = out_dir or RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    (out / f"{name}.md").write_text(text + "\n", encoding="utf-8")
    return path


def update_readme(section: str, text: str) -> bool:
    """Replace the text between ``<!-- section:begin -->`` and ``<!-- section:end -->`` in
    ``benchmarks/README.md``; False when the file or the markers are missing."""
    path = Path(__file__).resolve().parent / "README.md"
    begin, end = f"<!-- {section}:begin -->", f"<!-- {section}:end -->"
    content = path.read_text(encoding="utf-8") if path.exists() else ""
    if begin not in content or end not in content:
        return False
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{text}\n{end}{tail}", encoding="utf-8")
    return True


def add_common_arguments(parser: Any) -> None:
    """Options both scripts share."""
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="tiny data, 1 run, no warm-up")
    parser.add_argument("--runs", type=int, help="timed runs per case (default 3, quick 1)")
    parser.add_argument(
        "--warmup", type=int, help="untimed warm-up runs per case (default 1, quick 0)"
    )
    parser.add_argument("--out", type=Path, help="results directory (default benchmarks/results)")
    parser.add_argument(
        "--no-readme", action="store_true", help="do not update benchmarks/README.md"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="reuse the cases an interrupted run recorded in <out>/<name>.checkpoint.jsonl",
    )


def checkpoint_file(args: Any, name: str) -> Path:
    """The checkpoint of this suite: emptied unless ``--resume``; the scripts remove it at the end."""
    path = (args.out or RESULTS_DIR) / f"{name}.checkpoint.jsonl"
    if not args.resume:
        path.unlink(missing_ok=True)
    return path
