"""The ``extagg`` command line: ``python -m extagg <command>``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["COMMANDS", "main", "build_parser", "command_of", "run"]


COMMANDS = {
    "demo": "aggregate built-in sample data under a small budget",
    "demo-files": "the main job: extagg aggregate on a generated lineitem-like Parquet sample",
    "aggregate": "group the rows of Parquet/CSV/JSON Lines/Arrow files (larger than memory)",
    "state": "read a checkpoint's state store: a version, the change feed, the metadata",
}


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` asks for (its first word that is not an option), if any."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
        if word == "--":
            return None
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``extagg`` parser. With ``command``, only that subcommand's options are built (the
    others are listed with their help line): its module is the only one imported, so
    ``extagg aggregate`` does not load the state store, nor ``extagg state`` the engines."""
    parser = argparse.ArgumentParser(
        prog="extagg", description="Aggregate more data than fits in memory."
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log spills (-v) or more (-vv)"
    )
    from extagg import __version__

    parser.add_argument("--version", action="version", version=f"extagg {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in COMMANDS.items():
        if command is not None and name != command:
            sub.add_parser(name, help=text, add_help=False)  # listed, never parsed
        elif name == "demo":
            _add_demo(sub)
        elif name == "demo-files":
            _add_demo_files(sub)
        elif name == "aggregate":
            from extagg.cli_aggregate import add_aggregate_command

            add_aggregate_command(sub)
        else:
            _add_state(sub)
    _verbose_after_the_command(parser)
    return parser


def _verbose_after_the_command(parser: argparse.ArgumentParser) -> None:
    """``-v`` after a (sub)command's name as before it (``extagg aggregate … -v`` was
    "unrecognized arguments"): every subcommand parser that is built takes it too, without
    a default of its own (which would reset the count given before the name)."""
    for action in parser._actions:  # argparse keeps its subparsers nowhere public
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for sub in dict.fromkeys(action.choices.values()):
            if not sub.add_help:  # listed only, never parsed
                continue
            if not any("-v" in a.option_strings for a in sub._actions):
                sub.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                                 help="log spills (-v) or more (-vv)")  # fmt: skip
            _verbose_after_the_command(sub)


def _add_demo(sub: Any) -> None:
    demo = sub.add_parser("demo", help=COMMANDS["demo"])
    demo.add_argument("--records", type=int, default=3_000_000, help="records to generate")
    demo.add_argument("--keys", type=int, default=1_000_000, help="distinct keys at most")
    demo.add_argument("--memory", default="32m", help="memory budget, e.g. 32m, 1g (default 32m)")
    demo.add_argument("--seed", type=int, default=42)
    demo.add_argument("--spill-dir", action="append", dest="spill_dirs", help="spill directory")


def _add_demo_files(sub: Any) -> None:
    files = sub.add_parser("demo-files", help=COMMANDS["demo-files"])
    files.add_argument("--rows", type=int, default=4_000_000, help="sample rows (default 4 M)")
    files.add_argument("--seed", type=int, default=42)
    files.add_argument("--memory-q1", default="64m", help="budget of the few-groups query")
    files.add_argument("--memory-q2", default="32m", help="budget of the 1 M-groups query")
    files.add_argument("--cache", default=".cache", help="where the sample is generated once")
    files.add_argument("--spill-dir", action="append", dest="spill_dirs", help="spill directory")


def _add_state(sub: Any) -> None:
    try:
        from extagg.state.cli import add_state_subcommands
    except ImportError:  # pragma: no cover - state store not installed
        sub.add_parser("state", help=COMMANDS["state"])
    else:
        add_state_subcommands(sub)


#: options whose value is a size or a number: a negative one is their value, not an option
_SIZE_OPTIONS = frozenset({"--memory", "--memory-q1", "--memory-q2", "--records", "--keys",
                           "--rows", "--threads"})  # fmt: skip


