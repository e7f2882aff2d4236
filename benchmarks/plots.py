"""PNG plots of the benchmark results, for the README and the documentation site.

Reads what the benchmark scripts write — ``results/generic.json`` (``bench_generic.py``),
``results/columnar.json`` (``bench_columnar.py``) and ``results/rss-trace.json``
(``rss_trace.py``); with ``--quick`` their ``*-quick.json`` twins — and draws, for each script:

* ``<script>-time-vs-budget.png``: median time (min–max bars) against the memory budget, one line
  per engine and peer, one panel per workload;
* ``<script>-rss-vs-budget.png``: peak RSS above the baseline against the budget, with the
  ``y = budget`` line (and ``1.25 × budget``, the contract) — a point under the line kept to it;
* ``<script>-throughput.png``: records (rows) per second of each engine per workload;

and ``rss-trace.png``: RSS above the baseline over time of one spilling run (sampled every
10 ms), with the memory granted by the manager, the budget, each spill and the merge.

    .venv/bin/python benchmarks/plots.py                 # = make plots; writes docs/img/*.png
    .venv/bin/python benchmarks/plots.py --quick --out /tmp/plots
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

#: plain numbers on log axes ("0.5", "64", "2048") instead of powers
PLAIN = FuncFormatter(lambda v, _: f"{v:g}")

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
OUT_DIR = HERE.parent / "docs" / "img"
MIB = 1024 * 1024
#: budgets at or above this count as "in memory" (the generic script's 8 GiB)
IN_MEMORY = 4 * 1024 * MIB
COLORS = {
    "extagg": "#1f4e9c",
    "merger": "#d1495b",
    "dict": "#7a7a7a",
    "feed": "#bbbbbb",
    "duckdb-1t": "#edae49",
    "duckdb-2t": "#c17d11",
    "polars-eager": "#00798c",
    "polars-streaming": "#30a39b",
    "pandas": "#8e6c8a",
    "ceiling": "#66a182",
}
DPI = 110


def _color(engine: str) -> str:
    return COLORS.get(engine, "#444444")


def _fmt_bytes(n: float) -> str:
    if n >= 1024 * MIB:
        return f"{n / 1024 / MIB:.0f} GiB"
    if n >= MIB:
        return f"{n / MIB:.0f} MiB" if n >= 10 * MIB else f"{n / MIB:.1f} MiB"
    return f"{n / 1024:.0f} KiB"


def load(path: Path) -> dict[str, Any]:
    """One results file; ``SystemExit`` naming it when it is missing or not results JSON."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SystemExit(f"{path} does not exist: run the benchmark script first") from None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or "results" not in data:
        raise SystemExit(f"{path} holds no 'results' list: not a benchmark results file")
    return data


