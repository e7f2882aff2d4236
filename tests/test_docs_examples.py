"""Every code block of README.md and docs/**/*.md runs (see tests/docs_runner.py for the rules)."""

from __future__ import annotations

import pytest

from tests import docs_runner

PAGES = [p for p in docs_runner.pages() if not docs_runner.needs_spark(p)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(docs_runner.ROOT)))
def test_page_examples_run(page, tmp_path):
    skipped = docs_runner.run_page(page, tmp_path)
    for reason in skipped:
        print("skipped", reason)


def test_every_page_is_covered():
    every = docs_runner.pages()
    assert docs_runner.ROOT / "README.md" in every
    assert any(p.name == "getting-started.md" for p in every)
    python_blocks = [b for p in every for b in docs_runner.blocks(p) if b.lang == "python"]
    assert len(python_blocks) >= 10
    skips = [b for p in every for b in docs_runner.blocks(p) if b.marker == "skip"]
    assert len(skips) <= 3, f"skips must be rare: {[f'{b.page}:{b.line}' for b in skips]}"


def test_markers_are_parsed(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- skip: needs a cluster -->\n```python\nraise SystemExit\n```\n\n"
        "```python\nx = 1\n```\n\n<!-- run -->\n```sh\n$ python -m extagg --help  # usage\n"
        "make test\n```\n\n```sh\nextagg demo\n```\n",
        encoding="utf-8",
    )
    found = docs_runner.blocks(page)
    assert [(b.lang, b.marker, b.reason) for b in found] == [
        ("python", "skip", "needs a cluster"),
        ("python", None, None),
        ("sh", "run", None),
        ("sh", None, None),
    ]
    assert [argv[1:] for argv in docs_runner.shell_commands(found[2])] == [
        ["-m", "extagg", "--help"]
    ]
    bad = tmp_path / "bad.md"
    bad.write_text("<!-- skip -->\n```python\npass\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="needs a reason"):
        docs_runner.blocks(bad)


def test_a_failing_block_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```python\nvalue = 1\n```\n\n```python\nassert value == 2\n```\n")
    with pytest.raises(AssertionError):
        docs_runner.run_page(page, tmp_path)