def _negative_sizes_joined(words: list[str]) -> list[str]:
    """``--memory -1m`` as ``--memory=-1m``: argparse took ``-1m`` for an option and said only
    "expected one argument"; joined, the size's own check says what is wrong with it."""
    out: list[str] = []
    for word in words:
        if out and out[-1] in _SIZE_OPTIONS and len(word) > 1 and word[0] == "-" and (
            word[1].isdigit() or word[1] == "."
        ):  # fmt: skip
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    words = _negative_sizes_joined(sys.argv[1:] if argv is None else list(argv))
    command = command_of(words)
    if command is None:  # --help, --version, or a usage error: the subcommands are listed only,
        command = ""  # none of their modules imported (`extagg --help` took 1.3 s)
    args = build_parser(command).parse_args(words)
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

    Once ``main()`` has returned, everything the run made is removed or committed: the
    ``atexit`` handlers run (logging, spill folders, unfinished scans' readers) and the
    process leaves (``os._exit``) without tearing down the interpreter, numba, LLVM and
    Arrow's thread pools. After Ctrl-C (status 130) that teardown took seconds on a loaded
    machine ("stop" should mean stop); after a failed JSON read, one of Arrow's I/O threads
    dropped its Python file object while the interpreter was finalizing and the process
    aborted (``terminate called without an active exception``, 2 runs in 12). The process is
    the command's own, so the C heap keeps freed memory for reuse
    (``keep_freed_heap_for_reuse``: a library caller's process is never changed so).
    """
    import atexit
    import os
    import signal

    from extagg._interrupts import interrupt_once
    from extagg._malloc import keep_freed_heap_for_reuse

    keep_freed_heap_for_reuse()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        interrupt_once()  # not where the shell or a caller ignores Ctrl-C
    stopped_by = _stop_on_termination()
    _leave_at_once_while_compiling()
    try:
        code = main()
    except SystemExit as exc:  # argparse: --help, usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:  # a command that does not catch it itself
        print("extagg: interrupted", file=sys.stderr)
        code = 130
    if code == 130 and stopped_by:  # as a command killed by that signal
        code = 128 + stopped_by[-1]
    if code == 130 or stopped_by:
        from extagg.spill.tempdir import remove_process_dirs

        remove_process_dirs(leaving=True)
    else:
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that left; a closed stream
            pass
    os._exit(code)


#: seconds after a Ctrl-C (SIGTERM, SIGHUP) in which the run must have stopped on its own (it
#: takes 0.03-0.2 s, a few seconds on a loaded machine); then its files are removed and the
#: process leaves all the same
STOP_DEADLINE = 15.0


def _leave_at_once_while_compiling() -> None:
    """A Ctrl-C (or SIGTERM/SIGHUP) while kernels compile on a cold cache — the first run
    after an install compiles the query's kernels for 6-30 s, out of an interrupt's reach —
    stops the command at once all the same: the spill folders and the partial output are
    removed and the process leaves with ``os._exit`` (``_interrupts.compiling``). Elsewhere
    the interrupt takes its usual way (the run stops at the next batch and cleans up), and
    a run not stopped :data:`STOP_DEADLINE` seconds later is left the same way."""
    import os

    from extagg._interrupts import stop_process_on_interrupt

    def leave(signum: int) -> None:
        from extagg.spill.tempdir import remove_process_dirs

        remove_process_dirs(leaving=True)
        output = sys.modules.get("extagg.io.output")  # loaded if an output is being written
        if output is not None:
            output.remove_unfinished_outputs()
        try:
            print("extagg: interrupted; spill files and partial output removed", file=sys.stderr)
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed stderr
            pass
        os._exit(128 + signum)

    stop_process_on_interrupt(leave, deadline=STOP_DEADLINE)


def _stop_on_termination() -> list[int]:
    """SIGTERM (``timeout``, ``docker stop``, a cancelled CI job) and SIGHUP (a closed
    terminal) stop the command as Ctrl-C does — spill files and partial output removed,
    held back where Ctrl-C is — instead of killing it with its files left behind; the exit
    status is then 128 + the signal's number. Returns the list the signal is noted in."""
    import signal

    stopped_by: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        stopped_by.append(signum)
        handler = signal.getsignal(signal.SIGINT)  # Python's, or one holding Ctrl-C back
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    for name in ("SIGTERM", "SIGHUP"):
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) is signal.SIG_DFL:
            signal.signal(number, stop)
    return stopped_by


if __name__ == "__main__":  # pragma: no cover
    run()
