"""Every public name has a NumPy-style docstring documenting its parameters, and the examples in
those docstrings run (doctest).

"Public" is ``__all__`` of the packages in ``docs/hooks/check_docstrings.py``'s
``PUBLIC_PACKAGES``; the same check runs inside ``mkdocs build --strict`` (``make docs``).
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
from pathlib import Path

import griffe
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "check_docstrings", ROOT / "docs" / "hooks" / "check_docstrings.py"
)
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


def test_every_public_name_documents_its_parameters():
    assert check.problems() == []


def test_every_public_package_is_checked():
    """A new subpackage with ``__all__`` is public (gets a reference page) unless listed here."""
    internal = {
        "extagg.collection",  # the engines' building blocks
        "extagg.generic",  # documented through its re-exports in extagg
        "extagg.io",  # the file pipeline; users call extagg.aggregate_files / the CLI
    }
    packages = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "extagg").rglob("*/__init__.py")
        if not any(part.startswith("_") for part in init.parent.relative_to(ROOT).parts)
        and "__all__" in init.read_text(encoding="utf-8")
    }
    assert {"extagg.memory", "extagg.state.spark"} <= packages
    assert packages - internal == set(check.PUBLIC_PACKAGES) - {"extagg"}


def _checked(code: str) -> list[str]:
    with griffe.temporary_visited_module(code, docstring_parser=griffe.Parser.numpy) as module:
        return [p for name, obj in module.members.items() for p in check.check_object(name, obj)]


DOC_A = '''"""Do.

    Parameters
    ----------
    a
        A.
    """'''


def test_the_check_finds_what_is_missing():
    assert _checked("def f(a, b):\n    pass\n") == ["f: no docstring"]
    assert _checked(f"def f(a, *, b=1):\n    {DOC_A}\n") == ["f: parameters not documented: b"]
    documented = DOC_A.replace("        A.", "        A.\n    **options\n        More.")
    assert _checked(f"def f(a, **options):\n    {documented}\n") == []
    class_code = (
        f"class C:\n    {DOC_A}\n\n    def __init__(self, a):\n        pass\n\n"
        "    def go(self):\n        pass\n"
    )
    assert _checked(class_code) == ["C.go: no docstring"]


def _public_objects():
    seen = {}
    for package in check.PUBLIC_PACKAGES:
        module = importlib.import_module(package)
        seen[id(module)] = (package, module, vars(module))
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                home = importlib.import_module(obj.__module__)
                seen.setdefault(id(obj), (f"{package}.{name}", obj, vars(home)))
    return list(seen.values())


def _doctests():
    finder = doctest.DocTestFinder(recurse=False)
    found = []
    for label, obj, globs in _public_objects():
        for test in finder.find(obj, label, globs=dict(globs)):
            if test.examples:
                found.append(test)
    return found


DOCTESTS = _doctests()


def test_the_main_names_have_examples():
    labels = {t.name for t in DOCTESTS}
    for name in ("extagg.aggregate", "extagg.HashAggregator", "extagg.ExternalAppendOnlyMap",
                 "extagg.stable_hash", "extagg.state"):  # fmt: skip
        assert name in labels


@pytest.mark.parametrize("test", DOCTESTS, ids=lambda t: t.name)
def test_docstring_examples_run(test, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, (
        f"{result.failed} of {result.attempted} examples of {test.name} failed"
    )
