"""Runs the code blocks of the Markdown documentation (README.md and docs/**/*.md).

Rules (also written in docs/writing-docs.md):

* every ```` ```python ```` block runs; the blocks of one page run in order in one namespace, in a
  fresh temporary directory (so relative paths in examples are private to the test);
* a ```` ```sh ```` / ```` ```console ```` block runs only when the line before it is
  ``<!-- run -->``; then each of its lines that starts with ``extagg `` or ``python -m extagg``
  (after an optional ``$ `` prompt) is run as a subprocess and must exit with status 0
  (``# comments`` are stripped); other lines (``make``, ``pip``) are not run;
* ``<!-- skip: reason -->`` on the line before a block skips it; the reason is mandatory;
* a page whose Python blocks import ``pyspark`` runs in ``tests/spark`` with the shared local
  SparkSession (examples get it from ``SparkSession.builder.getOrCreate()`` and must not stop it).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^(?P<indent>[ ]{0,3})```(?P<lang>[\w+-]*)[^\n]*$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>skip|run)\s*(?::\s*(?P<reason>.*?))?\s*-->\s*$")
_RUNNABLE_SHELL = ("extagg ", "python -m extagg")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the first code line
    lang: str
    code: str
    marker: str | None  # "skip" | "run" | None
    reason: str | None


def pages() -> list[Path]:
    """Every Markdown page whose blocks are run."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in found if p.is_file()]


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of ``page`` with the marker on the line before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, lang = match["indent"], match["lang"].lower()
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            raise ValueError(f"{page}:{i + 1}: code block is never closed")
        body = [
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : j]
        ]
        marker = reason = None
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k >= 0 and (m := _MARKER.match(lines[k])):
            marker, reason = m["kind"], m["reason"]
            if marker == "skip" and not reason:
                raise ValueError(
                    f"{page}:{k + 1}: <!-- skip --> needs a reason: <!-- skip: why -->"
                )
        out.append(Block(page, i + 2, lang, "\n".join(body) + "\n", marker, reason))
        i = j + 1
    return out


def needs_spark(page: Path) -> bool:
    """Whether a page's Python blocks use PySpark (then it runs with the shared session)."""
    return any(
        b.lang == "python" and re.search(r"^\s*(from|import) pyspark", b.code, re.M)
        for b in blocks(page)
    )


def shell_commands(block: Block) -> list[list[str]]:
    """The extagg commands of a runnable shell block, as argv lists for this interpreter."""
    commands = []
    for raw in block.code.splitlines():
        line = raw.strip().removeprefix("$ ").strip()
        if not line.startswith(_RUNNABLE_SHELL):
            continue
        argv = shlex.split(line, comments=True)
        if argv[0] == "extagg":
            argv = [sys.executable, "-m", "extagg", *argv[1:]]
        else:
            argv = [sys.executable, *argv[1:]]
        commands.append(argv)
    return commands


def _relative(page: Path) -> str:
    try:
        return str(page.relative_to(ROOT))
    except ValueError:
        return str(page)


def run_page(page: Path, workdir: Path) -> list[str]:
    """Run every block of ``page`` in ``workdir``; returns what was skipped, with reasons."""
    namespace: dict[str, object] = {"__name__": "__docs__", "__file__": str(page)}
    skipped = []
    old_cwd = os.getcwd()
    os.chdir(workdir)
    try:
        for block in blocks(page):
            where = f"{_relative(page)}:{block.line}"
            if block.marker == "skip":
                skipped.append(f"{where}: {block.reason}")
                continue
            if block.lang == "python":
                # blank lines before the code keep tracebacks pointing at the Markdown line
                code = compile("\n" * (block.line - 1) + block.code, str(page), "exec")
                exec(code, namespace)
            elif block.lang in ("sh", "console", "bash", "shell") and block.marker == "run":
                for argv in shell_commands(block):
                    done = subprocess.run(
                        argv, cwd=workdir, capture_output=True, text=True, timeout=600
                    )
                    if done.returncode != 0:
                        raise AssertionError(
                            f"{where}: `{shlex.join(argv)}` exited with {done.returncode}\n"
                            f"{done.stdout}\n{done.stderr}"
                        )
    finally:
        os.chdir(old_cwd)
    return skipped
