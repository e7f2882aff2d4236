"""The ``extagg`` command line: ``python -m extagg <command>``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser", "run"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="extagg", description="Aggregate more data than fits in memory."
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log spills (-v) or more (-vv)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="aggregate built-in sample data under a small budget")
    demo.add_argument("--records", type=int, default=3_000_000, help="records to generate")
    demo.add_argument("--keys", type=int, default=1_000_000, help="distinct keys at most")
    demo.add_argument("--memory", default="32m", help="memory budget, e.g. 32m, 1g (default 32m)")
    demo.add_argument("--seed", type=int, default=42)
    demo.add_argument("--spill-dir", action="append", dest="spill_dirs", help="spill directory")
    files = sub.add_parser(
        "demo-files",
        help="the main job: extagg aggregate on a generated lineitem-like Parquet sample",
    )
    files.add_argument("--rows", type=int, default=4_000_000, help="sample rows (default 4 M)")
    files.add_argument("--seed", type=int, default=42)
    files.add_argument("--memory-q1", default="64m", help="budget of the few-groups query")
    files.add_argument("--memory-q2", default="32m", help="budget of the 1 M-groups query")
    files.add_argument("--cache", default=".cache", help="where the sample is generated once")
    files.add_argument("--spill-dir", action="append", dest="spill_dirs", help="spill directory")
    from extagg.cli_aggregate import add_aggregate_command

    add_aggregate_command(sub)
    try:
        from extagg.state.cli import add_state_subcommands
    except ImportError:  # pragma: no cover - state store not installed
        pass
    else:
        add_state_subcommands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        from extagg.demo import run_demo

        try:
            return run_demo(args.records, args.keys, args.memory, args.seed, args.spill_dirs)
        except (ValueError, OSError, MemoryError) as exc:  # bad options, disk full, budget
            print(f"extagg demo: error: {exc}", file=sys.stderr)
            return 2
    if args.command == "demo-files":
        from extagg.demo_files import run_files_demo

        return run_files_demo(
            args.rows, args.seed, args.memory_q1, args.memory_q2, args.cache, args.spill_dirs
        )
    if args.command == "aggregate":
        from extagg.cli_aggregate import run_aggregate

        return run_aggregate(args)
    if args.command == "state":
        from extagg.state.cli import run_state_command

        return run_state_command(args)
    raise AssertionError(f"unhandled command {args.command}")  # pragma: no cover


def run() -> None:
    """The console entry point: ``main()``, then exit with its status.

    After Ctrl-C (status 130) everything the run made is already removed; the process then
    leaves at once (``os._exit``) instead of tearing down numba, LLVM and Arrow's thread pools,
    which takes seconds on a loaded machine: "stop" should mean stop.
    """
    code = main()
    if code == 130:
        import os

        from extagg.spill.tempdir import remove_process_dirs

        sys.stdout.flush()
        sys.stderr.flush()
        remove_process_dirs()
        os._exit(130)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
