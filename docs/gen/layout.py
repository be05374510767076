"""The package's layout: its folders and top-level modules, each with its docstring's summary.

The tree is walked on disk at build time and each file's docstring read with :mod:`ast`
(nothing imported, nothing run), so a module moved, added or removed shows on the page the
next time the documentation is built. Every folder is listed with the modules it holds; the
summary is a docstring's first paragraph (reStructuredText's double backquotes and roles
dropped), as ``tests/docs/test_layout.py`` requires each folder's ``__init__.py`` and each
top-level module to have one.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

#: The repository root: the package's folder is found under it by name.
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "icegate_dagster"
#: Total width of a line of the tree, and where the summaries start.
WIDTH = 96
NAME_COLUMN = 21

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


@dataclass
class Folder:
    """One folder of the package: its summary, its modules' names, the folders in it."""

    path: Path
    summary: str
    modules: list[str] = field(default_factory=list)
    folders: list[Folder] = field(default_factory=list)


def summary(path: Path) -> str:
    """The first paragraph of ``path``'s module docstring on one line ("" when it has none)."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not docstring:
        return ""
    first = docstring.strip().split("\n\n", 1)[0]
    text = " ".join(line.strip() for line in first.splitlines())
    return _ROLE.sub(r"\1", text).replace("``", "")


def is_folder(path: Path) -> bool:
    """A folder of Python modules (``__pycache__`` and the like are not)."""
    return path.is_dir() and not path.name.startswith(("_", ".")) and any(path.glob("*.py"))


def walk(path: Path) -> Folder:
    """``path`` and every folder under it, modules sorted by name."""
    init = path / "__init__.py"
    return Folder(
        path=path,
        summary=summary(init) if init.exists() else "",
        modules=sorted(p.name for p in path.glob("*.py") if p.name != "__init__.py"),
        folders=[walk(p) for p in sorted(path.iterdir()) if is_folder(p)],
    )


def _entry(name: str, text: str, depth: int) -> list[str]:
    """``name`` at ``depth``, ``text`` wrapped in the summaries' column beside it."""
    head = "  " * depth + name
    column = max(NAME_COLUMN, len(head) + 2)
    lines = textwrap.wrap(text, WIDTH - column) or [""]
    first = head.ljust(column) + lines[0]
    return [first.rstrip(), *(" " * column + line for line in lines[1:])]


def _folder_lines(folder: Folder, depth: int, *, top: bool) -> list[str]:
    lines = _entry(folder.path.name + "/", folder.summary, depth)
    inner = depth + 1
    if top:  # the package's own modules, each with its summary, among its folders
        entries: dict[str, list[str]] = {
            name: _entry(name, summary(folder.path / name), inner) for name in folder.modules
        }
        for sub in folder.folders:
            entries[sub.path.name] = _folder_lines(sub, inner, top=False)
        return lines + [line for name in sorted(entries) for line in entries[name]]
    if folder.modules:
        lines += _entry("", "in it: " + " ".join(folder.modules), inner)
    for sub in folder.folders:
        lines += _folder_lines(sub, inner, top=False)
    return lines


def tree(package: str = PACKAGE) -> list[str]:
    """The layout's lines: the package, its top-level modules and every folder under it."""
    return _folder_lines(walk(ROOT / package), 0, top=True)


def markdown(package: str = PACKAGE) -> str:
    """The layout as a code block (``<!-- generated: layout -->``)."""
    return "\n".join(["```", *tree(package), "```", ""])