def cases(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measured case: workload, engine, budget, medians.

    A case without a limit ("no limit") is drawn at the machine's memory, the budget it really had.
    """
    machine = int(data.get("machine", {}).get("memory_total") or 64 * 1024 * MIB)
    rows = []
    for result in data["results"]:
        case, summary = result.get("case", {}), result.get("summary") or {}
        seconds = summary.get("seconds") or []
        if not seconds or "error" in result:
            continue
        budget = case.get("budget")
        rate = summary.get("records_per_s") or summary.get("rows_per_s") or []
        peak = summary.get("peak_above_baseline") or []
        rows.append(
            {
                "workload": case["workload"],
                "engine": case["engine"],
                "budget": budget,
                "x": budget if budget is not None else machine,
                "unlimited": budget is None,
                "in_memory": budget is None or budget >= IN_MEMORY,
                "label": case.get("mode", ""),
                "seconds": statistics.median(seconds),
                "seconds_lo": min(seconds),
                "seconds_hi": max(seconds),
                "peak": statistics.median(peak) if peak else None,
                "rate": statistics.median(rate) if rate else None,
                "spills": max(summary.get("spills") or [0]),
            }
        )
    return rows


def _budget_axis(ax: Any, rows: list[dict[str, Any]]) -> list[int]:
    """A log2 budget axis with a tick at every budget of ``rows``; returns the budgets."""
    budgets = sorted({r["x"] for r in rows})
    labels = []
    for b in budgets:
        unlimited = any(r["unlimited"] and r["x"] == b for r in rows)
        labels.append(f"no limit\n({_fmt_bytes(b)})" if unlimited else _fmt_bytes(b))
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, labels, fontsize=8)
    ax.minorticks_off()
    if budgets:
        ax.set_xlim(budgets[0] / 1.6, budgets[-1] * 1.6)
    return budgets


def _by_workload(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        out[row["workload"]].append(row)
    return dict(out)


def _panels(n: int, title: str) -> tuple[Any, list[Any]]:
    cols = min(n, 3)
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.6 * nrows + 0.6), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=12)
    return fig, flat[:n]


def _legend(fig: Any, axes: list[Any]) -> None:
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(
        handles.values(),
        handles.keys(),
        loc="lower center",
        ncol=min(len(handles), 6),
        fontsize=8,
        frameon=False,
    )


def plot_time_vs_budget(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    groups = _by_workload(rows)
    fig, axes = _panels(len(groups), title)
    for ax, (workload, wrows) in zip(axes, groups.items()):
        _budget_axis(ax, wrows)
        for engine in dict.fromkeys(r["engine"] for r in wrows):
            erows = sorted((r for r in wrows if r["engine"] == engine), key=lambda r: r["x"])
            xs = [r["x"] for r in erows]
            ys = [r["seconds"] for r in erows]
            err = [
                [r["seconds"] - r["seconds_lo"] for r in erows],
                [r["seconds_hi"] - r["seconds"] for r in erows],
            ]
            ax.errorbar(xs, ys, yerr=err, marker="o", ms=5, capsize=3, lw=1.6,
                        color=_color(engine), label=engine)  # fmt: skip
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(PLAIN)
        ax.yaxis.set_minor_formatter(PLAIN)
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_title(workload, fontsize=10)
        ax.set_xlabel("memory budget", fontsize=9)
        ax.set_ylabel("seconds (median, min–max)", fontsize=9)
        ax.grid(True, which="both", alpha=0.25)
    _legend(fig, axes)
    fig.tight_layout(rect=(0, 0.08, 1, 0.97))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_rss_vs_budget(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    rows = [r for r in rows if r["peak"] is not None and r["engine"] != "feed"]
    groups = _by_workload(rows)
    fig, axes = _panels(len(groups), title)
    for ax, (workload, wrows) in zip(axes, groups.items()):
        budgets = _budget_axis(ax, wrows)
        line = [budgets[0] / 1.6, budgets[-1] * 1.6]
        ax.plot(line, [b / MIB for b in line], "k-", lw=1.1, label="y = budget")
        ax.plot(line, [1.25 * b / MIB for b in line], "k--", lw=0.8, label="1.25 × budget")
        for engine in dict.fromkeys(r["engine"] for r in wrows):
            erows = sorted((r for r in wrows if r["engine"] == engine), key=lambda r: r["x"])
            ax.plot([r["x"] for r in erows], [r["peak"] / MIB for r in erows], marker="o",
                    ms=5, lw=1.6, color=_color(engine), label=engine)  # fmt: skip
        peaks = [r["peak"] / MIB for r in wrows]
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(PLAIN)
        ax.set_ylim(max(min(peaks) / 2, 0.25), max(max(peaks), budgets[-1] / MIB) * 2)
        ax.set_title(workload, fontsize=10)
        ax.set_xlabel("memory budget", fontsize=9)
        ax.set_ylabel("peak RSS above baseline, MiB", fontsize=9)
        ax.grid(True, which="both", alpha=0.25)
    _legend(fig, axes)
    fig.tight_layout(rect=(0, 0.08, 1, 0.97))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_throughput(rows: list[dict[str, Any]], title: str, unit: str, path: Path) -> None:
    rows = [r for r in rows if r["rate"] is not None and r["engine"] != "feed"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    modes = [("in memory / no limit", True), ("under a budget (spilling)", False)]
    modes = [(name, flag) for name, flag in modes if any(r["in_memory"] == flag for r in rows)]
    fig, axes = plt.subplots(
        len(modes), 1, figsize=(max(7.0, 1.6 * len(workloads) + 3), 3.4 * len(modes) + 0.8),
        squeeze=False,
    )  # fmt: skip
    fig.suptitle(title, fontsize=12)
    flat = [row[0] for row in axes]
    for ax, (name, flag) in zip(flat, modes):
        mrows = [r for r in rows if r["in_memory"] == flag]
        engines = list(dict.fromkeys(r["engine"] for r in mrows))
        width = 0.8 / max(1, len(engines))
        for j, engine in enumerate(engines):
            xs, ys = [], []
            for i, workload in enumerate(workloads):
                found = [r for r in mrows if r["engine"] == engine and r["workload"] == workload]
                if found:
                    xs.append(i - 0.4 + width * (j + 0.5))
                    ys.append(found[0]["rate"] / 1e6)
            ax.bar(xs, ys, width=width, color=_color(engine), label=engine)
        ax.set_xticks(range(len(workloads)), workloads, fontsize=8)
        ax.set_ylabel(f"million {unit}/s (median)", fontsize=9)
        ax.set_title(name, fontsize=10)
        ax.grid(True, axis="y", alpha=0.25)
    _legend(fig, flat)
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_trace(trace: dict[str, Any], path: Path) -> None:
    base = trace["baseline_rss"]
    ts = [s["t"] for s in trace["samples"]]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    ax.plot(ts, [(s["rss"] - base) / MIB for s in trace["samples"]], color=_color("extagg"),
            lw=1.4, label="RSS above baseline")  # fmt: skip
    ax.plot(ts, [s["granted"] / MIB for s in trace["samples"]], color="#66a182", lw=1.0,
            label="granted by the memory manager")  # fmt: skip
    budget = trace["budget"] / MIB
    ax.axhline(budget, color="k", lw=1.2, label=f"budget ({_fmt_bytes(trace['budget'])})")
    ax.axhline(1.25 * budget, color="k", ls="--", lw=0.9, label="1.25 × budget")
    merge = trace.get("phases", {}).get("merge")
    if merge:
        ax.axvspan(merge[0], merge[1], color="#edae49", alpha=0.18, label="merge (iteration)")
    spills = [e["t"] for e in trace["events"] if e["kind"] == "spill"]
    for i, t in enumerate(spills):
        ax.axvline(t, color="#d1495b", lw=0.8, alpha=0.8, label="spill" if i == 0 else None)
    passes = [e["t"] for e in trace["events"] if e["kind"] == "merge pass"]
    for i, t in enumerate(passes):
        ax.axvline(t, color="#8e6c8a", ls=":", lw=1.0, label="merge pass" if i == 0 else None)
    ax.set_xlabel(f"seconds (sampled every {trace['interval_s'] * 1000:.0f} ms)", fontsize=9)
    ax.set_ylabel("MiB", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.set_title(
        f"{trace['engine']}: {trace['records']:,} records, {trace['keys']:,} keys, "
        f"{len(spills)} spills",
        fontsize=10,
    )
    ax.grid(True, alpha=0.25)
    ax.legend(fontsize=8, loc="upper right", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


SCRIPTS = (
    # results name, title, unit of the throughput
    ("generic", "Generic engine vs PySpark's ExternalMerger and a dict", "records"),
    ("columnar", "Columnar engine vs DuckDB, Polars, pandas", "rows"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="where the JSON is")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where the PNGs go")
    parser.add_argument("--quick", action="store_true", help="plot the --quick results")
    args = parser.parse_args(argv)
    suffix = "-quick" if args.quick else ""
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, title, unit in SCRIPTS:
        data = load(args.results / f"{name}{suffix}.json")
        rows = cases(data)
        if not rows:
            raise SystemExit(f"{args.results / f'{name}{suffix}.json'} has no measured case")
        when = data.get("machine", {}).get("time", "")[:10]
        full = f"{title} ({when})" if when else title
        for kind, draw in (
            ("time-vs-budget", lambda p, r=rows, t=full: plot_time_vs_budget(r, t, p)),
            ("rss-vs-budget", lambda p, r=rows, t=full: plot_rss_vs_budget(r, t, p)),
            ("throughput", lambda p, r=rows, t=full, u=unit: plot_throughput(r, t, u, p)),
        ):
            path = args.out / f"{name}-{kind}.png"
            draw(path)
            written.append(path)
    trace_path = args.results / f"rss-trace{suffix}.json"
    if trace_path.exists():
        path = args.out / "rss-trace.png"
        plot_trace(json.loads(trace_path.read_text(encoding="utf-8")), path)
        written.append(path)
    else:
        print(f"no {trace_path}: run benchmarks/rss_trace.py for the RSS trace", file=sys.stderr)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
