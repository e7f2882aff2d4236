"""MkDocs hook: every public name has a NumPy-style docstring that documents its parameters.

"Public" is every name in ``__all__`` of the packages in :data:`PUBLIC_PACKAGES`; each of those
packages must also have an API reference page (``docs/reference/*.md`` holding
``::: <package>``). A problem is logged as a warning, which ``mkdocs build --strict`` turns into
a failed build; ``tests/test_docstrings.py`` runs the same check without MkDocs.

To publish a new package: add it to :data:`PUBLIC_PACKAGES`, add ``docs/reference/<name>.md``
with ``::: extagg.<name>`` and one line under "API reference" in ``mkdocs.yml``.
"""

from __future__ import annotations

import importlib
import logging
import re
from pathlib import Path
from typing import Any

import griffe

PUBLIC_PACKAGES = (
    "extagg",
    "extagg.memory",
    "extagg.columnar",
    "extagg.state",
    "extagg.state.spark",
    "extagg.spark",
)
ROOT = Path(__file__).resolve().parents[2]
REFERENCE_DIR = ROOT / "docs" / "reference"
#: sections whose entries count as documenting a parameter (dataclasses list their fields)
_PARAM_SECTIONS = {"parameters", "other parameters", "attributes"}

log = logging.getLogger("mkdocs.hooks.check_docstrings")


def _documented_names(obj: Any) -> set[str]:
    names: set[str] = set()
    if obj.docstring is None:
        return names
    for section in obj.docstring.parse(griffe.Parser.numpy, warnings=False):
        if section.kind.value in _PARAM_SECTIONS:
            for item in section.value:
                for name in str(item.name).split(","):
                    names.add(name.strip().lstrip("*"))
    return names


def _signature_names(func: Any) -> list[str]:
    return [p.name for p in func.parameters if p.name not in ("self", "cls")]


def check_object(label: str, obj: Any) -> list[str]:
    problems: list[str] = []
    if obj.docstring is None or not obj.docstring.value.strip():
        return [f"{label}: no docstring"]
    documented = _documented_names(obj)
    if obj.is_function:
        params = _signature_names(obj)
    elif obj.is_class:
        # the constructor's parameters, inherited from an extagg base class or not (builtin
        # bases such as Exception are not loaded, so their constructors are not asked for)
        init = obj.all_members.get("__init__")
        params = _signature_names(init) if init is not None and init.is_function else []
        for name, member in obj.members.items():
            if name.startswith("_") or member.is_alias or member.is_attribute:
                continue
            if member.docstring is None or not member.docstring.value.strip():
                problems.append(f"{label}.{name}: no docstring")
    else:
        params = []
    missing = [p for p in params if p not in documented]
    if missing:
        problems.append(f"{label}: parameters not documented: {', '.join(missing)}")
    return problems


def _reference_pages() -> set[str]:
    found: set[str] = set()
    for page in REFERENCE_DIR.glob("*.md"):
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.startswith("::: "):
                found.add(line[4:].strip())
    return found


def problems(packages: tuple[str, ...] = PUBLIC_PACKAGES) -> list[str]:
    """Every missing docstring, undocumented parameter and missing reference page."""
    loader = griffe.GriffeLoader(docstring_parser=griffe.Parser.numpy, search_paths=[str(ROOT)])
    root = loader.load("extagg")
    loader.resolve_aliases(implicit=False, external=False)
    pages = _reference_pages()
    out: list[str] = []
    for package in packages:
        if package not in pages:
            out.append(f"{package}: no API reference page (docs/reference/*.md with ::: {package})")
        module = importlib.import_module(package)
        node = root if package == "extagg" else root[package.removeprefix("extagg.")]
        for name in module.__all__:
            label = f"{package}.{name}"
            try:
                obj = node[name]
                obj = obj.final_target if obj.is_alias else obj
            except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError) as exc:
                out.append(f"{label}: cannot be resolved ({exc})")
                continue
            out.extend(check_object(label, obj))
    return sorted(set(out))


def on_pre_build(config: Any) -> None:
    for problem in problems():
        log.warning("docstring check: %s", problem)


# Docstrings written for Sphinx use roles (:class:`X`, :meth:`~a.b.X`); Markdown renders them as
# ":class:" plus code. Turn each into a cross-reference (resolved by mkdocs-autorefs when the
# target is documented, plain code otherwise).
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|data|mod|attr|exc|obj):<code>(~?)([\w.]+)</code>")


def _role_to_autoref(match: re.Match[str], package: str) -> str:
    short, target = match.group(1), match.group(2)
    title = target.rsplit(".", 1)[-1] if short else target
    identifier = target if target.startswith("extagg") else f"{package}.{target}"
    return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'


def on_page_content(html: str, page: Any, **_: Any) -> str:
    src = page.file.src_uri
    if not src.startswith("reference/"):
        return html
    name = src.removeprefix("reference/").removesuffix(".md")
    package = "extagg" if name == "extagg" else f"extagg.{name}"
    return _ROLE.sub(lambda m: _role_to_autoref(m, package), html)
